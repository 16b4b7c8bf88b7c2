"""Engine work in order, inline (synchronous GRPO) or on one background thread (async prefetch).

The trainer enqueues two kinds of work: *sample* jobs (generate one batch of prompts, drawn on the main
thread) and *weight loads* (a snapshot of the trained weights, taken on the main thread when enqueued).
One worker runs them strictly in the order they were enqueued, so the weights every batch was sampled
with are fixed by that order, not by thread timing: batch j is sampled with every load enqueued before
it and none after. With `depth` d, the trainer keeps d sample jobs ahead of the batch it trains on;
the staleness of a batch is therefore exactly d generation batches (plus the sync interval), and a run
is reproducible and resumable exactly.

No collective and no access to the module being trained happens on the worker: it only runs the
engine (which holds its own weights). A failure on the worker is raised on the main thread at the next
call that waits for the worker.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable

from rlft.errors import RolloutError

WAIT_POLL_S = 0.5  # a wait on the worker re-checks that the worker is alive this often


class Prefetcher:
    """An ordered engine-work queue. `depth == 0`: every job runs inline when enqueued (synchronous GRPO)."""

    def __init__(self, depth: int):
        self.depth = depth
        self._ready: deque[Future] = deque()  # sample jobs enqueued and not yet taken, oldest first
        self._work: queue.Queue = queue.Queue()
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self.busy_s = 0.0  # seconds the worker spent on jobs (for the overlap metric)

    # ------------------------------------------------------------------ enqueue
    def submit_sample(self, job: Callable[[], Any]) -> None:
        """Enqueue a sample job; its result is taken, in order, by `take()`."""
        self._ready.append(self._enqueue(job))

    def submit_load(self, load: Callable[[], Any]) -> Future:
        """Enqueue a weight load (or any engine call that must fall between two batches). Without a worker (depth 0)
        the load runs now and its failure (or a Ctrl-C during it) is raised here: nobody waits on a load's result, and
        a lost failure would leave the engine sampling from the weights it had."""
        future = self._enqueue(load)
        if self.depth == 0:
            self._wait(future)
        return future

    def submit_part(self, job: Callable[[], Any]) -> Future:
        """Enqueue engine work that is not taken but read by a later sample job (the first share of a batch sampled in
        two, rlft.train.rollout_feed); jobs run in order, so it is done when that job runs."""
        return self._enqueue(job)

    def call(self, job: Callable[[], Any]) -> Any:
        """Run `job` after everything already enqueued and wait for its result (evaluation, dynamic-sampling draws)."""
        return self._wait(self._enqueue(job))

    @property
    def queued(self) -> int:
        """Sample jobs enqueued and not taken yet (finished or not)."""
        return len(self._ready)

    # ------------------------------------------------------------------ take
    def take(self) -> tuple[Any, float]:
        """The oldest sample job's result and the seconds the caller waited for it."""
        if not self._ready:
            raise RolloutError("internal: no rollout batch was enqueued before take()")
        began = time.perf_counter()
        result = self._wait(self._ready.popleft())
        return result, time.perf_counter() - began

    def drain(self) -> list[Any]:
        """Wait until every enqueued job has run; return the finished sample results (in order) without taking them."""
        marker = self._enqueue(lambda: None)
        self._wait(marker)
        return [self._wait(future) for future in self._ready]

    def replace_ready(self, results: list[Any]) -> None:
        """Put finished sample results back at the head of the queue (restored from a checkpoint)."""
        for result in reversed(results):
            future: Future = Future()
            future.set_result(result)
            self._ready.appendleft(future)

    def close(self) -> None:
        """Stop the worker after the job it is running: jobs still queued are cancelled, not run (the run is ending, on
        an error or Ctrl-C, and nobody will take their results)."""
        self._closed = True
        if self._thread is not None:
            while True:
                try:
                    item = self._work.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[1].cancel()
            self._work.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    # ------------------------------------------------------------------ internals
    def _enqueue(self, job: Callable[[], Any]) -> Future:
        if self._closed:
            raise RolloutError("internal: the rollout prefetcher is closed")
        future: Future = Future()
        if self.depth == 0:
            self._run(job, future)
            return future
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="rlft-rollouts", daemon=True)
            self._thread.start()
        self._work.put((job, future))
        return future

    def _run(self, job: Callable[[], Any], future: Future) -> None:
        began = time.perf_counter()
        try:
            future.set_result(job())
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread, raised there
            future.set_exception(exc)
        self.busy_s += time.perf_counter() - began

    def _loop(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            job, future = item
            if self._failure is not None:  # an earlier job failed: later ones would run on a broken state
                future.set_exception(self._failure)
                continue
            self._run(job, future)
            if future.exception() is not None:
                self._failure = future.exception()

    def _wait(self, future: Future) -> Any:
        while True:
            try:
                return future.result(timeout=WAIT_POLL_S)
            except TimeoutError:
                if self._thread is not None and not self._thread.is_alive():
                    raise RolloutError("the background rollout thread stopped unexpectedly") from None
