"""NeMo Gym's real servers for tests: `ng_run` from `.venv-nemo-gym` (`make nemo-gym`) on 127.0.0.1, in a session of its
own that `kill_session` ends (Ray's workers included)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from server_utils import REPO

VENV = REPO / ".venv-nemo-gym"
needs_gym = pytest.mark.skipif(not (VENV / ".installed").exists(), reason="NeMo Gym's environment is not built: `make nemo-gym`")
SERVER_FOLDERS = ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers")


def gym_site() -> Path:
    return next(VENV.glob("lib/python*/site-packages"))


def link_servers(*folders: str) -> None:
    """Run these Gym server folders (e.g. resources_servers/reasoning_gym) in the Gym environment itself."""
    for folder in folders:
        link = gym_site() / folder / ".venv"
        if not link.exists():
            link.symlink_to(VENV.resolve())


def start_ng_run(config_paths: list[str], port: int, log: Path, *overrides: str) -> subprocess.Popen:
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", PATH=f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}")
    with open(log, "wb") as out:
        return subprocess.Popen([str(VENV / "bin" / "ng_run"), f"+config_paths=[{','.join(config_paths)}]",
                                 "+skip_venv_if_present=true", f"+head_server={{host: 127.0.0.1, port: {port}}}", *overrides],
                                cwd=gym_site(), env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for_gym(process: subprocess.Popen, port: int, log: Path, servers: int, timeout: float = 240.0) -> dict:
    """The head server's global config once `servers` servers have ports and answer."""
    from rlft.rollout.envs.nemo_gym import head_config, servers_of

    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"ng_run exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            config = head_config(port, timeout=2)
            urls = [url for kind in SERVER_FOLDERS for url, _ in servers_of(config, kind).values()]
            if len(urls) >= servers:
                for url in urls:
                    httpx.get(url + "/", timeout=2)
                return config
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(1)
    raise RuntimeError(f"NeMo Gym did not come up within {timeout} s:\n{log.read_text()[-3000:]}")


def session_members(session: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == session and fields[0] != "Z":
                members.append(int(entry.name))
    return members
