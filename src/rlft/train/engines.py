"""Which rollout engine an online-RL run samples from, from the `trl:` keys.

* `use_vllm: false` (default): rlft's in-process transformers engine (the policy's own weights in a
  synchronous run with a push every step, else a copy of them: `rlft.train.recipes.grpo_engine`).
* `use_vllm: true`, `vllm_mode: server` (default): a rollout server reached over HTTP; the trainer waits for it up
  to `vllm_server_timeout`, then finds which kind answers: rlft's (`rlft vllm-serve CONFIG`, transformers or vLLM
  backend: its /health reports a weight version), or a stock vLLM OpenAI server (`vllm serve`, which takes LoRA
  adapters only). With `vllm_group_port`, full weights travel to rlft's server through a collective group instead
  (gloo or NCCL).
* `use_vllm: true`, `vllm_mode: colocate`: vLLM inside the trainer process (needs vLLM and a CUDA GPU).
"""

from __future__ import annotations

import os
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from rlft.config.settings import Settings
from rlft.config.plugins import nemo_gym_enabled
from rlft.config.settings.rollout import ServerSettings
from rlft.errors import ConfigError, RolloutError
from rlft.rollout.engine import RolloutEngine
from rlft.models.weights import plain_state_dict
from rlft.rollout.remote import NotAnRlftServer, RemoteEngine
from rlft.rollout.server.protocol import DTYPES, dtype_name
from rlft.rollout.weight_group import TensorSpec
from rlft.rollout.server.colocated import ColocatedEngine
from rlft.rollout.server.security import local_token
from rlft.rollout.types import sampling_params
from rlft.rollout.vllm_openai import VLLMServerEngine


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
        token = server_token(cfg, s.server_port, s.server_host)
        engine = RemoteEngine(s.server_host, s.server_port, token=token,
                              on_note=lambda text: console.print(f"[yellow]note:[/yellow] {text}"))
        try:
            state = wait_for_server(engine, s, console)
        except NotAnRlftServer:
            engine.close()
            return stock_vllm(cfg, settings, console, token)
        console.print(f"rollout server: rlft's at {engine.base_url} ({state.get('backend')} backend, {state.get('model')})",
                      highlight=False, markup=False)
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


def stock_vllm(cfg, settings: Settings, console: Console, token: str | None) -> VLLMServerEngine:
    """The engine for a stock vLLM OpenAI server at the trainer's server address, once the run is one it can serve:
    a LoRA adapter synced as a folder, from base_model's own weights, with log-probs of the sampled distribution."""
    s = settings.rl
    engine = VLLMServerEngine(s.server_host, s.server_port, token=token or os.environ.get("VLLM_API_KEY"))
    try:
        found = engine.describe()
        console.print(f"rollout server: a stock vLLM {found['version']} OpenAI server at {engine.base_url}, serving "
                      f"{found['id']}: LoRA adapters load through /v1/load_lora_adapter", highlight=False, markup=False)
        stock_vllm_refusal(cfg, settings, engine.base_url)
        engine.check_serves(str(settings.model.base_model))
        engine.check_lora_support()
        engine.check_logprobs_mode(sampling_params(s, ()))
    except BaseException:
        engine.close()
        raise
    return engine


def stock_vllm_refusal(cfg, settings: Settings, where: str) -> None:
    """Raise when this run needs more than a stock vLLM server gives: it takes adapters, not full weights."""
    stock = f"the rollout server at {where} is a stock vLLM OpenAI server, which takes LoRA adapters but no full weights"
    rlft_server = "or start rlft's server there with `rlft vllm-serve CONFIG`"
    if not settings.model.adapter.kind:
        raise RolloutError(f"{stock}, and this run trains every weight: train a LoRA adapter synced as a folder "
                           f"(adapter: lora, trl.vllm_lora_sync: true), {rlft_server}")
    if settings.rl.group_port is not None:
        raise RolloutError(f"{stock}, and forms no weight group: remove trl.vllm_group_port (the adapter travels as a "
                           f"folder), {rlft_server}")
    if not settings.rl.lora_sync:
        raise RolloutError(f"{stock}, and without trl.vllm_lora_sync the adapter is sent merged into full weights: set "
                           f"trl.vllm_lora_sync: true, {rlft_server}")
    if settings.model.random_init:
        raise RolloutError(f"{stock}: it serves base_model's weights from disk, and random_init trains from other ones: "
                           f"save the initial weights to a folder and serve and train that, {rlft_server}")
    if nemo_gym_enabled(cfg) and cfg.nemo_gym_multi_turn:
        raise RolloutError(f"{stock}: NeMo Gym's agents need the token ids and weight version of every turn, which only "
                           "rlft's OpenAI routes report: start rlft's server there with `rlft vllm-serve CONFIG`")


def wait_for_server(engine, s, console: Console) -> dict:
    """Poll the server's /health until it answers or `vllm_server_timeout` passes, with a progress bar."""
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console,
                        transient=True, disable=not console.is_terminal)
    where = f"http://{s.server_host}:{s.server_port}"
    with progress:
        task = progress.add_task(f"waiting for the rollout server at {where}", total=s.server_timeout)
        if not console.is_terminal:
            console.print(f"waiting for the rollout server at {where} (up to {s.server_timeout:.0f} s)")
        return engine.wait_until_ready(s.server_timeout, on_progress=lambda elapsed: progress.update(task, completed=elapsed))


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
