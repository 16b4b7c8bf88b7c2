"""Two-number addition, "a+b=" -> "c": learnable by a sub-million-parameter model in under a minute.

Rows are {"prompt": "12+34=", "completion": "46"}; the split is deterministic, so the shipped files
in examples/quickstart/data and examples/preference/data can be regenerated exactly with
`python -m rlft.tasks.addition`. Preference pairs put the right sum against a near miss.
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


def near_miss(row: dict[str, str], rng: random.Random) -> str:
    """A wrong answer that looks plausible: off by 1-10 (never negative, never the right one)."""
    right = int(row["completion"])
    offsets = [d for d in range(-10, 11) if d and right + d >= 0]
    return str(right + rng.choice(offsets))


def preference_rows(rows: list[dict[str, str]], seed: int = 1) -> list[dict[str, str]]:
    """{"prompt", "chosen": right sum, "rejected": a near miss}."""
    rng = random.Random(seed)
    return [{"prompt": r["prompt"], "chosen": r["completion"], "rejected": near_miss(r, rng)} for r in rows]


def kto_rows(rows: list[dict[str, str]], seed: int = 2) -> list[dict[str, object]]:
    """{"prompt", "completion", "label"}: every other row is a near miss labelled undesirable."""
    rng = random.Random(seed)
    out: list[dict[str, object]] = []
    for index, r in enumerate(rows):
        wrong = index % 2 == 1
        out.append({"prompt": r["prompt"], "completion": near_miss(r, rng) if wrong else r["completion"], "label": not wrong})
    return out


def text_documents(rows: list[dict[str, str]], per_document: int = 6) -> list[dict[str, str]]:
    """Raw text for strided EBFT: {"text": "12+34=46\n3+4=7\n..."} with `per_document` sums each."""
    lines = [f"{r['prompt']}{r['completion']}" for r in rows]
    return [{"text": "\n".join(lines[i : i + per_document])} for i in range(0, len(lines) - per_document + 1, per_document)]


def write_jsonl(rows: list[dict[str, str]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def read_jsonl(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def exact_match(predictions: list[str], answers: list[str]) -> float:
    """Fraction of predictions equal to the answer after stripping whitespace."""
    hits = sum(prediction.strip() == answer.strip() for prediction, answer in zip(predictions, answers))
    return hits / max(1, len(answers))


def write_example_data(root: Path) -> None:
    train, held_out = split_rows()
    write_jsonl(train, root / "quickstart" / "data" / "train.jsonl")
    write_jsonl(held_out, root / "quickstart" / "data" / "heldout.jsonl")
    preference = root / "preference" / "data"
    write_jsonl(preference_rows(train[:1000]), preference / "pairs.jsonl")
    write_jsonl(preference_rows(held_out, seed=3), preference / "pairs-heldout.jsonl")
    write_jsonl(kto_rows(train[:1000]), preference / "kto.jsonl")
    write_jsonl(kto_rows(held_out, seed=4), preference / "kto-heldout.jsonl")
    write_jsonl(text_documents(train), root / "ebft" / "data" / "train.jsonl")
    write_jsonl(text_documents(held_out), root / "ebft" / "data" / "heldout.jsonl")


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "examples")
    write_example_data(root)
    print(f"wrote the addition task's example data under {root}")
