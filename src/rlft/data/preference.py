"""Preference and KTO records -> token ids, length handling, and batches for one concatenated forward.

A pair example is {prompt_ids, chosen_ids, rejected_ids[, margin]}; a KTO example is
{prompt_ids, completion_ids, label}. Prompt + answer is tokenised as one text (with the tokenizer's
special tokens unless it already starts with BOS) and cut where the answer begins
(`split_answers`); answers end with EOS (added when they do not already).
"""

from __future__ import annotations

from typing import Any

import torch

from rlft.data.collate import pad_batch, shared_prompt_rows, tensor_of
from rlft.data.formats.rows import RowError, text
from rlft.data.tokenize import IGNORE, split_answers


def _with_eos(tokenizer, ids: list[int]) -> list[int]:
    if tokenizer.eos_token_id is not None and (not ids or ids[-1] != tokenizer.eos_token_id):
        return ids + [tokenizer.eos_token_id]
    return ids


def tokenize_pair(record: dict[str, Any], tokenizer) -> dict[str, Any]:
    answers = [_answer(record, key) for key in ("chosen", "rejected")]
    prompt, (chosen, rejected) = split_answers(tokenizer, text(record.get("prompt"), "prompt", optional=True), answers)
    example = {"prompt_ids": prompt, "chosen_ids": _with_eos(tokenizer, chosen), "rejected_ids": _with_eos(tokenizer, rejected)}
    if record.get("margin") is not None:
        example["margin"] = float(record["margin"])
    return example


def _answer(record: dict[str, Any], key: str) -> str:
    answer = text(record.get(key), key, optional=True)
    if not answer.strip():
        raise RowError(f"{key!r} is empty or missing")
    return answer


def tokenize_kto(record: dict[str, Any], tokenizer) -> dict[str, Any]:
    answer = _answer(record, "completion")
    prompt, (completion,) = split_answers(tokenizer, text(record.get("prompt"), "prompt", optional=True), [answer])
    return {"prompt_ids": prompt, "completion_ids": _with_eos(tokenizer, completion), "label": bool(record["label"])}


def fit_completions(example: dict[str, Any], keys: tuple[str, ...], sequence_len: int, strategy: str) -> tuple[dict | None, str]:
    """Apply excess_length_strategy to prompt + each completion in `keys` (Axolotl's rule).

    truncate cuts completions to sequence_len - len(prompt); a prompt that alone fills the window is dropped.
    """
    prompt = len(example["prompt_ids"])
    longest = max(prompt + len(example[key]) for key in keys)
    if longest <= sequence_len:
        return example, "ok"
    if strategy == "raise":
        raise RowError(f"prompt + completion is {longest} tokens, more than sequence_len={sequence_len} "
                       "(raise sequence_len, or set excess_length_strategy: drop or truncate)")
    room = sequence_len - prompt
    if strategy == "drop" or room < 1:
        return None, "too_long"
    return {**example, **{key: example[key][:room] for key in keys}}, "truncated"


def pair_batch(examples: list[dict[str, Any]], pad_id: int, width: int = 0, multiple: int = 1) -> dict[str, Any]:
    """Chosen rows first, then rejected rows, right-padded (to at least `width` tokens, a multiple of `multiple`): one
    forward computes both halves."""
    sequences = [e["prompt_ids"] + e["chosen_ids"] for e in examples] + [e["prompt_ids"] + e["rejected_ids"] for e in examples]
    prompt_lengths = [len(e["prompt_ids"]) for e in examples] * 2
    batch = _right_pad(sequences, prompt_lengths, pad_id, width, multiple)
    if any("margin" in e for e in examples):  # rows without a margin column get margin 0
        batch["margin"] = torch.tensor([e.get("margin", 0.0) for e in examples], dtype=torch.float32)
    for side in ("chosen", "rejected"):  # carried along so reference log-probs can be precomputed once
        key = f"ref_{side}"
        if all(key in e for e in examples):
            batch[key] = torch.tensor([e[key] for e in examples], dtype=torch.float32)
    return batch


def shared_pair_inputs(examples: list[dict[str, Any]], padded_width: int, pad_id: int, one_sequence: bool = False,
                       multiple: int = 1) -> dict[str, torch.Tensor]:
    """`pair_batch`'s pairs with each prompt computed once: pair i as one sequence [prompt | chosen | rejected]
    (`shared_prompt_rows`), whose log-probs are the padded rows' to float rounding.

    Returned as the `flat_*` keys that `rlft.models.logprobs.model_inputs` and `padded` read. `flat_index`
    (2 x pairs, `padded_width`) gives, for each slot of `pair_batch`'s layout (chosen rows, then rejected rows), the
    position in the forward's flattened outputs that holds its values; a padding slot points at its row's last token
    (the labels mask it)."""
    flat, starts = shared_prompt_rows([(e["prompt_ids"], [e["chosen_ids"], e["rejected_ids"]]) for e in examples],
                                      pad_id, one_sequence, multiple)
    rows = [], []  # chosen rows, rejected rows: (prompt | answer | the answer's last position repeated) per slot
    for example, (prompt, *answers) in zip(examples, starts):
        p = len(example["prompt_ids"])
        head, tail = list(range(prompt, prompt + min(p, padded_width))), padded_width - p
        for side, start, key in zip(rows, answers, ("chosen_ids", "rejected_ids")):
            n = len(example[key])
            side.append(head + list(range(start, start + min(n, tail))) + [start + n - 1] * (tail - n))
    flat["flat_index"] = tensor_of(rows[0] + rows[1])
    return flat


def assign_kl_completions(examples: list[dict[str, Any]]) -> None:
    """Give example i the completion of example i+1 as its mismatched pair (KTO's KL reference point).

    Fixed once per dataset (TRL fixes them once too, shifting within chunks of the batch size), so the pairs do not
    depend on batching and their reference log-probs can be precomputed.
    """
    for index, example in enumerate(examples):
        example["kl_completion_ids"] = examples[(index + 1) % len(examples)]["completion_ids"]


def kto_batch(examples: list[dict[str, Any]], pad_id: int, width: int = 0, multiple: int = 1) -> dict[str, Any]:
    """Matched rows (trained) and, under `kl_*`, the mismatched rows for the KL reference point (right-padded to at
    least `width` tokens)."""
    prompts = [len(e["prompt_ids"]) for e in examples]
    batch = _right_pad([e["prompt_ids"] + e["completion_ids"] for e in examples], prompts, pad_id, width, multiple)
    mismatched = _right_pad([e["prompt_ids"] + e["kl_completion_ids"] for e in examples], prompts, pad_id, width, multiple)
    batch.update({f"kl_{key}": value for key, value in mismatched.items() if key != "num_tokens"})
    batch["num_tokens"] += mismatched["num_tokens"]
    batch["desirable"] = torch.tensor([e["label"] for e in examples], dtype=torch.bool)
    for key in ("ref_logps", "ref_kl_logps"):
        if all(key in e for e in examples):
            batch[key] = torch.tensor([e[key] for e in examples], dtype=torch.float32)
    return batch


def _right_pad(sequences: list[list[int]], prompt_lengths: list[int], pad_id: int, width: int = 0,
               multiple: int = 1) -> dict[str, Any]:
    """pad_batch's right-padded rows, with the prompt's tokens out of the labels."""
    return pad_batch([{"input_ids": s, "labels": [IGNORE] * p + list(s[p:])} for s, p in zip(sequences, prompt_lengths)],
                     pad_id, width, multiple)


def shared_length(example: dict[str, Any]) -> int:
    """Tokens of a pair's sequence with its prompt shared (`shared_pair_inputs`)."""
    return len(example["prompt_ids"]) + len(example["chosen_ids"]) + len(example["rejected_ids"])


def example_length(example: dict[str, Any]) -> int:
    """Longest sequence the example puts in a batch (for length-grouped batching)."""
    completions = [len(example[k]) for k in ("chosen_ids", "rejected_ids", "completion_ids") if k in example]
    return len(example["prompt_ids"]) + max(completions)
