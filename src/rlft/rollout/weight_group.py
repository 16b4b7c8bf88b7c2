"""A torch.distributed group of the trainer and the rollout server's engine, through which full weights travel as
bucketed broadcasts: gloo between CPUs, NCCL between CUDA GPUs (`trl.vllm_group_port`).

As in TRL's vLLM client, the server's engine workers are ranks 0..N-1 and the trainer the last rank; the server
keeps the rendezvous store on the group port of its machine. The group is its own (a store and a process group
made directly, not torch.distributed's default group), so a trainer running DDP keeps its own group untouched. The
store's keys live under a random prefix that only the trainer learns, in the handshake guarded by the server's
token: a process that reaches the port without it cannot join. Every collective waits at most `timeout`.

Both sides cut the same tensors into the same buckets (`bucket_plan`), in name order: a tensor of `ALONE_BYTES` or
more travels alone (the sender broadcasts the tensor it holds; the transformers backend receives into its
parameter, the vLLM backend into a buffer its reload copies from); smaller ones (norms, biases) travel together in flat buffers of up to `bucket_bytes`, so a model
of many small tensors does not pay a broadcast for each.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist

from rlft.errors import RolloutError

DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BUCKET_BYTES = 32 * 2**20  # the most small tensors travel together
ALONE_BYTES = 2**20  # a tensor this large or larger travels alone


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # a DTYPE_NAMES key

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * DTYPE_NAMES[self.dtype].itemsize

    def to_json(self) -> list:
        return [self.name, list(self.shape), self.dtype]

    @classmethod
    def from_json(cls, item) -> "TensorSpec":
        name, shape, dtype = item
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"tensor {name!r}: dtype {dtype!r} is not one of {sorted(DTYPE_NAMES)}")
        return cls(str(name), tuple(int(size) for size in shape), dtype)


def specs_of(tensors: dict[str, torch.Tensor]) -> list[TensorSpec]:
    names = {dtype: name for name, dtype in DTYPE_NAMES.items()}
    return [TensorSpec(name, tuple(tensor.shape), names[tensor.dtype]) for name, tensor in sorted(tensors.items())]


def bucket_plan(specs: list[TensorSpec], bucket_bytes: int, alone_bytes: int = ALONE_BYTES) -> list[list[TensorSpec]]:
    """Specs in name order: each of `alone_bytes` or more alone, the others grouped into buckets of one dtype and at
    most `bucket_bytes`."""
    buckets: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in sorted(specs, key=lambda spec: spec.name):
        alone = spec.nbytes >= alone_bytes
        if buckets[-1] and (alone or size + spec.nbytes > bucket_bytes or spec.dtype != buckets[-1][0].dtype
                            or buckets[-1][0].nbytes >= alone_bytes):
            buckets.append([])
            size = 0
        buckets[-1].append(spec)
        size += spec.nbytes
    return [bucket for bucket in buckets if bucket]


def send_buckets(group: "WeightGroup", plan: list[list[TensorSpec]], tensors: dict[str, torch.Tensor]) -> None:
    """The trainer's side: broadcast each bucket (`tensors` already in the served dtype, on the group's device)."""
    for bucket in plan:
        if len(bucket) == 1:
            group.broadcast(tensors[bucket[0].name].contiguous())
        else:
            group.broadcast(torch.cat([tensors[spec.name].reshape(-1) for spec in bucket]))


def receive_buckets(group: "WeightGroup", plan: list[list[TensorSpec]], device: torch.device,
                    targets: dict[str, torch.Tensor] | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """The engine's side: each bucket's tensors as they arrive. A tensor alone lands in place in `targets[name]` when
    that is a contiguous tensor of its shape, dtype and device (no copy at all); the others in a fresh flat buffer."""
    for bucket in plan:
        dtype = DTYPE_NAMES[bucket[0].dtype]
        target = targets.get(bucket[0].name) if targets is not None and len(bucket) == 1 else None
        if (target is not None and target.is_contiguous() and target.dtype == dtype and target.device == device
                and tuple(target.shape) == bucket[0].shape):
            group.broadcast(target)
            yield {bucket[0].name: target}
            continue
        buffer = torch.empty(sum(spec.nbytes for spec in bucket) // dtype.itemsize, dtype=dtype, device=device)
        group.broadcast(buffer)
        views, offset = {}, 0
        for spec in bucket:
            count = spec.nbytes // dtype.itemsize
            views[spec.name] = buffer[offset : offset + count].view(spec.shape)
            offset += count
        yield views
        del buffer, views  # before the next bucket's buffer: one at a time


def first_difference(sent: list[TensorSpec], served: dict[str, tuple[tuple[int, ...], str]]) -> str | None:
    """Why the trainer's tensors cannot load into the served model (the first tensor that differs), or None."""
    names = {spec.name for spec in sent}
    for spec in sorted(sent, key=lambda spec: spec.name):
        if spec.name not in served:
            return f"the trainer's tensor {spec.name!r} is not in the served model"
        shape, dtype = served[spec.name]
        if tuple(shape) != spec.shape:
            return f"tensor {spec.name!r} has shape {spec.shape} in the trainer and {tuple(shape)} in the served model"
        if dtype != spec.dtype:
            return f"tensor {spec.name!r} is {spec.dtype} in the trainer and {dtype} in the served model"
    missing = sorted(set(served) - names)
    if missing:
        return f"the served model's tensor {missing[0]!r} is not among the trainer's"
    return None


class WeightGroup:
    """This process's membership of a weight group: `rank` of `world_size`, source of broadcasts `source`."""

    def __init__(self, group, rank: int, world_size: int, timeout: float):
        self.group, self.rank, self.world_size, self.timeout = group, rank, world_size, timeout
        self.source = world_size - 1  # the trainer

    @classmethod
    def join(cls, store, *, prefix: str, rank: int, world_size: int, backend: str, timeout: float,
             address: str | None = None) -> "WeightGroup":
        """Join the group (blocks until every rank has); `address`: this machine's address the others reach (gloo)."""
        prefixed = dist.PrefixStore(prefix, store)
        wait = datetime.timedelta(seconds=timeout)
        if backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = wait
            group = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
        else:
            options = dist.ProcessGroupGloo._Options()
            options._timeout = wait
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=address or "127.0.0.1")]
            group = dist.ProcessGroupGloo(prefixed, rank, world_size, options)
        return cls(group, rank, world_size, timeout)

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast from the trainer into `tensor` (its data on the trainer), waiting at most `timeout`."""
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = self.source, 0
        work = self.group.broadcast([tensor], options)
        if not work.wait(datetime.timedelta(seconds=self.timeout)):
            raise RolloutError(f"a weight broadcast did not finish within {self.timeout:.0f} s")

    def close(self) -> None:
        """Leave the group: it is freed, and its connections closed, once no broadcast holds it (a broadcast in
        progress cannot be interrupted: it ends when the group's timeout passes)."""
        self.group = None


def connect_store(host: str, port: int, timeout: float):
    """The trainer's client of the server's rendezvous store."""
    try:
        return dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False)
    except (RuntimeError, dist.DistStoreError) as exc:
        raise RolloutError(f"cannot reach the weight group's store at {host}:{port} ({str(exc).splitlines()[0][:200]}): "
                           "open trl.vllm_group_port on the server's machine to the trainer, or unset it to send weights "
                           "over HTTP") from None


def host_store(port: int, timeout: float):
    """The server's rendezvous store on `port` (all interfaces); OSError when the port is taken."""
    try:
        return dist.TCPStore("0.0.0.0", port, is_master=True, timeout=datetime.timedelta(seconds=timeout),
                             wait_for_workers=False)
    except (RuntimeError, dist.DistStoreError) as exc:
        raise OSError(str(exc).splitlines()[0][:200]) from None
