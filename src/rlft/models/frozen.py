"""The frozen policy: the initial weights, as a reference for KL terms and as EBFT's feature network.

One of three things, chosen once at set-up:
  * a separate `ref_model` folder, loaded frozen;
  * the policy itself with its LoRA adapter disabled: the frozen base, no second copy in memory
    (valid while the adapter is never merged into the base weights);
  * a frozen deep copy of the initial policy (full fine-tuning).
`view(policy)` yields the network to run; `reset` / `mix` move a copy towards the policy
(Cosmos-RL reference reset, TR-DPO soft update).
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Iterator

import torch


class FrozenPolicy:
    def __init__(self, copy_: torch.nn.Module | None = None):
        self.model = copy_  # None: the policy with its adapter disabled

    @classmethod
    def copy_of(cls, model: torch.nn.Module) -> "FrozenPolicy":
        return cls(copy.deepcopy(getattr(model, "module", model)).eval().requires_grad_(False))

    @classmethod
    def adapter_disabled(cls) -> "FrozenPolicy":
        return cls(None)

    @property
    def is_copy(self) -> bool:
        return self.model is not None

    @contextmanager
    def view(self, policy: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """The frozen network; `policy` (possibly DDP-wrapped) is used only when it is the adapter-disabled view."""
        if self.model is not None:
            yield self.model
            return
        base = getattr(policy, "module", policy)
        if not callable(getattr(base, "disable_adapter", None)):
            raise ValueError("the frozen policy is the adapter-disabled view, but the policy has no adapter")
        with base.disable_adapter():
            yield policy

    def to(self, device) -> "FrozenPolicy":
        if self.model is not None:
            self.model.to(device)
        return self

    @torch.no_grad()
    def reset(self, weights: dict[str, torch.Tensor]) -> None:
        """ref <- policy (plain-model names, as `models.weights.merged_weights` gives them)."""
        self.model.load_state_dict(weights)

    @torch.no_grad()
    def mix(self, weights: dict[str, torch.Tensor], alpha: float) -> None:
        """ref <- alpha * policy + (1 - alpha) * ref (TR-DPO, https://arxiv.org/abs/2404.09656)."""
        seen = set()
        for name, ref_param in self.model.state_dict().items():
            if ref_param.data_ptr() in seen:  # tied weights (embeddings and lm_head) are one tensor: mix it once
                continue
            seen.add(ref_param.data_ptr())
            ref_param.mul_(1 - alpha).add_(weights[name].to(ref_param), alpha=alpha)
