"""Trainer-side weight sync: after optimizer steps, send the policy's new weights to the rollout engine.

The weight version is the number of optimizer steps the weights have seen; every rollout row carries the
version that sampled it, and the checkpoint records the engine's version. `prepare` takes a snapshot of
the weights on the main thread (so training may go on changing them) and returns the load to run where the
engine work runs (rollout/prefetch.py); a load that runs at once (synchronous GRPO) reads the weights
themselves. What is sent depends on the engine:

* an in-process engine copied from the policy gets the tensors that train (a LoRA adapter, or every weight); one
  that shares the policy's tensors (`LocalEngine.shares_weights`) holds them already, and gets the version only;
* a rollout server gets a plain model's weights: every trained weight of a full fine-tune, or, for a LoRA
  policy, the merged weights of the layers the adapter touches (W + scale * B A), or with `vllm_lora_sync`
  the adapter itself, saved with PEFT as safetensors in a folder the server reads (a stock vLLM server takes
  only that).

Every load is verified: the engine must then serve the version it was sent (and rlft's server reports the
checksum of what it loaded, which the client compares with what it sent). Sampling from weights other
than the ones the trainer thinks it sent is how off-policy bugs start, so a mismatch stops the run.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Callable

import torch

from rlft.errors import RolloutError
from rlft.models.weights import merged_weights, plain_state_dict, trainable_weights
from rlft.rollout.engine import RolloutEngine


class WeightSync:
    def __init__(self, engine: RolloutEngine, every: int = 1, plain: bool = False, lora_folder: Path | None = None):
        """`plain`: the engine holds a plain (non-PEFT) model, as a server does; `lora_folder`: send the adapter
        through this folder instead (vllm_lora_sync)."""
        self.engine, self.every, self.plain, self.lora_folder = engine, every, plain, lora_folder
        self.pushed: int | None = None  # the last version handed to the engine
        self.seconds = 0.0  # engine-side load time of the last push

    def due(self, step: int) -> bool:
        return sync_due(step, self.every)

    def reset(self, policy, version: int) -> None:
        """Make a plain engine (a server: it may hold another run's weights or adapter) serve exactly this policy:
        every weight of the base model, then, with `lora_folder`, the adapter; without it, a LoRA policy's weights
        are sent merged. Later pushes send only what trains.

        A quantized base (QLoRA) cannot be sent, and a stock vLLM server (`base_fixed`) takes no base weights: the
        engine keeps base_model's own weights, which it must still hold (no earlier run replaced them), and gets the
        adapter only."""
        if self.lora_folder is not None and (is_quantized(policy) or getattr(self.engine, "base_fixed", False)):
            if self.engine_base_updated():
                raise RolloutError("the rollout server's base weights were replaced by an earlier run, and a QLoRA run "
                                   "cannot send its 4-bit base: restart the server (rlft vllm-serve CONFIG), then this run")
            self.prepare(policy, version, snapshot=False)()
            return
        base = plain_state_dict(policy) if self.lora_folder is not None else merged_weights(policy)
        self._timed(lambda: self.engine.load_weights(base, version))  # a full update also drops any adapter
        self._check(version)
        self.pushed = version
        if self.lora_folder is not None:
            self.prepare(policy, version, snapshot=False)()

    def prepare(self, policy, version: int, snapshot: bool = True) -> Callable[[], None]:
        """Snapshot the weights now; the returned call loads them into the engine and verifies the version. Without
        `snapshot` the call reads the weights as they are when it runs: for a load that runs before training changes
        them (synchronous GRPO), which then copies the weights once instead of twice."""
        self.pushed = version
        if getattr(self.engine, "shares_weights", False):  # it samples with the policy's own tensors: nothing to send
            return self._relabel(version)
        if self.lora_folder is not None:
            folder = self.lora_folder / f"v{version}"
            if folder.exists():
                shutil.rmtree(folder)
            getattr(policy, "module", policy).save_pretrained(folder, safe_serialization=True)

            def load_adapter() -> None:
                self._timed(lambda: self.engine.load_adapter(folder, version))
                self._check(version)
                # the server has read it: drop older versions only (a newer one may be being written on the main
                # thread right now, with async prefetch)
                for old in self.lora_folder.glob("v*"):
                    if old.name[1:].isdigit() and int(old.name[1:]) < version:
                        shutil.rmtree(old, ignore_errors=True)
            return load_adapter
        weights = plain_weights(policy) if self.plain else trainable_weights(policy)
        taken = {name: tensor.detach().clone() if snapshot else tensor.detach() for name, tensor in weights.items()}

        def load() -> None:
            self._timed(lambda: self.engine.load_weights(taken, version))
            self._check(version)
        return load

    def prepare_relabel(self, version: int) -> Callable[[], None] | None:
        """For a step that changed no weight: the call that makes the engine's weights stand for `version` without a
        load, or None when the engine cannot (then the caller pushes the weights)."""
        if getattr(self.engine, "relabel", None) is None or self.pushed is None:
            return None
        self.pushed = version
        return self._relabel(version)

    def _relabel(self, version: int) -> Callable[[], None]:
        def load() -> None:
            self._timed(lambda: self.engine.relabel(version))
            self._check(version)
        return load

    def engine_base_updated(self) -> bool:
        weight_info = getattr(self.engine, "weight_info", None)  # a server; an in-process engine holds the policy itself
        return bool(weight_info()["base_updated"]) if weight_info is not None else False

    def _timed(self, call: Callable[[], None]) -> None:
        began = time.perf_counter()
        call()
        self.seconds = time.perf_counter() - began

    def _check(self, version: int) -> None:
        served = self.engine.health().get("version")
        if served != version:
            raise RolloutError(f"weight sync: the engine serves version {served} after being sent version {version}")


def sync_due(step: int, every: int) -> bool:
    """Whether the weights after optimizer step `step` are pushed (every `vllm_sync_interval` steps); every process
    knows it, also those without an engine."""
    return step % every == 0


@torch.no_grad()
def plain_weights(policy) -> dict[str, torch.Tensor]:
    """The weights a plain copy of the base model needs to equal the policy: for a LoRA policy only the layers its
    adapter changes (merged) and its `modules_to_save`; for a full fine-tune every weight that trains."""
    model = getattr(policy, "module", policy)
    if not hasattr(model, "peft_config"):
        return with_tied_names(model, trainable_weights(model))
    merged = merged_weights(model)
    touched = set()
    for name, param in model.get_base_model().named_parameters():
        if not param.requires_grad:
            continue
        parts = name.split(".")
        for marker in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector"):
            if marker in parts:
                touched.add(".".join(parts[: parts.index(marker)]) + ".weight")
        if "modules_to_save" in parts:
            touched.add(name.replace(".modules_to_save.default.", "."))
    missing = sorted(touched - set(merged))
    if missing:
        raise RolloutError(f"weight sync: cannot map trained weight {missing[0]!r} onto the base model's names")
    return with_tied_names(model, {name: merged[name] for name in sorted(touched)})


def is_quantized(policy) -> bool:
    """Whether the base weights are stored quantized (bitsandbytes 4/8 bit: integer storage)."""
    return any(not tensor.is_floating_point() for tensor in plain_state_dict(policy).values())


def with_tied_names(model, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`weights` plus every other plain name of a tied tensor (lm_head.weight beside model.embed_tokens.weight).

    A parameter appears once among named_parameters but under each of its names in a state dict, and an engine may
    hold the names apart: vLLM's in-place reload restores every layer it was sent nothing for, so a tied output
    layer would keep the old embedding while the checksum of what was sent still matches."""
    plain = plain_state_dict(model)
    by_storage: dict[int, list[str]] = {}
    for name, tensor in plain.items():
        by_storage.setdefault(tensor.data_ptr(), []).append(name)
    out = dict(weights)
    for name in weights:
        if name in plain:
            for alias in by_storage[plain[name].data_ptr()]:
                out.setdefault(alias, weights[name])
    return out
