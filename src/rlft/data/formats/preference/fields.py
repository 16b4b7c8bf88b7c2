"""Reading the fields of preference and KTO rows, and the names and types the formats share."""

from __future__ import annotations

from typing import Any, Callable

from rlft.data.formats.rows import Record, RowError, RowFormat, fields_of, get_field, text

# A factory builds the row function of one dataset entry: (ds, tokenizer, method) -> row function.
FormatFactory = Callable[[Any, Any, str], RowFormat]


def required_text(row: dict[str, Any], name: str, *, allow_empty: bool = False) -> str:
    """A string field; empty (after strip) is an error unless allowed."""
    return checked_text(get_field(row, name), name, allow_empty=allow_empty)


def checked_text(value: Any, name: str, *, allow_empty: bool = False) -> str:
    value = text(value, name)
    if not allow_empty and not value.strip():
        raise RowError(f"field {name!r} is empty")
    return value


def first_present(row: dict[str, Any], names: tuple[str, ...]) -> str:
    for name in names:
        if row.get(name) is not None:
            return name
    listed = " / ".join(repr(name) for name in names)
    raise RowError(f"missing field {listed} (row has {fields_of(row)})")


def system_text(row: dict[str, Any], name: str = "system") -> str | None:
    """The optional system prompt: present and truthy, else None (Axolotl adds no system block then)."""
    value = row.get(name)
    if not value:
        return None
    return checked_text(value, name)


def message_content(row: dict[str, Any], name: str, position: int) -> str:
    """`row[name][position]["content"]` of a message list, as the chatml/llama3 *_chat formats read it."""
    messages = get_field(row, name)
    if not isinstance(messages, list):
        raise RowError(f"field {name!r} must be a list of messages, got {type(messages).__name__}")
    if len(messages) <= position:
        raise RowError(f"field {name!r} needs at least {position + 1} messages, has {len(messages)}")
    message = messages[position]
    if not isinstance(message, dict) or message.get("content") is None:
        raise RowError(f"missing field '{name}[{position}].content'")
    return checked_text(message["content"], f"{name}[{position}].content", allow_empty=position == 0)


def parse_label(value: Any, name: str = "label") -> bool:
    """A KTO label: a bool, 0/1, or the strings true/false (any case); anything else is a RowError."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, float) and value in (0.0, 1.0):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    raise RowError(f"field {name!r} must be a boolean (true/false, 1/0), got {value!r}")


def margin_of(row: dict[str, Any]) -> float | None:
    value = row.get("margin")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise RowError(f"field 'margin' must be a number, got {type(value).__name__}")
    try:
        return float(value)
    except ValueError:
        raise RowError(f"field 'margin' must be a number, got {value!r}") from None


def is_degenerate_pair(record: Record) -> bool:
    """True when chosen and rejected are the same text: the pair carries no preference signal."""
    return record.get("chosen") == record.get("rejected")
