"""Receiving weights: safetensors buckets streamed into the engine, shared paths and adapter folders, each checked
before it is loaded.

Only safetensors are ever read (never pickle / torch.load): a weight file cannot run code here.
Every transfer is verified against the checksum the sender computed (`weights_checksum`), and every
name and shape against the served model, before the backend sees it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Iterator

import torch
import xxhash
from safetensors import SafetensorError
from safetensors.torch import load_file

from rlft.models.weights import ChecksumStream, weights_checksum
from rlft.rollout import wire
from rlft.rollout.server.protocol import AdapterFiles, ServerError, dtype_name


def body_digest(chunks) -> str:
    """XXH3-64 of a request body (bytes, or the chunks it is sent as): damage on the way shows before anything is
    decoded."""
    digest = xxhash.xxh3_64()
    for chunk in [chunks] if isinstance(chunks, (bytes, bytearray)) else chunks:
        digest.update(chunk)
    return digest.hexdigest()


def decode_bucket(body: bytes | bytearray, where: str) -> dict[str, torch.Tensor]:
    """The tensors of one bucket, as views of its body (rlft.rollout.wire: no copy)."""
    try:
        return wire.decode(body)
    except ValueError as exc:
        raise ServerError(400, f"transfer corrupted: {where} is not valid safetensors ({exc}); nothing was loaded: send it again") from None


class StreamedTransfer:
    """One full-weight transfer over HTTP, loaded into the engine bucket by bucket as the buckets arrive: the server
    never holds a second copy of the model. Each bucket is checked before any of it is loaded: the XXH3-64 digest of
    its bytes (damage on the way), then every name and shape against the served model; a transfer of one bucket is
    checked against the sender's checksum too. The checksum of everything read back must equal the sender's at the
    last bucket. Buckets come in name order, so the checksum is taken as they come.

    Bucket k is answered once it is checked and queued on the engine thread, after bucket k-1 is loaded: the next
    bucket travels while this one loads, and at most two are held."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.version: int | None = None
        self.expected = self.received = 0
        self.stream = ChecksumStream()
        self.loading: asyncio.Future | None = None  # the load of the bucket before
        self.last_name: str | None = None  # the last tensor name of the bucket before

    async def add(self, body: bytes | bytearray, *, version: int, bucket: int, buckets: int, digest: str | None,
                  checksum: str | None) -> dict[str, Any] | None:
        """Check one bucket and queue its load; the answer of the whole transfer after the last, else None."""
        if buckets < 1 or not 0 <= bucket < buckets:
            raise ServerError(400, f"bucket {bucket} of {buckets}: bucket must be in 0..buckets-1")
        if bucket > 0 and ((version, buckets) != (self.version, self.expected) or bucket != self.received):
            waiting = f"bucket {self.received} of version {self.version}" if self.version is not None else "bucket 0"
            raise ServerError(400, f"bucket {bucket}/{buckets} of version {version} arrived while the server waits for "
                                   f"{waiting}: resend the transfer from bucket 0")
        try:
            part = await asyncio.to_thread(self._checked, body, version, bucket, buckets, digest, checksum)
            if bucket > 0:
                await self.loading  # in order, and a failed load fails the transfer here
        except ServerError:
            if bucket > 0:  # the buckets before were loaded: what is served is neither version
                await self.backend.on_engine(self.backend.abandon_now)
                self.version = None
            raise
        if bucket == 0:
            self.version, self.expected, self.received, self.stream = version, buckets, 0, ChecksumStream()
        self.received += 1
        self.last_name = max(part)
        last = bucket == buckets - 1
        self.loading = asyncio.ensure_future(self.backend.on_engine(lambda: self._load(part, version, bucket, last, checksum)))
        if not last:
            return None
        self.version = None
        loaded = await self.loading
        return {"weight_version": version, "weight_checksum": loaded, "received_checksum": loaded}

    def _checked(self, body: bytes | bytearray, version: int, bucket: int, buckets: int, digest: str | None,
                 checksum: str | None) -> dict[str, torch.Tensor]:
        where = f"bucket {bucket} of version {version}"
        if digest is not None and (arrived := body_digest(body)) != digest:
            raise ServerError(400, f"transfer corrupted: {where} arrived with digest {arrived}, the sender computed "
                                   f"{digest}; resend the transfer from bucket 0")
        part = decode_bucket(body, where)
        if buckets == 1 and checksum:
            verify_checksum(part, checksum, "weights")
        check_against_model(part, self.backend.parameter_shapes())
        first = min(part)
        if bucket > 0 and self.last_name is not None and first <= self.last_name:
            raise ServerError(400, f"tensor {first!r} of {where} comes after {self.last_name!r}: buckets must "
                                   "hold the tensors in name order, each once; resend from bucket 0")
        return part

    def _load(self, part: dict[str, torch.Tensor], version: int, bucket: int, last: bool, checksum: str | None) -> str | None:
        """On the engine thread."""
        if bucket == 0:
            self.backend.begin_now(version)
        self.stream.update(self.backend.write_now(part, version))
        if not last:
            return None
        loaded = self.stream.hexdigest()
        if checksum and loaded != checksum:
            self.backend.abandon_now()
            raise ServerError(400, f"transfer corrupted: the weights read back have checksum {loaded[:16]}..., the sender "
                                   f"computed {checksum[:16]}...; the served weights are in an unknown state: send them again")
        self.backend.end_now(version, loaded)
        return loaded


def verify_checksum(tensors: dict[str, torch.Tensor], claimed: str | None, what: str) -> str:
    """The checksum of what arrived; a mismatch with the sender's means the bytes changed on the way."""
    actual = weights_checksum(tensors)
    if claimed and actual != claimed:
        raise ServerError(400, f"transfer corrupted: the {what} received have checksum {actual[:16]}..., the sender "
                               f"computed {claimed[:16]}...; nothing was loaded: send them again")
    return actual


def check_against_model(tensors: dict[str, torch.Tensor], shapes: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> None:
    """Every name must exist in the served model with the same shape and dtype (400 naming the first bad one)."""
    if not tensors:
        raise ServerError(400, "the weight update holds no tensors")
    for name in sorted(tensors):
        tensor = tensors[name]
        if name not in shapes:
            raise ServerError(400, f"the served model has no weight {name!r}: the update comes from another model "
                                   f"(send plain state-dict names, as merged_weights() gives them)")
        shape, dtype = shapes[name]
        if tuple(tensor.shape) != shape:
            raise ServerError(400, f"weight {name!r} has shape {tuple(tensor.shape)}, the served model's is {shape}: "
                                   f"the update comes from another model size")
        if tensor.dtype != dtype:
            raise ServerError(400, f"weight {name!r} is {dtype_name(tensor.dtype)}, the server serves {dtype_name(dtype)}: "
                                   f"cast before sending (RemoteEngine.load_weights does)")


def weights_path_files(path: str) -> list[Path]:
    """The .safetensors file at `path`, or every *.safetensors file of the folder `path`."""
    source = Path(path).expanduser()
    if source.is_dir():
        files = sorted(source.glob("*.safetensors"))
        if not files:
            pickles = sorted(p.name for p in source.glob("*.bin")) + sorted(p.name for p in source.glob("*.pt"))
            hint = f" (it holds {', '.join(pickles[:3])}: pickle files are never read; save with safe_serialization=True)" if pickles else ""
            raise ServerError(400, f"{source} has no *.safetensors file{hint}")
        return files
    if source.is_file():
        if source.suffix != ".safetensors":
            raise ServerError(400, f"{source} is not a .safetensors file: only safetensors are read (never pickle)")
        return [source]
    raise ServerError(400, f"{source} does not exist on the server's machine: give a path both machines share")


class WeightsOnDisk:
    """The tensors of safetensors files, read a part at a time with plain reads (not memory-mapped: the files' pages
    stay out of the server's memory). Every name, shape and dtype is checked against the served model from the files'
    headers before any tensor is read."""

    def __init__(self, path: str, shapes: dict[str, tuple[tuple[int, ...], torch.dtype]]):
        self.files = {}  # file -> (entries, data start)
        self.where: dict[str, Path] = {}
        for file in weights_path_files(path):
            try:
                with open(file, "rb") as handle:
                    self.files[file] = wire.read_file_header(handle)
            except (OSError, ValueError) as exc:
                raise ServerError(400, f"cannot read {file} as safetensors: {exc}") from None
            for name in self.files[file][0]:
                if name in self.where:
                    raise ServerError(400, f"tensor {name!r} is in both {self.where[name]} and {file}: keep one copy of "
                                           "each tensor in the weights folder")
                self.where[name] = file
        if not self.where:
            raise ServerError(400, f"{path} holds no tensors")
        for name in sorted(self.where):
            dtype, shape, _, _ = self.files[self.where[name]][0][name]
            check_against_model({name: torch.empty(shape, dtype=dtype, device="meta")}, shapes)

    def parts(self, part_bytes: int = 64 * 2**20) -> Iterator[dict[str, torch.Tensor]]:
        """The tensors in name order, in parts of about `part_bytes`."""
        handles = {file: open(file, "rb") for file in self.files}
        try:
            part: dict[str, torch.Tensor] = {}
            size = 0
            for name in sorted(self.where):
                file = self.where[name]
                entries, start = self.files[file]
                dtype, shape, begin, end = entries[name]
                part[name] = wire.read_tensor(handles[file], start, dtype, shape, begin, end)
                size += end - begin
                if size >= part_bytes:
                    yield part
                    part, size = {}, 0
            if part:
                yield part
        finally:
            for handle in handles.values():
                handle.close()


def load_from_disk(backend, weights: WeightsOnDisk, version: int, claimed: str | None) -> str:
    """On the engine thread: every part into the engine; the checksum of what it read back, which must be `claimed`."""
    backend.begin_now(version)
    stream = ChecksumStream()
    try:
        for part in weights.parts():
            readback = backend.write_now(part, version)
            del part  # before the next part is read: one held at a time
            stream.update(readback)
    except (OSError, ValueError) as exc:
        backend.abandon_now()
        raise ServerError(400, f"reading the weights failed part-way ({exc}): the served weights are in an unknown state; "
                               "send them again") from None
    loaded = stream.hexdigest()
    if claimed and loaded != claimed:
        backend.abandon_now()
        raise ServerError(400, f"transfer corrupted: the weights read have checksum {loaded[:16]}..., the sender computed "
                               f"{claimed[:16]}... (a file changed while it was read?); the served weights are in an "
                               "unknown state: send them again")
    backend.end_now(version, loaded)
    return loaded


def read_adapter_folder(folder: str, max_lora_rank: int) -> AdapterFiles:
    """adapter_config.json + adapter_model.safetensors of a PEFT LoRA folder, its rank checked."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise ServerError(400, f"LoRA folder {path} does not exist on the server's machine: give a path both machines share")
    config_file, weights_file = path / "adapter_config.json", path / "adapter_model.safetensors"
    if not config_file.is_file():
        raise ServerError(400, f"{path} has no adapter_config.json: give the folder save_pretrained() wrote")
    if not weights_file.is_file():
        if (path / "adapter_model.bin").exists():
            raise ServerError(400, f"{path} holds adapter_model.bin (a pickle), which the server never reads: "
                                   "save the adapter with safe_serialization=True")
        raise ServerError(400, f"{path} has no adapter_model.safetensors")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ServerError(400, f"cannot read {config_file}: {exc}") from None
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise ServerError(400, f"{config_file}: peft_type {config.get('peft_type')!r} is not LORA; only LoRA adapters are served")
    ranks = [int(config.get("r", 8))] + [int(r) for r in (config.get("rank_pattern") or {}).values()]
    rank = max(ranks)
    if rank > max_lora_rank:
        raise ServerError(400, f"LoRA rank {rank} is above vllm.max_lora_rank={max_lora_rank}: "
                               "raise vllm.max_lora_rank or lower lora_r")
    try:
        tensors = load_file(str(weights_file))
    except (SafetensorError, OSError) as exc:
        raise ServerError(400, f"cannot read {weights_file}: {exc}") from None
    return AdapterFiles(str(path.resolve()), config, tensors, weights_checksum(tensors), rank)
