"""Start `rlft vllm-serve` in a subprocess of its own process group for tests, and always stop it; small stand-in JSON
servers for unit tests of HTTP clients."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from cli_process import CliProcess

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])  # this checkout's code
    env.pop("RLFT_SERVER_TOKEN", None)
    return env


def run_cli(*args: str, log: Path, python: str = sys.executable, env: dict[str, str] | None = None) -> CliProcess | subprocess.Popen:
    """`rlft ARGS` in a new session (its own process group), output to `log`: forked with its imports done
    (`tests/cli_process.py`), or with `python`, another environment's interpreter (the vLLM one), `python -m rlft.cli`.
    `env`: variables set for it on top of `server_env()`."""
    environment = {**server_env(), **(env or {})}
    if python == sys.executable:
        return CliProcess(*args, stdout=log, env=environment, cwd=REPO)
    with open(log, "wb") as out:
        return subprocess.Popen([python, "-m", "rlft.cli", *args], stdout=out, stderr=subprocess.STDOUT,
                                env=environment, cwd=REPO, start_new_session=True)


def wait_for_health(process: subprocess.Popen, port: int, log: Path, timeout: float = 120.0) -> None:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"the server did not answer within {timeout} s:\n{log.read_text()}")


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the server's whole process group (also when stopped with SIGSTOP) and reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def kill_session(process: subprocess.Popen) -> None:
    """SIGKILL every process of the session `process` leads (start_new_session=True): Ray's workers move to process
    groups of their own but stay in the session."""
    from rlft.rollout.envs.nemo_gym_launch import session_members

    for pid in session_members(process.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    kill_group(process)


@contextlib.contextmanager
def stand_in(answer: Callable[[str, dict[str, Any]], tuple[int, Any]]) -> Iterator[str]:
    """A JSON server on 127.0.0.1 for the block: every POST is answered with `answer(path, body)` -> (status, JSON);
    yields its base URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            status, reply = answer(self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def saved_tiny_model(folder: Path, size: str, max_positions: int) -> Path:
    """A tiny model folder (rlft.models.tiny) with seeded random weights saved, as a server loads it from disk."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlft.models.tiny import write_tiny_model

    write_tiny_model(folder, size, max_positions=max_positions)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).save_pretrained(folder)
    return folder


def addition_prompts(path: Path) -> Path:
    """32 "a+b=" prompts with their answers, one JSON row each."""
    path.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a in range(8) for b in range(4)))
    return path
