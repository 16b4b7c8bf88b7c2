"""The profiler keys: the `profiler:` section (Cosmos-RL's ProfilerConfig, same names and defaults) and Axolotl's
`profiler_steps` / `profiler_steps_start`. What they record and where: docs/training.md#profiling."""

from __future__ import annotations

from typing import Optional

from pydantic import field_validator

from rlft.config.base import Section, field, planned


class SubProfilerConfig(Section):
    """`profiler.sub_profiler_config`: which optimizer steps and ranks are profiled, and what the trace holds."""

    do_profile: bool = planned(
        False, "Cosmos-RL's switch that its controller sets while a run trains (`profile set`): rlft has no controller; "
               "profiler.enable_profiler profiles from the run's start. Default false.",
        what="switching the profiler on while a run trains, from Cosmos-RL's controller")
    active_steps: int = field(1, "Optimizer steps recorded in the trace, after the wait and warm-up steps. Default 1.", ge=1)
    warmup_steps: int = field(
        1, "Optimizer steps before the recorded ones with the profiler running and its records dropped, so its start-up "
           "cost stays out of the trace. Default 1.", ge=0)
    wait_steps: int = field(1, "Optimizer steps at the run's start with the profiler off. Default 1.", ge=0)
    rank_filter: list[int] = field(
        default_factory=list, description="The ranks (processes) that profile; empty: rank 0 only (as Cosmos-RL). "
                                          "Default [].")
    record_shape: bool = field(False, "Record each operator's input shapes in the trace. Default false.")
    profile_memory: bool = field(False, "Record tensor allocations and frees (host memory, and GPU memory on a GPU) in "
                                        "the trace. Default false.")
    with_stack: bool = field(False, "Record the Python calls that led to each operator (file and line), each nn.Module "
                                    "call as a range of its own. Default false.")
    with_modules: bool = field(False, "torch.profiler's module hierarchy of each operator, which it records for TorchScript "
                                      "models only; rlft trains eager models, so true is refused: with_stack shows each "
                                      "nn.Module call as a range. Default false.")

    @field_validator("rank_filter")
    @classmethod
    def _ranks(cls, ranks: list[int]) -> list[int]:
        if negative := [rank for rank in ranks if rank < 0]:
            raise ValueError(f"ranks count from 0, and {negative} are below it")
        return ranks


class ProfilerConfig(Section):
    """The `profiler:` section (Cosmos-RL's): a torch.profiler trace and NVTX ranges over a few optimizer steps."""

    enable_profiler: bool = field(
        False, "Write a torch.profiler trace (Chrome trace JSON, opened by Perfetto and TensorBoard) of the steps "
               "sub_profiler_config chooses to output_dir/profile/, with rlft's phases as named ranges. Default false.")
    enable_nsys: bool = field(
        False, "For Nsight Systems (`nsys profile --capture-range=cudaProfilerApi`): NVTX ranges per step and phase, and "
               "cudaProfilerStart/Stop around the steps sub_profiler_config records. CUDA GPUs only. Default false.")
    sub_profiler_config: SubProfilerConfig = field(
        default_factory=SubProfilerConfig, description="Which steps and ranks are profiled, and what the trace holds.")


class ProfilerFields(Section):
    """The profiler keys of the config file."""

    profiler: ProfilerConfig = field(
        default_factory=ProfilerConfig, description="torch.profiler trace and Nsight Systems ranges (Cosmos-RL's "
                                                    "section): docs/training.md#profiling.")
    profiler_steps: Optional[int] = field(
        None, "Axolotl's profiler: a torch.profiler trace (shapes, memory, stacks) of this many optimizer steps and, on a "
              "CUDA GPU, a CUDA memory snapshot over them (https://pytorch.org/memory_viz), in output_dir/profile/; the "
              "ranks of profiler.sub_profiler_config.rank_filter. Unset or 0: off.", ge=0)
    profiler_steps_start: Optional[int] = field(
        0, "Optimizer steps trained before profiler_steps starts recording. Default 0.", ge=0)
