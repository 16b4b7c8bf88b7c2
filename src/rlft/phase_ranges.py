"""Named ranges around the phases of a training step (generate, reward, logprobs, forward_backward, optimizer,
weight_sync, ...: the names of the `time/*` metrics), for a profiler's timeline.

`with phase_range("generate"): ...` opens nothing unless a profiler has switched the ranges on
(`rlft.train.profiling`): a run that does not profile pays one function call and a shared do-nothing context per phase.
While a profiler records, each range is a `torch.profiler.record_function` (a row in the trace) and, for Nsight
Systems, an NVTX range. It lives below every layer so that the rollout code, which runs some of the phases, can mark
them too.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Callable

_NOTHING = nullcontext()  # stateless: one instance serves every phase of a run that does not profile
_opener: Callable[[str], AbstractContextManager] | None = None


def phase_range(name: str) -> AbstractContextManager:
    """A range named `name` on the profiler's timeline while a profiler records, else a context that does nothing."""
    return _NOTHING if _opener is None else _opener(name)


def open_ranges_with(opener: Callable[[str], AbstractContextManager] | None) -> None:
    """Make `phase_range` open its ranges with `opener(name)` (None: open nothing). The profiler sets it for its
    recording and clears it after."""
    global _opener
    _opener = opener


def ranges_open() -> bool:
    """Whether `phase_range` opens ranges (a profiler is recording)."""
    return _opener is not None
