"""`rlft vllm-serve CONFIG`: bind the port, load the model, serve until Ctrl-C / SIGTERM (exit 0).

The port is bound before the model loads, so a port in use is reported at once and never after
minutes of loading; the bound socket is handed to uvicorn, so no other process can take it between.
"""

from __future__ import annotations

import signal
import socket
import sys
import time
from typing import Any

import uvicorn

from rlft.config.settings.rollout import ServerSettings
from rlft.errors import ConfigError, RlftError
from rlft.heap import collector_paused
from rlft.models.loading import hub_revision
from rlft.data.tokenizer import end_ids
from rlft.rollout.server.app import build_app
from rlft.rollout.server.backends import choose_backend, load_backend
from rlft.rollout.server.security import TOKEN_ENV, resolve_token, save_generated_token


# `vllm:` keys that only vLLM reads (the transformers backend decodes on one device, adapters in the served dtype)
VLLM_ONLY = {"tensor_parallel_size", "gpu_memory_utilization", "enable_prefix_caching", "enforce_eager", "kv_cache_dtype",
             "max_loras", "lora_dtype", "worker_extension_cls"}


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or an RlftError that says what to do when it is taken."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise ConfigError(f"vllm.host: cannot listen on {host!r} ({exc}): use an address of this machine, 0.0.0.0 or 127.0.0.1") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart may reuse a port in TIME_WAIT; never a live one
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno in (98, 48, 10048):  # EADDRINUSE on Linux, macOS, Windows
            raise RlftError(f"port {port} on {host} is in use: stop the other server or set vllm.port / --port") from None
        raise RlftError(f"cannot listen on {host}:{port}: {exc.strerror}: set vllm.host / --host and vllm.port / --port") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(server: ServerSettings, console, *, backend_name: str) -> int:
    settings = server.vllm
    if (settings.data_parallel_size or 1) > 1:
        raise ConfigError("vllm.data_parallel_size > 1 is not supported by rlft's server: start one server per replica "
                          "(each with its own --port) and point the trainer at each")
    host, port = settings.host or "0.0.0.0", settings.port or 8000
    sock = bind_socket(host, port)
    try:
        backend_name = choose_backend(backend_name)
        unused = sorted(VLLM_ONLY & settings.model_fields_set) if backend_name == "transformers" else []
        if unused:
            console.print(f"note: {', '.join('vllm.' + key for key in unused)} apply to the vllm backend only; the "
                          "transformers backend does not use them", highlight=False, markup=False, soft_wrap=True)
        token, generated = resolve_token(settings.api_key, host)
        console.print(f"loading {server.model.base_model} (backend {backend_name}) ...", highlight=False, markup=False, soft_wrap=True)
        began = time.monotonic()
        with console.status("loading the model", spinner="dots"), collector_paused():  # minutes for vLLM; rlft/heap.py
            backend = load_backend(server, backend_name)
        console.print(f"loaded in {time.monotonic() - began:.1f} s", highlight=False, markup=False)
    except BaseException:
        sock.close()
        raise
    model_name = str(server.model.base_model)
    ends = end_ids(model_name, backend.tokenizer, **hub_revision(server.model, model_name))  # base_model's, at revision_of_model
    app = build_app(backend, model_name=model_name, token=token, ends=ends)
    shown = f"[{host}]" if ":" in host else host
    console.print(f"serving {model_name} on http://{shown}:{port} (backend {backend.name}, dtype "
                  f"{str(backend.dtype).removeprefix('torch.')}, max_model_len {backend.max_model_len}"
                  f"{', decode step compiled (torch_compile)' if getattr(backend, 'compiled', False) else ''})",
                  highlight=False, markup=False, soft_wrap=True)
    if generated:
        saved = save_generated_token(token, port)
        console.print(f"token for weight updates (the server listens beyond loopback and none was set): {token}\n"
                      f"a trainer on this machine reads it from {saved}; elsewhere give it as vllm.api_key or the "
                      f"{TOKEN_ENV} environment variable", highlight=False, markup=False, soft_wrap=True)
    elif token is None:
        console.print("weight-changing endpoints need no token (loopback only)", highlight=False, markup=False, soft_wrap=True)
    sys.stdout.flush()  # a supervisor reading a pipe sees the address now, not at exit
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5))
    stopped: list[int] = []
    previous = _quiet_signals(stopped)  # uvicorn re-raises the signal it caught after shutting down: make that a no-op
    try:
        server.run(sockets=[sock])
    finally:
        backend.close()
        sock.close()
        _restore(previous)
    console.print(f"rollout server stopped{' (' + signal.Signals(stopped[0]).name + ')' if stopped else ''}", highlight=False, markup=False, soft_wrap=True)
    return 0


def _quiet_signals(stopped: list[int]) -> dict[int, Any]:
    def note(signum, frame) -> None:
        stopped.append(signum)

    return {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}


def _restore(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
