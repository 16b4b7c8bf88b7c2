"""How a command ends: the state its signal handling keeps, the one line said for an error, and the exit code."""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NoReturn

from rlft.cli.consoles import err_console
from rlft.config.parallel import launched
from rlft.errors import RlftError, Terminated, TrainingInterrupted

INTERRUPTED = 130  # a Ctrl-C, as a shell reports a process that SIGINT ended
TERMINATED = 143  # SIGTERM, likewise


@dataclass
class CommandState:
    """What one command learns as it runs and its exit lines need.

    sigterm_seen: set by `stop_on_sigterm`'s handler; whatever error follows is reported as the SIGTERM.
    weights_only: set by `train` and `quickstart` once the config is read: True where the run's checkpoints hold the
    weights only (save_only_model), which the lines for a run stopped from outside say."""

    sigterm_seen: bool = False
    weights_only: bool = False


def resume_hint(state: CommandState) -> str:
    """What to do with the checkpoints of a run stopped outside its steps (SIGTERM, Ctrl-C, a failed process)."""
    if state.weights_only:
        return ("they hold the weights only (save_only_model: true): a new run can start from the newest one's model/ "
                "folder, none can resume")
    return "resume with --resume_from_checkpoint=auto"


@contextlib.contextmanager
def stop_on_sigterm(state: CommandState) -> Iterator[None]:
    """Within: SIGTERM raises Terminated, so that the run stops through its `finally` blocks (the servers and
    environments it started are stopped) and says why in one line. Python's default would end the process without a
    word, and a launched process would or would not print its own error depending on whether it saw its peer's death
    before the launcher's SIGTERM. Outside the main thread (where no handler can be set) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(*_) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # said once
        state.sigterm_seen = True  # a library may turn Terminated into an error of its own (torch's CheckpointException)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def report_error(exc: RlftError, state: CommandState) -> int:
    """One line for an rlft error (rank 0's only, for a run interrupted on every process), and the exit code."""
    if state.sigterm_seen:
        return stopped_by_sigterm(state)
    rank, processes = launched()
    if isinstance(exc, TrainingInterrupted) and rank != 0:
        return INTERRUPTED  # the processes stopped together: rank 0 says where the checkpoint is
    where = f" (rank {rank} of {processes})" if processes > 1 else ""
    err_console.print(f"error{where}:", style="bold red", end=" ")
    err_console.print(str(exc), markup=False, highlight=False)  # messages quote YAML like [ipo]: no markup
    return INTERRUPTED if isinstance(exc, TrainingInterrupted) else 1


def report_peer_failure(exc: BaseException) -> int:
    """One line for a training process whose collective failed because another process stopped first, and the exit
    code; the launcher's SIGTERM that follows a moment later says nothing more."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rank, processes = launched()
    lines = str(exc).splitlines() or [type(exc).__name__]
    line = next((text for text in lines if "by peer" in text), lines[0])  # DCP's exception: the failure is inside
    detail = re.sub(r"^\s*\[[^\]]*\]\s*", "", line).split(". ")[0][:160]  # gloo: "[file:line] what. advice"
    err_console.print(f"error (rank {rank} of {processes}): another training process stopped first, so this one cannot go on "
                      f"({detail}); that process's own error is above", markup=False, highlight=False)
    return 1


def interrupted_outside_the_steps(state: CommandState) -> int:
    err_console.print(f"interrupted outside the training steps: nothing to save beyond the checkpoints already written; "
                      f"{resume_hint(state)}", markup=False, highlight=False)
    return INTERRUPTED


def stopped_by_sigterm(state: CommandState) -> int:
    """One line for a run that SIGTERM stopped, and its exit status."""
    rank, processes = launched()
    where = f" (rank {rank} of {processes})" if processes > 1 else ""
    cause = ("the launcher stops every process when one fails, and that process's error is above; a scheduler does "
             "when it cancels the job") if processes > 1 else "a scheduler cancelling the job, or `kill`"
    err_console.print(f"error{where}: stopped by SIGTERM ({cause}). Checkpoints are written whole or not at all: "
                      f"{resume_hint(state)}", markup=False, highlight=False)
    return TERMINATED


def end_training_process(code: int) -> NoReturn:
    """A training process under a launcher ends without the interpreter's shutdown. In that shutdown gloo's threads
    could still hold work with tensors in it, and a run that had finished died of SIGABRT ("terminate called without
    an active exception", its launcher then failing the run), in a different test each time, with or without
    destroy_process_group first. The atexit handlers run (log handlers; trackers and checkpoints are closed before),
    then the process exits with `code`."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
