"""What the profiler records (`rlft.train.profiling`), resolved from the `profiler:` section (Cosmos-RL's) or from
Axolotl's `profiler_steps` / `profiler_steps_start` (the rules allow one of the two)."""

from __future__ import annotations

from dataclasses import dataclass

PROFILE_FOLDER = "profile"  # under output_dir: the traces and memory snapshots


@dataclass(frozen=True)
class ProfileSettings:
    """The profiled steps count the optimizer steps this process trains: `wait` with the profiler off, `warmup` with it
    running and its records dropped, then `active` recorded, once (torch.profiler.schedule with repeat=1)."""

    trace: bool  # a torch.profiler trace (profiler.enable_profiler, or profiler_steps)
    nsys: bool  # profiler.enable_nsys: NVTX ranges, cudaProfilerStart/Stop around the recorded steps
    wait: int
    warmup: int
    active: int
    ranks: tuple[int, ...]  # the ranks that profile (rank_filter; empty: rank 0)
    record_shapes: bool
    profile_memory: bool
    with_stack: bool
    memory_snapshot: bool  # profiler_steps (Axolotl's): a CUDA memory snapshot over the recorded steps
    keys: str  # the keys that asked for it, for messages

    @property
    def on(self) -> bool:
        return self.trace or self.nsys

    def records(self, rank: int) -> bool:
        """Whether the process of rank `rank` profiles."""
        return self.on and rank in self.ranks

    def recorded_steps(self, first_step: int) -> tuple[int, int]:
        """The first and last optimizer step recorded (numbered as metrics.jsonl numbers them, from 1), for a process
        whose run starts after `first_step` steps (a resumed run: its checkpoint's step)."""
        start = first_step + self.wait + self.warmup + 1
        return start, start + self.active - 1


def profile_settings(cfg) -> ProfileSettings:
    """`profiler_steps` records that many steps after `profiler_steps_start`, as Axolotl's key description says
    (Axolotl's PytorchProfilerCallback, https://github.com/axolotl-ai-cloud/axolotl, stops a step sooner: it saves at
    the end of the step that brings the count to start + steps - 1)."""
    sub = cfg.profiler.sub_profiler_config
    ranks = tuple(sorted(set(sub.rank_filter))) or (0,)
    if cfg.profiler_steps:  # Axolotl's PytorchProfilerCallback: shapes, memory and stacks over the steps, no warm-up
        return ProfileSettings(trace=True, nsys=False, wait=cfg.profiler_steps_start or 0, warmup=0, active=cfg.profiler_steps,
                               ranks=ranks, record_shapes=True, profile_memory=True, with_stack=True, memory_snapshot=True, keys="profiler_steps")
    return ProfileSettings(trace=cfg.profiler.enable_profiler, nsys=cfg.profiler.enable_nsys, wait=sub.wait_steps,
                           warmup=sub.warmup_steps, active=sub.active_steps, ranks=ranks, record_shapes=sub.record_shape,
                           profile_memory=sub.profile_memory, with_stack=sub.with_stack, memory_snapshot=False, keys="profiler")


def profile_problems(profile: ProfileSettings, processes: int, cuda: bool) -> list[str]:
    """What this machine and launch cannot profile as asked, one sentence each."""
    problems = []
    if profile.nsys and not cuda:
        problems.append("profiler.enable_nsys: NVTX ranges and the cudaProfilerStart/Stop capture range are for Nsight "
                        "Systems on a CUDA GPU, and this machine has none (torch.cuda.is_available() is false): remove it; "
                        "profiler.enable_profiler writes a torch.profiler trace on a CPU too")
    missing = [rank for rank in profile.ranks if rank >= processes] if profile.on else []
    if missing:
        problems.append(f"profiler.sub_profiler_config.rank_filter names rank(s) {missing}, and this run has "
                        f"{processes} process(es) (ranks 0 to {processes - 1}): no process would profile them; list "
                        "ranks below the process count")
    return problems
