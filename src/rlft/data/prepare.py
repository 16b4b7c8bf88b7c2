"""From the `datasets:` entries to tokenised train and eval examples, with a report per dataset."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from rlft.data.formats import RowError, resolve_sft_format
from rlft.data.loading import describe, load_rows
from rlft.data.tokenize import LengthReport, fit_length, tokenize_record
from rlft.errors import DataError


@dataclass
class PreparedData:
    train: list[dict[str, list[int]]]
    eval: list[dict[str, list[int]]]
    reports: list[LengthReport]


def tokenize_dataset(ds, index: int, cfg, tokenizer, label: str) -> tuple[list[dict[str, list[int]]], LengthReport]:
    """Load, format, tokenise and length-fit one dataset entry; bad rows raise DataError with their index.

    Rows are processed with `datasets.map` (`dataset_num_proc` processes); a row's error travels back
    as a value so the message can name the first bad row whatever process met it.
    """
    where = describe(ds, index) if label == "datasets" else f"{label}[{index}] ({ds.path or ds.data_files})"
    rows = load_rows(ds, index)
    convert = resolve_sft_format(ds, cfg, index, where, tokenizer)

    def process(row: dict, row_index: int) -> dict:
        try:
            record = convert(dict(row))  # datasets hands lazy rows to map functions
            example = tokenize_record(record, tokenizer, cfg.train_on_inputs, ds.roles_to_train, ds.train_on_eos)
            example, outcome = fit_length(example, cfg.sequence_len, cfg.excess_length_strategy)
        except RowError as exc:
            return {"input_ids": [], "labels": [], "outcome": "error", "error": f"row {row_index}: {exc}"}
        example = example or {"input_ids": [], "labels": []}
        return {**example, "outcome": outcome, "error": ""}

    processed = rows.map(process, with_indices=True, num_proc=cfg.dataset_num_proc, remove_columns=rows.column_names,
                         load_from_cache_file=False, desc=f"tokenising {where}")
    report = LengthReport(name=where, rows=len(rows))
    examples = []
    for item in processed:
        outcome = item["outcome"]
        if outcome == "error":
            raise DataError(f"{where}, {item['error']}")
        if outcome == "too_long":
            report.dropped_too_long += 1
        elif outcome == "no_target":
            report.dropped_no_target += 1
        else:
            report.truncated += outcome == "truncated"
            report.kept += 1
            report.lengths.append(len(item["input_ids"]))
            examples.append({"input_ids": item["input_ids"], "labels": item["labels"]})
    return examples, report


def prepare_sft_data(cfg, tokenizer) -> PreparedData:
    """Every training dataset merged (shuffled once, seeded), plus the eval split or test_datasets."""
    train: list[dict[str, list[int]]] = []
    reports = []
    for index, ds in enumerate(cfg.datasets):
        examples, report = tokenize_dataset(ds, index, cfg, tokenizer, "datasets")
        train.extend(examples)
        reports.append(report)
    if not train:
        dropped = "; ".join(f"{r.name}: {r.dropped_too_long} too long, {r.dropped_no_target} without trained tokens" for r in reports)
        raise DataError(f"no training rows left after filtering ({dropped}). Raise sequence_len or check train_on_inputs/roles_to_train")
    if cfg.shuffle_merged_datasets:
        random.Random(cfg.seed).shuffle(train)
    evaluation: list[dict[str, list[int]]] = []
    if cfg.test_datasets:
        for index, ds in enumerate(cfg.test_datasets):
            examples, report = tokenize_dataset(ds, index, cfg, tokenizer, "test_datasets")
            evaluation.extend(examples)
            reports.append(report)
    elif cfg.val_set_size:
        size = int(cfg.val_set_size) if cfg.val_set_size >= 1 else max(1, math.ceil(cfg.val_set_size * len(train)))
        if size >= len(train):
            raise DataError(f"val_set_size={cfg.val_set_size} leaves no training rows out of {len(train)}")
        evaluation, train = train[:size], train[size:]
    return PreparedData(train=train, eval=evaluation, reports=reports)
