"""The output layer applied by the loss instead of the model: target positions only, in chunks.

`forward_hidden` runs the model with `logits_to_keep=1` (one position's logits, no (B, T, V) block) and returns
the last hidden state; the loss then applies the output layer to the target positions itself
(`rlft.losses.linear_ce`). That is only right when the model's logits are exactly `lm_head(hidden)`, so every call
also compares the one kept position's logits with `lm_head(hidden)` there: a model that soft-caps or scales its
logits (Gemma 2, Cohere, Granite) fails the comparison once, and from then on uses the model's own logits.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from rlft.errors import ConfigError


_NOT_PLAIN: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()  # models whose logits failed the check once
MIN_VOCAB = 4096  # below this the (B, T, V) logits are small: the chunked loss saves little


def output_layer(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The model's output `nn.Linear` when it is worth applying in the loss and its weights are whole here, else None.

    None for a vocabulary under MIN_VOCAB (the byte tokenizer of the tests and the quickstart; at 32k entries SFT's step
    was 4.5x faster than TRL's, which takes the logits, with 6.7x less peak memory: results/sft_vs_trl-S-v32768.json), under FSDP2 (DTensor shards, gathered only inside the model's forward), DeepSpeed ZeRO-3 (partitioned,
    empty outside the forward) and for an output layer that is not a plain Linear (e.g. a LoRA-adapted lm_head).
    """
    return _output_layer(model)[0]


def _output_layer(model: torch.nn.Module) -> tuple[torch.nn.Linear | None, str]:
    """(output_layer's answer, why it is None)."""
    network = _network(model)
    if network in _NOT_PLAIN:
        return None, "its logits are not the output layer's product (soft-capped or scaled)"
    get = getattr(network, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if type(head) is not torch.nn.Linear:
        return None, ("its output layer is not a plain linear layer (e.g. a LoRA-adapted lm_head, or qat's "
                      "fake-quantized one, whose rounding happens in its own forward)")
    if head.out_features < MIN_VOCAB:
        return None, f"its output layer has {head.out_features:,} entries (under {MIN_VOCAB:,}): the logits are small"
    weight = head.weight
    if isinstance(weight, DTensor) or weight.numel() == 0 or hasattr(weight, "ds_id"):
        return None, "its output layer is sharded (fsdp, DeepSpeed ZeRO-3) and whole only inside the model's forward"
    return head, ""


def logits_reason(model: torch.nn.Module, sharded: bool = False) -> str:
    """Why the losses will take the model's own logits ("" where they apply the output layer themselves); `sharded`: the
    model is about to be sharded (the plan is printed before)."""
    head, why = _output_layer(model)
    if head is not None and sharded:
        why = "its output layer is sharded (fsdp, DeepSpeed ZeRO-3) and whole only inside the model's forward"
    return why


def loss_path(model: torch.nn.Module, sharded: bool = False) -> str:
    """The plan's words for how the losses reach the vocabulary (cut_cross_entropy's row)."""
    if why := logits_reason(model, sharded):
        return f"the model's own logits: {why}"
    return (f"rlft's chunked output-layer loss over {output_layer(model).out_features:,} entries, target positions only: no logits block "
            "(as Cut Cross-Entropy; the first step checks the model's logits are the output layer's)")


def _network(model: torch.nn.Module) -> torch.nn.Module:
    network = getattr(model, "_orig_mod", model)  # torch.compile
    return getattr(network, "module", network)  # DDP


def forward_hidden(model: torch.nn.Module, inputs: dict[str, Any], head: torch.nn.Linear) -> tuple[torch.Tensor | None, Any]:
    """((B, T, H) last hidden state (after the final norm) of a forward that builds one position's logits, or None when
    the model's logits are not `head(hidden)` (checked at that position); the forward's outputs)."""
    outputs = model(**inputs, use_cache=False, output_hidden_states=True, logits_to_keep=1)
    if not outputs.hidden_states:
        return None, outputs
    hidden = outputs.hidden_states[-1]
    with torch.no_grad():
        expected = outputs.logits[:, -1].float()
        if not torch.allclose(head(hidden[:, -1]).float(), expected, rtol=1e-3, atol=1e-3 * (1 + float(expected.abs().max()))):
            _NOT_PLAIN.add(_network(model))  # output_layer() says None from now on: one wasted forward, not one per step
            return None, outputs
    return hidden, outputs


def without_router_logits(model: torch.nn.Module) -> dict[str, bool]:
    """The forward keyword that turns off an MoE router's logits where the model's config turns them on, for decoding:
    the router's loss is the trainer's, and transformers computes it from a mask as wide as the whole sequence, which
    a one-token step's router logits do not match. Empty for other models."""
    config = getattr(_network(model), "config", None)
    return {"output_router_logits": False} if getattr(config, "output_router_logits", False) else {}


def router_loss(model: torch.nn.Module, outputs: Any) -> tuple[torch.Tensor, float] | None:
    """(An MoE forward's load-balancing loss, the config's router_aux_loss_coef) with output_router_logits, which
    transformers adds to the loss of a forward given labels as coef x loss; None for other models. A model whose
    config sets output_router_logits but whose forward computes no such loss (transformers' GLM-4 MoE, HunYuan MoE and
    DeepSeek V2/V3 only return the router's logits) is refused at its first forward: the setting would do nothing."""
    config = _network(model).config
    aux = getattr(outputs, "aux_loss", None)
    if aux is None:
        if getattr(config, "output_router_logits", False):
            raise ConfigError(f"output_router_logits (model_config, or the checkpoint's config.json): transformers' "
                              f"{type(_network(model)).__name__} computes no router load-balancing loss, so the setting "
                              "would add nothing to the loss; remove it (or set model_config: {output_router_logits: false})")
        return None
    return aux, float(getattr(config, "router_aux_loss_coef", 0.0))


def score_head(model) -> torch.nn.Module | None:
    """The layer that turns the last hidden states into scores (`score`, under DDP or PEFT too), or None."""
    network = getattr(model, "module", model)
    if hasattr(network, "get_base_model"):
        network = network.get_base_model()
    head = getattr(network, "score", None)
    return head if isinstance(head, torch.nn.Module) else None
