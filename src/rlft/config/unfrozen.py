"""`unfrozen_parameters` patterns, read as Axolotl reads them (`axolotl/utils/freeze.py`): a regular expression matched
at the start of the parameter name (`re.match`: add `$` to match whole names), in which a dot is a literal dot unless a
`+` follows it; a trailing `[start:end]` (or `[i]`, `[:end]`, `[start:]`) names the rows (dimension 0) that train."""

from __future__ import annotations

import re
from dataclasses import dataclass

_RANGE = re.compile(r"^(.+)\[([0-9]*)(?::([0-9]*))?\]$")


@dataclass(frozen=True)
class NamePattern:
    text: str
    regex: re.Pattern
    rows: tuple[int, int | None] | None  # rows [start, end) that train; None: the whole parameter


def parse_pattern(text: str) -> NamePattern:
    """One `unfrozen_parameters` entry; ValueError naming what is wrong with it."""
    name, rows = text, None
    if found := _RANGE.match(text):
        name, start, end = found.groups()
        if end is None and start:  # [i]: one row
            rows = (int(start), int(start) + 1)
        elif end is not None:
            rows = (int(start or 0), int(end) if end else None)
        else:
            raise ValueError(f"{text!r}: an empty row range []: write [start:end], [:end], [start:] or [i]")
        if rows[1] is not None and rows[0] >= rows[1]:
            raise ValueError(f"{text!r}: the row range ends at or before its start")
    try:
        regex = re.compile(re.sub(r"\.(?!\+)", r"\\.", name))
    except re.error as exc:
        raise ValueError(f"{text!r} is not a regular expression ({exc})") from None
    return NamePattern(text, regex, rows)
