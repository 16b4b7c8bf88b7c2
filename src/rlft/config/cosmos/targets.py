"""rlft's side of a translation: whether rlft has a key, whether it takes a value, its default, and setting a key.

Keys are dotted paths into rlft's config: `trl.beta`, `fsdp_config.fsdp_offload_params` (below a mapping field), and
`datasets[0].split` or `datasets[*].name` (one entry of a list of sections, or every entry).
"""

from __future__ import annotations

import functools
import re
import typing
from typing import Annotated, Any

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from rlft.config.rl import DEFAULTS as TRL_DEFAULTS
from rlft.config.schema import RlftConfig

PART = re.compile(r"^(\w+)(?:\[(\d+|\*)\])?$")


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type):
        return [annotation] if issubclass(annotation, BaseModel) else []
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def _is_mapping(annotation: Any) -> bool:
    return annotation is dict or typing.get_origin(annotation) is dict or any(_is_mapping(a) for a in typing.get_args(annotation))


@functools.cache
def field_at(path: str) -> FieldInfo | None:
    """The rlft field at a dotted path; None where rlft has no such key. Below a mapping field any key is rlft's."""
    model: type[BaseModel] = RlftConfig
    parts = path.split(".")
    for n, part in enumerate(parts):
        match = PART.match(part)
        if match is None or match.group(1) not in model.model_fields:
            return None
        info = model.model_fields[match.group(1)]
        if n == len(parts) - 1:
            return info
        models = _models_in(info.annotation)
        if models:
            model = models[0]
        elif _is_mapping(info.annotation):
            return info
        else:
            return None
    return None


def rlft_has(path: str) -> bool:
    return field_at(path) is not None


@functools.cache
def _adapter(path: str) -> TypeAdapter:
    info = field_at(path)
    return TypeAdapter(Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation)


def rlft_accepts(path: str, value: Any) -> bool:
    """Whether rlft's key takes `value` (its type and bounds; cross-field rules are build_config's)."""
    if path.split(".")[-1] != field_name(path):  # below a mapping: the mapping's own rules
        return True
    try:
        _adapter(path).validate_python(value)
    except ValidationError:
        return False
    return True


def field_name(path: str) -> str:
    """The name of the field a path ends in (`datasets[*].name` -> name), or of the mapping field it is below."""
    model: type[BaseModel] = RlftConfig
    for part in path.split("."):
        name = PART.match(part).group(1)
        info = model.model_fields[name]
        models = _models_in(info.annotation)
        if not models:
            return name
        model = models[0]
    return path.split(".")[-1]


def rlft_default(path: str) -> Any:
    """What rlft does when the key is left out: the field's default, or for `trl:` keys whose default is None the value
    a run takes (rlft.config.rl.DEFAULTS)."""
    info = field_at(path)
    default = info.get_default(call_default_factory=True) if info is not None else None
    if default is None and path.startswith("trl."):
        return TRL_DEFAULTS.get(path[4:])
    return default


def set_path(target: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted key in a nested config mapping; `[*]` sets it in every entry of an existing list."""
    parts = path.split(".")
    nodes = [target]
    for n, part in enumerate(parts):
        name, index = PART.match(part).groups()
        last = n == len(parts) - 1
        following = []
        for node in nodes:
            if index is None:
                if last:
                    node[name] = value
                else:
                    following.append(node.setdefault(name, {}))
                continue
            entries = node.setdefault(name, [])
            chosen = range(len(entries)) if index == "*" else [int(index)]
            for i in chosen:
                while len(entries) <= i:
                    entries.append({})
                if last:
                    entries[i] = value
                else:
                    following.append(entries[i])
        nodes = following
