"""Two-number addition, "a+b=" -> "c": learnable by a sub-million-parameter model in under a minute.

Rows are {"prompt": "12+34=", "completion": "46"}; the split is deterministic, so the shipped files
in examples/quickstart/data can be regenerated exactly with `python -m rlft.tasks.addition DIR`.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HELD_OUT = 200


def all_rows(limit: int = 50) -> list[dict[str, str]]:
    return [{"prompt": f"{a}+{b}=", "completion": str(a + b)} for a in range(limit) for b in range(limit)]


def split_rows(seed: int = 0) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train, held_out): every pair appears in exactly one of them."""
    rows = all_rows()
    random.Random(seed).shuffle(rows)
    return rows[HELD_OUT:], rows[:HELD_OUT]


def write_jsonl(rows: list[dict[str, str]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def read_jsonl(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def exact_match(predictions: list[str], answers: list[str]) -> float:
    """Fraction of predictions equal to the answer after stripping whitespace."""
    hits = sum(prediction.strip() == answer.strip() for prediction, answer in zip(predictions, answers))
    return hits / max(1, len(answers))


if __name__ == "__main__":
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "examples/quickstart/data")
    train, held_out = split_rows()
    write_jsonl(train, folder / "train.jsonl")
    write_jsonl(held_out, folder / "heldout.jsonl")
    print(f"wrote {len(train)} train and {len(held_out)} held-out rows to {folder}")
