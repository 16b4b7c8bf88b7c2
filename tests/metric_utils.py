"""What two runs that train the same thing must log alike: metrics.jsonl values without the timings."""

from __future__ import annotations

from typing import Any


def trained_values(record: dict[str, Any]) -> dict[str, float]:
    """A metrics.jsonl record's float values less the clock-dependent ones (phase times, throughput, MFU, memory)."""
    return {key: value for key, value in record.items() if isinstance(value, float)
            and not key.startswith(("time/", "perf/")) and "tokens_per_s" not in key and "mfu" not in key
            and "memory" not in key and key != "step_time_s"}
