"""EBFT datasets.

Structured mode: rows -> {prompt, ground_truth}. Built-in transforms (Axolotl's names):
  ebft_opencode.transform / ebft_structured.transform   prompt from input|prompt|question,
                                                        ground truth from output|completion|answer|ground_truth
  ebft_chat_multiturn.transform(_last_turn)              messages: prompt = the turns before the last
                                                        assistant turn, ground truth = that turn
No `type`: the row's `prompt` and `ground_truth` (or `completion`) columns.

Strided mode: rows -> a document of token ids, right-padded later.
  ebft_strided_structured.transform                     prompt + completion; anchors start after the prompt
  ebft_pretrain.transform                               raw text in `question`, else `text` (Axolotl's transform
                                                        tokenises it padded to sequence_len; rlft pads per batch)
  no type / `completion`                                raw text in `field` (default `text`)
"""

from __future__ import annotations

from typing import Any, Callable

from rlft.data.formats.rows import RowError, fields_of, get_field, text, text_field
from rlft.data.prompts import prompt_text, resolve_prompt_format, template_kwargs, tokenize_prompt
from rlft.data.tokenize import encode_text, split_answers
from rlft.errors import DataError

PROMPT_FIELDS = ("input", "prompt", "question")
ANSWER_FIELDS = ("output", "completion", "answer", "ground_truth")


def _first(row: dict[str, Any], names: tuple[str, ...], what: str) -> str:
    for name in names:
        if row.get(name) not in (None, ""):
            return text(row[name], name)
    raise RowError(f"no {what}: the row needs one of {', '.join(names)} (it has {fields_of(row)})")


def structured_record(row: dict[str, Any]) -> dict[str, Any]:
    prompt, truth = _first(row, PROMPT_FIELDS, "prompt"), _first(row, ANSWER_FIELDS, "ground truth")
    rest = {k: v for k, v in row.items() if k not in PROMPT_FIELDS + ANSWER_FIELDS}
    return {**rest, "prompt": prompt, "ground_truth": truth}


def chat_last_turn_record(row: dict[str, Any], field: str = "messages") -> dict[str, Any]:
    messages = get_field(row, field)
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise RowError(f"field {field!r} must be a list of messages (mappings with role and content)")
    for turn, message in enumerate(messages):
        text(message.get("role"), f"{field}[{turn}].role")
        text(message.get("content"), f"{field}[{turn}].content")
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
    if last is None or last == 0:
        raise RowError(f"{field!r} has no assistant turn after a prompt: nothing to use as the ground truth")
    return {"prompt": [{"role": m["role"], "content": m["content"]} for m in messages[:last]],
            "ground_truth": messages[last]["content"]}


STRUCTURED = {
    "ebft_opencode.transform": structured_record,
    "ebft_structured.transform": structured_record,
    "ebft_chat_multiturn.transform": chat_last_turn_record,
    "ebft_chat_multiturn.transform_last_turn": chat_last_turn_record,
}


def resolve_structured(ds, cfg, index: int, where: str, tokenizer) -> Callable[[dict], dict]:
    """Row -> {prompt, ground_truth, other columns} for structured EBFT."""
    if isinstance(ds.type, str) and ds.type in STRUCTURED:
        convert = STRUCTURED[ds.type]
        return (lambda row: convert(row, ds.field_messages)) if convert is chat_last_turn_record else convert
    base = resolve_prompt_format(ds, cfg, index, where, tokenizer)

    def convert(row: dict) -> dict:
        record = base(row)
        if record.get("ground_truth") in (None, "") and record.get("completion") not in (None, ""):
            record["ground_truth"] = record["completion"]
        if record.get("ground_truth") in (None, ""):
            raise RowError(f"no ground truth: EBFT compares samples with a reference answer; add a `ground_truth` "
                           f"(or `completion`) column, or use type: ebft_opencode.transform (row has {fields_of(record)})")
        record["ground_truth"] = text(record["ground_truth"], "ground_truth")
        return record

    return convert


def tokenize_structured(record: dict[str, Any], tokenizer, chat_template_kwargs: dict | None) -> dict[str, Any]:
    example = tokenize_prompt(record, tokenizer, chat_template_kwargs)
    # the ground truth as the model would write it after the prompt (tokenised in context, not alone)
    rendered, special = prompt_text(record["prompt"], tokenizer, template_kwargs(record, chat_template_kwargs))
    whole = tokenizer(rendered + record["ground_truth"], add_special_tokens=special)["input_ids"]
    prompt = example["prompt_ids"]
    if whole[: len(prompt)] == prompt:
        truth = whole[len(prompt):]
    else:  # the tokenizer merged across the boundary: the ground truth alone
        truth = tokenizer(record["ground_truth"], add_special_tokens=False)["input_ids"]
    example["ground_truth_ids"] = truth + ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
    example["columns"].pop("ground_truth", None)
    return example


def resolve_strided(ds, cfg, index: int, where: str, tokenizer) -> Callable[[dict], dict]:
    """Row -> {"text"} (unstructured) or {"prompt", "completion"} (anchors start after the prompt)."""
    if ds.type in ("ebft_strided_structured.transform", "ebft_strided_structured"):
        return lambda row: {"prompt": _first(row, PROMPT_FIELDS, "prompt"), "completion": _first(row, ANSWER_FIELDS, "completion")}
    if ds.type in ("ebft_pretrain.transform", "ebft_pretrain"):
        return lambda row: {"text": _first(row, ("question", "text"), "text")}
    if ds.type in (None, "completion", "completion.default"):
        return lambda row: {"text": text_field(row, ds.field)}
    raise DataError(f"{where}: type {ds.type!r} is not a strided EBFT format: use ebft_strided_structured.transform, "
                    "ebft_pretrain.transform, completion (raw text in `field`), or no type")


def tokenize_strided(record: dict[str, Any], tokenizer) -> dict[str, Any]:
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    if "text" in record:
        return {"input_ids": encode_text(tokenizer, record["text"])["input_ids"] + eos, "prompt_length": 0}
    prompt, (completion,) = split_answers(tokenizer, record["prompt"], [record["completion"]])
    completion = completion + eos
    return {"input_ids": prompt + completion, "prompt_length": len(prompt)}


def fit_strided(example: dict[str, Any], sequence_len: int, context_length: int, generate_max_len: int,
                min_prefix: int, strategy: str) -> tuple[dict | None, str]:
    """Cut to sequence_len (the end goes first), and drop documents too short for a single block.

    A block needs its first anchor (context_length, or the prompt + min_completion_prefix for
    prompt+completion rows) plus generate_max_len tokens of ground truth.
    """
    ids = example["input_ids"]
    outcome = "ok"
    if len(ids) > sequence_len:
        if strategy == "raise":
            raise RowError(f"document has {len(ids)} tokens, more than sequence_len={sequence_len}")
        if strategy == "drop":
            return None, "too_long"
        example = {**example, "input_ids": ids[:sequence_len], "prompt_length": min(example["prompt_length"], sequence_len)}
        outcome = "truncated"
    prompt = example["prompt_length"]
    first_anchor = max(prompt + min_prefix, context_length) if prompt else context_length
    if len(example["input_ids"]) < first_anchor + generate_max_len:
        return None, "too_short"
    return example, outcome
