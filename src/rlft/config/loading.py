"""Read a config (rlft's YAML, or a Cosmos-RL TOML or YAML: rlft.config.cosmos), apply `--key=value` overrides,
validate, and turn every error into plain words.

A pydantic error becomes `(key path, message)`: unknown keys name the closest valid key (also when
the key belongs to another section, e.g. top-level `beta` -> `trl.beta`), wrong types name the
expected type and the value that was given.
"""

from __future__ import annotations

import difflib
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rlft.config.base import Section
from rlft.config.cosmos.front import is_cosmos, read_toml, split_overrides, translated, with_origins
from rlft.config.cosmos.translate import Translation
from rlft.config.rules import combination_problems
from rlft.config.schema import RlftConfig
from rlft.config.sections.datasets import DatasetConfig, PretrainingDatasetConfig, UserDefinedType
from rlft.config.sections.nemo_gym import NemoGymDataset
from rlft.errors import ConfigError

_TYPE_WORDS = {
    "int_parsing": "a whole number",
    "int_type": "a whole number",
    "int_from_float": "a whole number",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping (key: value)",
    "model_type": "a mapping (key: value)",
    "model_attributes_type": "a mapping (key: value)",
}


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Parse a config file (YAML, or TOML by its suffix); syntax errors name the file, line and column."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file not found: {path} (check the path; it is relative to {Path.cwd()})")
    if path.is_dir():
        raise ConfigError(f"{path} is a folder: pass the YAML config file inside it")
    if path.suffix.lower() == ".toml":
        return read_toml(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: YAML syntax error at {where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(data).__name__}")
    return data


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """Turn `--trl.beta=0.01 --max_steps 5` into a nested dict; values are parsed as YAML scalars."""
    overrides: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r}: overrides look like --key=value or --section.key=value")
        key, sep, raw = arg[2:].partition("=")
        if not sep:
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                raw = args[i + 1]
                i += 1
            else:
                raw = "true"
        try:
            value = yaml.safe_load(raw) if raw != "" else None
        except yaml.YAMLError:
            value = raw
        set_dotted(overrides, key.replace("-", "_"), value)
        i += 1
    return overrides


def set_dotted(target: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = target.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted}: {part} is not a section")
        target = node
    target[parts[-1]] = value


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key with `update` winning; everything else (lists too) is replaced."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _sections_in(annotation: Any) -> list[type[BaseModel]]:
    """The config sections an annotation holds (`TRLConfig`, `list[DatasetConfig]`, `Optional[Union[str, X]]`)."""
    if isinstance(annotation, type):
        return [annotation] if issubclass(annotation, BaseModel) else []
    return [section for arg in typing.get_args(annotation) for section in _sections_in(arg)]


def field_named(model: type[BaseModel], key: str):
    """The field of `model` that `key` names: its own name or one of its other names (`validation_alias`)."""
    if key in model.model_fields:
        return model.model_fields[key]
    for info in model.model_fields.values():
        if info.alias == key:
            return info
        alias = info.validation_alias
        if alias is not None and key in (getattr(alias, "choices", None) or [alias]):
            return info
    return None


def drop_empty(data: dict[str, Any], model: type[BaseModel] = RlftConfig) -> dict[str, Any]:
    """Axolotl's idiom: a known key left empty (`fp16:` with no value) is unset, at every level.

    Keys whose null has a meaning of its own keep it (their default is not null and they accept
    null, e.g. `trl.reward_timeout: null` = no limit). Unknown keys stay, to be reported.
    """
    kept: dict[str, Any] = {}
    for key, value in data.items():
        info = field_named(model, key)
        if info is None:
            kept[key] = value
            continue
        if value is None:
            if type(None) in typing.get_args(info.annotation) and info.get_default(call_default_factory=True) is not None:
                kept[key] = value
            continue
        sections = _sections_in(info.annotation)
        if sections and isinstance(value, dict):
            value = drop_empty(value, sections[0])
        elif sections and isinstance(value, list):
            value = [drop_empty(item, sections[0]) if isinstance(item, dict) else item for item in value]
        kept[key] = value
    return kept


def build_config(data: dict[str, Any], source: str = "config") -> RlftConfig:
    """Validate a config mapping and its key combinations; raise ConfigError listing every problem."""
    try:
        cfg = RlftConfig.model_validate(drop_empty(data))
    except ValidationError as exc:
        problems = [describe_error(err) for err in exc.errors()]
        # A union field reports each member; keep the deeper error (e.g. a misspelt key in a `type:` mapping).
        problems = [
            (where, what) for where, what in problems
            if not (what.startswith("expected") and any(other.startswith(where + ".") for other, _ in problems))
        ]
        raise _config_error(source, problems) from None
    problems = [("combination", sentence) for sentence in combination_problems(cfg)]
    if problems:
        raise _config_error(source, problems)
    return cfg


def _config_error(source: str, problems: list[tuple[str, str]]) -> ConfigError:
    lines = "\n".join(f"  - {where}: {what}" for where, what in problems)
    return ConfigError(f"{source}: {len(problems)} problem(s)\n{lines}", problems)


def load_config(path: str | Path, overrides: list[str] | None = None) -> RlftConfig:
    """Read, override and validate a config file. Relative paths in it stay relative to the working directory."""
    return load_translated(path, overrides)[0]


def load_translated(path: str | Path, overrides: list[str] | None = None) -> tuple[RlftConfig, Translation | None]:
    """`load_config`, and for a Cosmos-RL file what became of each of its keys (None for an rlft config)."""
    data = read_yaml(path)
    parsed = parse_overrides(overrides) if overrides else {}
    if not is_cosmos(Path(path), data):
        return build_config(deep_merge(data, parsed), source=str(path)), None
    cosmos, rlft = split_overrides(parsed)
    translation = translated(Path(path), deep_merge(data, cosmos))
    try:
        return build_config(deep_merge(translation.rlft, rlft), source=str(path)), translation
    except ConfigError as exc:
        raise with_origins(exc, translation) from None


def describe_error(err: dict[str, Any]) -> tuple[str, str]:
    """One pydantic error as (key path, message with the fix)."""
    kind, parts = err["type"], list(err["loc"])
    # an unknown key ends the location whatever its spelling (`Learning_rate` is no union member's name)
    loc = [part for i, part in enumerate(parts) if not _is_union_tag(part) or (kind == "extra_forbidden" and i == len(parts) - 1)]
    where = _format_loc(loc) or "config"
    if kind == "extra_forbidden":
        return where, _unknown_key_message(loc)
    if kind == "missing":
        return where, "required key is missing"
    if kind == "literal_error":
        allowed = err.get("ctx", {}).get("expected", "")
        guess = _closest(str(err.get("input")), [a.strip(" '") for a in allowed.replace(" or ", ",").split(",")])
        hint = f" (did you mean {guess!r}?)" if guess else ""
        return where, f"{err.get('input')!r} is not allowed: expected {allowed}{hint}"
    if kind in _TYPE_WORDS:
        given = err.get("input")
        return where, f"expected {_TYPE_WORDS[kind]}, got {given!r} ({type(given).__name__})"
    if kind in _RANGE_WORDS:  # pydantic's "Input should be greater than 0" names neither the value nor the fix
        sign, bound = _RANGE_WORDS[kind]
        return where, f"must be {sign} {err.get('ctx', {}).get(bound)}, got {err.get('input')!r}"
    message = err["msg"].removeprefix("Value error, ")
    return where, message


_RANGE_WORDS = {"greater_than": (">", "gt"), "greater_than_equal": (">=", "ge"), "less_than": ("<", "lt"),
                "less_than_equal": ("<=", "le")}


def _is_union_tag(part: Any) -> bool:
    # pydantic adds the union member's name to the location: `type.str`, `type.UserDefinedType`.
    return isinstance(part, str) and (part in {"str", "int", "float", "bool"} or part[:1].isupper() or "[" in part)


def _format_loc(loc: list[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _entry_model(key: str) -> type[BaseModel] | None:
    """The model of one entry of a dataset list (`datasets`, `test_datasets`, `pretraining_dataset`), else None."""
    return {"datasets": DatasetConfig, "test_datasets": DatasetConfig, "pretraining_dataset": PretrainingDatasetConfig}.get(key)


def _section_for(loc: list[Any]) -> type[BaseModel]:
    """The model class that owns the key at `loc` (walks nested sections and lists)."""
    model: type[BaseModel] = RlftConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part)
        if info is None:
            break
        annotation = str(info.annotation)
        if entry := _entry_model(part):
            model = entry
        elif part == "type":
            model = UserDefinedType
        elif isinstance(info.annotation, type) and issubclass(info.annotation, Section):
            model = info.annotation
        elif "NemoGymDataset" in annotation:
            model = NemoGymDataset
    return model


def _unknown_key_message(loc: list[Any]) -> str:
    key = str(loc[-1])
    owner = _section_for(loc)
    guess = _closest(key, [info.alias or name for name, info in owner.model_fields.items()])
    # the key may belong to another section: `beta` at top level is `trl.beta`
    elsewhere = [
        f"{name}.{key}"
        for name, info in RlftConfig.model_fields.items()
        if isinstance(info.annotation, type) and issubclass(info.annotation, Section) and key in info.annotation.model_fields
    ]
    if owner is not RlftConfig and key in RlftConfig.model_fields:
        elsewhere.append(f"{key} (top level)")
    if elsewhere:
        return f"unknown key {key!r} here; it belongs under {' or '.join(elsewhere)}"
    if guess:
        return f"unknown key {key!r}: did you mean {guess!r}?"
    return f"unknown key {key!r} (see `rlft validate --explain` for the valid keys)"


def _closest(word: str, options: list[str]) -> str | None:
    matches = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return matches[0] if matches else None


def explain(key: str) -> str:
    """Describe a dotted key (`trl.beta`, `lora_r`): type, default and description."""
    parts = key.split(".")
    model: type[BaseModel] = RlftConfig
    for part in parts[:-1]:
        info = model.model_fields.get(part)
        if entry := _entry_model(part):
            model = entry
        elif info is not None and isinstance(info.annotation, type) and issubclass(info.annotation, Section):
            model = info.annotation
        else:
            raise ConfigError(f"no section {part!r} in {key!r}")
    name = parts[-1]
    info = field_named(model, name)
    if info is None:
        guess = _closest(name, list(model.model_fields))
        full = ".".join(parts[:-1] + [guess]) if guess else None
        raise ConfigError(f"unknown key {key!r}" + (f": did you mean {full!r}?" if full else ""))
    default = info.get_default(call_default_factory=True)
    if isinstance(default, BaseModel):
        default = "(section)"
    annotation = getattr(info.annotation, "__name__", None) if isinstance(info.annotation, type) else None
    annotation = annotation or str(info.annotation).replace("typing.", "")
    extra = info.json_schema_extra or {}
    planned = str(extra.get("planned")) if isinstance(extra, dict) and "planned" in extra else ""
    status = f"\n  not built: {planned}" if planned else ""
    return f"{key}\n  type: {annotation}\n  default: {default!r}\n  {info.description}{status}"
