"""Atomic, exactly-resumable checkpoints.

A checkpoint `output_dir/checkpoint-N/` holds:
  model/              save_pretrained output (only the adapter for LoRA) + tokenizer: loadable as is; the full
                      weights even when they were sharded over processes (gathered for the save); a PiSSA or OLoRA
                      adapter converted to load on the original base (rlft.models.base_changing)
  adapter-as-trained/ PiSSA, OLoRA: the adapter on the residual base, which a resume loads
  optimizer/          optimizer state, torch.distributed.checkpoint: each process writes its own shard, and a
                      load re-shards it for any number of processes (or one); under DeepSpeed, each trained
                      parameter's state whole (zero.json, zero-R.safetensors: train/zero.py), which loads on
                      any number of processes too
  scheduler.json      learning-rate schedule state
  rng-R.pt            python, numpy and torch RNG states of process R (tensors and numbers)
  trainer_state.json  step, data position (epoch, batch), process count, metrics; written last

Every process takes part in a save, written atomically (checkpoint_save.py: under `output_dir/.tmp-checkpoint-N/`,
renamed into place once every process has written its part), while training waits or on a background thread. This
module reads checkpoints: which are complete, which one a resume takes, and loading one. Loading runs no code from
the files (state_files.py). Checkpoints of earlier rlft versions (`optimizer.pt`, `scheduler.pt`, `rng.pt`) still load.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

from rlft.config.parallel import launched
from rlft.errors import CheckpointError
from rlft.models.base_changing import RESUME_FOLDER
from rlft.train import zero
from rlft.train.checkpoint_folders import list_checkpoints
from rlft.train.optim import inner_optimizer, optimizer_mode
from rlft.train.parallel import broadcast_object
from rlft.train.state_files import (SCHEDULER_FILE, SafePlanner, SafeReader, UnsafeState, load_tensors, optimizer_files_problem,
                                    restore_rng, scheduler_state)

STATE_FILE = "trainer_state.json"
GROUP_STATE = ("train_mode", "k", "weight_sum", "lr_max", "scheduled_lr")  # schedule-free optimizers' running state
SCALER_FILE = "scaler.pt"  # fp16 runs: the loss scaler's scale and growth counter
REQUIRED = ("model", STATE_FILE)
# this version's name, or an earlier version's
EITHER = (("optimizer", "optimizer.pt"), ("rng-0.pt", "rng.pt"), (SCHEDULER_FILE, "scheduler.pt"))


@dataclass
class TrainState:
    """Where training stands: enough, with the files above, to continue exactly."""

    global_step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    tokens_seen: int = 0
    total_steps: int = 0
    world_size: int = 1  # processes that wrote it; the data position is per process
    plan_batches: int = 0  # micro-batches an epoch over all processes (0: not recorded in the checkpoint)
    last_metrics: dict[str, Any] = field(default_factory=dict)
    recipe_state: dict[str, Any] = field(default_factory=dict)  # e.g. running statistics of a loss
    guards: dict[str, Any] = field(default_factory=dict)  # the loss watchdog's and early stopping's counters
    best: dict[str, Any] = field(default_factory=dict)  # load_best_model_at_end: the best checkpoint's step and metric


def load_optimizer(model, optimizer, folder: Path) -> None:
    """Load the optimizer state of a checkpoint (written by checkpoint_save.py's `_write_optimizer`: each process's
    shard through torch.distributed.checkpoint, or `zero.write_optimizer` under DeepSpeed), re-sharded for however
    many processes run now."""
    written_by_deepspeed = (folder / zero.INDEX).is_file()
    if written_by_deepspeed != zero.is_deepspeed(model):
        raise CheckpointError(f"{folder.parent} was written {'with' if written_by_deepspeed else 'without'} DeepSpeed and "
                              f"this run is {'not ' if written_by_deepspeed else ''}under DeepSpeed: their optimizer states "
                              "differ in form. Resume with the deepspeed: setting it was written with (its weights load "
                              "either way: point base_model at its model/ folder to start afresh from them)")
    if written_by_deepspeed:
        return zero.load_optimizer(model, folder)
    # torch initialises the state to load into with a step at learning rate 0, and only when the state is empty: a
    # schedule-free optimizer steps only in train mode, and its mode switch leaves empty entries behind
    optimizer_mode(optimizer, training=True)
    inner = inner_optimizer(optimizer)
    for param in [param for param, values in inner.state.items() if not values]:
        del inner.state[param]
    target = {"optimizer": get_optimizer_state_dict(model, inner)}  # initialised: the tensors to load into
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(target, storage_reader=SafeReader(str(folder)), planner=SafePlanner())
    set_optimizer_state_dict(model, inner_optimizer(optimizer), target["optimizer"])


def checkpoint_problem(folder: Path) -> str | None:
    """Why `folder` is not a complete, readable checkpoint, or None when it is. Every state file is read (safely: see
    state_files.py), so `auto` never picks a checkpoint that would fail, or run code, on resume."""
    problem = weights_problem(folder)
    if problem is None and not any((folder / name).exists() for names in EITHER for name in names):
        start = (f"lora_model_dir: {folder / 'model'} (and the same base_model)" if (folder / "model" / "adapter_config.json").exists()
                 else f"base_model: {folder / 'model'}")
        return (f"it holds the weights only (saved with save_only_model: true), without the optimizer, schedule and RNG "
                f"state that resuming needs; start a new run from them with {start}")
    missing = [names[0] for names in EITHER if not any((folder / name).exists() for name in names)]
    return problem or (f"it lacks {', '.join(missing)} (a partial save?)" if missing else _state_files_problem(folder))


def weights_problem(folder: Path) -> str | None:
    """Why the weights and training record of `folder` cannot be read (what a final model is taken from), or None."""
    if not folder.is_dir():
        return "it does not exist"
    missing = [name for name in REQUIRED if not (folder / name).exists()]
    if missing:
        return f"it lacks {', '.join(missing)} (a partial save?)"
    weights = list((folder / "model").glob("*.safetensors"))
    if not weights:
        return "model/ holds no .safetensors weights"
    weights += list((folder / RESUME_FOLDER).glob("*.safetensors"))  # PiSSA, OLoRA: the adapter as trained
    for file in weights:
        try:
            with safe_open(str(file), framework="pt") as handle:
                handle.keys()
        except Exception as exc:  # safetensors raises its own error types for truncated files
            return f"{file.name} is unreadable ({exc}); was the save interrupted?"
    try:
        state = json.loads((folder / STATE_FILE).read_text())
        TrainState(**state)
    except json.JSONDecodeError:
        return f"{STATE_FILE} is not valid JSON"
    except TypeError:
        return f"{STATE_FILE} does not hold a training state (keys {sorted(state)[:6] if isinstance(state, dict) else type(state).__name__})"
    return None


def _state_files_problem(folder: Path) -> str | None:
    """Why the optimizer, schedule or RNG state of `folder` cannot be read, or None."""
    if (folder / "optimizer").is_dir():
        zero_state = (folder / "optimizer" / zero.INDEX).is_file()
        problem = (zero.optimizer_files_problem if zero_state else optimizer_files_problem)(folder / "optimizer")
        if problem:
            return problem + (" (rlft never runs code from a checkpoint)" if "running code" in problem else "")
    checks: list[tuple[str, Callable[[], Any]]] = [(SCHEDULER_FILE if (folder / SCHEDULER_FILE).exists() else "scheduler.pt",
                                                    lambda: scheduler_state(folder))]
    checks += [(file.name, lambda file=file: load_tensors(file)) for file in sorted(folder.glob("rng*.pt"))]
    if not (folder / "optimizer").is_dir():
        checks.append(("optimizer.pt", lambda: load_tensors(folder / "optimizer.pt")))
    for name, read in checks:
        try:
            read()
        except UnsafeState as exc:
            return f"{exc} (rlft never runs code from a checkpoint)"
        except (OSError, RuntimeError, ValueError, EOFError, KeyError, json.JSONDecodeError) as exc:
            return f"{name} is unreadable ({type(exc).__name__}: {str(exc)[:160]})"
    return None


def resolve_resume(setting: str | None, output_dir: Path, warn: Callable[[str], None] | None = None) -> Path | None:
    """The checkpoint to resume from: an explicit folder (must be complete) or `auto` (the newest complete one; each
    newer one it passes over is reported through `warn`)."""
    if not setting:
        return None
    if setting == "auto":
        for candidate in reversed(list_checkpoints(output_dir)):
            problem = checkpoint_problem(candidate)
            if problem is None:
                return candidate
            if warn:
                warn(f"resume_from_checkpoint: auto skips {candidate}: {problem}")
        return None
    folder = Path(setting).expanduser()
    problem = checkpoint_problem(folder)
    if problem:
        earlier = [str(p) for p in list_checkpoints(folder.parent) if p != folder and checkpoint_problem(p) is None]
        hint = f"; complete checkpoints there: {', '.join(earlier)}" if earlier else ""
        raise CheckpointError(f"resume_from_checkpoint: {folder} is not a usable checkpoint: {problem}. Use `auto` or another checkpoint{hint}")
    return folder


def agreed_resume(setting: str | None, output_dir: Path, warn: Callable[[str], None] | None = None) -> Path | None:
    """`resolve_resume` on the main process, its choice (or its refusal) taken by every process: each one looking
    for itself could pick another checkpoint (a save still landing on a shared filesystem, one rank's stale view),
    and the ranks would load different steps' weights."""
    found, problem = None, None
    if launched()[0] == 0:
        try:
            found = resolve_resume(setting, output_dir, warn)
        except CheckpointError as exc:
            problem = str(exc)
    found, problem = broadcast_object((found, problem))
    if problem:
        raise CheckpointError(problem)
    if found is not None and not (found / STATE_FILE).is_file():
        raise CheckpointError(f"resume_from_checkpoint: process {launched()[0]} cannot see {found}, which the main "
                              "process resumes from: output_dir must be on a filesystem that every node sees")
    return found


def _mismatch(exc: RuntimeError) -> str:
    """The first tensor torch names in a `load_state_dict` failure, e.g. "size mismatch for lm_head.weight: ..."."""
    lines = [line.strip() for line in str(exc).splitlines() if "mismatch" in line]
    return (lines[0] if lines else str(exc).splitlines()[0])[:300]


def load_weights(model, folder: Path) -> None:
    """Load checkpoint weights into an already-built model (full weights or a PEFT adapter)."""
    files = sorted(folder.glob("*.safetensors"))
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(file))
        except Exception as exc:
            raise CheckpointError(f"{file} is unreadable ({exc}): use another checkpoint") from None
    if (folder / "adapter_config.json").exists():
        try:
            from peft import set_peft_model_state_dict  # adapters only

            result = set_peft_model_state_dict(model, state)
        except RuntimeError as exc:  # torch: "size mismatch for ...": another lora_r, or another base model's widths
            raise CheckpointError(f"{folder}: adapter weights do not fit the configured adapter ({_mismatch(exc)}): was it "
                                  "saved with another lora_r, lora_target_modules or base_model?") from None
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise CheckpointError(f"{folder}: adapter weights do not match the configured adapter ({unexpected[:3]} ...)")
        return
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        missing, unexpected = target.load_state_dict(state, strict=False)
    except RuntimeError as exc:
        raise CheckpointError(f"{folder}: weights do not fit the configured model ({_mismatch(exc)}): was it saved "
                              "from a different base_model?") from None
    tied = {name for name in missing if "lm_head" in name and getattr(target.config, "tie_word_embeddings", False)}
    if set(missing) - tied or unexpected:
        raise CheckpointError(
            f"{folder}: weights do not match the configured model (missing {sorted(set(missing) - tied)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}): was it saved from a different base_model?"
        )


def load_checkpoint(folder: Path, model, optimizer, scheduler, scaler=None) -> TrainState:
    """The optimizer, schedule and RNG state of `folder` (its weights were loaded before the model was wrapped,
    with `load_weights`). Every process calls it; each restores its own RNG (rank 0's when it wrote none)."""
    rank = launched()[0]
    # today's hyperparameters (learning_rate, betas, weight_decay, ...): a run resumed with a lower learning rate after
    # a divergence must train with it, not with the checkpoint's (which the optimizer and schedule states carry); not
    # the state schedule-free optimizers keep in the groups (train_mode, k, weight_sum, lr_max, scheduled_lr)
    today = [{key: value for key, value in group.items() if key != "params" and key not in GROUP_STATE}
             for group in optimizer.param_groups]
    base_lrs = list(scheduler.base_lrs)
    try:
        if (folder / "optimizer").is_dir():
            load_optimizer(model, optimizer, folder / "optimizer")
        else:
            inner_optimizer(optimizer).load_state_dict(load_tensors(folder / "optimizer.pt"))
        scheduler.load_state_dict(scheduler_state(folder))
        for group, settings in zip(optimizer.param_groups, today):
            group.update(settings)
        scheduler.base_lrs = base_lrs
        # the schedule is rebuilt from today's config (max_steps may have changed): apply it from this step on
        scheduler._last_lr = scheduler.get_lr()
        for group, lr in zip(optimizer.param_groups, scheduler._last_lr):
            group["lr"] = lr
        rng = next((folder / name for name in (f"rng-{rank}.pt", "rng-0.pt", "rng.pt") if (folder / name).exists()))
        restore_rng(load_tensors(rng))
        if scaler is not None and (folder / SCALER_FILE).exists():  # a checkpoint of an fp32/bf16 run has none
            scaler.load_state_dict(load_tensors(folder / SCALER_FILE))
    except UnsafeState as exc:
        raise CheckpointError(f"{folder}: {exc}; rlft never runs code from a checkpoint. Use a checkpoint you wrote") from None
    except (RuntimeError, ValueError, KeyError, EOFError) as exc:
        raise CheckpointError(f"{folder}: cannot restore optimizer/scheduler/RNG state: {exc}") from None
    return read_state(folder)


def read_state(folder: Path) -> TrainState:
    return TrainState(**json.loads((folder / STATE_FILE).read_text()))


def changed_learning_rate(folder: Path, scheduler) -> str:
    """What the resume note says when today's learning_rate is not the checkpoint's (the run goes on with today's)."""
    saved = scheduler_state(folder).get("base_lrs") or []
    if not saved or all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(saved, scheduler.base_lrs)):
        return ""
    return f" (learning_rate {saved[0]:g} in the checkpoint, {scheduler.base_lrs[0]:g} now: the schedule goes on with it)"
