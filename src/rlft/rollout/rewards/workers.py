"""Reward worker processes, used when `trl.reward_num_workers > 1`.

The rows are split into contiguous chunks scored by a persistent pool of "spawn" worker processes
(torch may be loaded here: fork is unsafe), each importing the user modules once (`_worker_main`,
which spawn imports by its module path, rlft.rollout.rewards.workers). Each worker runs the
functions on its own main thread, so a function's own `signal.alarm` works there. The parent
(RewardRunner) enforces the per-call timeout: a hung worker is terminated and replaced, a crashed
one replaced, and the functions it had not reached yet are re-sent.
"""

from __future__ import annotations

import importlib
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from rlft.errors import RolloutError
from rlft.rollout.rewards.calling import BadReturn, _invoke, coerce_scores, describe_exception

logger = logging.getLogger("rlft.rewards")

WORKER_BOOT_TIMEOUT_S = 120.0  # spawn + import torch/user modules on a slow machine
WORKER_STOP_TIMEOUT_S = 5.0


def _import_target(target: str) -> Callable:
    module_name, _, attr = target.rpartition(".")
    return getattr(importlib.import_module(module_name), attr)


def _worker_main(conn, cwd: str, targets: list[tuple[int, str]]) -> None:
    """A reward worker: import the functions once, then score (call_id, indices, rows...) messages until None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it stops us
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        os.chdir(cwd)
    except OSError:
        pass
    functions: dict[int, Callable] = {}
    problems: dict[int, str] = {}
    for index, target in targets:
        try:
            functions[index] = _import_target(target)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which runs it itself
            problems[index] = describe_exception(exc)
    conn.send(("ready", os.getpid(), problems))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if message is None:
            return
        call_id, indices, prompts, completions, completion_ids, columns = message
        for index in indices:
            try:
                output = _invoke(functions[index], prompts, completions, completion_ids, columns)
                reply = (call_id, index, "ok", coerce_scores(output))
            except BadReturn as exc:
                reply = (call_id, index, "error", f"BadReturn: {exc}")
            except BaseException as exc:  # noqa: BLE001 - SystemExit from user code is a failure too
                reply = (call_id, index, "error", describe_exception(exc))
            conn.send(reply)


@dataclass
class _Worker:
    process: Any
    conn: Any


@dataclass
class _Job:
    """Rows [start, stop) on one worker; `indices` are the functions not answered yet, the first one running."""

    start: int
    stop: int
    indices: list[int]
    payload: tuple
    deadline: float = math.inf


class _WorkerPool:
    def __init__(self, size: int, cwd: str, targets: list[tuple[int, str]]):
        self.context = multiprocessing.get_context("spawn")
        self.cwd = cwd
        self.targets = targets
        self.workers: list[_Worker | None] = [None] * size
        self.unavailable: dict[int, str] = {}
        for slot in range(size):  # start all, then wait: they boot in parallel
            self.workers[slot] = self._start(slot)
        deadline = time.monotonic() + WORKER_BOOT_TIMEOUT_S
        for slot in range(size):
            self._await_ready(slot, deadline)

    def _start(self, slot: int) -> _Worker:
        parent_conn, child_conn = self.context.Pipe(duplex=True)
        process = self.context.Process(target=_worker_main, args=(child_conn, self.cwd, self.targets),
                                       name=f"rlft-reward-worker-{slot}", daemon=True)
        process.start()
        child_conn.close()
        return _Worker(process, parent_conn)

    def _await_ready(self, slot: int, deadline: float) -> None:
        worker = self.workers[slot]
        assert worker is not None
        message = None
        while message is None and time.monotonic() < deadline:
            ready = multiprocessing.connection.wait([worker.conn, worker.process.sentinel],
                                                    timeout=max(deadline - time.monotonic(), 0.0))
            if worker.conn in ready or worker.conn.poll():
                try:
                    message = worker.conn.recv()
                except (EOFError, OSError):
                    break
            elif ready:  # the process ended without a word
                break
        if not message or message[0] != "ready":
            worker.process.join(1.0)
            exitcode = worker.process.exitcode
            self._stop(worker)
            self.workers[slot] = None
            state = (f"exited with code {exitcode} while starting (its traceback is printed above)" if exitcode is not None
                     else f"did not start within {WORKER_BOOT_TIMEOUT_S:g}s")
            raise RolloutError(
                f"reward worker process {state}. Workers are started with 'spawn', which re-imports the main script: "
                "a script that starts training must do so under `if __name__ == '__main__':`. "
                "Or set trl.reward_num_workers: 1 to score in this process"
            )
        for index, problem in message[2].items():
            if index not in self.unavailable:
                logger.warning("reward function %s cannot be imported in a worker process (%s): it runs in the main process",
                               dict(self.targets)[index], problem)
            self.unavailable[index] = problem

    def ensure(self, slot: int) -> _Worker:
        if self.workers[slot] is None or not self.workers[slot].process.is_alive():
            if self.workers[slot] is not None:
                self._stop(self.workers[slot])
            self.workers[slot] = self._start(slot)
            self._await_ready(slot, time.monotonic() + WORKER_BOOT_TIMEOUT_S)
        return self.workers[slot]

    def replace(self, slot: int) -> _Worker:
        if self.workers[slot] is not None:
            self._stop(self.workers[slot])
            self.workers[slot] = None
        return self.ensure(slot)

    @property
    def pids(self) -> list[int | None]:
        return [w.process.pid if w is not None else None for w in self.workers]

    @staticmethod
    def _stop(worker: _Worker, polite: bool = False) -> None:
        process = worker.process
        if polite and process.is_alive():
            try:
                worker.conn.send(None)
            except (OSError, ValueError):
                pass
            process.join(WORKER_STOP_TIMEOUT_S)
        if process.is_alive():
            process.terminate()
            process.join(1.0)
        if process.is_alive():
            process.kill()
            process.join(1.0)
        try:
            worker.conn.close()
        except OSError:
            pass

    def close(self) -> None:
        workers, self.workers = [w for w in self.workers if w is not None], [None] * len(self.workers)
        for worker in workers:  # ask all first, so they stop in parallel
            try:
                worker.conn.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + WORKER_STOP_TIMEOUT_S
        for worker in workers:
            worker.process.join(max(deadline - time.monotonic(), 0.0))
            self._stop(worker)

