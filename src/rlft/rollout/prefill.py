"""The prompts' forward before decoding (the prefill): each distinct prompt once, its keys and values given to every
row that samples from it.

A GRPO batch holds each prompt G times. The prompt's keys and values do not depend on what is sampled after it, so
the engines run one row per distinct prompt and copy its cache entries to its G rows, as vLLM's prefix cache reuses a
computed prefix: the prefill's matrix work shrinks G-fold (bench/decode.py --group 4 --long: at size M a decode took
307 against 835 ms compiled). A row's keys and values are those it would get in a forward of its own, up to the float
rounding of a batch of another size. Only plain per-layer keys and values are copied (transformers' `DynamicLayer`): a model
with other kinds of layers (recurrent or convolutional state: `rlft.models.attention.unmaskable_layers`) runs every
row.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rlft.data.collate import tensor_of
from rlft.models.attention import unmaskable_layers
from rlft.models.head import without_router_logits
from rlft.models.masks import safe_attention


def cache_keyword(model) -> str:
    """The name the model's forward takes its KV cache by: `cache` since transformers 5.24 (`past_key_values`, its
    earlier name, still works there but warns on every call)."""
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(target).forward).parameters else "past_key_values"


def distinct_prompts(prompts: list[list[int]]) -> tuple[list[list[int]], torch.Tensor | None]:
    """(The distinct prompts in the order first seen, each prompt's index among them); the index is None when no two
    prompts are the same."""
    index: dict[tuple[int, ...], int] = {}
    rows = [index.setdefault(tuple(ids), len(index)) for ids in prompts]
    if len(index) == len(prompts):
        return prompts, None
    return [list(ids) for ids in index], tensor_of(rows)


def left_padded(prompts: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids, attention mask, position ids) of the prompts padded on the left: every row's next token is at the
    same column."""
    width = max(len(p) for p in prompts)  # padded as lists, one tensor each (as rlft.data.collate.completion_batch)
    input_ids = tensor_of([[pad_id] * (width - len(ids)) + list(ids) for ids in prompts]).to(device)
    attention = tensor_of([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompts]).to(device)
    return input_ids, attention, (attention.cumsum(-1) - 1).clamp_min(0)


def forward_prompts(model, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, Any]:
    """The prompts' forward (eager): (the last position's logits, no (B, T, V) block; the KV cache it filled). Of an
    MoE model no router logits: their loss is the trainer's."""
    input_ids, attention, positions = batch
    cache = DynamicCache()
    logits = model(input_ids=input_ids, attention_mask=safe_attention(model, attention), position_ids=positions,
                   use_cache=True, logits_to_keep=1, **{cache_keyword(model): cache}, **without_router_logits(model)).logits
    return logits[:, -1], cache


def shares_prompts(model) -> bool:
    """Whether rows of one prompt can take their cache from one row's forward: the model's layers are all attention."""
    return not unmaskable_layers(model)


def rows_copyable(cache) -> bool:
    """Whether `cache` holds plain keys and values per layer, which rows can be selected from."""
    return bool(cache.layers) and all(type(layer) is DynamicLayer and layer.is_initialized for layer in cache.layers)
