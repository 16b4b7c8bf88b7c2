"""From the `datasets:` entries to tokenised train and eval examples, with a report per dataset.

Each method supplies three steps: resolve the row format, tokenise a canonical record, fit it to
`sequence_len`. Everything else (loading, parallel mapping, error reporting, counts, merging,
eval split) is shared.
"""

from __future__ import annotations

import json
import math
import random
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from datasets.utils.tqdm import tqdm

from rlft.config.methods import spec_of
from rlft.data.cache import cached
from rlft.data.formats import ebft as E
from rlft.data.formats.preference.fields import is_degenerate_pair
from rlft.data.formats.preference.resolve import resolve_preference_format
from rlft.data.formats.rows import RowError
from rlft.data.formats.sft import resolve_sft_format
from rlft.data.loading import PLACE, describe, load_rows, unpack
from rlft.data.preference import example_length, fit_completions, tokenize_kto, tokenize_pair
from rlft.data.prepared import LengthReport, PreparedData
from rlft.config.settings.training import prompt_budget
from rlft.data.prompts import fit_prompt, resolve_prompt_format, tokenize_prompt
from rlft.data.tokenize import fit_length, tokenize_record
from rlft.errors import DataError


@dataclass
class MethodSteps:
    resolve: Callable[..., Callable[[dict], dict]]  # (ds, cfg, index, where, tokenizer) -> row format
    tokenize: Callable[[dict, Any, Any], dict]  # (record, tokenizer, ds) -> example
    fit: Callable[[dict, Any], tuple[dict | None, str]]  # (example, cfg) -> (example or None, outcome)


def sft_steps(cfg) -> MethodSteps:
    return MethodSteps(
        resolve=resolve_sft_format,
        tokenize=lambda record, tokenizer, ds: tokenize_record(record, tokenizer, cfg.train_on_inputs, ds.roles_to_train, ds.train_on_eos,
                                                                cfg.eot_tokens),
        fit=lambda example, cfg: fit_length(example, cfg.sequence_len, cfg.excess_length_strategy),
    )


def pair_steps(cfg) -> MethodSteps:
    """Preference pairs (DPO family, ORPO, SimPO, reward models); a pair with chosen == rejected is dropped."""
    def tokenize(record, tokenizer, ds):
        if is_degenerate_pair(record):
            raise _Identical()
        return tokenize_pair(record, tokenizer)

    return MethodSteps(_preference_resolve(cfg.method), tokenize,
                       lambda example, cfg: fit_completions(example, ("chosen_ids", "rejected_ids"), cfg.sequence_len, cfg.excess_length_strategy))


def unpaired_steps(cfg) -> MethodSteps:
    """KTO rows: a prompt and one completion with its desirable label."""
    return MethodSteps(_preference_resolve(cfg.method), lambda record, tokenizer, ds: tokenize_kto(record, tokenizer),
                       lambda example, cfg: fit_completions(example, ("completion_ids",), cfg.sequence_len, cfg.excess_length_strategy))


def _preference_resolve(method: str):
    def resolve(ds, cfg, index, where, tokenizer):
        return resolve_preference_format(ds, cfg, index, where, tokenizer, method)
    return resolve


def prompt_steps(cfg, chat_template_kwargs: dict | None = None, chat: bool = False) -> MethodSteps:
    """Online RL prompts: the prompt plus every other column (for the reward functions). `chat_template_kwargs` replace
    trl.chat_template_kwargs and `chat` renders string prompts as a user message (multi-turn rollouts with tools)."""
    budget = prompt_budget(cfg)
    kwargs = cfg.trl.chat_template_kwargs if chat_template_kwargs is None else chat_template_kwargs

    def fit(example, cfg):
        return (example, "ok") if budget is None else fit_prompt(example, budget, cfg.excess_length_strategy)

    return MethodSteps(resolve_prompt_format, lambda record, tokenizer, ds: tokenize_prompt(record, tokenizer, kwargs, chat), fit)


def structured_steps(cfg) -> MethodSteps:
    """Structured EBFT rows: prompts with a ground-truth answer."""
    budget = prompt_budget(cfg)

    def fit(example, cfg):
        return (example, "ok") if budget is None else fit_prompt(example, budget, cfg.excess_length_strategy)

    return MethodSteps(E.resolve_structured, lambda record, tokenizer, ds: E.tokenize_structured(record, tokenizer, cfg.trl.chat_template_kwargs), fit)


def strided_steps(cfg) -> MethodSteps:
    """Strided EBFT rows: documents, in whose blocks the run generates."""
    ebft = cfg.ebft
    return MethodSteps(E.resolve_strided, lambda record, tokenizer, ds: E.tokenize_strided(record, tokenizer),
                       lambda example, cfg: E.fit_strided(example, cfg.sequence_len, ebft.context_length,
                                                          ebft.generate_max_len, ebft.min_completion_prefix,
                                                          cfg.excess_length_strategy))


# the steps of each kind of rows a method trains on (`MethodSpec.data`)
STEPS: dict[str, Callable[[Any], MethodSteps]] = {
    "sft": sft_steps, "pair": pair_steps, "unpaired": unpaired_steps, "prompt": prompt_steps,
    "prompt_answer": structured_steps, "text": strided_steps,
}


def method_steps(cfg) -> MethodSteps:
    """The steps of the rows this config's method trains on."""
    return STEPS[spec_of(cfg).data](cfg)


class _Identical(Exception):
    """A preference pair whose chosen and rejected texts are the same: no learning signal."""


def tokenize_dataset(ds, index: int, cfg, tokenizer, label: str, steps: MethodSteps | None = None) -> tuple[list[dict[str, Any]], LengthReport]:
    """Load, format, tokenise and length-fit one dataset entry; bad rows raise DataError with their index.

    With `dataset_num_proc` above 1 the rows go through `datasets.map` in that many processes, each row's example
    coming back as JSON text and its error as a value, so that the message names the first bad row whatever process
    met it. In one process they are tokenised in a plain loop, without the round trip through Arrow (half the time
    for 2,300 short rows).
    """
    steps = steps or sft_steps(cfg)
    where = describe(ds, index) if label == "datasets" else f"{label}[{index}] ({ds.path or ds.data_files})"
    rows = load_rows(ds, index)
    convert = steps.resolve(ds, cfg, index, where, tokenizer)

    def process(row: dict) -> tuple[dict | None, str, str]:
        place, fields = unpack(row)
        try:
            record = convert(fields)
            example, outcome = steps.fit(steps.tokenize(record, tokenizer, ds), cfg)
        except RowError as exc:
            return None, "error", f"{place}: {exc}"
        except _Identical:
            return None, "identical", ""
        bad = _not_plain_json(example)
        return (None, "error", f"{place}: {bad}") if bad else (example or None, outcome, "")

    if (cfg.dataset_num_proc or 1) > 1:
        def as_columns(row: dict) -> dict:
            example, outcome, error = process(row)
            return {"example": json.dumps(example) if example else "", "outcome": outcome, "error": error}

        processed = rows.map(as_columns, num_proc=cfg.dataset_num_proc, remove_columns=rows.column_names,
                             load_from_cache_file=False, new_fingerprint=uuid.uuid4().hex,  # never cached: no hashing
                             desc=f"tokenising {where}")
        results = ((json.loads(item["example"]) if item["example"] else None, item["outcome"], item["error"])
                   for item in processed)
    else:
        results = (process(row) for row in tqdm(rows.to_list(), desc=f"tokenising {where}", unit=" examples"))
    report = LengthReport(name=where, rows=len(rows))
    examples = []
    for example, outcome, error in results:
        if outcome == "error":
            raise DataError(f"{where}, {error}")
        if _tally(report, example, outcome):
            examples.append(example)
    return examples, report


def _not_plain_json(example: dict | None) -> str:
    """What keeps an example from being plain JSON (the cache and the processes carry examples as JSON), or ""."""
    try:
        json.dumps(example)
    except TypeError as exc:  # a column the rows carry on (prompts keep every column) holds no plain JSON value
        values = {**example, **(example.get("columns") or {})}  # a prompt keeps the row's other columns there
        bad = sorted(key for key, value in values.items() if key != "columns" and not _plain_json(value))
        return (f"column {', '.join(bad) or '?'} holds a value that is not plain JSON ({exc}): drop it with a "
                "transform's remove_columns, or convert it to text or numbers")
    return ""


def _tally(report: LengthReport, example: dict[str, Any] | None, outcome: str) -> bool:
    """Count one row's outcome in `report`; whether it is kept."""
    if outcome in ("too_long", "no_target", "identical", "too_short"):
        report.dropped[outcome] = report.dropped.get(outcome, 0) + 1
        return False
    report.truncated += outcome == "truncated"
    report.kept += 1
    report.lengths.append(_length(example))
    return True


def prepare_records(records: list[dict[str, Any]], cfg, tokenizer, steps: MethodSteps, name: str) -> PreparedData:
    """Records already in the method's canonical form (NeMo Gym tasks), tokenised and length-fitted as dataset rows
    are; a bad record raises DataError naming its place (`PLACE`: file and line) or else `name` and its index."""
    report = LengthReport(name=name, rows=len(records))
    train = []
    for index, record in enumerate(records):
        record = dict(record)
        place = record.pop(PLACE, None) or f"{name}, row {index}"
        try:
            example, outcome = steps.fit(steps.tokenize(record, tokenizer, None), cfg)
        except RowError as exc:
            raise DataError(f"{place}: {exc}") from None
        if _tally(report, example, outcome):
            train.append(example)
    if not train:
        raise DataError(f"no training rows left after filtering ({name}: {report.dropped_text()}): raise sequence_len")
    return PreparedData(train=train, eval=[], reports=[report])


def _length(example: dict[str, Any]) -> int:
    if "input_ids" in example:
        return len(example["input_ids"])
    if "columns" in example:  # a prompt
        return len(example["prompt_ids"])
    return example_length(example)


def prepare_data(cfg, tokenizer, steps: MethodSteps | None = None) -> PreparedData:
    """Every training dataset merged (shuffled once, seeded), plus the eval split or test_datasets
    (from the `dataset_prepared_path` cache when it holds this config's data)."""
    if cfg.dataset_prepared_path:
        return cached(cfg, tokenizer, lambda: _prepare_data(cfg, tokenizer, steps))
    return _prepare_data(cfg, tokenizer, steps)


def _plain_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except TypeError:
        return False
    return True


def _prepare_data(cfg, tokenizer, steps: MethodSteps | None) -> PreparedData:
    train: list[dict[str, Any]] = []
    reports = []
    for index, ds in enumerate(cfg.datasets):
        examples, report = tokenize_dataset(ds, index, cfg, tokenizer, "datasets", steps)
        train.extend(examples)
        reports.append(report)
    if not train:
        dropped = "; ".join(f"{r.name}: {r.dropped_text()}" for r in reports)
        hint = ("EBFT strided documents need at least context_length + generate_max_len tokens"
                if any(r.dropped.get("too_short") for r in reports) else "raise sequence_len or check the data and format")
        raise DataError(f"no training rows left after filtering ({dropped}): {hint}")
    if cfg.shuffle_merged_datasets:
        random.Random(cfg.seed).shuffle(train)
    evaluation: list[dict[str, Any]] = []
    if cfg.test_datasets:
        evaluation = tokenize_test_datasets(cfg, tokenizer, steps, reports)
    elif cfg.val_set_size:
        size = int(cfg.val_set_size) if cfg.val_set_size >= 1 else max(1, math.ceil(cfg.val_set_size * len(train)))
        if size >= len(train):
            raise DataError(f"val_set_size={cfg.val_set_size} leaves no training rows out of {len(train)}")
        train, evaluation = train[:-size], train[-size:]  # the last rows, as Axolotl's unshuffled train_test_split
    if cfg.dataset_exact_deduplication:
        train, evaluation = deduplicate(train, evaluation, reports)
    return PreparedData(train=train, eval=evaluation, reports=reports)


def tokenize_test_datasets(cfg, tokenizer, steps: MethodSteps | None, reports: list[LengthReport]) -> list[dict[str, Any]]:
    evaluation = []
    for index, ds in enumerate(cfg.test_datasets or []):
        examples, report = tokenize_dataset(ds, index, cfg, tokenizer, "test_datasets", steps)
        evaluation.extend(examples)
        reports.append(report)
    return evaluation


def deduplicate(train: list[dict[str, Any]], evaluation: list[dict[str, Any]],
                reports: list[LengthReport]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`dataset_exact_deduplication`: the first of identical prepared examples (same tokens, labels and values) in
    each split, and no eval example that is also a training one. The counts go into the first report."""

    def unique(examples: list[dict[str, Any]], seen: set[str]) -> list[dict[str, Any]]:
        kept = []
        for example in examples:
            key = json.dumps(example, sort_keys=True)
            if key not in seen:
                seen.add(key)
                kept.append(example)
        return kept

    seen: set[str] = set()
    kept_train = unique(train, seen)
    kept_eval = unique(evaluation, seen)  # a training example counts as seen
    for split, before, after in (("duplicate", train, kept_train), ("duplicate_eval", evaluation, kept_eval)):
        if len(after) < len(before):
            reports[0].dropped[split] = len(before) - len(after)
    return kept_train, kept_eval


def prepare_sft_data(cfg, tokenizer) -> PreparedData:
    return prepare_data(cfg, tokenizer, sft_steps(cfg))
