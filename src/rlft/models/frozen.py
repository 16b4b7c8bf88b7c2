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
from pathlib import Path
from typing import Iterator

import torch

from rlft.errors import CheckpointError
from rlft.models.weights import merged_weights


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

    def save(self, path: Path) -> None:
        """The copy's weights, as it has moved (tied weights once), into a safetensors file."""
        from safetensors.torch import save_model

        save_model(self.model, str(path))

    def saved_bytes(self) -> int:
        """About what `save` writes: the copy's tensors, tied weights once."""
        tensors = {t.data_ptr(): t.numel() * t.element_size() for t in self.model.state_dict().values()}
        return sum(tensors.values())

    def load(self, path: Path) -> bool:
        """The copy's weights from `save`'s file; False where there is none."""
        from safetensors.torch import load_model

        if not path.is_file():
            return False
        load_model(self.model, str(path), device=str(next(self.model.parameters()).device))
        return True


class ReferenceMoves:
    """A reference copy that moves towards the policy: Cosmos-RL's reset every `reference_reset_interval` optimizer
    steps, or TR-DPO's soft update every `ref_model_sync_steps` (`sync_ref_model`). A checkpoint holds it as it has
    moved (`reference.safetensors`), so a resumed run goes on with the reference the uninterrupted run would use."""

    FILE = "reference.safetensors"

    def __init__(self, reference: FrozenPolicy | None, settings):
        self.reference, self.s = reference, settings
        self.active = reference is not None and reference.is_copy and bool(settings.reference_reset_interval or settings.sync_ref_model)

    def after_step(self, policy: torch.nn.Module, step: int) -> None:
        if not self.active:
            return
        if self.s.reference_reset_interval and step % self.s.reference_reset_interval == 0:
            self.reference.reset(merged_weights(policy))
        elif self.s.sync_ref_model and step % self.s.ref_model_sync_steps == 0:
            self.reference.mix(merged_weights(policy), self.s.ref_model_mixup_alpha)

    def save(self, folder: Path) -> None:
        if self.active:
            self.reference.save(folder / self.FILE)

    def saved_bytes(self) -> int:
        return self.reference.saved_bytes() if self.active else 0

    def load(self, folder: Path) -> list[str]:
        """Restores the reference from a checkpoint; the warning where the checkpoint has none."""
        try:
            if not self.active or self.reference.load(folder / self.FILE):
                return []
        except Exception as exc:  # a damaged file (SafetensorError), or a reference of another shape (RuntimeError)
            raise CheckpointError(f"{folder / self.FILE}: cannot restore the reference from it ({str(exc).splitlines()[0][:200]}). "
                                  "Resume from an earlier checkpoint, or start a new run from this one's model/ "
                                  "folder") from None
        return [f"{folder} holds no {self.FILE} (rlft wrote none before 2026-11-26): the reference starts again from the "
                "starting weights, until its next reset or update"]
