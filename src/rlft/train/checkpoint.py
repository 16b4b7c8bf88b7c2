"""Atomic, exactly-resumable checkpoints.

A checkpoint `output_dir/checkpoint-N/` holds:
  model/              save_pretrained output (only the adapter for LoRA) + tokenizer: loadable as is; the full
                      weights even when they were sharded over processes (gathered for the save)
  optimizer/          optimizer state, torch.distributed.checkpoint: each process writes its own shard, and a
                      load re-shards it for any number of processes (or one)
  scheduler.pt        learning-rate schedule state
  rng-R.pt            python, numpy and torch RNG states of process R
  trainer_state.json  step, data position (epoch, batch), process count, metrics; written last

Every process takes part in a save. It is written under `output_dir/.tmp-checkpoint-N/` and renamed into
place by rank 0 once every process has written its part, so a crash mid-save (of any process) leaves the
previous checkpoints untouched and never a half-written `checkpoint-N`. Checkpoints of earlier rlft
versions (`optimizer.pt`, `rng.pt`) still load.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlft.config.parallel import launched
from rlft.errors import CheckpointError

STATE_FILE = "trainer_state.json"
REQUIRED = ("model", "scheduler.pt", STATE_FILE)
EITHER = (("optimizer", "optimizer.pt"), ("rng-0.pt", "rng.pt"))  # this version's name, or an earlier version's
_NAME = re.compile(r"^checkpoint-(\d+)$")


@dataclass
class TrainState:
    """Where training stands: enough, with the files above, to continue exactly."""

    global_step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    tokens_seen: int = 0
    total_steps: int = 0
    world_size: int = 1  # processes that wrote it; the data position is per process
    last_metrics: dict[str, Any] = field(default_factory=dict)
    recipe_state: dict[str, Any] = field(default_factory=dict)  # e.g. running statistics of a loss
    guards: dict[str, Any] = field(default_factory=dict)  # the loss watchdog's and early stopping's counters


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(output_dir: Path, state: TrainState, model, tokenizer, optimizer, scheduler, keep: int | None) -> Path:
    """Write checkpoint-N atomically, then drop the oldest beyond `keep`. Returns its path. Every process calls it."""
    from rlft.train.parallel import barrier, gathered_state_dict

    rank = launched()[0]
    final = output_dir / f"checkpoint-{state.global_step}"
    staging = output_dir / f".tmp-checkpoint-{state.global_step}"
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    barrier()
    unwrapped = getattr(model, "module", model)
    weights = gathered_state_dict(model)  # sharded: gathered (a collective); else None, and the model saves itself
    if rank == 0:
        unwrapped.save_pretrained(staging / "model", safe_serialization=True, state_dict=weights)
        tokenizer.save_pretrained(staging / "model")
    save_optimizer(model, optimizer, staging / "optimizer")
    torch.save(rng_state(), staging / f"rng-{rank}.pt")
    barrier()  # every process has written its part
    if rank == 0:
        torch.save(scheduler.state_dict(), staging / "scheduler.pt")
        (staging / STATE_FILE).write_text(json.dumps(asdict(state), indent=2))
        _fsync_tree(staging)
        if final.exists():  # re-saving the same step (e.g. final save after a periodic one)
            old = output_dir / f".old-checkpoint-{state.global_step}-{os.getpid()}"
            final.rename(old)
            staging.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(final)
        if keep:
            for stale in list_checkpoints(output_dir)[:-keep]:
                shutil.rmtree(stale, ignore_errors=True)
    barrier()
    return final


def _inner(optimizer):
    return getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper


def save_optimizer(model, optimizer, folder: Path) -> None:
    """The optimizer state keyed by parameter names, each process writing its shard (a collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    with warnings.catch_warnings():  # one process: "assuming the intent is to save in a single process", which it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"optimizer": get_optimizer_state_dict(model, _inner(optimizer))}, checkpoint_id=str(folder))


def load_optimizer(model, optimizer, folder: Path) -> None:
    """Load a state `save_optimizer` wrote, re-sharded for however many processes run now."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    target = {"optimizer": get_optimizer_state_dict(model, _inner(optimizer))}  # initialised: the tensors to load into
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(target, checkpoint_id=str(folder))
    set_optimizer_state_dict(model, _inner(optimizer), target["optimizer"])


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())


def list_checkpoints(output_dir: Path) -> list[Path]:
    """checkpoint-N folders, oldest first (by N)."""
    if not output_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in output_dir.iterdir() if p.is_dir() and (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def checkpoint_problem(folder: Path) -> str | None:
    """Why `folder` is not a complete checkpoint, or None when it is."""
    if not folder.is_dir():
        return "it does not exist"
    missing = [name for name in REQUIRED if not (folder / name).exists()]
    missing += [names[0] for names in EITHER if not any((folder / name).exists() for name in names)]
    if missing:
        return f"it lacks {', '.join(missing)} (a partial save?)"
    weights = list((folder / "model").glob("*.safetensors"))
    if not weights:
        return "model/ holds no .safetensors weights"
    from safetensors import safe_open

    for file in weights:
        try:
            with safe_open(str(file), framework="pt") as handle:
                handle.keys()
        except Exception as exc:  # safetensors raises its own error types for truncated files
            return f"{file.name} is unreadable ({exc}); was the save interrupted?"
    try:
        json.loads((folder / STATE_FILE).read_text())
    except json.JSONDecodeError:
        return f"{STATE_FILE} is not valid JSON"
    return None


def resolve_resume(setting: str | None, output_dir: Path) -> Path | None:
    """The checkpoint to resume from: an explicit folder (must be complete) or `auto` (newest complete one)."""
    if not setting:
        return None
    if setting == "auto":
        for candidate in reversed(list_checkpoints(output_dir)):
            if checkpoint_problem(candidate) is None:
                return candidate
        return None
    folder = Path(setting).expanduser()
    problem = checkpoint_problem(folder)
    if problem:
        earlier = [str(p) for p in list_checkpoints(folder.parent) if p != folder and checkpoint_problem(p) is None]
        hint = f"; complete checkpoints there: {', '.join(earlier)}" if earlier else ""
        raise CheckpointError(f"resume_from_checkpoint: {folder} is not a usable checkpoint: {problem}. Use `auto` or another checkpoint{hint}")
    return folder


def load_weights(model, folder: Path) -> None:
    """Load checkpoint weights into an already-built model (full weights or a PEFT adapter)."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(file))
        except Exception as exc:
            raise CheckpointError(f"{file} is unreadable ({exc}): use another checkpoint") from None
    if (folder / "adapter_config.json").exists():
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, state)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise CheckpointError(f"{folder}: adapter weights do not match the configured adapter ({unexpected[:3]} ...)")
        return
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    missing, unexpected = target.load_state_dict(state, strict=False)
    tied = {name for name in missing if "lm_head" in name and getattr(target.config, "tie_word_embeddings", False)}
    if set(missing) - tied or unexpected:
        raise CheckpointError(
            f"{folder}: weights do not match the configured model (missing {sorted(set(missing) - tied)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}): was it saved from a different base_model?"
        )


def load_checkpoint(folder: Path, model, optimizer, scheduler) -> TrainState:
    """The optimizer, schedule and RNG state of `folder` (its weights were loaded before the model was wrapped,
    with `load_weights`). Every process calls it; each restores its own RNG (rank 0's when it wrote none)."""
    rank = launched()[0]
    try:
        if (folder / "optimizer").is_dir():
            load_optimizer(model, optimizer, folder / "optimizer")
        else:
            _inner(optimizer).load_state_dict(torch.load(folder / "optimizer.pt", weights_only=False))
        scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=False))
        # the schedule is rebuilt from today's config (max_steps may have changed): apply it from this step on
        scheduler._last_lr = scheduler.get_lr()
        for group, lr in zip(optimizer.param_groups, scheduler._last_lr):
            group["lr"] = lr
        rng = next((folder / name for name in (f"rng-{rank}.pt", "rng-0.pt", "rng.pt") if (folder / name).exists()))
        restore_rng(torch.load(rng, weights_only=False))
    except (RuntimeError, ValueError, KeyError, EOFError) as exc:
        raise CheckpointError(f"{folder}: cannot restore optimizer/scheduler/RNG state: {exc}") from None
    return TrainState(**json.loads((folder / STATE_FILE).read_text()))


def clean_staging(output_dir: Path) -> None:
    """Remove `.tmp-checkpoint-*` folders left by a run killed mid-save (rank 0, before any save)."""
    if output_dir.is_dir():
        for leftover in output_dir.glob(".tmp-checkpoint-*"):
            shutil.rmtree(leftover, ignore_errors=True)
