"""Which rollout engine an online-RL run samples from, from the `trl:` keys.

* `use_vllm: false` (default): rlft's in-process transformers engine (a copy of the trained weights).
* `use_vllm: true`, `vllm_mode: server` (default): a rollout server started with `rlft vllm-serve CONFIG`
  (transformers or vLLM backend), reached over HTTP; the trainer waits for it up to `vllm_server_timeout`. With
  `vllm_group_port`, full weights travel through a collective group with the server instead (gloo or NCCL).
* `use_vllm: true`, `vllm_mode: colocate`: vLLM inside the trainer process (needs vLLM and a CUDA GPU).
"""

from __future__ import annotations

import os
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from rlft.config.settings import Settings
from rlft.config.settings.rollout import ServerSettings
from rlft.errors import ConfigError
from rlft.rollout.engine import RolloutEngine
from rlft.models.weights import plain_state_dict
from rlft.rollout.remote import RemoteEngine
from rlft.rollout.server.protocol import DTYPES, dtype_name
from rlft.rollout.weight_group import TensorSpec
from rlft.rollout.server.colocated import ColocatedEngine
from rlft.rollout.server.security import local_token


def server_token(cfg, port: int, host: str = "127.0.0.1") -> str | None:
    """vllm.api_key, else RLFT_SERVER_TOKEN, else the token a server on this machine generated for that port (only for
    a server on this machine: it is not sent elsewhere)."""
    here = host in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::")
    return cfg.vllm.api_key or os.environ.get("RLFT_SERVER_TOKEN") or (local_token(port) if here else None)


def engine_factory(cfg, settings: Settings, console: Console) -> tuple[Callable[..., RolloutEngine] | None, bool]:
    """(make_engine(policy, version), whether that engine holds a plain model of its own); (None, False) for the
    default in-process engine."""
    s = settings.rl
    if not s.use_vllm:
        return None, False
    if s.vllm_mode == "colocate":
        return colocated_vllm(settings.server), True

    def connect(policy, version: int) -> RolloutEngine:
        engine = RemoteEngine(s.server_host, s.server_port, token=server_token(cfg, s.server_port, s.server_host),
                              on_note=lambda text: console.print(f"[yellow]note:[/yellow] {text}"))
        wait_for_server(engine, s, console)
        engine.check_serves(policy)  # another model behind that port: say so before sending it weights
        if s.group_port is not None:
            open_weight_group(engine, policy, s.group_port, console)
        return engine

    return connect, True


def open_weight_group(engine: RemoteEngine, policy, port: int, console: Console) -> None:
    """Form the collective weight group (trl.vllm_group_port) over the policy's plain weights in the served dtype."""
    dtype = dtype_name(DTYPES[engine.weight_info()["dtype"]])
    specs = [TensorSpec(name, tuple(tensor.shape), dtype) for name, tensor in sorted(plain_state_dict(policy).items())]
    backend = engine.open_group(port, specs)
    console.print(f"full weights go to the rollout server as {backend} broadcasts (weight group on port {port}; HTTP if "
                  "the group breaks)")


def wait_for_server(engine, s, console: Console) -> None:
    """Poll the server's /health until it answers or `vllm_server_timeout` passes, with a progress bar."""
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console,
                        transient=True, disable=not console.is_terminal)
    where = f"http://{s.server_host}:{s.server_port}"
    with progress:
        task = progress.add_task(f"waiting for the rollout server at {where}", total=s.server_timeout)
        if not console.is_terminal:
            console.print(f"waiting for the rollout server at {where} (up to {s.server_timeout:.0f} s)")
        engine.wait_until_ready(s.server_timeout, on_progress=lambda elapsed: progress.update(task, completed=elapsed))


def colocated_vllm(server: ServerSettings) -> Callable[..., RolloutEngine]:
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise ConfigError(
            "trl.vllm_mode: colocate runs vLLM inside the trainer, and vLLM is not installed here: install it with "
            "`pip install 'rlft[vllm]' -c constraints.txt` on a machine with a CUDA GPU, use vllm_mode: server with "
            "`rlft vllm-serve CONFIG` (its transformers backend runs anywhere), or set trl.use_vllm: false for rlft's "
            "in-process transformers engine") from None
    def make(policy, version: int) -> RolloutEngine:
        return ColocatedEngine.from_config(server, version=version)

    return make
