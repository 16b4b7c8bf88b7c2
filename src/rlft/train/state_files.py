"""The state files of a checkpoint, written and read so that reading one never runs code from it.

A checkpoint may come from someone else (a shared run folder, a download), and a pickle can run anything when it
is loaded. So:
  - the schedule state is JSON (`scheduler.json`);
  - the RNG states are tensors and plain numbers (`rng-R.pt`), read with `torch.load(weights_only=True)`;
  - the optimizer state is torch.distributed.checkpoint's folder, read through `SafeReader` / `SafePlanner`: its
    index (`.metadata`) with an unpickler that builds only the checkpoint format's own classes, and its non-tensor
    values (learning rates, betas) with `weights_only=True`; tensors are read that way by torch already.
Anything else in these files is refused with `UnsafeState`, naming the file. Files of earlier rlft versions
(`scheduler.pt`, `optimizer.pt`, numpy arrays in `rng.pt`) still load under the same rule.
"""

from __future__ import annotations

import io
import json
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, StorageMeta

SCHEDULER_FILE = "scheduler.json"
# numpy arrays (the RNG state in rng.pt of earlier versions): rebuilding an array runs no code
_NUMPY_GLOBALS = [np.ndarray, np.dtype, np._core.multiarray._reconstruct, type(np.dtype("uint32"))]


class UnsafeState(Exception):
    """A state file holds something that would only load by running code from the file."""


def load_tensors(path: Path) -> Any:
    """`torch.load` that only builds tensors, numbers, strings and containers (and numpy arrays)."""
    try:
        with torch.serialization.safe_globals(_NUMPY_GLOBALS):
            return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError:
        found = ", ".join(torch.serialization.get_unsafe_globals_in_checkpoint(path)) if _is_zip(path) else ""
        raise UnsafeState(f"{path.name} holds objects that load only by running code from the file"
                          + (f" ({found})" if found else "")) from None


def _is_zip(path: Path) -> bool:
    with open(path, "rb") as handle:
        return handle.read(4) == b"PK\x03\x04"


# ------------------------------------------------------------------ RNG

def rng_state() -> dict[str, Any]:
    """This process's python, numpy and torch RNG states as tensors and numbers."""
    version, internal, gauss = random.getstate()
    name, keys, position, has_gauss, cached = np.random.get_state()
    state = {"python": (version, torch.tensor(internal, dtype=torch.int64), gauss),
             "numpy": (name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(int(x) for x in internal), gauss))
    name, keys, position, has_gauss, cached = state["numpy"]
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else keys
    np.random.set_state((name, keys.astype(np.uint32), position, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ------------------------------------------------------------------ schedule

def scheduler_json(scheduler) -> str:
    """`scheduler.json`'s text: the schedule's state, taken with a checkpoint's snapshot and written by `write_scheduler`."""
    return json.dumps(scheduler.state_dict())


def write_scheduler(text: str, folder: Path) -> None:
    (folder / SCHEDULER_FILE).write_text(text)


def scheduler_state(folder: Path) -> dict[str, Any]:
    if (folder / SCHEDULER_FILE).exists():
        return json.loads((folder / SCHEDULER_FILE).read_text())
    return load_tensors(folder / "scheduler.pt")  # an earlier version's


# ------------------------------------------------------------------ optimizer (torch.distributed.checkpoint)

# the classes of DCP's index; each is a plain record (dataclasses, an enum, torch.Size, a path)
_DCP_MODULES = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "MetadataIndex", "TensorStorageMetadata", "BytesStorageMetadata",
                                              "ChunkStorageMetadata", "TensorProperties", "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
}


class _IndexUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _DCP_MODULES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)):
            return getattr(torch, name)
        raise UnsafeState(f".metadata refers to {module}.{name}, not part of a checkpoint index: loading it would mean "
                          "running code from the file")


def read_index(folder: Path):
    """The DCP index of `folder` (its `.metadata`), built without running code from it."""
    try:
        with open(folder / ".metadata", "rb") as handle:
            return _IndexUnpickler(handle).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError, IndexError) as exc:
        raise UnsafeState(f".metadata is not a readable checkpoint index ({type(exc).__name__}: {exc})") from None


class SafeReader(FileSystemReader):
    def read_metadata(self, *args: Any, **kwargs: Any):
        metadata = read_index(Path(self.path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafePlanner(DefaultLoadPlanner):
    """Non-tensor values (learning rates, betas, flags) are read with `weights_only=True`, not as free pickles."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError:
            raise UnsafeState(f"optimizer value {read_item.dest_index.fqn} holds objects that load only by running "
                              "code from the file") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def optimizer_files_problem(folder: Path) -> str | None:
    """Why the DCP folder `folder` cannot be read (a bad index, a missing or truncated shard), or None."""
    try:
        index = read_index(folder)
    except (OSError, UnsafeState) as exc:
        return f"optimizer/{exc}" if isinstance(exc, UnsafeState) else f"optimizer/.metadata is unreadable ({exc})"
    needed: dict[str, int] = {}
    for info in (getattr(index, "storage_data", None) or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in needed.items():
        shard = folder / name
        if not shard.is_file():
            return f"optimizer/{name} is missing"
        if shard.stat().st_size < size:
            return f"optimizer/{name} is truncated ({shard.stat().st_size} of {size} bytes)"
    return _values_problem(folder, index)


def _values_problem(folder: Path, index) -> str | None:
    """Read the index's non-tensor values (small: learning rates, betas) as a load would, safely."""
    for key, info in index.storage_data.items():
        if not isinstance(index.state_dict_metadata.get(key.fqn), BytesStorageMetadata) or info.transform_descriptors:
            continue
        with open(folder / info.relative_path, "rb") as handle:
            handle.seek(info.offset)
            value = io.BytesIO(handle.read(info.length))
        try:
            torch.load(value, weights_only=True)
        except pickle.UnpicklingError:
            return f"optimizer value {key.fqn} holds objects that load only by running code from the file"
        except (RuntimeError, EOFError, ValueError) as exc:
            return f"optimizer value {key.fqn} is unreadable ({type(exc).__name__})"
    return None
