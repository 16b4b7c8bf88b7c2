"""The pieces of the translation table: a `Row` per Cosmos-RL key, and the `View` of a file that a row reads.

A row says what one Cosmos-RL key becomes in rlft, in one of three ways:

* `convert`: the value -> rlft keys (`{"trl.beta": 0.04}`; `datasets[*].name` sets every dataset entry, `datasets[0]`
  one); {} where the value is what rlft does anyway;
* `refuse`: the value -> the reason `rlft train` refuses it, with the nearest thing that runs (None: not refused);
* `unused`: why rlft does not read the key (launcher settings, engine tuning with no effect on results).

A row may have `refuse` beside `convert` or `unused` (the value decides). `carry` rows also translate Cosmos-RL's
default when the file leaves the key out, since rlft's own default may differ (Cosmos-RL's learning rate is 1e-6,
rlft's 2e-5). A value that rlft's key does not take (a bound, a type) is refused by `rlft train`, naming the key
(at Cosmos-RL's default, the key is not used, for the same reason).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlft.config.cosmos.schema import effective, find, policy_type

Convert = Callable[[Any, "View"], dict[str, Any]]
Judge = Callable[[Any, "View"], "str | None"]


class View:
    """A Cosmos-RL file as its rows read it: values with Cosmos-RL's defaults filled in, and which keys the file sets."""

    def __init__(self, data: dict[str, Any]):
        self.data = data
        self.full = effective(data)
        self.method = policy_type(data)

    def get(self, path: str) -> Any:
        node: Any = self.full
        for part in path.split("."):
            if not isinstance(node, dict):
                return None
            node = node.get(part)
        return node

    def default(self, path: str) -> Any:
        """Cosmos-RL's default of a key (of this file's train_policy type)."""
        key = find(path, self.method)
        return key.default if key is not None else None

    def given(self, path: str) -> bool:
        node: Any = self.data
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True


@dataclass(frozen=True)
class Row:
    cosmos: str
    targets: tuple[str, ...] = ()
    convert: Convert | None = None
    refuse: Judge | None = None
    unused: str | Judge | None = None
    carry: bool = False
    method: str | None = None
    note: str = ""

    def why_unused(self, value: Any, view: View) -> str | None:
        return self.unused(value, view) if callable(self.unused) else self.unused


def to(cosmos: str, target: str, transform: Callable[[Any], Any] | None = None, **kwargs: Any) -> Row:
    """A key that becomes one rlft key, its value passed through `transform`."""
    return Row(cosmos, (target,), lambda value, view: {target: transform(value) if transform else value}, **kwargs)


def rows_to(cosmos: str, targets: tuple[str, ...], convert: Convert, **kwargs: Any) -> Row:
    return Row(cosmos, targets, convert, **kwargs)


def unused(cosmos: str, why: str | Judge, **kwargs: Any) -> Row:
    return Row(cosmos, unused=why, **kwargs)


def refused_when(cosmos: str, when: Callable[[Any], bool], why: str, otherwise: str | None = None, **kwargs: Any) -> Row:
    """A key rlft runs only at its off value: `when(value)` -> refused with `why`; else nothing to set (`otherwise`
    says why: the value is what rlft does)."""
    kwargs.setdefault("note", f"rlft train refuses any other value: {why}")
    return Row(cosmos, convert=lambda value, view: {}, refuse=lambda value, view: why if when(value) else None,
               unused=otherwise or "what rlft does anyway", **kwargs)


def above_one(value: Any) -> bool:
    return isinstance(value, (int, float)) and value > 1
