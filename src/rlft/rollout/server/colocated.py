"""`trl.vllm_mode: colocate`: a server backend (vLLM) inside the trainer process, without HTTP.

The backend is the one `rlft vllm-serve` runs, with its engine thread; this adapter gives it the
RolloutEngine protocol and the same verification as the HTTP client: every weight or adapter load
must come back with the version sent and the checksum of what was sent (cast to the served dtype).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Awaitable, Mapping, TypeVar

import torch

from rlft.config.settings.rollout import ServerSettings
from rlft.errors import RolloutError
from rlft.models.weights import weights_checksum
from rlft.rollout.server.backends import load_backend
from rlft.rollout.server.protocol import GenerationRequest, ServerError
from rlft.rollout.server.transfer import check_against_model, read_adapter_folder
from rlft.rollout.types import Rollout, SamplingParams

T = TypeVar("T")


def _run(work: Awaitable[T]) -> T:
    """The backend's coroutine, on its engine thread; a refusal becomes the RolloutError a server answer would."""
    try:
        return asyncio.run(work)
    except ServerError as exc:
        raise RolloutError(f"the colocated engine refused: {exc.message}") from None


class ColocatedEngine:
    def __init__(self, backend, version: int = 0):
        self.backend = backend
        self.backend.weight_version = version

    @classmethod
    def from_config(cls, server: ServerSettings, version: int = 0) -> "ColocatedEngine":
        return cls(load_backend(server, "vllm"), version)

    @property
    def version(self) -> int:
        return self.backend.weight_version

    def weight_info(self) -> dict[str, Any]:
        return {"weight_version": self.backend.weight_version, "base_updated": self.backend.base_updated,
                "lora": self.backend.lora}

    def health(self) -> dict[str, Any]:
        dead = self.backend.dead()
        return {"ok": dead is None, "engine": f"colocated {self.backend.name}", "version": self.backend.weight_version,
                "checksum": self.backend.weight_checksum, **({"error": f"the engine is dead: {dead}"} if dead else {})}

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, num_samples: int = 1,
                 seed: int | None = None) -> Rollout:
        out = _run(self.backend.generate(GenerationRequest(prompt_ids, num_samples, params, seed)))
        expanded = [ids for ids in prompt_ids for _ in range(num_samples)]
        return Rollout(expanded, out.completion_ids, out.logprobs, out.truncated, weight_versions=[out.weight_version] * len(expanded))

    def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        tensors = {name: tensor.detach().to("cpu", self.backend.dtype).contiguous() for name, tensor in weights.items()}
        try:
            check_against_model(tensors, self.backend.parameter_shapes())
        except ServerError as exc:
            raise RolloutError(f"the colocated engine refused the weights: {exc.message}") from None
        self._confirm(_run(self.backend.load_weights(tensors, version)), weights_checksum(tensors), version, "weights")

    def relabel(self, version: int) -> None:
        _run(self.backend.relabel(self.backend.weight_version, version))

    def load_adapter(self, folder: str | Path, version: int) -> None:
        try:
            adapter = read_adapter_folder(str(folder), self.backend.max_lora_rank)
        except ServerError as exc:
            raise RolloutError(f"the colocated engine refused the adapter: {exc.message}") from None
        expected = weights_checksum({name: t.to(self.backend.lora_dtype) for name, t in adapter.tensors.items()})
        self._confirm(_run(self.backend.load_adapter(adapter, version)), expected, version, "LoRA adapter")

    def _confirm(self, loaded: str, expected: str, version: int, what: str) -> None:
        if loaded != expected or self.backend.weight_version != version:
            raise RolloutError(f"{what} sync of version {version}: the engine loaded checksum {loaded} (version "
                               f"{self.backend.weight_version}), the trainer sent {expected}")

    def close(self) -> None:
        self.backend.close()
