"""EBFT feature network and features: layer indices, hidden-state features, pooling.

The feature map phi(context : completion) is read from intermediate hidden states of the frozen initial policy
(`rlft.models.frozen`): the selected layers (`ebft.feature_layers`, fractions of depth) concatenated along the feature
axis, pooled over positions (`ebft.embed_method`). Everything here runs without gradient.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from rlft.models.masks import safe_attention

EMBED_METHODS = ("last_token", "mean_pooling", "completion_mean", "concat")


def feature_layer_indices(num_layers: int, fractions: list[float]) -> list[int]:
    """Hidden-state indices for fractions of depth: idx = max(1, min(L, floor(frac * L))), L = num_hidden_layers.

    `hidden_states[idx]` is the output of decoder block idx (index 0 is the embedding output, never chosen). Axolotl's
    int(frac * L) and REF's `critic.py` clamp agree on every fraction in (0, 1]: 32 layers with [0.25, 0.5, 0.75] ->
    [8, 16, 24]; 16 -> [4, 8, 12]; 28 -> [7, 14, 21]. (Take L from `text_config` for multimodal models.)
    Raises ValueError for a fraction outside (0, 1], an empty list, or num_layers < 1.
    """
    if num_layers < 1:
        raise ValueError(f"the feature network needs at least one layer, got num_hidden_layers={num_layers}")
    if not fractions:
        raise ValueError("ebft.feature_layers must list at least one fraction of depth in (0, 1]")
    indices = []
    for fraction in fractions:
        if not 0.0 < float(fraction) <= 1.0:
            raise ValueError(
                f"ebft.feature_layers entries are fractions of depth in (0, 1], got {fraction!r} "
                "(e.g. [0.25, 0.5, 0.75])"
            )
        indices.append(max(1, min(num_layers, int(float(fraction) * num_layers))))
    return indices


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DDP / accelerate wrapper."""
    return getattr(model, "module", model)


def hidden_layer_count(model) -> int:
    """The decoder depth of `model` (DDP, PEFT or compiled wrappers looked through): `num_hidden_layers` of its text
    config, where a multimodal model (Gemma 3, Qwen2-VL, ...) keeps it, not on its top-level config."""
    network = _unwrap(model)
    return getattr(network, "_orig_mod", network).config.get_text_config().num_hidden_layers


def _sharded(model: torch.nn.Module) -> bool:
    """Whether FSDP2 shards `model`'s weights (DTensors between forwards)."""
    return any(isinstance(parameter, DTensor) for parameter in model.parameters())


def _backbone(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder without the LM head: hidden states only, no (B, S, vocab) logits to allocate.

    Works through a PEFT wrapper (attribute lookup falls through to the base model, and the adapter layers inside
    follow `disable_adapter()`). Models without `get_decoder` are called whole."""
    get_decoder = getattr(model, "get_decoder", None)
    if callable(get_decoder):
        decoder = get_decoder()
        if isinstance(decoder, torch.nn.Module):
            return decoder
    return model


def _model_mask(mask, dtype: torch.dtype):
    """One layer type's mask as the model reads it: a flex_attention BlockMask as it is, a 4-D one additive."""
    if type(mask).__name__ == "BlockMask":
        return mask
    if mask.dim() != 4:
        raise ValueError(f"attention_4d must be (B, 1 or heads, S, S), got {tuple(mask.shape)}")
    return _additive_mask(mask, dtype)


def _additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean 4-D mask (True = may attend) as the additive float mask every attention implementation accepts.

    SDPA would take the boolean directly, but eager attention adds the mask to the scores, and a query row with no
    allowed key gives NaN under a boolean SDPA mask; 0 / finfo.min gives a harmless uniform row instead."""
    if mask.dtype != torch.bool:
        return mask.to(dtype)
    blocked = torch.full(mask.shape, torch.finfo(dtype).min, dtype=dtype, device=mask.device)
    return torch.where(mask, torch.zeros((), dtype=dtype, device=mask.device), blocked)


def hidden_features(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    layers: list[int],
    position_ids: torch.Tensor | None = None,
    attention_4d: torch.Tensor | dict | None = None,
) -> torch.Tensor:
    """Hidden states at `layers` concatenated along the feature axis: (B, S) ids -> (B, S, len(layers) * H).

    One forward with output_hidden_states, under torch.no_grad, with the model in eval mode (dropout off) and its
    training mode restored afterwards. `hidden_states[idx]`: index 0 is the embedding output, idx the output of block
    idx (use `feature_layer_indices`). No per-layer normalisation (the rewards normalise the features jointly).

    attention_mask: the usual (B, S) padding mask. With left padding pass position_ids = cumsum(mask) - 1 (clamped at
    0) so every row's real tokens sit at positions 0.. as they would unpadded. attention_4d: a (B, 1 or heads, S, S)
    mask that replaces the 2-D one (strided mode's block mask; boolean True = may attend, already additive float, or
    a flex_attention BlockMask for a model that runs flex_attention), or a dict of them per layer type (a model with
    sliding-window layers: rlft.models.masks.per_layer_type);
    attention_mask is then ignored and position_ids should be given. The features come back in the model's dtype.
    Raises ValueError for an empty `layers` or an index outside 0..num_hidden_layers.
    """
    if not layers:
        raise ValueError("hidden_features needs at least one layer index")
    network = _unwrap(model)
    backbone = _backbone(network)
    kwargs: dict[str, torch.Tensor] = {}
    if attention_4d is not None:
        dtype = next(backbone.parameters()).dtype
        dtype = dtype if dtype.is_floating_point else torch.float32
        masks = attention_4d.items() if isinstance(attention_4d, dict) else [(None, attention_4d)]
        masks = {kind: _model_mask(mask, dtype) for kind, mask in masks}
        kwargs["attention_mask"] = masks if isinstance(attention_4d, dict) else masks[None]
    elif attention_mask is not None:
        kwargs["attention_mask"] = safe_attention(backbone, attention_mask)  # left padding (rlft.models.masks)
    if position_ids is not None:
        kwargs["position_ids"] = position_ids
    if _sharded(network):  # FSDP2 gathers the root's weights (embeddings, final norm) only around the root's forward
        backbone, kwargs = network, {**kwargs, "logits_to_keep": 1}  # one position's logits: no (B, S, vocab) block
    was_training = network.training
    network.eval()
    try:
        with torch.no_grad():
            outputs = backbone(input_ids=input_ids, output_hidden_states=True, use_cache=False, **kwargs)
    finally:
        network.train(was_training)
    hidden_states = outputs.hidden_states
    for index in layers:
        if not 0 <= index < len(hidden_states):
            raise ValueError(f"feature layer index {index} is outside 0..{len(hidden_states) - 1}")
    return torch.cat([hidden_states[index] for index in layers], dim=-1)


def _valid_mask(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    if hidden.dim() != 3 or attention_mask.shape != hidden.shape[:2]:
        raise ValueError(
            f"pool expects hidden (B, S, D) and attention_mask (B, S), got {tuple(hidden.shape)} and "
            f"{tuple(attention_mask.shape)}"
        )
    valid = attention_mask.bool()
    if not bool(valid.any(dim=1).all()):
        raise ValueError("pool: a row has no valid token (attention_mask all 0): nothing to embed")
    return valid


def _at_valid_rank(hidden: torch.Tensor, valid: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
    """(B, D): each row's hidden state at its rank[b]-th valid token (0-based), wherever the padding sits."""
    ranks = valid.long().cumsum(dim=1) - 1
    hit = valid & (ranks == rank.unsqueeze(1))
    position = hit.long().argmax(dim=1)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), position]


def _masked_mean(hidden: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    weights = weights.to(hidden.dtype).unsqueeze(-1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0)


def pool(
    hidden: torch.Tensor,
    attention_mask: torch.Tensor,
    method: str,
    completion_start: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pool per-token features (B, S, D) over each row's valid tokens (attention_mask 1) -> (B, D), or (B, 3D).

    Padding-side safe: valid tokens are found from the mask, never as positions 0..mask.sum()-1 (Axolotl's
    last_token reads index mask.sum()-1, which is a pad under left padding). With v valid tokens:
        last_token       the last valid token
        mean_pooling     mean over all valid tokens (prompt included)
        completion_mean  mean over valid tokens at positions >= completion_start[b]; completion_start is an ABSOLUTE
                         index into the padded row: under left padding it is n_pads + prompt_length, under right
                         padding prompt_length. A row with no completion token pools to zeros.
        concat           the valid tokens of rank floor(v/4), floor(v/2), floor(3v/4), concatenated -> (B, 3D)
                         (Axolotl structured mode; strided mode's REF concat over the G block tokens is the recipe's)
    Raises ValueError for an unknown method, a row without valid tokens, or completion_mean without completion_start.
    """
    if method not in EMBED_METHODS:
        raise ValueError(f"ebft.embed_method must be one of {', '.join(EMBED_METHODS)}, got {method!r}")
    valid = _valid_mask(hidden, attention_mask)
    counts = valid.long().sum(dim=1)
    if method == "last_token":
        return _at_valid_rank(hidden, valid, counts - 1)
    if method == "mean_pooling":
        return _masked_mean(hidden, valid)
    if method == "completion_mean":
        if completion_start is None:
            raise ValueError("embed_method completion_mean needs completion_start (B,)")
        positions = torch.arange(hidden.shape[1], device=hidden.device)
        start = completion_start.to(hidden.device).reshape(-1, 1)
        return _masked_mean(hidden, valid & (positions.unsqueeze(0) >= start))
    return torch.cat([_at_valid_rank(hidden, valid, (counts * q) // 4) for q in (1, 2, 3)], dim=-1)
