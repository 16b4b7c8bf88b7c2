"""`rlft vllm-serve` (alias `serve`): serve base_model for rollouts over HTTP."""

from __future__ import annotations

import argparse

from pydantic import ValidationError

from rlft.cli.config_file import load_run_config
from rlft.cli.consoles import console
from rlft.cli.exit import CommandState
from rlft.config.settings.rollout import server_settings
from rlft.errors import ConfigError
from rlft.rollout.server.launch import serve as run_server

SERVE_FLAGS = ("host", "port", "tensor_parallel_size", "data_parallel_size", "gpu_memory_utilization", "dtype", "max_model_len",
               "enable_prefix_caching", "enforce_eager", "backend", "api_key")


def serve(args: argparse.Namespace, state: CommandState) -> int:
    cfg = load_run_config(args.config, args.overrides)
    for name in SERVE_FLAGS:  # flags override the `vllm:` section (booleans too, when given as --no-...)
        value = getattr(args, name)
        if value is not None:
            try:
                setattr(cfg.vllm, name, value)
            except ValidationError as exc:
                raise ConfigError(f"--{name.replace('_', '-')} {value}: {exc.errors()[0]['msg']}") from None
    return run_server(server_settings(cfg), console, backend_name=cfg.vllm.backend)
