"""Starting NeMo Gym's servers for a run (`nemo_gym_auto_start: true`) and stopping every one of them after it.

rlft runs NeMo Gym's own launcher, `ng_run "+config_paths=[...]" "+skip_venv_if_present=true"`, in `nemo_gym_dir`,
in a session of its own, with its head server on 127.0.0.1:`nemo_gym_head_port`, and waits (a progress bar, up to
`nemo_gym_server_timeout` s) until the head server lists every configured server and each of them answers. ng_run's
output goes to `<output_dir>/nemo_gym/ng_run.log`. At the end of the run, on an error and on Ctrl-C, every process
of that session is stopped (SIGTERM, then SIGKILL after 10 s), Ray's workers included: they leave ng_run's process
group but not its session.

With multi-turn, the Gym model server that points at rlft's rollout server gets its address through the variables
Gym's `vllm_model_for_training.yaml` reads (`policy_base_url`, `policy_api_key`, `policy_model_name`), and every
configured agent gets `max_steps: nemo_gym_max_turns`.

When `nemo_gym_dir` is the site-packages folder of an environment with the `nemo-gym` package (`make nemo-gym`),
each configured server runs in that environment: its folder gets a `.venv` link to it, which is what
`+skip_venv_if_present=true` looks for (ng_run would otherwise build a venv per server, from the internet).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from rlft.config.settings.rollout import NemoGymSettings
from rlft.errors import ConfigError
from rlft.rollout.envs.nemo_gym import gym_dir, head_config, servers_of

SERVER_KINDS = ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers")
INSTALL = ("install NeMo Gym with `make nemo-gym` (rlft's repository; then nemo_gym_dir is "
           ".venv-nemo-gym/lib/python3.X/site-packages) or clone https://github.com/NVIDIA-NeMo/Gym and run `uv sync` there")


def find_ng_run(base: Path) -> Path:
    """ng_run of the Gym checkout (`.venv/bin`), of the environment whose site-packages `base` is, or on PATH."""
    if not (base / "resources_servers").is_dir():
        raise ConfigError(f"nemo_gym_dir {base} holds no resources_servers/ folder, so it is not NeMo Gym: set "
                          f"nemo_gym_dir to the folder that holds it, or {INSTALL}")
    candidates = [base / ".venv" / "bin" / "ng_run", base.parent.parent.parent / "bin" / "ng_run"]
    on_path = shutil.which("ng_run")
    for candidate in candidates + ([Path(on_path)] if on_path else []):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise ConfigError(f"NeMo Gym's launcher ng_run is not installed for {base} (looked in "
                      f"{', '.join(str(c.parent) for c in candidates)} and on PATH): {INSTALL}")


def configured_servers(base: Path, paths: list[str]) -> dict[str, tuple[str, str]]:
    """{top-level name: (kind, server folder name)} declared by the config files."""
    servers = {}
    for entry in paths:
        path = Path(entry).expanduser()
        path = path if path.is_absolute() else base / path
        if not path.is_file():
            raise ConfigError(f"nemo_gym_config_paths: no such file {path} (paths are relative to nemo_gym_dir {base})")
        try:
            config = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"nemo_gym_config_paths: {path} is not YAML: {exc}") from None
        for top, section in config.items() if isinstance(config, dict) else ():
            for kind in SERVER_KINDS:
                group = section.get(kind) if isinstance(section, dict) else None
                for name in group or {} if isinstance(group, dict) else ():
                    servers[top] = (kind, name)
    if not servers:
        raise ConfigError(f"nemo_gym_config_paths ({', '.join(paths)}) declare no NeMo Gym server")
    return servers


def overrides(gym: NemoGymSettings, servers: dict[str, tuple[str, str]], policy: dict[str, str] | None) -> list[str]:
    args = [f"+config_paths=[{','.join(gym.config_paths)}]", "+skip_venv_if_present=true",
            f"+head_server={{host: 127.0.0.1, port: {gym.head_port}}}"]
    if policy:
        args += [f"+policy_base_url={policy['base_url']}", f"+policy_api_key={policy['api_key']}",
                 f"+policy_model_name={policy['model']}"]
    if gym.max_turns is not None:
        args += [f"++{top}.{kind}.{name}.max_steps={gym.max_turns}"
                 for top, (kind, name) in servers.items() if kind == "responses_api_agents"]
    return args


def link_environment(base: Path, ng_run: Path, servers: dict[str, tuple[str, str]]) -> None:
    """Point each configured server folder's `.venv` at ng_run's environment when Gym lives in its site-packages."""
    venv = ng_run.parent.parent
    if base.resolve().parent.parent.parent != venv.resolve():
        return  # a Gym checkout: its servers have (or build) their own environments
    for kind, name in servers.values():
        folder = base / kind / name
        if folder.is_dir() and not (folder / ".venv").exists():
            (folder / ".venv").symlink_to(venv.resolve())


class GymServers:
    """`with GymServers(gym, console, policy):` NeMo Gym's servers run inside the block, and nothing after it."""

    def __init__(self, gym: NemoGymSettings, console: Console, policy: dict[str, str] | None = None):
        self.gym, self.console, self.policy = gym, console, policy
        self.process: subprocess.Popen | None = None
        self.log = gym.log

    def __enter__(self) -> GymServers:
        gym = self.gym
        base = gym_dir(gym.dir).absolute()
        ng_run = find_ng_run(base)
        servers = configured_servers(base, list(gym.config_paths))
        _refuse_busy_port(gym.head_port)
        link_environment(base, ng_run, servers)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
                   PATH=f"{ng_run.parent}{os.pathsep}{os.environ.get('PATH', '')}")
        try:
            with open(self.log, "wb") as out:
                self.process = subprocess.Popen([str(ng_run), *overrides(gym, servers, self.policy)], cwd=base, env=env,
                                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise ConfigError(f"could not start NeMo Gym's {ng_run}: {exc}: {INSTALL}") from None
        try:
            self.wait(len(servers))
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def wait(self, expected: int) -> None:
        timeout = self.gym.server_timeout
        progress = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=self.console,
                            transient=True, disable=not self.console.is_terminal)
        if not self.console.is_terminal:
            self.console.print(f"starting NeMo Gym's servers (ng_run, up to {timeout} s; log: {self.log})", highlight=False)
        began = time.monotonic()
        with progress:
            task = progress.add_task(f"starting NeMo Gym's servers (log: {self.log})", total=timeout)
            while time.monotonic() - began < timeout:
                if self.process.poll() is not None:
                    raise ConfigError(f"NeMo Gym's ng_run exited with code {self.process.returncode} before its servers were "
                                      f"up; the end of {self.log}:\n{_tail(self.log)}")
                up = self.answering()
                progress.update(task, completed=time.monotonic() - began, description=f"NeMo Gym servers up: {up}/{expected}")
                if up >= expected:
                    return
                time.sleep(1.0)
        raise ConfigError(f"NeMo Gym's servers were not all up after nemo_gym_server_timeout={timeout} s: raise it, or look "
                          f"at the end of {self.log}:\n{_tail(self.log)}")

    def answering(self) -> int:
        """How many servers the head server lists with a port and that answer on it (any status)."""
        try:
            config = head_config(self.gym.head_port, timeout=2)
        except ConfigError:
            return 0
        up = 0
        for url, _ in (server for kind in SERVER_KINDS for server in servers_of(config, kind).values()):
            try:
                httpx.get(url + "/", timeout=2)
                up += 1
            except httpx.HTTPError:
                pass
        return up

    def stop(self) -> None:
        if self.process is None:
            return
        process, self.process = self.process, None
        for pid in session_members(process.pid):
            _signal(pid, signal.SIGTERM)
        _wait_gone(process, 10)
        for pid in session_members(process.pid):
            _signal(pid, signal.SIGKILL)
        _wait_gone(process, 5)  # a killed process lingers a moment: return once none of the session is left


def _wait_gone(process: subprocess.Popen, seconds: float) -> None:
    """Until no process of `process`'s session is alive (ng_run itself reaped), or `seconds` have passed."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and session_members(process.pid):
        process.poll()  # reap ng_run itself
        time.sleep(0.1)
    process.poll()  # ng_run may have exited (a zombie, not counted above) during the last sleep


def _refuse_busy_port(port: int) -> None:
    try:
        httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
    except httpx.HTTPError:
        return
    raise ConfigError(f"nemo_gym_head_port {port} is already in use (NeMo Gym servers from another run?): stop them, "
                      "pick another port, or set nemo_gym_auto_start: false to use the servers running there")


def session_members(session: int) -> list[int]:
    """The live processes whose session id is `session` (Linux /proc; elsewhere just the leader, if alive)."""
    proc = Path("/proc")
    if sys.platform != "linux" or not proc.is_dir():
        try:
            os.kill(session, 0)
            return [session]
        except OSError:
            return []
    members = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == session and fields[0] != "Z":  # field 6 of /proc/PID/stat: the session id
                members.append(int(entry.name))
    return members


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
