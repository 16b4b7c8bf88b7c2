"""The `vllm:` section: how `rlft vllm-serve` starts the rollout server (vLLM or transformers backend)."""

from __future__ import annotations

from typing import Literal, Optional

from rlft.config.axolotl_tables import VLLM, known_only
from rlft.config.base import field, planned

CUSTOM_SERVER = "custom vLLM server code"
REASONING = "reasoning transforms"


class VLLMConfig(known_only("AxolotlVllmKeys", VLLM)):
    """The `vllm:` section: how `rlft vllm-serve` starts the rollout server (vLLM or transformers backend)."""

    host: Optional[str] = field(
        "0.0.0.0",
        "Address the server listens on (0.0.0.0 = every interface; clients reach it as 127.0.0.1 on this machine).",
    )
    port: Optional[int] = field(8000, "Port the server listens on.", ge=1, le=65535)
    backend: Literal["auto", "transformers", "vllm"] = field(
        "auto",
        "Engine behind the server: vllm, transformers (any device, batched KV-cache decode), "
        "auto -> vllm when it imports and CUDA is available, else transformers.",
    )
    api_key: Optional[str] = field(
        None,
        "Token for weight-changing endpoints; env RLFT_SERVER_TOKEN; generated at start when bound beyond loopback and unset.",
    )
    tensor_parallel_size: Optional[int] = field(
        None,
        "Tensor-parallel GPUs per engine (vllm backend); None -> 1.",
        ge=1,
    )
    data_parallel_size: Optional[int] = field(
        None,
        "Engine replicas (data parallel); None -> 1. Only 1 is supported (start one server per replica).",
        ge=1,
    )
    gpu_memory_utilization: Optional[float] = field(
        None,
        "Fraction of GPU memory for the engine (vllm backend); None -> 0.9.",
        gt=0.0, le=1.0,
    )
    dtype: Optional[str] = field(
        "auto",
        "Engine weight dtype (auto, bfloat16, float16, float32); auto -> the model's dtype, float32 on CPU.",
    )
    max_model_len: Optional[int] = field(
        None,
        "Engine context length (prompt + completion); None -> the model's max_position_embeddings.",
        ge=1,
    )
    enable_prefix_caching: Optional[bool] = field(
        None,
        "Reuse KV cache across prompts sharing a prefix (vllm backend); None -> engine default.",
    )
    enforce_eager: Optional[bool] = field(
        None,
        "Disable CUDA-graph capture (vllm backend); None -> false.",
    )
    kv_cache_dtype: Optional[str] = field(
        None,
        "KV-cache dtype (e.g. fp8; vllm backend); None -> auto.",
    )
    serve_module: Optional[str] = planned(
        None,
        "Python module implementing the server; None -> rlft's rollout server.",
        what=CUSTOM_SERVER,
    )
    worker_extension_cls: Optional[str] = field(
        None,
        "vLLM worker extension class (module.Class) for weight sync, vllm backend; it must subclass "
        "rlft.rollout.server.backends.vllm_worker.WeightGroupWorker; None -> that class.",
    )
    enable_reasoning: Optional[bool] = planned(
        None,
        "Split reasoning content from answers in responses.",
        what=REASONING,
    )
    reasoning_parser: Optional[str] = planned(
        None,
        "vLLM reasoning parser name (with enable_reasoning).",
        what=REASONING,
    )
    max_lora_rank: Optional[int] = field(
        None,
        "Largest LoRA rank the engine accepts; None -> lora_r.",
        ge=1,
    )
    max_loras: int = field(2, "LoRA adapters kept loaded at once (vllm backend).", ge=1)
    lora_dtype: Optional[str] = field(
        "bfloat16",
        "Dtype of loaded LoRA adapters (vllm backend; the transformers backend runs them in the served dtype).",
    )
