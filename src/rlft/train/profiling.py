"""The profiler over a few optimizer steps, as `ProfileSettings` say (the `profiler:` section, Cosmos-RL's, or
Axolotl's `profiler_steps`): a torch.profiler trace, NVTX ranges for Nsight Systems, Axolotl's CUDA memory snapshot.

The Trainer runs its steps inside `window(settings, first_step, console)` and calls `.step()` after each optimizer
step. Where nothing is asked, or on a rank that does not profile, the window is `NO_PROFILE`, which does nothing: no
profiler starts and rlft's phase ranges stay closed (`rlft.phase_ranges`).

The steps: torch.profiler.schedule(wait, warmup, active, repeat=1) over the optimizer steps this process trains
(https://docs.pytorch.org/docs/stable/profiler.html). While the profiler runs, each phase (`time/*` metric names:
data, forward_backward, optimizer, generate, reward, logprobs, weight_sync, save) and each step (`step N`, N as in
metrics.jsonl) is a `record_function` range. The trace is a Chrome trace JSON,
output_dir/profile/rank{R}.{N}.pt.trace.json with N the first recorded step: the `worker.span.pt.trace.json` name
TensorBoard's PyTorch profiler plugin reads; Perfetto (https://ui.perfetto.dev) opens it as it is.

enable_nsys (as Cosmos-RL): cudaProfilerStart before the first recorded step and cudaProfilerStop after the last, for
`nsys profile --capture-range=cudaProfilerApi`, and NVTX ranges per step and phase for the whole run.

profiler_steps (as Axolotl's PytorchProfilerCallback): the trace records shapes, memory and stacks, and on a CUDA GPU
the allocator's history over the recorded steps is dumped to rank{R}.{N}.memory_snapshot.pickle
(https://pytorch.org/memory_viz). Without CUDA there is no snapshot: the trace's memory events hold the host
allocations instead.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from rich.console import Console
from torch.profiler import ProfilerAction, ProfilerActivity, record_function

from rlft.config.settings import Settings
from rlft.config.settings.profiling import PROFILE_FOLDER, ProfileSettings
from rlft.phase_ranges import open_ranges_with

RECORDING = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)


class _NoProfile:
    """The window of a run (or rank) that does not profile."""

    def __enter__(self) -> "_NoProfile":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def step(self) -> None:
        return None


NO_PROFILE = _NoProfile()


def window(settings: Settings, first_step: int, console: Console):
    """The profiler for this process's steps (`first_step`: the steps its run starts after), or `NO_PROFILE`."""
    profile, rank = settings.profile, settings.parallel.rank
    if not profile.records(rank):
        return NO_PROFILE
    if console.quiet:  # a rank above 0 prints nothing, but says where its trace went
        console = Console(stderr=True)
    return StepProfile(profile, rank, first_step, Path(settings.run.output_dir) / PROFILE_FOLDER, console,
                       torch.cuda.is_available())


def step_schedule(profile: ProfileSettings):
    """torch.profiler's schedule of the profiled steps: `schedule(n)` is the profiler's action during step n (from 0)."""
    with warnings.catch_warnings():  # warmup 0 (profiler_steps, as Axolotl) is chosen: torch's warning says nothing new
        warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
        return torch.profiler.schedule(wait=profile.wait, warmup=profile.warmup, active=profile.active, repeat=1)


class _Range:
    """A named range: a record_function (torch.profiler's trace) and/or an NVTX range (Nsight Systems)."""

    def __init__(self, name: str, record: bool, nvtx: bool):
        self.name, self.record, self.nvtx, self.function = name, record, nvtx, None

    def __enter__(self) -> None:
        if self.nvtx:
            torch.cuda.nvtx.range_push(self.name)
        if self.record:
            self.function = record_function(self.name)
            self.function.__enter__()

    def __exit__(self, *exc) -> None:
        if self.function is not None:
            self.function.__exit__(*exc)
        if self.nvtx:
            torch.cuda.nvtx.range_pop()


class StepProfile:
    """The profiler of one process over its steps (see the module's docstring)."""

    def __init__(self, profile: ProfileSettings, rank: int, first_step: int, folder: Path, console: Console, cuda: bool):
        self.profile, self.rank, self.first_step, self.folder, self.console = profile, rank, first_step, folder, console
        self.snapshots = profile.memory_snapshot and cuda
        self.activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self.schedule = step_schedule(profile)
        self.first, self.last = profile.recorded_steps(first_step)
        self.done = 0  # steps trained inside the window
        self.capturing = False  # inside the recorded steps: nsys's capture range and the memory history are on
        self.profiler: torch.profiler.profile | None = None
        self.step_range: _Range | None = None

    # ------------------------------------------------------------------ the Trainer's hooks
    def __enter__(self) -> "StepProfile":
        p = self.profile
        if p.trace or self.snapshots:
            self.folder.mkdir(parents=True, exist_ok=True)
        if p.memory_snapshot and not self.snapshots:
            self._say("no CUDA memory snapshot (this machine has no CUDA GPU): the trace's memory events record the host "
                      "memory allocations instead")
        if p.trace:
            self.profiler = torch.profiler.profile(
                activities=self.activities, schedule=self.schedule, on_trace_ready=self._save_trace,
                record_shapes=p.record_shapes, profile_memory=p.profile_memory, with_stack=p.with_stack)
            self.profiler.start()
        open_ranges_with(self._range)
        self._follow_schedule()
        self._begin_step()
        return self

    def step(self) -> None:
        """An optimizer step has finished."""
        self._end_step()
        self.done += 1
        if self.profiler is not None:
            self.profiler.step()  # after the last recorded step: the trace is saved
        self._follow_schedule()
        if self.over:  # the rest of the run: no profiler, and phases cost nothing again unless nsys wants its ranges
            self._stop_profiler()
            if not self.profile.nsys:
                open_ranges_with(None)
        self._begin_step()

    def __exit__(self, *exc) -> None:
        self._end_step()
        open_ranges_with(None)
        self._stop_profiler()  # inside the recorded steps: what was recorded is saved
        if self.capturing:
            self._stop_capture()
        if self.reached < self.first:
            keys = ("profiler_steps_start" if self.profile.keys == "profiler_steps" else
                    "profiler.sub_profiler_config.wait_steps or warmup_steps")
            self._say(f"nothing recorded: the run ended at step {self.reached}, before the first profiled step {self.first}; "
                      f"lower {keys}")

    # ------------------------------------------------------------------ steps and ranges
    @property
    def over(self) -> bool:
        """The recorded steps are behind."""
        p = self.profile
        return self.done >= p.wait + p.warmup + p.active

    @property
    def reached(self) -> int:
        """The last step trained (numbered as in metrics.jsonl)."""
        return self.first_step + self.done

    def _range(self, name: str) -> _Range:
        return _Range(name, record=self.profiler is not None, nvtx=self.profile.nsys)

    def _begin_step(self) -> None:
        if self.profile.nsys or not self.over:
            self.step_range = self._range(f"step {self.reached + 1}")
            self.step_range.__enter__()

    def _end_step(self) -> None:
        if self.step_range is not None:
            self.step_range.__exit__(None, None, None)
            self.step_range = None

    def _stop_profiler(self) -> None:
        if self.profiler is not None:
            self.profiler.stop()
            self.profiler = None

    def _follow_schedule(self) -> None:
        """Start or stop nsys's capture range and the memory history as the next step is recorded or not."""
        recording = self.schedule(self.done) in RECORDING
        if recording and not self.capturing:
            self.capturing = True
            if self.profile.nsys:
                torch.cuda.profiler.start()
            if self.snapshots:
                torch.cuda.memory._record_memory_history()
        elif self.capturing and not recording:
            self._stop_capture()

    def _stop_capture(self) -> None:
        self.capturing = False
        if self.profile.nsys:
            torch.cuda.profiler.stop()
            self._say(f"nsys's capture range (cudaProfilerStart/Stop) spanned {self._recorded()}")
        if self.snapshots:
            path = self.folder / f"rank{self.rank}.{self.first}.memory_snapshot.pickle"
            torch.cuda.memory._dump_snapshot(str(path))
            torch.cuda.memory._record_memory_history(enabled=None)
            self._say(f"{self._recorded()} recorded in {path.resolve()}")

    def _save_trace(self, profiler: torch.profiler.profile) -> None:
        path = self.folder / f"rank{self.rank}.{self.first}.pt.trace.json"
        profiler.export_chrome_trace(str(path))
        self._say(f"{self._recorded()} recorded in {path.resolve()}")

    # ------------------------------------------------------------------ what it says
    def _recorded(self) -> str:
        """The steps recorded so far, and why fewer than asked when the run ended inside them."""
        last = min(self.last, self.reached)
        steps = f"steps {self.first}-{last}" if last > self.first else f"step {self.first}"
        return steps + (f" (the run ended at step {self.reached}, before step {self.last})" if last < self.last else "")

    def _say(self, text: str) -> None:
        self.console.print(f"profile: rank {self.rank}: {text}", markup=False, highlight=False, soft_wrap=True)
