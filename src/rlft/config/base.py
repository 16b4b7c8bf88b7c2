"""Building blocks shared by every config section.

Every section forbids unknown keys (a misspelt key is an error, never silently ignored) and every
field carries a description (`rlft validate --explain KEY` prints it).

A field made with :func:`planned` belongs to a capability that is specified but not built.
`rlft validate` accepts it so that users' existing configs check clean; `rlft train` refuses a
config that sets it to anything but its default, naming the key and the capability.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignment is validated, and no number may be NaN or
    infinite (`.nan` / `.inf` in YAML would train silently wrong: every key says how to turn its feature off)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True, allow_inf_nan=False)


def field(default: Any = None, description: str = "", **kwargs: Any) -> Any:
    """A documented config field (the description is required in spirit: write one)."""
    if "default_factory" in kwargs:
        return Field(description=description, **kwargs)
    return Field(default, description=description, **kwargs)


def planned(default: Any = None, description: str = "", *, what: str, **kwargs: Any) -> Any:
    """A field of a capability not built (`what`): it validates, but `train` refuses a non-default value."""
    extra = dict(kwargs.pop("json_schema_extra", None) or {})
    extra["planned"] = what
    return Field(default, description=description, json_schema_extra=extra, **kwargs)


def planned_settings(model: BaseModel, prefix: str = "") -> list[tuple[str, str]]:
    """(key path, what is not built) for every `planned` field that the config sets to a non-default value."""
    found: list[tuple[str, str]] = []
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        path = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            found.extend(planned_settings(value, f"{path}."))
            continue
        extra = info.json_schema_extra
        if isinstance(extra, dict) and "planned" in extra and name in model.model_fields_set:
            if value != info.get_default(call_default_factory=True):
                found.append((path, str(extra["planned"])))
    return found
