"""The prompts an online-RL run validates on (`validation:`): each entry of `validation.datasets` one set, named after
its file or hub id, or else the eval split (test_datasets or val_set_size) as one set."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from rlft.data.prepare import MethodSteps, prompt_steps, tokenize_dataset
from rlft.data.prepared import LengthReport
from rlft.errors import DataError

DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".arrow", ".txt")
# metric names under eval/ that a set of the same name would shadow (eval/<set>/...)
RESERVED = {"rewards", "completions"}


@dataclass
class ValidationSet:
    name: str  # in metric names: eval/<name>/... when a run has several sets
    prompts: list[dict[str, Any]]  # tokenised prompt rows (rlft.data.prompts)
    report: LengthReport | None = None  # what length handling did to its rows (None: the eval split's own)


def set_names(entries: list) -> list[str]:
    """A metric-safe name per dataset entry: its file's stem or the hub id's last part; entries that share one get
    their configuration name, then their split, then their place in the list appended."""
    names = [_clean(_stem(entry)) for entry in entries]
    for extra in (lambda entry, index: entry.name, lambda entry, index: entry.split, lambda entry, index: str(index)):
        repeated = {name for name in names if names.count(name) > 1}
        names = [f"{name}_{_clean(extra(entry, index))}" if name in repeated and extra(entry, index) else name
                 for index, (name, entry) in enumerate(zip(names, entries))]
    return [f"{name}_set" if name in RESERVED else name for name in names]


def _stem(entry) -> str:
    files = entry.data_files if isinstance(entry.data_files, list) else [entry.data_files]
    source = PurePath((entry.path or files[0] or "data").rstrip("/"))
    return source.stem if source.suffix in DATA_SUFFIXES else source.name


def _clean(text: str) -> str:
    return re.sub(r"[^\w.-]+", "_", text).strip("_") or "set"


def validation_sets(cfg, tokenizer, evaluation: list[dict[str, Any]], steps: MethodSteps | None = None) -> list[ValidationSet]:
    """`validation.datasets` tokenised as prompts (as training prompts are: prompt budget, chat template, and `steps`
    where the training's prompts have steps of their own, e.g. a multi-turn run's tools), one set each; without them,
    the eval split `evaluation` as one set named `eval` (none when it is empty)."""
    entries = list(cfg.validation.datasets or [])
    if not entries:
        return [ValidationSet("eval", evaluation)] if evaluation else []
    steps, sets = steps or prompt_steps(cfg), []
    for index, (entry, name) in enumerate(zip(entries, set_names(entries))):
        prompts, report = tokenize_dataset(entry, index, cfg, tokenizer, "validation.datasets", steps)
        if not prompts:
            raise DataError(f"{report.name}: no prompt left to validate on ({report.dropped_text()} dropped): raise "
                            "sequence_len, or check the rows")
        sets.append(ValidationSet(name, prompts, report))
    return sets
