"""What travels between the HTTP layer and a backend: requests, results, errors, and the backend protocol."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from rlft.rollout.types import SamplingParams


UNKNOWN_VERSION = -1  # served after a weight update failed part-way: no trainer ever sent it, so its samples are refused


class ServerError(Exception):
    """A request the server refuses or cannot serve: answered as `{"error": message}` with `status`."""

    def __init__(self, status: int, message: str):
        self.status = status
        self.message = message
        super().__init__(message)


@dataclass
class GenerationRequest:
    """`n` samples of each prompt. With a `seed` the request is decoded alone after seeding, so it reproduces."""

    prompt_ids: list[list[int]]
    n: int
    params: SamplingParams
    seed: int | None = None
    top_logprobs: int = 0  # k most likely tokens per step (OpenAI routes); 0 = none


@dataclass
class Generated:
    """Prompt-major samples (the n of prompt 0 first) and the weights that produced them."""

    completion_ids: list[list[int]]
    logprobs: list[list[float]]
    truncated: list[bool]
    top_logprobs: list[list[list[tuple[int, float]]]] | None
    weight_version: int
    weight_checksum: str | None


@dataclass
class AdapterFiles:
    """A PEFT LoRA adapter as read from its folder (safetensors only)."""

    folder: str
    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    checksum: str  # weights_checksum of `tensors` as stored in the file
    rank: int


class ServingBackend(Protocol):
    """An engine the server drives. Generation and weight changes run on the backend's own thread, in arrival
    order, so an update always lands between two generation batches and never inside one."""

    name: str  # "transformers" | "vllm"
    model_name: str
    tokenizer: Any
    dtype: torch.dtype  # of the served base weights
    lora_dtype: torch.dtype  # of loaded adapter weights
    max_model_len: int
    max_lora_rank: int
    architecture: str  # architecture_digest of the base model's plain state dict
    vocab_size: int
    weight_version: int
    weight_checksum: str | None
    lora: dict[str, int] | None  # {"rank", "version"} of the loaded adapter
    base_updated: bool  # full weights were loaded since start: the base is no longer base_model's own

    def parameter_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]: ...

    async def generate(self, request: GenerationRequest) -> Generated: ...

    async def load_weights(self, tensors: dict[str, torch.Tensor], version: int) -> str: ...

    async def relabel(self, from_version: int, version: int) -> str | None: ...

    async def on_engine(self, function): ...  # run `function` on the engine thread, between generation batches

    # a full update in parts, on the engine thread (rlft.rollout.server.engine_thread.ThreadedBackend)
    def begin_now(self, version: int, stall_timeout: float = 120.0) -> None: ...

    def write_now(self, tensors: dict[str, torch.Tensor], version: int) -> dict[str, torch.Tensor]: ...

    def end_now(self, version: int, checksum: str) -> None: ...

    def abandon_now(self) -> None: ...

    # the weight group (rlft.rollout.server.collective): ranks it takes, whether joining is engine work, its device
    group_ranks: int
    joins_on_engine: bool

    def group_device(self) -> torch.device: ...

    def join_group(self, store, port: int, *, prefix: str, world_size: int, backend: str, timeout: float,
                   address: str) -> None: ...

    def leave_group(self) -> None: ...

    def receive_weights(self, plan, version: int) -> str: ...  # on the engine thread; the checksum of what it loaded

    async def load_adapter(self, adapter: AdapterFiles, version: int) -> str: ...

    async def reset_prefix_cache(self) -> None: ...

    def dead(self) -> str | None: ...  # why the engine can no longer generate; None while it can

    def close(self) -> None: ...


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


DTYPES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "half": torch.float16, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
