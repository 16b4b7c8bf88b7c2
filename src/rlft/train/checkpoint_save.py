"""Writing a checkpoint, while training waits (`save_mode: sync`) or on a background thread (`save_mode: async`).

A save first takes a snapshot of the state between two steps, on the main thread of every process: the weights
(gathered where they are sharded), the optimizer state, the RNG states, the schedule, the loss scaler and the
training record; the recipe's own files are written then too. With `save_mode: async` the tensors that the next
optimizer step changes in place (trained weights, buffers, the optimizer state) are copied to host memory, and the
files are written on a background thread while training goes on; frozen weights (a LoRA run's base) are not copied,
since training never changes them. One write at a time: a save waits for the one before it, and the end of a run (a
Ctrl-C and SIGTERM too) waits for the one in flight (`CheckpointWriter`).

Either way the files go to `output_dir/.tmp-checkpoint-N/`, which rank 0 flushes to disk and renames `checkpoint-N`
once every process has written its part: a crash of any process at any moment of a save (SIGKILL too) leaves the
earlier checkpoints untouched and never a `checkpoint-N` that `resume_from_checkpoint: auto` could pick. A write error
(a full disk) on any process removes the staging folder and every process stops with the reason.

With several processes, a background write's collectives (torch.distributed.checkpoint's plan exchange, the
agreement that every process wrote its part) run on a gloo process group of their own, as PyTorch advises for
asynchronous checkpoints (https://pytorch.org/docs/stable/distributed.checkpoint.html, `async_save`), so they never
interleave with training's collectives on the main thread; they have the run's `ddp_timeout`.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

from rlft.config.parallel import launched
from rlft.errors import CheckpointError
from rlft.models.base_changing import convert_folder, keep_for_resume
from rlft.train import zero
from rlft.train.checkpoint import SCALER_FILE, STATE_FILE, TrainState, checkpoint_problem
from rlft.train.checkpoint_folders import list_checkpoints, pruned
from rlft.train.optim import inner_optimizer
from rlft.train.parallel import barrier, distributed, gathered_state_dict, peer_failure
from rlft.train.state_files import rng_state, scheduler_json, write_scheduler

# one process writes the optimizer folder without a process group, which is what torch warns of; set here and not
# around the call, since warnings.catch_warnings is not safe on a thread
warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled, unavailable or uninitialized, assuming the intent "
                        r"is to save in a single process", category=UserWarning)


@dataclass
class Snapshot:
    """One checkpoint as it is written: taken between two steps; with `copied`, independent of the state that
    training goes on changing."""

    output_dir: Path
    step: int  # the N of checkpoint-N: the optimizer steps taken
    final: Path  # checkpoint-N
    staging: Path  # .tmp-checkpoint-N
    rank: int
    model: Any  # the unwrapped model, for save_pretrained (its config and adapter settings)
    tokenizer: Any
    weights: dict[str, torch.Tensor] | None  # rank 0: what save_pretrained writes (None: the model's own state)
    optimizer: Any  # {"optimizer": DCP state dict}, a zero.OptimizerShard, or None (model_only)
    rng: dict[str, Any] | None
    scheduler: str | None  # scheduler.json's text
    scaler: dict[str, Any] | None
    state: str  # trainer_state.json's text
    keep: int | None
    protect: Path | None
    model_only: bool
    initial_adapter: Path | None
    problems: list[BaseException] = field(default_factory=list)  # writes that failed while it was taken


def save_checkpoint(output_dir: Path, state: TrainState, model, tokenizer, optimizer, scheduler, keep: int | None,
                    extra_files: Callable[[Path], None] | None = None, scaler=None, extra_bytes: int = 0,
                    protect: Path | None = None, model_only: bool = False, initial_adapter: Path | None = None) -> Path:
    """Write checkpoint-N atomically while the caller waits, then drop the oldest beyond `keep` (-1: none), never
    `protect` (the best checkpoint). Returns its path. Every process calls it. `extra_files(folder)` writes the
    recipe's own files into it (the main process), about `extra_bytes` of them; fp16's loss `scaler` keeps its scale
    (a resumed run would otherwise start again at 65536 and skip steps finding its way back down). Refused before
    anything is written when the disk lacks the room; a write error on the way (a full disk, a quota) removes the
    staging folder and raises CheckpointError naming what failed: earlier checkpoints are untouched either way.
    `model_only` (save_only_model): the weights and the training state's record, no optimizer, schedule, RNG or recipe
    state, so it cannot resume. `initial_adapter` (PiSSA, OLoRA): `model/` holds the adapter converted to load on the
    original base, and the checkpoint keeps the adapter as trained for resuming (rlft.models.base_changing)."""
    snapshot = take_snapshot(output_dir, state, model, tokenizer, optimizer, scheduler, keep, extra_files, scaler, extra_bytes,
                             protect, model_only, initial_adapter, copied=False)
    write_snapshot(snapshot)
    return snapshot.final


def take_snapshot(output_dir: Path, state: TrainState, model, tokenizer, optimizer, scheduler, keep: int | None,
                  extra_files: Callable[[Path], None] | None, scaler, extra_bytes: int, protect: Path | None, model_only: bool,
                  initial_adapter: Path | None, copied: bool) -> Snapshot:
    """What `write_snapshot` writes (arguments as `save_checkpoint`'s), on the main thread of every process (it gathers
    sharded weights and optimizer state: collectives). `copied`: the tensors training changes in place are copied to
    host memory, so that training may go on while it is written."""
    rank = launched()[0]
    final, staging = output_dir / f"checkpoint-{state.global_step}", output_dir / f".tmp-checkpoint-{state.global_step}"
    unwrapped = getattr(model, "module", model)
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        converted = 0 if initial_adapter is None else 2 * sum(  # the converted adapter (twice the rank) beside the one trained
            p.numel() * p.element_size() for p in unwrapped.parameters() if p.requires_grad)
        check_room(output_dir, final, model, None if model_only else optimizer, (0 if model_only else extra_bytes) + converted,
                   model_only)
        staging.mkdir(parents=True)
    barrier()
    weights = gathered_state_dict(model)  # sharded: gathered (a collective); else None, and the model saves itself
    if copied and rank == 0:
        weights = detached_weights(unwrapped, weights)
    snapshot = Snapshot(output_dir, state.global_step, final, staging, rank, unwrapped, tokenizer, weights, None, None, None,
                        None, json.dumps(asdict(state), indent=2), keep, protect, model_only, initial_adapter)
    if model_only:
        return snapshot
    if zero.is_deepspeed(model):
        snapshot.optimizer = zero.optimizer_shard(model)  # copies already
    else:
        snapshot.optimizer = {"optimizer": get_optimizer_state_dict(model, inner_optimizer(optimizer))}
        if copied:
            snapshot.optimizer = BlockingAsyncStager().stage(snapshot.optimizer)
    snapshot.rng, snapshot.scheduler = rng_state(), scheduler_json(scheduler)
    snapshot.scaler = dict(scaler.state_dict()) if scaler is not None else None
    if rank == 0 and extra_files is not None:  # the recipe's state as it is now: written before training goes on
        try:
            extra_files(staging)
        except Exception as exc:  # noqa: BLE001 - reported as every write error is, by write_snapshot
            snapshot.problems.append(exc)
    return snapshot


def detached_weights(module: torch.nn.Module, weights: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """`weights` (None: `module`'s state dict) with each tensor that training changes in place (a trained parameter or
    a buffer, by its storage) copied to host memory; frozen parameters stay shared. Tensors that were one (tied
    embeddings) stay one copy."""
    live = [p for p in module.parameters() if p.requires_grad] + list(module.buffers())
    changing = {_local(t).untyped_storage().data_ptr() for t in live}
    state = module.state_dict() if weights is None else weights
    copies: dict[tuple, torch.Tensor] = {}
    detached = {}
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor) or tensor.untyped_storage().data_ptr() not in changing:
            detached[name] = tensor
            continue
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()),
               tensor.dtype)
        if key not in copies:
            copies[key] = tensor.detach().to("cpu", copy=True)
        detached[name] = copies[key]
    return detached


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else zero.local_values(tensor)


def write_snapshot(snapshot: Snapshot, group=None) -> None:
    """Write `snapshot` into its staging folder and rename it into place: every process calls it (on any thread, with
    `group` the process group of its collectives; None: the default one). Every process learns whether every other
    wrote its part, and a failure anywhere raises the same CheckpointError on each, the staging folder removed."""
    problems = list(snapshot.problems)

    def attempt(action: Callable[[], None]) -> None:
        try:
            action()
        except (Exception, CheckpointException) as exc:  # OSError, or the writers' wrappers of one (safetensors, torch.save,
            # DCP's CheckpointException, a BaseException)
            if peer_failure(exc):  # another process died during the save: the disk is not the problem
                raise
            problems.append(exc)

    if snapshot.rank == 0:
        attempt(lambda: _write_model(snapshot))
    if not snapshot.model_only:  # also after a failure above: the other processes' collectives wait for this one's
        attempt(lambda: _write_optimizer(snapshot, group))
        attempt(lambda: torch.save(snapshot.rng, snapshot.staging / f"rng-{snapshot.rank}.pt"))
    found = _write_failure(problems[0], snapshot.final, snapshot.output_dir, snapshot.model_only) if problems else None
    failure = next((text for text in _gathered(found, group) if text), None)  # every process has written its part
    if snapshot.rank == 0 and failure is None:
        try:
            _finish(snapshot)
        except Exception as exc:  # noqa: BLE001 - the same report as a failed write
            failure = _write_failure(exc, snapshot.final, snapshot.output_dir, snapshot.model_only)
    if snapshot.rank == 0 and failure is not None:
        shutil.rmtree(snapshot.staging, ignore_errors=True)
    failure = _gathered(failure, group)[0]  # rank 0's outcome, on every process once it has renamed the folder
    if failure:
        raise CheckpointError(failure)


def _write_model(snapshot: Snapshot) -> None:
    folder = snapshot.staging / "model"
    snapshot.model.save_pretrained(folder, safe_serialization=True, state_dict=snapshot.weights)
    snapshot.tokenizer.save_pretrained(folder)
    if snapshot.initial_adapter is not None:
        if not snapshot.model_only:
            keep_for_resume(folder, snapshot.staging)
        convert_folder(folder, snapshot.initial_adapter)


def _write_optimizer(snapshot: Snapshot, group) -> None:
    """Each process its shard: torch.distributed.checkpoint (a collective on `group`), or DeepSpeed's (train/zero.py)."""
    folder = snapshot.staging / "optimizer"
    if isinstance(snapshot.optimizer, zero.OptimizerShard):
        zero.write_optimizer(snapshot.optimizer, folder)
    else:
        dcp.save(snapshot.optimizer, checkpoint_id=str(folder), process_group=group, no_dist=not dist.is_initialized())


def _finish(snapshot: Snapshot) -> None:
    """Rank 0, once every process has written its part: the small files, the flush to disk, the rename, the pruning."""
    staging, final = snapshot.staging, snapshot.final
    if not snapshot.model_only:
        write_scheduler(snapshot.scheduler, staging)
        if snapshot.scaler is not None:
            torch.save(snapshot.scaler, staging / SCALER_FILE)
    (staging / STATE_FILE).write_text(snapshot.state)  # written last
    _fsync_tree(staging)
    if final.exists():  # re-saving the same step (e.g. final save after a periodic one)
        old = snapshot.output_dir / f".old-{final.name}-{os.getpid()}"
        final.rename(old)
        staging.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(final)
    if snapshot.keep:
        for stale in pruned(list_checkpoints(snapshot.output_dir), final, snapshot.step, snapshot.keep, snapshot.protect):
            shutil.rmtree(stale, ignore_errors=True)


def _gathered(value: str | None, group) -> list[str | None]:
    """Every process's `value`, in rank order (a collective on `group`)."""
    if not distributed():
        return [value]
    found: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(found, value, group=group)
    return found


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())


class CheckpointWriter:
    """Saves a run's checkpoints as `save_mode` says: `sync` while training waits, `async` on a background thread.
    At most one write is in flight; `wait` (every way out of a run calls it) lets it finish."""

    def __init__(self, mode: str, timeout_s: float):
        self.background, self.timeout = mode == "async", timedelta(seconds=timeout_s)
        self.waited = 0.0  # seconds training waited for saves (a snapshot; a write in flight; a save written whole)
        self.group = None  # the background writes' gloo process group, made at the first one
        self.thread: threading.Thread | None = None
        self.written = threading.Event()  # set when the write in flight has ended
        self.failure: BaseException | None = None
        self.completed: Path | None = None  # the newest checkpoint this run wrote whole

    def save(self, *args: Any, wait: bool = False, **kwargs: Any) -> Path:
        """`save_checkpoint(*args, **kwargs)`, after the write in flight; in the background unless `wait` (the
        run's last save) or `save_mode: sync`. Every process calls it."""
        began = time.perf_counter()
        try:
            self.wait()
            background = self.background and not wait
            snapshot = take_snapshot(*args, **kwargs, copied=background)
            if not background:
                write_snapshot(snapshot)
                self.completed = snapshot.final
                return snapshot.final
        finally:
            self.waited += time.perf_counter() - began
        if self.group is None and distributed():
            self.group = dist.new_group(backend="gloo", timeout=self.timeout)  # every process, on the main thread
        self.written = threading.Event()
        self.thread = threading.Thread(target=self._write, args=(snapshot,), name=f"rlft-save-{snapshot.final.name}", daemon=True)
        self.thread.start()
        return snapshot.final

    def _write(self, snapshot: Snapshot) -> None:
        try:
            write_snapshot(snapshot, self.group)
            self.completed = snapshot.final
        except BaseException as exc:  # noqa: BLE001 - raised on the main thread by `wait`
            self.failure = exc
        finally:
            self.written.set()

    def finished(self) -> Path | None:
        """The newest checkpoint this run wrote whole, once the write in flight has ended (its failure kept for `wait`)."""
        if self.thread is not None:
            # an Event, not Thread.join: a join that a signal handler's exception (Ctrl-C, SIGTERM) interrupts can
            # leave the thread marked as ended while it still writes, and the run would exit mid-write
            self.written.wait()
            self.thread = None
        return self.completed

    def wait(self) -> None:
        """Until the write in flight has ended; its failure raised here."""
        self.finished()
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure

    def close(self, warn: Callable[[str], None] | None) -> None:
        """`wait` on any way out of a run, one with an error of its own too: a failure of the write is said through
        `warn` instead of raised."""
        try:
            self.wait()
        except (Exception, CheckpointException) as exc:
            if warn is not None:
                warn(str(exc))


# ------------------------------------------------------------------ disk room and write errors

def _last_complete(output_dir: Path, besides: Path) -> Path | None:
    return next((p for p in reversed(list_checkpoints(output_dir)) if p != besides and checkpoint_problem(p) is None), None)


def _then(model_only: bool) -> str:  # what to do after a failed save
    return "start a new run from a checkpoint's model/ folder" if model_only else "resume with resume_from_checkpoint: auto"


def _write_failure(exc: BaseException, final: Path, output_dir: Path, model_only: bool = False) -> str:
    last = _last_complete(output_dir, final)
    keep = f"the last complete checkpoint, {last}, is untouched" if last else "no earlier checkpoint exists"
    code = exc.errno if isinstance(exc, OSError) else None
    if code is None and (found := re.search(r"os error (\d+)|errno (\d+)|\[Errno (\d+)\]", str(exc), re.IGNORECASE)):
        code = int(next(group for group in found.groups() if group))
    what = ("the disk is full" if code in (errno.ENOSPC, errno.EDQUOT) else
            "a file grew past the size this process may write (ulimit -f)" if code == errno.EFBIG else
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ''}")
    where = getattr(exc, "filename", None) or output_dir
    fix = "raise it" if code == errno.EFBIG else f"free space under {output_dir} (or lower save_total_limit)"
    return (f"saving {final.name} failed: {what} (writing under {where}). The partial save was removed and {keep}. "
            f"Fix it ({fix}), then {_then(model_only)}")


def check_room(output_dir: Path, final: Path, model, optimizer, extra_bytes: int = 0, model_only: bool = False) -> None:
    """Refuse the save when the disk under `output_dir` has less room than it needs (the size of the previous
    checkpoint, or the tensors it will hold and the recipe's `extra_bytes`, plus a tenth)."""
    previous = _last_complete(output_dir, final)
    if previous is not None:
        needed = sum(f.stat().st_size for f in previous.rglob("*") if f.is_file())
    else:
        unwrapped = getattr(model, "module", model)
        saved = [p for p in unwrapped.parameters() if p.requires_grad] if hasattr(unwrapped, "peft_config") else \
            list(unwrapped.parameters())
        entries = inner_optimizer(optimizer).state.values() if optimizer is not None else []
        state = [v for entry in entries for v in entry.values() if isinstance(v, torch.Tensor)]
        needed = sum(t.numel() * t.element_size() for t in saved + state) + extra_bytes
    needed = int(needed * 1.1) + (1 << 20)
    free = shutil.disk_usage(output_dir).free
    if free < needed:
        keep = f"; the last complete checkpoint is {previous}" if previous else ""
        raise CheckpointError(f"not enough disk space to save {final.name}: it needs about {needed / 2**20:.0f} MiB and "
                              f"{free / 2**20:.0f} MiB are free under {output_dir}{keep}. Free space (or lower "
                              f"save_total_limit), then {_then(model_only)}")
