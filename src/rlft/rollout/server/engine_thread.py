"""The one thread that owns an engine: generation batches and weight changes, in arrival order.

HTTP handlers never block the event loop: they put an item on the queue and await its future. The
thread takes everything waiting at once; consecutive generation requests become one batch (the
backend decodes compatible ones together) and a weight change is run between two batches, never
inside one. A batch that fails as a whole is run again request by request, so that one request the
engine rejects fails alone.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from concurrent.futures import Future
from typing import Any, Awaitable, Callable, TypeVar

import torch

from rlft.rollout.server.protocol import UNKNOWN_VERSION, AdapterFiles, Generated, GenerationRequest, ServerError

T = TypeVar("T")
RunBatch = Callable[[list[GenerationRequest]], list["Generated | BaseException"]]
_STOP = object()


class EngineThread:
    def __init__(self, run_batch: RunBatch, name: str = "rlft-engine"):
        self._run_batch = run_batch
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    async def generate(self, request: GenerationRequest) -> Generated:
        future: Future = Future()
        self._queue.put((request, future))
        return await asyncio.wrap_future(future)

    async def call(self, function: Callable[[], T]) -> T:
        """Run `function` on the engine thread between two generation batches."""
        future: Future = Future()
        self._queue.put((function, future))
        return await asyncio.wrap_future(future)

    def run_now(self, function: Callable[[], T]) -> T:
        """`call` for code that is not on the event loop (start-up)."""
        future: Future = Future()
        self._queue.put((function, future))
        return future.result()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            items = [self._queue.get()]
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            batch: list[tuple[GenerationRequest, Future]] = []
            for item in items:
                if item is _STOP:
                    self._flush(batch)
                    return
                work, future = item
                if not future.set_running_or_notify_cancel():  # the client went away: drop its work
                    continue
                if isinstance(work, GenerationRequest):
                    batch.append((work, future))
                    continue
                self._flush(batch)
                batch = []
                _settle(future, work)
            self._flush(batch)

    def _flush(self, batch: list[tuple[GenerationRequest, Future]]) -> None:
        if not batch:
            return
        requests = [request for request, _ in batch]
        try:
            results = self._run_batch(requests)
        except Exception as exc:  # noqa: BLE001 - one request the engine refuses must not fail the others with it
            results = [exc] if len(batch) == 1 else [self._alone(request) for request in requests]
        except BaseException as exc:  # noqa: BLE001 - handed to every waiting request, never lost
            results = [exc] * len(batch)
        for (_, future), result in zip(batch, results):
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

    def _alone(self, request: GenerationRequest) -> "Generated | BaseException":
        try:
            return self._run_batch([request])[0]
        except BaseException as exc:  # noqa: BLE001 - this request's own failure, handed to it
            return exc


def _settle(future: Future, function: Callable[[], Any]) -> None:
    try:
        future.set_result(function())
    except BaseException as exc:  # noqa: BLE001 - reported to the waiting handler
        future.set_exception(exc)


class ThreadedBackend:
    """The async face of a backend whose work all runs on one EngineThread. A subclass sets `_thread` and `_shapes`
    and implements, for that thread, `_run_batch`, `_load_weights(tensors, version)` and `_load_adapter(adapter,
    version)` (each returning the checksum of what it loaded)."""

    _thread: EngineThread
    _shapes: dict[str, tuple[tuple[int, ...], torch.dtype]]

    def parameter_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return self._shapes

    async def generate(self, request: GenerationRequest) -> Generated:
        return await self._while_alive(lambda: self._thread.generate(request))

    async def load_weights(self, tensors: dict[str, torch.Tensor], version: int) -> str:
        return await self._while_alive(lambda: self._thread.call(lambda: self._load_weights(tensors, version)))

    async def load_adapter(self, adapter: AdapterFiles, version: int) -> str:
        self._check_alive()
        if getattr(self, "weight_version", None) == UNKNOWN_VERSION:  # an adapter on a half-loaded base: no valid version
            raise ServerError(409, "the served base weights are in an unknown state (a full update failed part-way): send "
                                   "a full update before an adapter, or restart the server")
        return await self._while_alive(lambda: self._thread.call(lambda: self._load_adapter(adapter, version)))

    def dead(self) -> str | None:
        """Why the engine can no longer generate (the server answers /health with 503 and this reason), else None."""
        return None if self._thread.alive else "its engine thread has stopped"

    def _check_alive(self) -> None:
        """503 for work sent to a dead engine, rather than an error from inside it (or a wait for ever)."""
        if reason := self.dead():
            raise ServerError(503, f"the engine is dead: {reason}")

    async def _while_alive(self, start: Callable[[], Awaitable[T]], poll_s: float = 1.0) -> T:
        """`start()`'s result, or a 503 once the engine dies under it: work caught in a dead engine (vLLM leaves a batch
        in flight waiting for ever when its engine-core process is killed) is answered, not left hanging."""
        self._check_alive()
        work = asyncio.ensure_future(start())
        while True:
            done, _ = await asyncio.wait({work}, timeout=poll_s)
            if done:
                return work.result()
            if self.dead():
                work.cancel()  # nobody waits for it any more
                self._check_alive()

    def close(self) -> None:
        self._thread.stop()
