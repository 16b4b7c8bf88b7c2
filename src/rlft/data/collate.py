"""Batches: right-padded rows, or packed rows with per-document attention.

A packed row holds several documents. Each document sees only itself: the attention mask is
block-diagonal and causal, position ids restart at 0 per document, and the first token of each
document is not a target (it would otherwise be predicted from the previous document). Packed and
unpacked batches therefore give the same per-token losses.
"""

from __future__ import annotations

import torch

from rlft.data.tokenize import IGNORE

Example = dict[str, list[int]]


def pad_batch(examples: list[Example], pad_id: int, width: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad to the longest row (or to `width`): input_ids, attention_mask, labels (-100 on padding)."""
    width = max(width, max(len(e["input_ids"]) for e in examples))
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example["input_ids"])
        input_ids[row, :n] = torch.tensor(example["input_ids"])
        labels[row, :n] = torch.tensor(example["labels"])
        attention[row, :n] = 1
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels, "num_tokens": int(attention.sum())}


def pack_examples(examples: list[Example], capacity: int) -> list[list[int]]:
    """Group example indices into packs of at most `capacity` tokens (first fit, order kept)."""
    packs: list[list[int]] = []
    room: list[int] = []
    for index, example in enumerate(examples):
        size = len(example["input_ids"])
        for slot, free in enumerate(room):
            if size <= free:
                packs[slot].append(index)
                room[slot] -= size
                break
        else:
            packs.append([index])
            room.append(capacity - size)
    return packs


def packed_batch(packs: list[list[Example]], pad_id: int, width: int = 0) -> dict[str, torch.Tensor]:
    """Rows of concatenated documents (padded to the longest, or to `width`) with a (B, 1, T, T) block-causal mask."""
    width = max(width, max(sum(len(doc["input_ids"]) for doc in pack) for pack in packs))
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
    same_document = document[:, :, None] == document[:, None, :]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    mask = same_document & causal & (document[:, :, None] >= 0)
    mask |= torch.eye(width, dtype=torch.bool)  # padding rows attend to themselves: no all-masked softmax
    return {
        "input_ids": input_ids,
        "attention_mask": mask[:, None],
        "labels": labels,
        "position_ids": positions,
        "num_tokens": int((document >= 0).sum()),
    }
