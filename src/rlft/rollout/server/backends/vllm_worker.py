"""rlft's vLLM worker extension (`vllm.worker_extension_cls`): the methods the vLLM backend calls in every engine worker
through `LLM.collective_rpc`, by name. vLLM mixes the class into its worker class, so `self` is the worker.

* `rlft_reload_from_file(path)`: read a safetensors file onto the model's device and reload those weights in place
  (the HTTP and shared-path syncs).
* `rlft_join_group(...)`, `rlft_receive_weights(plan, tied)`, `rlft_leave_group()`: the collective sync. Worker `rank`
  is rank `rank` of the weight group (the trainer is the last); the buckets are received on the model's device and
  handed to the reload as they arrive, and the checksum of what arrived is returned.

vLLM's in-place reload (`model_runner.reload_weights`) restores each layer's checkpoint-format parameters, loads, then
re-runs the layer's post-load processing: needed wherever vLLM repacks weights after loading (its CPU build packs
linear weights for oneDNN and frees the originals; quantized kernels do the same). Layers it gets nothing for keep
their weights. Older vLLMs without it get the weights through `model.load_weights`.

A class of the user's (`vllm.worker_extension_cls`) must subclass this one, so these methods stay.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import torch
from safetensors.torch import load_file

from rlft.models.weights import ChecksumStream
from rlft.rollout.weight_group import TensorSpec, WeightGroup, connect_store, receive_buckets


class WeightGroupWorker:
    def rlft_reload_from_file(self, path: str) -> None:
        self._rlft_reload(load_file(path, device=str(self._rlft_device())).items())

    def rlft_join_group(self, host: str, port: int, prefix: str, world_size: int, backend: str, timeout: float,
                        address: str) -> None:
        store = connect_store(host, port, timeout)
        rank = int(getattr(self, "rank", 0))
        self._rlft_group = WeightGroup.join(store, prefix=prefix, rank=rank, world_size=world_size, backend=backend,
                                            timeout=timeout, address=address)

    def rlft_leave_group(self) -> None:
        group = getattr(self, "_rlft_group", None)
        if group is not None:
            group.close()
        self._rlft_group = None

    def rlft_receive_weights(self, plan: list[list[list]], tied: list[list[str]]) -> str:
        """Receive every bucket of `plan` ([name, shape, dtype] lists) into the model; the checksum of what arrived."""
        group = getattr(self, "_rlft_group", None)
        if group is None:
            raise RuntimeError("this vLLM worker is not in a weight group")
        buckets = [[TensorSpec.from_json(item) for item in bucket] for bucket in plan]
        sent = {spec.name for bucket in buckets for spec in bucket}
        stream = ChecksumStream()

        def arriving() -> Iterator[tuple[str, torch.Tensor]]:
            for part in receive_buckets(group, buckets, self._rlft_device()):
                stream.update(part)
                for name, tensor in part.items():
                    yield name, tensor
                    for alias in _aliases(name, tied, sent):  # a tied layer gets nothing else: load it under each name
                        yield alias, tensor

        self._rlft_reload(arriving())
        return stream.hexdigest()

    def _rlft_runner(self):
        return getattr(self, "model_runner", None) or self.worker.model_runner

    def _rlft_device(self) -> torch.device:
        """The model's device (a parameter vLLM repacked may sit on `meta`: the runner's device is the one)."""
        runner = self._rlft_runner()
        device = getattr(runner, "device", None)
        if device is None:
            device = next(p.device for p in runner.get_model().parameters() if p.device.type != "meta")
        return torch.device(device)

    def _rlft_reload(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        runner = self._rlft_runner()
        if hasattr(runner, "reload_weights"):
            runner.reload_weights(weights_iterator=iter(weights))
        else:
            runner.get_model().load_weights(weights=iter(weights))


def _aliases(name: str, tied: list[list[str]], sent: set[str]) -> list[str]:
    """The other names of `name`'s tied group that were not sent themselves."""
    for names in tied:
        if name in names:
            return [other for other in names if other != name and other not in sent]
    return []
