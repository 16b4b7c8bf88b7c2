"""Named weight tensors of the policy, for weight sync and reference updates.

`trainable_weights`: the tensors that change during training (a LoRA adapter's, or every weight of a
full fine-tune), under the policy's own parameter names: what an engine made by copying the policy
needs after each step. `merged_weights`: the policy as a plain model's state dict (LoRA deltas added
to their base weights), computed layer by layer without copying the model.
"""

from __future__ import annotations

import copy

import torch


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)  # DDP


def trainable_weights(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: param.detach() for name, param in _unwrap(policy).named_parameters() if param.requires_grad}


@torch.no_grad()
def merged_weights(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A plain model's state dict equal to `merge_and_unload().state_dict()` of a PEFT policy (detached copies
    only for the merged layers), or the state dict of a plain policy."""
    policy = _unwrap(policy)
    if not hasattr(policy, "peft_config"):
        return {name: value.detach() for name, value in policy.state_dict().items()}
    if any(getattr(config, "use_dora", False) for config in policy.peft_config.values()):
        # DoRA rescales each merged row by its magnitude vector: let PEFT merge a copy rather than re-derive it here
        return copy.deepcopy(policy).merge_and_unload().state_dict()
    base = policy.get_base_model()
    deltas = {}
    for name, module in base.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer") and not getattr(module, "merged", False):
            adapters = [a for a in module.active_adapters if a in getattr(module, "lora_A", {})]
            if adapters and not getattr(module, "disable_adapters", False):
                deltas[f"{name}.weight"] = sum(module.get_delta_weight(a) for a in adapters)
    merged = {}
    for key, value in base.state_dict().items():
        parts = key.split(".")
        if any(p.startswith("lora_") for p in parts) or "original_module" in parts:
            continue
        clean = key.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")
        merged[clean] = (value + deltas[clean].to(value.dtype)) if clean in deltas else value.detach()
    return merged
