"""Batches: right-padded rows, or packed rows with per-document attention.

A packed row holds several documents. Each document sees only itself: the attention mask is
block-diagonal and causal, position ids restart at 0 per document, and the first token of each
document is not a target (it would otherwise be predicted from the previous document). Packed and
unpacked batches therefore give the same per-token losses.

Packed and flattened batches carry their documents' boundaries (`documents`, `document_bounds`), not
the (T, T) mask: SDPA attends within each document without one (`rlft.models.varlen`), and the forward
builds the mask (`documents_mask`) only for an attention that needs it (`rlft.models.masks.with_model_mask`).
"""

from __future__ import annotations

import array
from itertools import chain
from typing import Any, TypedDict

import torch

from rlft.data.tokenize import IGNORE

Example = dict[str, list[int]]
ARRAY_TYPES = {torch.long: "q", torch.float32: "f"}  # the typed array of each dtype `tensor_of` builds through


def tensor_of(values: list, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """`torch.tensor(values, dtype=dtype)` of a list of numbers, or of rows of one length (a batch), made from a typed
    array (`array.array`, whose buffer the tensor then holds): torch.tensor converts a Python list element by element,
    3-4x slower for a batch (21 against 6 us for 268 ids; 44 us when it also has to infer the dtype). Rows of
    differing lengths, and empty ones, go to torch.tensor, which says what is wrong."""
    if not values:
        return torch.tensor(values, dtype=dtype)
    if isinstance(values[0], (list, tuple)):
        width = len(values[0])
        if not width or any(len(row) != width for row in values):
            return torch.tensor(values, dtype=dtype)
        flat = array.array(ARRAY_TYPES[dtype], chain.from_iterable(values))
        return torch.frombuffer(flat, dtype=dtype).view(len(values), width)
    return torch.frombuffer(array.array(ARRAY_TYPES[dtype], values), dtype=dtype)


def padded_to(longest: int, width: int = 0, multiple: int = 1) -> int:
    """The width a batch is padded to: its longest row, at least `width`, rounded up to a multiple of `multiple`."""
    return -(-max(width, longest) // multiple) * multiple


def padded_width(cfg) -> int:
    """The width every SFT, preference or reward-model batch is padded to at least: sequence_len with
    pad_to_sequence_len (one shape every step), else 0 (the longest row of the batch). Padded positions are masked."""
    return cfg.sequence_len if cfg.pad_to_sequence_len else 0


def pad_multiple(cfg) -> int:
    """`pad_to_multiple_of`, or when unset 64 on a CUDA GPU, as Axolotl pads: a few batch shapes instead of one per
    length, so the GPU's per-shape costs (attention kernel plans, allocator growth) are paid a few times, not every
    step (bench/results/gpu_check-H200.json). 1 on a CPU, where every padding token costs compute."""
    return cfg.pad_to_multiple_of or (64 if torch.cuda.is_available() else 1)


def pad_batch(examples: list[Example], pad_id: int, width: int = 0, multiple: int = 1) -> dict[str, torch.Tensor]:
    """Right-pad to the longest row (at least `width`, rounded up to `multiple`): input_ids, attention_mask, labels
    (-100 on padding)."""
    lengths = [len(e["input_ids"]) for e in examples]
    width = padded_to(max(lengths), width, multiple)
    # padded as lists, one tensor each: a tensor per row and a copy into the batch cost ~10x more for short rows
    input_ids = tensor_of([list(e["input_ids"]) + [pad_id] * (width - n) for e, n in zip(examples, lengths)])
    labels = tensor_of([list(e["labels"]) + [IGNORE] * (width - n) for e, n in zip(examples, lengths)])
    attention = (torch.arange(width)[None] < tensor_of(lengths)[:, None]).long()
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels, "num_tokens": sum(lengths)}


def pack_examples(examples: list[Example], capacity: int) -> list[list[int]]:
    """Group example indices into packs of at most `capacity` tokens (`first_fit` of their lengths)."""
    return first_fit([len(example["input_ids"]) for example in examples], capacity)


def first_fit(sizes: list[int], capacity: int) -> list[list[int]]:
    """Group indices of `sizes` into packs whose sizes add up to at most `capacity` (first fit, order kept within and
    across packs); a size above `capacity` gets a pack of its own. A full pack leaves the search: rows that each fill a
    pack (pretraining text cut to sequence_len) pack in linear time."""
    packs: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (pack, free tokens) of the packs not full, oldest first
    for index, size in enumerate(sizes):
        for slot, (pack, free) in enumerate(room):
            if size <= free:
                packs[pack].append(index)
                if free == size:
                    del room[slot]
                else:
                    room[slot] = (pack, free - size)
                break
        else:
            packs.append([index])
            if size < capacity:
                room.append((len(packs) - 1, capacity - size))
    return packs


def packed_batch(packs: list[list[Example]], pad_id: int, width: int = 0, block_mask: bool = True,
                 multiple: int = 1) -> dict[str, torch.Tensor]:
    """Rows of concatenated documents (padded to the longest, or to `width`) and their `documents` boundaries, from
    which the forward attends per document (`documents_mask`); without `block_mask`, neither, and the rows follow
    one another in one row: flash-attention's variable-length kernels find the documents from the position ids, which
    transformers reads only in a batch of one row (several rows would each attend across their documents). A row's
    last token never predicts the next row's first one: a document's first token is not a target."""
    width = padded_to(max(sum(len(doc["input_ids"]) for doc in pack) for pack in packs), width, multiple)
    batch = len(packs)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    labels = torch.full((batch, width), IGNORE, dtype=torch.long)
    positions = torch.zeros((batch, width), dtype=torch.long)
    document = torch.full((batch, width), -1, dtype=torch.long)
    for row, pack in enumerate(packs):
        offset = 0
        for number, doc in enumerate(pack):
            n = len(doc["input_ids"])
            input_ids[row, offset : offset + n] = torch.tensor(doc["input_ids"])
            labels[row, offset : offset + n] = torch.tensor(doc["labels"])
            labels[row, offset] = IGNORE
            positions[row, offset : offset + n] = torch.arange(n)
            document[row, offset : offset + n] = number
            offset += n
    batch = {"input_ids": input_ids, "labels": labels, "position_ids": positions, "num_tokens": int((document >= 0).sum())}
    if block_mask:
        return {**batch, "documents": document_bounds(document)}
    return {key: value.reshape(1, -1) if torch.is_tensor(value) else value for key, value in batch.items()}


def document_bounds(document: torch.Tensor) -> torch.Tensor:
    """(D + 1,) where each of the D documents of (B, T) `document` numbers (-1: padding) starts, over the B x T
    positions taken row after row, then B x T: a document ends at its row's end or where the number changes (a run of
    padding is one). SDPA attends within each on its own (`rlft.models.varlen`)."""
    flat = document.reshape(-1)
    starts = torch.ones_like(flat, dtype=torch.bool)
    starts[1:] = flat[1:] != flat[:-1]
    starts[:: document.size(1)] = True
    return torch.cat([starts.nonzero()[:, 0], torch.tensor([flat.numel()], device=flat.device)])


def documents_mask(bounds: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """The (B, 1, T, T) block-causal mask of the documents between `bounds` (`document_bounds`) in B rows of T: each
    token attends to the tokens before it in its own document (a run of padding is a document of its own)."""
    starts = torch.zeros(rows * width, dtype=torch.long, device=bounds.device)
    starts[bounds[:-1]] = 1
    return segment_mask((starts.cumsum(0) - 1).view(rows, width))


def segment_mask(segment: torch.Tensor, home: torch.Tensor | None = None) -> torch.Tensor:
    """(B, 1, T, T) bool, causal within segments: token q attends to the tokens k <= q of its own segment
    (`segment` (B, T) equal) and, given `home` (B, T), of the segment `home[q]` names: for a prompt shared by several
    answers, an answer's home is its prompt (`shared_prompt_rows`). A token whose segment holds it alone (padding)
    attends only to itself: no softmax row is all masked. At most six tensor operators, whatever the layout."""
    positions = torch.arange(segment.size(1), device=segment.device)
    key = segment[:, None, :]
    mask = key == segment[:, :, None]
    if home is not None:
        mask |= key == home[:, :, None]
    return (mask & (positions[None, :] <= positions[:, None]))[:, None]


def shared_prompt_rows(groups: list[tuple[list[int], list[list[int]]]], pad_id: int, one_sequence: bool = False,
                       multiple: int = 1) -> tuple[dict[str, torch.Tensor], list[list[int]]]:
    """Groups (prompt, answers) as sequences [prompt | answer 1 | answer 2 | ...] that compute each prompt once
    (`rlft.models.shared_prompts`).

    Position ids run 0..p-1 on the prompt and restart at p on every answer; the mask (`segment_mask`, each answer's
    home its prompt) lets each answer attend to its prompt and to itself, never to another answer. Every token thus
    sees what it sees in its own row [prompt | answer], at the same positions. One sequence per group, right-padded to
    the longest (rounded up to `multiple`), or with `one_sequence` every group in one sequence without padding.
    Returns the `flat_*` model inputs (`rlft.models.logprobs.model_inputs`), `model_tokens` (the tokens the forward
    computes, each prompt once: what MFU counts) and, per group, where its prompt and each answer start in the
    forward's outputs flattened over (sequences x width)."""
    lengths = [len(prompt) + sum(map(len, answers)) for prompt, answers in groups]
    rows, width = (1, sum(lengths)) if one_sequence else (len(groups), padded_to(max(lengths), 0, multiple))
    size = rows * width
    ids, positions = [pad_id] * size, [0] * size
    # segment k of group g is g * parts + k (k = 0 its prompt, k = 1.. its answers); a padding token is one of its own
    parts = 1 + max((len(answers) for _, answers in groups), default=0)
    segment = list(range(-1, -size - 1, -1))
    home = list(segment)
    starts, offset = [], 0
    for number, ((prompt, answers), n) in enumerate(zip(groups, lengths)):
        offset = offset if one_sequence else number * width
        p, first = len(prompt), number * parts
        ids[offset : offset + n] = [token for part in (prompt, *answers) for token in part]
        positions[offset : offset + n] = [*range(p), *(q for answer in answers for q in range(p, p + len(answer)))]
        segment[offset : offset + n] = [first] * p + [first + k for k, answer in enumerate(answers, 1) for _ in answer]
        home[offset : offset + n] = [first] * n
        group = [offset]
        for part in (prompt, *answers[:-1]):
            group.append(group[-1] + len(part))
        starts.append(group)
        offset += n
    shape = (rows, width)
    return ({"flat_input_ids": tensor_of(ids).view(shape), "flat_position_ids": tensor_of(positions).view(shape),
             "flat_attention_mask": segment_mask(tensor_of(segment).view(shape), tensor_of(home).view(shape)),
             "model_tokens": sum(lengths)}, starts)


def flatten_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, block_mask: bool, prefix: str = "") -> dict[str, torch.Tensor]:
    """Padded rows (left or right padding) as one sequence without padding (`batch_flattening`, `dpo_padding_free`).

    The rows' real tokens follow one another with position ids restarting at 0 for each row, as flash-attention's
    variable-length kernels read them (transformers' DataCollatorWithFlattening; Kundu et al. 2024,
    arXiv:2407.09105). With `block_mask` (SDPA and eager attention) `flat_documents` (`document_bounds`) keeps each
    row to itself (`documents_mask`); without it the attention kernel finds the rows from the position ids.
    `flat_index` (R, T) is the flat position of every padded slot (a padding slot points at a real token before it,
    whose values the padding's mask hides): `outputs[0][flat_index]` puts a flat output back in the padded layout.
    Keys are prefixed with `prefix`."""
    real = attention_mask.bool()
    count, length = real.shape
    flat = {"flat_input_ids": input_ids[real][None], "flat_position_ids": (real.long().cumsum(-1) - 1)[real][None],
            "flat_index": (real.reshape(-1).long().cumsum(0) - 1).clamp_min(0).view(count, length)}
    if block_mask:
        lengths = real.sum(-1)
        flat["flat_documents"] = torch.cat([lengths.new_zeros(1), lengths[lengths > 0].cumsum(0)])
    return {prefix + key: value for key, value in flat.items()}


class CompletionBatch(TypedDict, total=False):
    """`completion_batch`'s micro-batch of B rows: prompts of width P left-padded, completions of width C right-padded.
    Its columns keep the names of the rows' fields (`rlft.rollout.types.TrainingRow`)."""

    input_ids: torch.Tensor  # (B, P + C) long
    attention_mask: torch.Tensor  # (B, P + C) long: 1 on real tokens
    position_ids: torch.Tensor  # (B, P + C) long: 0 at each row's first real token
    loss_mask: torch.Tensor  # (B, C) float: the completion tokens that train
    advantage: torch.Tensor  # (B,) float
    completion_width: int  # C
    num_tokens: int  # real tokens (prompts and completions)
    old_logps: torch.Tensor  # (B, C) float, each present when every row has it
    old_sampled_logps: torch.Tensor
    ref_logps: torch.Tensor
    sampling_logps: torch.Tensor


def completion_batch(rows: list[dict[str, Any]], pad_id: int, values: tuple[str, ...] = (), multiple: int = 1) -> CompletionBatch:
    """Model inputs for rows of {prompt_ids, completion_ids, loss_mask, advantage}, and the per-token lists named in
    `values` (e.g. old_logps) as (B, C) tensors when every row has them. Prompts are left-padded, completions
    right-padded; `multiple` (pad_to_multiple_of) widens the completion part so the whole width is a multiple of it."""
    prompt_width = max(len(r["prompt_ids"]) for r in rows)
    completion_width = max(1, max(len(r["completion_ids"]) for r in rows))
    completion_width = padded_to(prompt_width + completion_width, 0, multiple) - prompt_width
    # padded as lists, one tensor each (as pad_batch): a tensor per row copied into the batch costs several times more
    ids, real, loss_mask = [], [], []
    for r in rows:
        p, c = r["prompt_ids"], r["completion_ids"]
        left, right = prompt_width - len(p), completion_width - len(c)
        ids.append([pad_id] * left + list(p) + list(c) + [pad_id] * right)
        real.append([0] * left + [1] * (len(p) + len(c)) + [0] * right)
        loss_mask.append(_padded_values(r["loss_mask"] if c else [], len(c), completion_width))
    attention = tensor_of(real)
    batch: CompletionBatch = {
        "input_ids": tensor_of(ids), "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp_min(0), "loss_mask": tensor_of(loss_mask, torch.float32),
        "advantage": tensor_of([r["advantage"] for r in rows], torch.float32),
        "completion_width": completion_width, "num_tokens": sum(map(sum, real)),
    }
    for key in values:
        if all(r.get(key) is not None for r in rows):
            batch[key] = tensor_of([_padded_values(r[key], len(r[key]), completion_width) for r in rows], torch.float32)
    return batch


def _padded_values(values, length: int, width: int) -> list[float]:
    """A row's per-token values (`length` of them, as its completion has tokens) right-padded with zeros to `width`."""
    if len(values) != length:
        raise ValueError(f"a row holds {len(values)} per-token values for a completion of {length} tokens")
    return [float(v) for v in values] + [0.0] * (width - length)
