"""Named weight tensors of the policy, for weight sync and reference updates.

`trainable_weights`: the tensors that change during training (a LoRA adapter's, or every weight of a
full fine-tune), under the policy's own parameter names: what an engine made by copying the policy
needs after each step. `merged_weights`: the policy as a plain model's state dict (LoRA deltas added
to their base weights), computed layer by layer without copying the model. `weights_checksum` and
`architecture_digest`: what the trainer and the rollout server compare to prove a sync landed.
"""

from __future__ import annotations

import copy
import hashlib

import torch
import xxhash


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
        clean = _plain_name(key)
        if clean is None:
            continue
        merged[clean] = (value + deltas[clean].to(value.dtype)) if clean in deltas else value.detach()
    return merged


def _plain_name(key: str) -> str | None:
    """A PEFT-wrapped base model's state-dict key as the plain model names it; None for adapter tensors."""
    parts = key.split(".")
    if any(p.startswith("lora_") for p in parts) or "original_module" in parts:
        return None
    return key.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")


def plain_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base model's state dict under plain names (PEFT wrappers and adapter tensors left out), sharing storage.

    Writing into these tensors (under no_grad) writes the module's weights: weight loading uses that.
    """
    model = _unwrap(model)
    if hasattr(model, "peft_config"):
        model = model.get_base_model()
    plain = {}
    for key, value in model.state_dict().items():
        name = _plain_name(key)
        if name is not None:
            plain[name] = value
    return plain


def weights_checksum(named_tensors) -> str:
    """XXH3-128 over the sorted (name, dtype, shape, raw bytes) of named tensors: equal iff the weights are identical.

    The trainer and the rollout server both call this, so a checksum that comes back equal means the
    server holds bit-for-bit what was sent. XXH3 (https://xxhash.com) hashes at memory speed (about 10 GB/s on one
    core, six times sha256 with CPU SHA instructions), and its 128 bits make two different weight sets that hash
    alike out of reach by accident; a forger is kept out by the server's token, not by the hash. Accepts a mapping
    or (name, tensor) pairs.
    """
    stream = ChecksumStream()
    stream.update(named_tensors)
    return stream.hexdigest()


class ChecksumStream:
    """`weights_checksum` over tensors that come in parts (the buckets of a transfer), each part's names after the
    last part's: the same digest as one call over all of them."""

    def __init__(self) -> None:
        self._digest = xxhash.xxh3_128()
        self.last_name: str | None = None

    def update(self, named_tensors) -> None:
        items = sorted(named_tensors.items() if hasattr(named_tensors, "items") else named_tensors, key=lambda item: item[0])
        if items and self.last_name is not None and items[0][0] <= self.last_name:
            raise ValueError(f"tensor {items[0][0]!r} comes after {self.last_name!r}: parts must come in name order")
        for name, tensor in items:
            tensor = tensor.detach().to("cpu").contiguous()
            self._digest.update(f"{name}|{str(tensor.dtype).removeprefix('torch.')}|{tuple(tensor.shape)}|".encode())
            self._digest.update(tensor.reshape(-1).view(torch.uint8).numpy())  # the bytes in place: no second copy
        if items:
            self.last_name = items[-1][0]

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def architecture_digest(model_or_state_dict) -> str:
    """sha256 of the sorted (plain name, shape) list: equal for two models of the same architecture and size.

    Lets a trainer detect a rollout server that serves another model before sending it weights.
    """
    if isinstance(model_or_state_dict, torch.nn.Module):
        state = plain_state_dict(model_or_state_dict)
    else:
        state = model_or_state_dict
    listing = sorted((name, tuple(tensor.shape)) for name, tensor in state.items())
    return hashlib.sha256(repr(listing).encode()).hexdigest()
