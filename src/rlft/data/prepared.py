"""What preparing a config's data gives: tokenised train and eval examples, and a report per dataset of what
formatting and length handling did to its rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DROP_REASONS = {"too_long": "too long", "no_target": "without trained tokens", "identical": "chosen == rejected",
                "too_short": "shorter than one EBFT block",
                "duplicate": "duplicates of earlier training rows, all datasets (dataset_exact_deduplication)",
                "duplicate_eval": "eval rows repeating an earlier eval row or a training row (dataset_exact_deduplication)"}


@dataclass
class LengthReport:
    """What formatting and length handling did to one dataset."""

    name: str
    rows: int = 0
    kept: int = 0
    truncated: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # reason (DROP_REASONS key) -> rows
    lengths: list[int] = field(default_factory=list)

    @property
    def dropped_too_long(self) -> int:
        return self.dropped.get("too_long", 0)

    @property
    def dropped_no_target(self) -> int:
        return self.dropped.get("no_target", 0)

    def dropped_text(self) -> str:
        parts = [f"{count} {DROP_REASONS[reason]}" for reason, count in self.dropped.items() if count]
        return ", ".join(parts) if parts else "0"

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.lengths)
        stats: dict[str, Any] = {}
        if ordered:
            stats = {
                "min": ordered[0],
                "mean": round(sum(ordered) / len(ordered), 1),
                "p50": ordered[len(ordered) // 2],
                "p95": ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))],
                "max": ordered[-1],
                "total_tokens": sum(ordered),
            }
        return {
            "dataset": self.name,
            "rows": self.rows,
            "kept": self.kept,
            "dropped_too_long": self.dropped_too_long,
            "dropped_no_target": self.dropped_no_target,
            "dropped_identical": self.dropped.get("identical", 0),
            "truncated": self.truncated,
            "tokens": stats,
        }


@dataclass
class PreparedData:
    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]
    reports: list[LengthReport]
