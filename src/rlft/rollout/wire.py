"""Tensors as safetensors bytes without copying them: the HTTP body of one weight bucket.

The safetensors format (https://huggingface.co/docs/safetensors): 8 bytes of header length (little endian), a JSON
header naming each tensor's dtype, shape and [begin, end) byte offsets in the data that follows, then the data. The
library writes a new bytes object holding every tensor and reads into new tensors: two copies of each bucket. Here
the sender hands the socket the header and then each tensor's own memory, and the receiver's tensors are views of
the body it received. Any file these bytes form is a valid safetensors file, and the other way round.
"""

from __future__ import annotations

import json
import math
import warnings
from typing import Any

import torch

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
          "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
NAMES = {dtype: name for name, dtype in DTYPES.items()}
CHUNK_BYTES = 8 * 2**20  # a socket write hands the kernel at most this (one write of 500 MB crawls: ~40x slower)


def encode(tensors: dict[str, torch.Tensor]) -> tuple[list[Any], int]:
    """(chunks, total bytes): the header, then each contiguous CPU tensor's bytes in place (memoryviews of at most
    CHUNK_BYTES)."""
    header: dict[str, Any] = {}
    offset = 0
    views = []
    for name in sorted(tensors):
        tensor = tensors[name]
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError(f"tensor {name!r} must be a contiguous CPU tensor")
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": NAMES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        if size:
            view = memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
            views.extend(view[start : start + CHUNK_BYTES] for start in range(0, size, CHUNK_BYTES))
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the library writes it
    head = len(text).to_bytes(8, "little") + text
    return [head, *views], len(head) + offset


def header(head: bytes, data_bytes: int) -> tuple[dict[str, tuple[torch.dtype, list[int], int, int]], int]:
    """({name: (dtype, shape, begin, end)}, where the data starts) from the bytes a body or file begins with (at
    least its first 8 + header length); `data_bytes`: how many bytes follow the header. ValueError when malformed."""
    if len(head) < 8:
        raise ValueError("shorter than its 8-byte header length")
    length = int.from_bytes(head[:8], "little")
    if length > len(head) - 8 or length > data_bytes + len(head):
        raise ValueError(f"its header of {length} bytes runs past the end of the body")
    try:
        entries = json.loads(head[8 : 8 + length])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"its header is not JSON ({exc})") from None
    if not isinstance(entries, dict):
        raise ValueError("its header is not a JSON object")
    out = {}
    for name, info in entries.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = DTYPES[info["dtype"]], [int(n) for n in info["shape"]], info["data_offsets"]
            if not (type(begin) is int and type(end) is int):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"tensor {name!r}: its header entry is not a dtype, shape and data_offsets") from None
        count = math.prod(shape)
        if not (0 <= begin <= end <= data_bytes and end - begin == count * dtype.itemsize) or min(shape, default=0) < 0:
            raise ValueError(f"tensor {name!r}: data_offsets {[begin, end]} do not hold a {info['dtype']} tensor of shape "
                             f"{shape} within the body")
        out[name] = (dtype, shape, begin, end)
    return out, 8 + length


def decode(body: bytes | bytearray) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors body, as views of `body` (they are copied into the model, never written);
    ValueError for anything that is not a well-formed body."""
    length = int.from_bytes(body[:8], "little") if len(body) >= 8 else 0
    entries, start = header(body[: 8 + length] if length <= len(body) - 8 else body, len(body) - 8 - length)
    tensors: dict[str, torch.Tensor] = {}
    for name, (dtype, shape, begin, end) in entries.items():
        count = math.prod(shape)
        if count == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        with warnings.catch_warnings():  # torch warns on read-only bytes: these views are only read
            warnings.simplefilter("ignore", UserWarning)
            tensors[name] = torch.frombuffer(body, dtype=dtype, count=count, offset=start + begin).view(shape)
    return tensors


def read_file_header(file) -> tuple[dict[str, tuple[torch.dtype, list[int], int, int]], int]:
    """`header` of an open safetensors file (binary, seekable)."""
    file.seek(0, 2)
    size = file.tell()
    file.seek(0)
    first = file.read(8)
    length = int.from_bytes(first, "little") if len(first) == 8 else 0
    head = first + file.read(min(length, max(size - 8, 0)))
    return header(head, size - len(head))


def read_tensor(file, start: int, dtype: torch.dtype, shape: list[int], begin: int, end: int) -> torch.Tensor:
    """One tensor of an open safetensors file, read into a fresh tensor (the file is not mapped into memory)."""
    tensor = torch.empty(shape, dtype=dtype)
    if end > begin:
        file.seek(start + begin)
        view = memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
        if file.readinto(view) != end - begin:
            raise ValueError("the file ends inside a tensor")
    return tensor
