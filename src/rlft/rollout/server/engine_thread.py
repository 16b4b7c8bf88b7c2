"""The one thread that owns an engine: generation batches and weight changes, in arrival order.

HTTP handlers never block the event loop: they put an item on the queue and await its future. The
thread takes everything waiting at once; consecutive generation requests become one batch (the
backend decodes compatible ones together) and a weight change is run between two batches, never
inside one. A batch that fails as a whole is run again request by request, so that one request the
engine rejects fails alone. A weight update that arrives in parts (the buckets of a streamed transfer) holds
generation: requests wait until its last part is in, so none samples from half-updated weights.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Awaitable, Callable, TypeVar

import torch

from rlft.models.weights import ChecksumStream
from rlft.rollout.server.protocol import UNKNOWN_VERSION, AdapterFiles, Generated, GenerationRequest, ServerError

T = TypeVar("T")
RunBatch = Callable[[list[GenerationRequest]], list["Generated | BaseException"]]
_STOP = object()


class EngineThread:
    def __init__(self, run_batch: RunBatch, name: str = "rlft-engine"):
        self._run_batch = run_batch
        self._queue: queue.Queue = queue.Queue()
        self._held: tuple[float, float, Callable[[], None]] | None = None  # (deadline, timeout, on_stall) while held
        self._aside: list[tuple[GenerationRequest, Future]] = []  # generation waiting for the hold to end
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def hold(self, timeout: float, on_stall: Callable[[], None]) -> None:
        """On the engine thread: keep generation waiting until `release`. When no call comes for `timeout` s (the
        sender of the parts died), `on_stall` runs on this thread and generation goes on."""
        self._held = (time.monotonic() + timeout, timeout, on_stall)

    def release(self) -> None:
        """On the engine thread: end a hold; the waiting generation runs next."""
        self._held = None

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

    def _next(self) -> object:
        """The next item; while held, a stall (no call before the deadline) runs `on_stall` and ends the hold."""
        while self._held is not None:
            try:
                return self._queue.get(timeout=max(self._held[0] - time.monotonic(), 0.0))
            except queue.Empty:
                on_stall = self._held[2]
                stalled: Future = Future()
                return on_stall, stalled  # run as a call: it ends the hold, and what waited is decoded after it
        return self._queue.get()

    def _loop(self) -> None:
        while True:
            items = [self._next()]
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
                    (self._aside if self._held is not None else batch).append((work, future))
                    continue
                self._flush(batch)
                batch = []
                _settle(future, work)
                if self._held is not None:  # a call under a hold moves the deadline on
                    self._held = (time.monotonic() + self._held[1], *self._held[1:])
                elif self._aside:
                    batch, self._aside = self._aside, []
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
    and implements, for that thread, `_run_batch`, `_write_weights(tensors)` (copy them into the model; return the
    tensors to checksum: what the model holds now, read back where the backend can) and `_load_adapter(adapter,
    version)` (returning the checksum of what it loaded); `_before_full_update` and `_after_full_update` run around
    a full update.

    A full update comes whole (`load_weights`) or in parts (`begin_now`, `write_now` per bucket, `end_now`, or `abandon_now`):
    between the first part and the last, generation waits and the served version is UNKNOWN_VERSION, so a sender
    that dies half-way leaves a state no trainer accepts samples from."""

    _thread: EngineThread
    _shapes: dict[str, tuple[tuple[int, ...], torch.dtype]]
    weight_version: int
    weight_checksum: str | None
    base_updated: bool

    def parameter_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return self._shapes

    async def generate(self, request: GenerationRequest) -> Generated:
        return await self._while_alive(lambda: self._thread.generate(request))

    async def load_weights(self, tensors: dict[str, torch.Tensor], version: int) -> str:
        def whole() -> str:
            self.begin_now(version)
            stream = ChecksumStream()
            stream.update(self.write_now(tensors, version))
            self.end_now(version, stream.hexdigest())
            return stream.hexdigest()
        return await self.on_engine(whole)

    async def relabel(self, from_version: int, version: int) -> str | None:
        """The served weights stand for `version` too (the trainer's step changed nothing): the version moves on,
        between two generation batches, when the engine still serves `from_version`; the checksum stays."""
        def move() -> str | None:
            if self.weight_version != from_version or from_version == UNKNOWN_VERSION:
                raise ServerError(409, f"the server serves weight version {self.weight_version}, not {from_version}: send "
                                       "the weights instead")
            self.weight_version = version
            lora = getattr(self, "lora", None)
            if lora is not None:
                lora["version"] = version
            return self.weight_checksum
        return await self.on_engine(move)

    async def on_engine(self, function: Callable[[], T]) -> T:
        """`function` on the engine thread (between generation batches), or a 503 once the engine is dead."""
        return await self._while_alive(lambda: self._thread.call(function))

    # ---------------------------------------------------------------- on the engine thread: a full update in parts

    def begin_now(self, version: int, stall_timeout: float = 120.0) -> None:
        self._thread.hold(stall_timeout, self.abandon_now)
        self._before_full_update()
        self.weight_version, self.weight_checksum = UNKNOWN_VERSION, None

    def write_now(self, tensors: dict[str, torch.Tensor], version: int) -> dict[str, torch.Tensor]:
        try:
            return self._write_weights(tensors)
        except Exception as exc:  # noqa: BLE001 - names and shapes were checked; a part may hold new weights now
            self.abandon_now()
            raise ServerError(500, f"loading the weights of version {version} failed part-way ({type(exc).__name__}: "
                                   f"{exc}): the served weights are in an unknown state (version {UNKNOWN_VERSION}); "
                                   "send a full update or restart the server") from None

    def end_now(self, version: int, checksum: str) -> None:
        self._after_full_update()
        self.weight_version, self.weight_checksum, self.base_updated = version, checksum, True
        self._thread.release()

    def abandon_now(self) -> None:
        """A full update that stops part-way: some layers may hold new weights, so no version is served."""
        self.weight_version, self.weight_checksum, self.base_updated = UNKNOWN_VERSION, None, True
        self._thread.release()

    def _before_full_update(self) -> None:
        return None

    def _after_full_update(self) -> None:
        return None

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
