"""Attention masks for left-padded rows that no attention kernel turns into NaN.

Under the causal and padding masks, a left padding position attends to no key at all. CUDA attention kernels have
returned NaN for such a row, in the forward (memory-efficient SDPA: pytorch/pytorch#110213, unslothai/unsloth#9848)
or in the backward (cuDNN SDPA: rlft's GRPO on an H200, docs/training.md#attention). 0 x NaN then carries it into
the real rows and into every gradient. transformers used to let such rows attend to every key and no longer does.
So for SDPA on a CUDA device, a 2-D mask with left padding becomes the 4-D boolean mask in which each padding query
attends to itself: the real positions' attention is unchanged, and no real position reads a padding position's
output. Other implementations get the 2-D mask as before (eager adds a finite minimum, flash-attention drops the
padding, CPU kernels return zeros for an empty row).
"""

from __future__ import annotations

import torch


def attention_implementation(model) -> str:
    """The attention implementation a (possibly DDP-wrapped) transformers model runs: sdpa, eager, flex_attention, ..."""
    model = getattr(model, "module", model)
    return getattr(getattr(model, "config", None), "_attn_implementation", None) or "sdpa"


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


def with_model_mask(model, inputs: dict) -> dict:
    """Forward inputs whose 4-D attention mask (a packed, flattened or prompt-sharing batch's) is in the form `model`
    reads (`model_attention_mask`); other inputs as they are."""
    mask = inputs.get("attention_mask")
    if mask is None or mask.dim() != 4:
        return inputs
    return {**inputs, "attention_mask": model_attention_mask(model, mask)}


def needs_guard(model, attention_mask: torch.Tensor | None) -> bool:
    """A 2-D mask on a CUDA device, read by SDPA, whose rows start with padding."""
    return (attention_mask is not None and attention_mask.dim() == 2 and attention_mask.device.type == "cuda"
            and attention_implementation(model) == "sdpa" and not bool(attention_mask[:, 0].all()))


def guarded_mask(attention_mask: torch.Tensor, kv_length: int | None = None) -> torch.Tensor:
    """(B, T) key validity -> (B, 1, T, K) boolean SDPA mask (True = attend; K = `kv_length`, default T, the length
    of a static KV cache the prompt is written into from position 0): query i attends to the valid keys j <= i, and a
    padding query attends to itself alone."""
    valid = attention_mask.bool()
    rows, width = valid.shape
    length = kv_length or width
    device = valid.device
    keys = torch.zeros((rows, length), dtype=torch.bool, device=device)
    keys[:, :width] = valid
    causal = torch.ones((width, length), dtype=torch.bool, device=device).tril()
    itself = torch.zeros((width, length), dtype=torch.bool, device=device)
    itself[:, :width] = torch.eye(width, dtype=torch.bool, device=device)
    mask = (causal[None] & keys[:, None, :]) | (itself[None] & ~valid[:, :, None])
    return mask[:, None]


def safe_attention(model, attention_mask: torch.Tensor | None, kv_length: int | None = None):
    """The mask to pass `model` for a forward over these rows (see the module docstring)."""
    return guarded_mask(attention_mask, kv_length) if needs_guard(model, attention_mask) else attention_mask
