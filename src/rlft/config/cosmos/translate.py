"""A Cosmos-RL file -> rlft's config mapping, by the table of rows (`ROWS`), with what became of each key.

Every key the file sets gets one `Outcome`: `mapped` (the rlft keys and values it became; none where its value is what
rlft does anyway), `refused` (`rlft train` stops, with the reason and the nearest thing that runs), `unused` (rlft does
not read it, and why) or `unknown` (not a key of Cosmos-RL's schema: Cosmos-RL ignores it; `rlft train` stops, so that
a misspelt key is not lost). Keys the file leaves out are translated at Cosmos-RL's default where the row says so
(`carry`) and rlft's own default differs; a left-out key is never refused.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from rlft.config.cosmos.rows import Row, View
from rlft.config.cosmos.rows_model import LOGGING_ROWS, POLICY_MODEL_ROWS, ROLLOUT_ROWS
from rlft.config.cosmos.rows_other import PROFILER_ROWS, TOP_ROWS, VALIDATION_ROWS
from rlft.config.cosmos.rows_policy import POLICY_ROWS
from rlft.config.cosmos.rows_train import TRAIN_ROWS
from rlft.config.cosmos.schema import Finding, check, leaves
from rlft.config.cosmos.targets import rlft_accepts, rlft_default, set_path

ROWS: list[Row] = (TOP_ROWS + TRAIN_ROWS + POLICY_ROWS + POLICY_MODEL_ROWS + ROLLOUT_ROWS + VALIDATION_ROWS + LOGGING_ROWS
                   + PROFILER_ROWS)


def row_for(path: str, method: str) -> Row | None:
    for row in ROWS:
        if row.cosmos == path and row.method in (None, method):
            return row
    return None


@dataclass
class Outcome:
    """What one key of the file became."""

    path: str
    value: Any
    kind: str  # mapped | refused | unused | unknown
    detail: str = ""  # the reason (refused, unused, unknown)
    rlft: dict[str, Any] = field(default_factory=dict)  # the rlft keys it set


@dataclass
class Translation:
    rlft: dict[str, Any]
    outcomes: list[Outcome]
    problems: list[Finding]  # wrong types and tables: the file is wrong for Cosmos-RL too
    method: str
    carried: list[Outcome] = field(default_factory=list)  # keys the file leaves out, at Cosmos-RL's default

    def of(self, kind: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.kind == kind]

    def written(self) -> set[str]:
        """The rlft keys the file's keys set, as a message may name them: whole, as their list (`datasets`), or by a
        last part with an underscore (`prefetch_depth` for trl.prefetch_depth)."""
        return {name for o in self.outcomes + self.carried for key in o.rlft for name in _names(key)}

    def origin(self, rlft_name: str) -> list[str]:
        """The Cosmos-RL keys that set an rlft key named so (`written`)."""
        return [o.path for o in self.outcomes + self.carried if any(rlft_name in _names(key) for key in o.rlft)]


def _names(key: str) -> set[str]:
    last = key.split(".")[-1]
    return {key, key.split("[")[0]} | ({last} if "_" in last else set())


def translate(data: dict[str, Any]) -> Translation:
    """The rlft mapping of a Cosmos-RL file (already parsed), and the outcome of each key it sets."""
    findings = check(data)
    problems = [f for f in findings if not f.unknown]
    if problems:  # the rows read values of the schema's types: a file with wrong ones stops here (front.translated)
        return Translation({}, [], problems, "grpo")
    unknown = {f.path: f.message for f in findings if f.unknown}
    view = View(data)
    out: dict[str, Any] = {}
    outcomes: dict[str, Outcome] = {}
    carried: list[Outcome] = []
    for row in ROWS:
        if row.method not in (None, view.method):
            continue
        given, value = view.given(row.cosmos), view.get(row.cosmos)
        if not given and not row.carry:
            continue
        outcome = _apply(row, value, view, given, out)
        if given:
            outcomes[row.cosmos] = outcome
        elif outcome.rlft:
            carried.append(outcome)
    listed = [Outcome(path, value, "unknown", unknown[path]) if key is None else outcomes[path]
              for path, value, key in leaves(data)]
    return Translation(out, listed, problems, view.method, carried)


def _apply(row: Row, value: Any, view: View, given: bool, out: dict[str, Any]) -> Outcome:
    reason = row.refuse(value, view) if row.refuse else None
    if reason and given:
        return Outcome(row.cosmos, value, "refused", reason)
    if reason:  # Cosmos-RL's default of a key rlft does not build (policy tp_size 2): not applied
        return Outcome(row.cosmos, value, "unused", reason)
    if row.convert is None:
        return Outcome(row.cosmos, value, "unused", row.why_unused(value, view) or "")
    converted = row.convert(value, view)
    lacking = [key for key in converted if not rlft_accepts(key, converted[key])]
    if lacking and given:
        why = "; ".join(f"rlft's {key} does not take {converted[key]!r}" for key in lacking)
        if value == view.default(row.cosmos):
            return Outcome(row.cosmos, value, "unused", f"Cosmos-RL's default; {why}")
        return Outcome(row.cosmos, value, "refused", why)
    written = {}
    for key, new in converted.items():
        if key in lacking or (not given and _is_rlft_default(key, new)):
            continue
        set_path(out, key, copy.deepcopy(new))
        written[key] = new
    return Outcome(row.cosmos, value, "mapped", "" if written or converted else _same(row, value, view), written)


def _is_rlft_default(key: str, value: Any) -> bool:
    return "[" not in key and rlft_default(key) == value


def _same(row: Row, value: Any, view: View) -> str:
    return row.why_unused(value, view) or "what rlft does anyway"
