"""Engines behind the rollout server, chosen by `vllm.backend` (auto -> vllm when it imports and CUDA is up)."""

from __future__ import annotations

import importlib.util

from rlft.errors import ConfigError


def choose_backend(requested: str) -> str:
    """The backend to run for `vllm.backend` / `--backend`."""
    if requested == "transformers":
        return "transformers"
    usable = importlib.util.find_spec("vllm") is not None and _cuda_available()
    if requested == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError("vllm.backend: vllm is not installed here: pip install vllm (on a CUDA machine), "
                              "or use --backend transformers")
        if not _cuda_available():
            raise ConfigError("vllm.backend: vllm needs a CUDA GPU and none is visible: use --backend transformers")
        return "vllm"
    return "vllm" if usable else "transformers"


def load_backend(cfg, name: str):
    """Build the backend `name` for config `cfg` (loads the model)."""
    if name == "vllm":
        from rlft.rollout.server.backends.vllm import VLLMBackend

        return VLLMBackend.from_config(cfg)
    from rlft.rollout.server.backends.transformers import TransformersBackend

    return TransformersBackend.from_config(cfg)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
