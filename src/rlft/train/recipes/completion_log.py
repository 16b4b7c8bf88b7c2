"""Sampled completions as users read them: TRL's `log_completions` (every completion of a generation batch appended to
output_dir/completions.jsonl) and `num_completions_to_print` (the first N of each batch, as console lines)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from rlft.rollout.types import ScoredBatch
from rlft.train.metrics import truncate_after


def completion_records(scored: ScoredBatch, tokenizer, generation: int) -> list[dict[str, Any]]:
    """One record per completion: its prompt, text, reward per function (None when unscorable), weight version and
    advantage."""
    rollout, scores = scored.rollout, scored.scores
    texts = tokenizer.batch_decode(rollout.completion_ids, skip_special_tokens=True)
    return [{"step": generation, "prompt": scored.prompt_of(index)["prompt"], "completion": text,
             "rewards": {name: _finite_or_none(scores.column(name)[index]) for name in scores.names},
             "weight_version": rollout.weight_versions[index], "advantage": round(float(scored.advantages[index]), 6)}
            for index, text in enumerate(texts)]


class CompletionLog:
    """A run's `log_completions` (completions.jsonl) and `num_completions_to_print` (console lines)."""

    def __init__(self, output_dir: str, tokenizer, to_file: bool, to_print: int):
        self.output_dir, self.tokenizer, self.to_file, self.to_print = output_dir, tokenizer, to_file, to_print

    @property
    def on(self) -> bool:
        return self.to_file or self.to_print > 0

    def resume(self, generation: int) -> None:
        """Drop the records of generation batches after `generation`: the resumed run generates those again."""
        if self.to_file:
            truncate_after(Path(self.output_dir) / "completions.jsonl", generation)

    def record(self, scored: ScoredBatch, generation: int) -> list[str]:
        """Write this generation batch's completions (when logged); return the console lines to print."""
        records = completion_records(scored, self.tokenizer, generation)
        if self.to_file:
            append_records(self.output_dir, records)
        return console_lines(records, self.to_print, generation)


def append_records(output_dir: str, records: list[dict[str, Any]]) -> None:
    path = Path(output_dir) / "completions.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        handle.writelines(json.dumps(record) + "\n" for record in records)


def console_lines(records: list[dict[str, Any]], count: int, generation: int) -> list[str]:
    """The first `count` records as console lines, under a heading; none when `count` is 0."""
    shown = records[:count]
    if not shown:
        return []
    lines = [f"completions of generation batch {generation} ({len(shown)} of {len(records)}):"]
    for record in shown:
        rewards = ", ".join(f"{name} {value:.3g}" if value is not None else f"{name} -" for name, value in record["rewards"].items())
        prompt = record["prompt"] if isinstance(record["prompt"], str) else json.dumps(record["prompt"])[-200:]
        lines.append(f"  {prompt!r} -> {record['completion']!r}  [{rewards}; advantage {record['advantage']:+.3f}]")
    return lines


def _finite_or_none(value: torch.Tensor) -> float | None:
    number = float(value)
    return None if number != number else round(number, 6)
