"""The frozen policy: the initial weights, as a reference for KL terms and as EBFT's feature network.

One of four things, chosen once at set-up:
  * a separate `ref_model` folder, loaded frozen;
  * the policy itself with its LoRA adapter disabled: the frozen base, no second copy in memory
    (valid while the adapter is never merged into the base weights);
  * the policy itself with its trainable tensors at their initial values, for an adapter whose init rewrote the base
    (PiSSA, OLoRA: the residual base plus the initial adapter B0 A0 is the original model; disabling the adapter
    would leave the residual). Only the adapter's tensors are kept twice, not the model;
  * a frozen deep copy of the initial policy (full fine-tuning, a reference that moves, sharded parameters).
`view(policy)` yields the network to run; `reset` / `mix` move a copy towards the policy
(Cosmos-RL reference reset, TR-DPO soft update).
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from safetensors.torch import load_model, save_model

from rlft.errors import CheckpointError
from rlft.models.weights import merged_weights


class FrozenPolicy:
    def __init__(self, copy_: torch.nn.Module | None = None,
                 initial: dict[int, tuple[torch.nn.Parameter, torch.nn.Parameter]] | None = None):
        self.model = copy_  # None: a view of the policy (its adapter disabled, or its `initial` values)
        self.initial = initial  # id(parameter) -> (the policy's parameter, its value at set-up)
        self.runs = copy_  # what `view` runs of a copy: the copy, or (torch_compile) its compiled forward

    @classmethod
    def copy_of(cls, model: torch.nn.Module) -> "FrozenPolicy":
        return cls(copy.deepcopy(getattr(model, "module", model)).eval().requires_grad_(False))

    @classmethod
    def adapter_disabled(cls) -> "FrozenPolicy":
        return cls(None)

    @classmethod
    def initial_trainables(cls, model: torch.nn.Module) -> "FrozenPolicy":
        """The policy with every tensor it trains at its value now (call it right after the adapter is attached)."""
        return cls(None, {id(p): (p, _frozen(p)) for p in model.parameters() if p.requires_grad})

    @property
    def is_copy(self) -> bool:
        return self.model is not None

    @contextmanager
    def view(self, policy: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """The frozen network; `policy` (possibly DDP-wrapped) is used only when the frozen network is a view of it
        (its adapter disabled, or its initial tensors swapped in)."""
        if self.model is not None:
            yield self.runs
            return
        base = getattr(policy, "module", policy)
        if self.initial is not None:
            with _initial_values(base, self.initial):
                yield policy
            return
        if not callable(getattr(base, "disable_adapter", None)):
            raise ValueError("the frozen policy is the adapter-disabled view, but the policy has no adapter")
        with base.disable_adapter():
            yield policy

    def to(self, device) -> "FrozenPolicy":
        if self.model is not None:
            self.model.to(device)
        if self.initial is not None:
            self.initial = {key: (p, _frozen(value, device)) for key, (p, value) in self.initial.items()}
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
        save_model(self.model, str(path))

    def saved_bytes(self) -> int:
        """About what `save` writes: the copy's tensors, tied weights once."""
        tensors = {t.data_ptr(): t.numel() * t.element_size() for t in self.model.state_dict().values()}
        return sum(tensors.values())

    def load(self, path: Path) -> bool:
        """The copy's weights from `save`'s file; False where there is none."""
        if not path.is_file():
            return False
        load_model(self.model, str(path), device=str(next(self.model.parameters()).device))
        return True


def _frozen(tensor: torch.Tensor, device=None, dtype=None) -> torch.nn.Parameter:
    """A copy of `tensor` as a parameter without gradient (on `device`, in `dtype` where given)."""
    return torch.nn.Parameter(tensor.detach().to(device=device, dtype=dtype, copy=True), requires_grad=False)


@contextmanager
def _initial_values(model: torch.nn.Module, initial: dict[int, tuple[torch.nn.Parameter, torch.nn.Parameter]]) -> Iterator[None]:
    """`model` with the parameters in `initial` replaced by their initial values, in eval mode (no dropout: a copy
    would be in eval mode), restored afterwards, every module's mode as it was. The trained tensors are not written
    to: the slots that hold them point elsewhere for a while, so a backward pending on them still finds them as they
    were. An initial value is cast once to the device and dtype its parameter has now (DeepSpeed's bf16 cast)."""
    swapped, modes = [], [(module, module.training) for module in model.modules()]
    try:
        for module in model.modules():
            for name, param in list(module._parameters.items()):
                if param is None or id(param) not in initial:
                    continue
                value = initial[id(param)][1]
                if (value.device, value.dtype) != (param.device, param.dtype):
                    value = _frozen(value, param.device, param.dtype)
                    initial[id(param)] = (param, value)
                module._parameters[name] = value
                swapped.append((module, name, param))
        if len({id(param) for _, _, param in swapped}) != len(initial):  # a parameter replaced since set-up
            raise RuntimeError("the frozen network's initial adapter no longer matches the policy's parameters")
        model.eval()
        yield
    finally:
        for module, name, param in swapped:
            module._parameters[name] = param
        for module, training in modes:
            module.training = training


class ReferenceMoves:
    """A reference copy that moves towards the policy: Cosmos-RL's reset every `reference_reset_interval` optimizer
    steps, or TR-DPO's soft update every `ref_model_sync_steps` (`sync_ref_model`). A checkpoint holds it as it has
    moved (`reference.safetensors`), so a resumed run goes on with the reference the uninterrupted run would use."""

    FILE = "reference.safetensors"

    def __init__(self, reference: FrozenPolicy | None, settings):
        self.reference, self.s = reference, settings
        self.active = reference is not None and reference.is_copy and bool(settings.reference_reset_interval or settings.sync_ref_model)

    def after_step(self, policy: torch.nn.Module, step: int) -> bool:
        """Move the reference when due after optimizer step `step`; True when it was reset (not for a soft update)."""
        if not self.active:
            return False
        if self.s.reference_reset_interval and step % self.s.reference_reset_interval == 0:
            self.reference.reset(merged_weights(policy))
            return True
        if self.s.sync_ref_model and step % self.s.ref_model_sync_steps == 0:
            self.reference.mix(merged_weights(policy), self.s.ref_model_mixup_alpha)
        return False

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
        return [f"{folder} holds no {self.FILE} (a checkpoint of an older rlft version): the reference starts again from the "
                "starting weights, until its next reset or update"]
