"""Attention masks for left-padded rows that no attention kernel turns into NaN.

Under the causal and padding masks, a left padding position attends to no key at all. CUDA attention kernels have
returned NaN for such a row, in the forward (memory-efficient SDPA: pytorch/pytorch#110213, unslothai/unsloth#9848)
or in the backward (cuDNN SDPA: rlft's GRPO on an H200, docs/training.md#attention). 0 x NaN then carries it into
the real rows and into every gradient. transformers leaves such rows without a key to attend to.
So for SDPA on a CUDA device, a 2-D mask with left padding becomes the 4-D boolean mask in which each padding query
attends to itself: the real positions' attention is unchanged, and no real position reads a padding position's
output. Other implementations get the 2-D mask as before (eager adds a finite minimum, flash-attention drops the
padding, CPU kernels return zeros for an empty row).
"""

from __future__ import annotations

import torch

from rlft.data.collate import documents_mask
from rlft.models.attention import attention_implementation, sliding_window
from rlft.models.varlen import DOCUMENTS, runs_documents, unread_mask


def model_attention_mask(model, mask: torch.Tensor) -> torch.Tensor:
    """A boolean 4-D mask (True = attend) in the form `model`'s attention implementation reads.

    transformers passes a 4-D mask through untouched: SDPA reads booleans, but eager attention and flex_attention *add*
    the mask to the scores, so they need an additive float mask (0 / dtype min); a boolean one would add 1 or 0 and
    mask nothing. Flash-attention reads no mask at all."""
    implementation = attention_implementation(model)
    if implementation == "sdpa" or mask.dtype != torch.bool:
        return mask
    if "flash" in implementation:
        raise ValueError(f"this batch needs an explicit attention mask; attn_implementation={implementation!r} reads none "
                         "(use sdpa, eager or flex_attention)")
    dtype = next(model.parameters()).dtype
    dtype = dtype if dtype.is_floating_point else torch.float32
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def per_layer_type(model, build):
    """The masks of `model`'s attention layers from `build(window)`, the mask of a layer with that sliding window (None:
    full attention): one mask if all layers are alike, else {"full_attention": ..., "sliding_attention": ...}, which a
    transformers model that mixes the two (Gemma 2 and 3, gpt-oss, ...) takes per layer type.

    transformers applies a 4-D mask (or a BlockMask) as given, so the sliding window (Mistral, Gemma 2 and 3, gpt-oss,
    ...) that it adds to the masks it builds itself is rlft's to add to the packed, flattened, prompt-sharing and
    strided masks it builds."""
    window, everywhere = sliding_window(model)
    if window is None:
        return build(None)
    return build(window) if everywhere else {"full_attention": build(None), "sliding_attention": build(window)}


def within_window(mask: torch.Tensor, position_ids: torch.Tensor, window: int | None) -> torch.Tensor:
    """A (B, 1, T, T) boolean mask limited to keys fewer than `window` positions before the query (None: as it is).
    Distances are counted in position ids: every rlft layout keeps each token's position from its own row, so a token
    keeps the keys it has there."""
    if window is None:
        return mask
    return mask & ((position_ids[:, :, None] - position_ids[:, None, :]) < window)[:, None]


def with_model_mask(model, inputs: dict) -> dict:
    """The forward inputs of a batch as `model` takes them. Packed or flattened rows (`documents`) run per document
    through SDPA where the model allows (`rlft.models.varlen.runs_documents`), with no (T, T) mask; flash-attention
    finds them from the position ids; otherwise they get their block-causal mask (`rlft.data.collate.documents_mask`). A 4-D mask (that one, or a prompt-sharing
    batch's) is limited to each layer's sliding window (`per_layer_type`) and put in the form the model's attention
    reads (`model_attention_mask`). Other inputs as they are."""
    inputs = dict(inputs)
    documents = inputs.pop("documents", None)
    if documents is not None and inputs.get("attention_mask") is None:
        ids = inputs["input_ids"]
        if "flash" in attention_implementation(model):  # its variable-length kernels find the rows from the position ids
            if ids.shape[0] > 1:  # which transformers reads only in a batch of one row (`packed_batch` makes one)
                raise ValueError("packed rows under flash-attention must come as one row (packed_batch, block_mask=False)")
            return inputs
        if runs_documents(model):
            return {**inputs, "attention_mask": unread_mask(ids), DOCUMENTS: documents}
        inputs["attention_mask"] = documents_mask(documents, *ids.shape)
    mask = inputs.get("attention_mask")
    if mask is None or mask.dim() != 4:
        return inputs
    positions = inputs.get("position_ids")
    if positions is None and sliding_window(model)[0] is not None:
        raise ValueError("a sliding-window model's packed or flattened batch needs its position ids")
    inputs["attention_mask"] = per_layer_type(model, lambda window: model_attention_mask(model, within_window(mask, positions, window)))
    return inputs


def needs_guard(model, attention_mask: torch.Tensor | None) -> bool:
    """A 2-D mask on a CUDA device, read by SDPA, whose rows start with padding. (A 4-D mask, or one per layer type,
    is rlft's own and needs no guard.)"""
    return (isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2 and attention_mask.device.type == "cuda"
            and attention_implementation(model) == "sdpa" and not bool(attention_mask[:, 0].all()))


def guarded_mask(attention_mask: torch.Tensor, kv_length: int | None = None, window: int | None = None) -> torch.Tensor:
    """(B, T) key validity -> (B, 1, T, K) boolean SDPA mask (True = attend; K = `kv_length`, default T, the length
    of a static KV cache the prompt is written into from position 0): query i attends to the valid keys j <= i (and
    j > i - `window` with a sliding window), and a padding query attends to itself alone."""
    valid = attention_mask.bool()
    rows, width = valid.shape
    length = kv_length or width
    device = valid.device
    keys = torch.zeros((rows, length), dtype=torch.bool, device=device)
    keys[:, :width] = valid
    causal = torch.ones((width, length), dtype=torch.bool, device=device).tril()
    if window is not None:
        causal = causal.triu(1 - window)
    itself = torch.zeros((width, length), dtype=torch.bool, device=device)
    itself[:, :width] = torch.eye(width, dtype=torch.bool, device=device)
    mask = (causal[None] & keys[:, None, :]) | (itself[None] & ~valid[:, :, None])
    return mask[:, None]


def safe_attention(model, attention_mask: torch.Tensor | None, kv_length: int | None = None):
    """The mask to pass `model` for a forward over these rows (see the module docstring): guarded, it is limited to
    each layer's sliding window (`per_layer_type`)."""
    if not needs_guard(model, attention_mask):
        return attention_mask
    return per_layer_type(model, lambda window: guarded_mask(attention_mask, kv_length, window))
