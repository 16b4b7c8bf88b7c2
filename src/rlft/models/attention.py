"""The attention a transformers model runs: its implementation, its sliding windows, its kinds of layers."""

from __future__ import annotations


def attention_implementation(model) -> str:
    """The attention implementation a (possibly DDP-wrapped) transformers model runs: sdpa, eager, flex_attention, ..."""
    model = getattr(model, "module", model)
    return getattr(getattr(model, "config", None), "_attn_implementation", None) or "sdpa"


def unmaskable_layers(model) -> list[str]:
    """`model`'s kinds of layers other than full and sliding-window attention (chunked attention in Llama 4; recurrent
    or convolutional layers in Qwen3-Next, LFM2, ...): a mask rlft builds cannot describe them."""
    config = getattr(getattr(model, "module", model), "config", None)
    return sorted(set(getattr(config, "layer_types", None) or ()) - {"full_attention", "sliding_attention"})


def sliding_window(model) -> tuple[int | None, bool]:
    """(window, every layer): the sliding window of `model`'s windowed attention layers (None if it has none), and
    whether all its layers are windowed (else it mixes windowed and full layers through `config.layer_types`)."""
    config = getattr(getattr(model, "module", model), "config", None)
    layers = getattr(config, "layer_types", None) or ()
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False or (layers and "sliding_attention" not in layers):
        return None, False
    return window, all(kind == "sliding_attention" for kind in layers)
