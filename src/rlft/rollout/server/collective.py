"""The server's side of the collective weight sync (`trl.vllm_group_port`): the handshake that forms the group, and
full updates received as broadcasts, bucket by bucket, straight into the engine.

`POST /init_weight_group` (token-guarded) takes the group port, the backend the trainer asks for and the names,
shapes and dtypes of every tensor it will send. A model of another shape is refused here, naming the first tensor
that differs. The server then keeps the rendezvous store on that port (a port in use is refused, naming it) and its
engine joins the group; it answers with the group's size, the trainer's rank and the store's key prefix, and the
trainer joins. A new handshake replaces the group of an earlier trainer.

`POST /update_weights_group` names the tensors of one update and its version; the engine receives the broadcasts,
loads each bucket, and answers with the checksum of what it read back, as every other path does. A broadcast that
fails or times out leaves no version served (as a transfer that stops part-way) and closes the group: the trainer
sends over HTTP from then on.
"""

from __future__ import annotations

import asyncio
import gc
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from pydantic import BaseModel, Field

from rlft.models.weights import ChecksumStream
from rlft.rollout.server.protocol import ServerError, dtype_name
from rlft.rollout.weight_group import (ALONE_BYTES, BUCKET_BYTES, TensorSpec, WeightGroup, bucket_plan, first_difference, host_store,
                                       receive_buckets)


class InitGroupBody(BaseModel):
    port: int = Field(ge=1, le=65535)
    backend: str = "gloo"  # gloo | nccl: what the trainer's tensors can take part in
    tensors: list[list[Any]]  # [name, shape, dtype] of every tensor the trainer will send
    timeout: float = Field(60.0, gt=0, le=3600)  # seconds any one broadcast may take


class GroupUpdateBody(BaseModel):
    version: int
    names: list[str]
    bucket_bytes: int = Field(BUCKET_BYTES, ge=1)
    alone_bytes: int = Field(ALONE_BYTES, ge=1)


class WeightGroupEndpoint:
    def __init__(self, backend):
        self.backend = backend
        self.specs: dict[str, TensorSpec] = {}
        self.store = None
        self.joining: asyncio.Future | None = None

    async def init(self, body: InitGroupBody, address: str) -> dict[str, Any]:
        """`address`: this server's address the trainer reached (the group's connections use it)."""
        try:
            specs = [TensorSpec.from_json(item) for item in body.tensors]
        except (ValueError, TypeError) as exc:
            raise ServerError(400, f"init_weight_group: tensors must be [name, shape, dtype] lists ({exc})") from None
        served = {name: (shape, dtype_name(dtype)) for name, (shape, dtype) in self.backend.parameter_shapes().items()}
        if reason := first_difference(specs, served):
            raise ServerError(400, f"the trainer and the server hold models of different shapes: {reason}: start the "
                                   "server with the trainer's base_model (and the trainer's vllm.dtype)")
        backend = "nccl" if body.backend == "nccl" and self.backend.group_device().type == "cuda" else "gloo"
        await self.close()  # a group of an earlier trainer: its peer is gone
        try:
            self.store = await asyncio.to_thread(reopened_store, body.port, body.timeout)
        except OSError as exc:
            raise ServerError(409, f"the weight group's port {body.port} on the server's machine is in use or cannot be "
                                   f"opened ({exc}): set trl.vllm_group_port to a free port") from None
        prefix = f"rlft-{secrets.token_hex(16)}/"
        world = self.backend.group_ranks + 1
        store, port = self.store, body.port
        self.specs = {spec.name: spec for spec in specs}
        def join() -> None:
            self.backend.join_group(store, port, prefix=prefix, world_size=world, backend=backend, timeout=body.timeout,
                                    address=address)
        # an engine in this process joins on a thread of its own: generation goes on while the trainer connects
        self.joining = asyncio.ensure_future(self.backend.on_engine(join) if self.backend.joins_on_engine
                                             else asyncio.to_thread(join))
        return {"world_size": world, "rank": world - 1, "prefix": prefix, "backend": backend}

    async def update(self, body: GroupUpdateBody) -> dict[str, Any]:
        if self.joining is None:
            raise ServerError(409, "no weight group is open: POST /init_weight_group first (or send over HTTP)")
        unknown = next((name for name in body.names if name not in self.specs), None)
        if unknown is not None or not body.names:
            raise ServerError(400, f"update_weights_group: {unknown!r} was not among the tensors of the handshake" if
                              unknown else "update_weights_group: no tensors named")
        try:
            await self.joining
        except Exception as exc:  # noqa: BLE001 - the join's own reason
            await self.close()
            raise ServerError(500, f"the engine could not join the weight group ({_reason(exc)}): send over HTTP") from None
        plan = bucket_plan([self.specs[name] for name in body.names], body.bucket_bytes, body.alone_bytes)
        try:
            loaded = await self.backend.on_engine(lambda: self.backend.receive_weights(plan, body.version))
        except Exception as exc:  # noqa: BLE001 - a broken group: the weights are in an unknown state
            await self.close()
            raise ServerError(500, f"the weight broadcast of version {body.version} failed ({_reason(exc)}): the served "
                                   "weights are in an unknown state and the group is closed: send them over HTTP") from None
        return {"weight_version": body.version, "weight_checksum": loaded, "received_checksum": loaded}

    async def close(self) -> None:
        if self.joining is not None:
            joining, self.joining = self.joining, None
            try:
                await joining  # a join still waiting for its peer fails within the group's timeout
            except Exception:  # noqa: BLE001 - a group that never formed has nothing to leave
                pass
            await self.backend.on_engine(self.backend.leave_group)
        self.store = None  # the port is free once the store is gone


def reopened_store(port: int, timeout: float, tries: int = 4):
    """`host_store` on `port`, which an earlier group of this server may still hold: a group left after a failed
    broadcast can stay referenced from the failure's traceback in a reference cycle, and its store keeps the port until
    the cycle is collected. Collect, wait a little and try again before calling the port taken (OSError)."""
    for attempt in range(tries):
        try:
            return host_store(port, timeout)
        except OSError:
            if attempt == tries - 1:
                raise
            gc.collect()
            time.sleep(0.5 * attempt)


class LocalGroupMember:
    """Group membership for an engine whose weights live in this process (the transformers backend): rank 0. The
    host class provides `weight_tensors()` and the ThreadedBackend update steps."""

    group_ranks = 1
    joins_on_engine = False  # the group is this process's own: no engine work to order it with
    _group: WeightGroup | None = None

    def group_device(self) -> torch.device:
        return next(iter(self.weight_tensors().values())).device

    def join_group(self, store, port: int, *, prefix: str, world_size: int, backend: str, timeout: float,
                   address: str) -> None:
        self._group = WeightGroup.join(store, prefix=prefix, rank=0, world_size=world_size, backend=backend,
                                       timeout=timeout, address=address)

    def leave_group(self) -> None:
        if self._group is not None:
            self._group.close()
            self._group = None

    def receive_weights(self, plan: list[list[TensorSpec]], version: int) -> str:
        """On the engine thread: receive every bucket into the model; the checksum of what it holds then. The
        checksum of one bucket is taken while the next arrives."""
        if self._group is None:
            raise ServerError(409, "the engine is not in a weight group")
        self.begin_now(version)
        stream = ChecksumStream()
        try:
            with ThreadPoolExecutor(1, thread_name_prefix="rlft-checksum") as hashing:
                hashed = None
                for part in receive_buckets(self._group, plan, self.group_device(), self.weight_tensors()):
                    readback = self.write_now(part, version)
                    del part  # its buffer goes before the next one comes
                    if hashed is not None:
                        hashed.result()
                    hashed = hashing.submit(stream.update, readback)
                if hashed is not None:
                    hashed.result()
        except BaseException:
            self.abandon_now()
            raise
        checksum = stream.hexdigest()
        self.end_now(version, checksum)
        return checksum


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ServerError):
        return exc.message
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
