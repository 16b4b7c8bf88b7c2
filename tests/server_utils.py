"""Start `rlft vllm-serve` in a subprocess of its own process group for tests, and always stop it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

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


def run_cli(*args: str, log: Path, python: str = sys.executable) -> subprocess.Popen:
    """`python -m rlft.cli ARGS` in a new session (its own process group), output to `log`; `python`: another
    environment's interpreter (the vLLM one)."""
    with open(log, "wb") as out:
        return subprocess.Popen([python, "-m", "rlft.cli", *args], stdout=out, stderr=subprocess.STDOUT,
                                env=server_env(), cwd=REPO, start_new_session=True)


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
    session = process.pid
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session:  # field 6 of /proc/PID/stat: the session id
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except ProcessLookupError:
                pass
    kill_group(process)
