"""`rlft ...` as a process of its own without a fresh interpreter's imports, for tests that signal, kill or wait on it.

A new `python -m rlft.cli` process spends 4-6 s of CPU importing torch, transformers, datasets and accelerate before it
reads its config, and the suite starts dozens of them on two cores. Here each one is forked from a multiprocessing fork
server that this test process starts once, with those modules imported and nothing run, and the child runs the command
as `python -m rlft.cli` does (`rlft.cli.run_command`): in a session of its own (the test stops the whole group), in the
given folder and environment, with its output written to files as it comes. Exit codes, signals, process groups and
everything the command starts (training processes, servers, reward workers) are those of the real command; what it does
not repeat is the interpreter's start and the imports: a setting that a library reads once when it is imported (such as
HF_HUB_CACHE) keeps the value this test process had when the fork server started. Tests of the start itself (which
modules a command imports, the `rlft` entry point) exec a fresh interpreter (`tests/unit/test_parallel.py`,
`tests/integration/test_checkpoints.py`, `make quickstart`)."""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

# imported by the fork server before it forks: what a training process, a launcher or a rollout server imports
PRELOAD = ["torch", "transformers.modeling_utils", "datasets", "peft", "accelerate", "rlft.cli", "rlft.train.run",
           "rlft.train.launch", "rlft.data.prepare", "rlft.models.loading", "rlft.rollout.server.app"]
_context = None
_started: list[CliProcess] = []


def _fork_server():
    global _context
    if _context is None:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # as `rlft.cli.main` sets it on a CPU machine, before DeepSpeed loads
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
        # before multiprocessing's own exit handler, which would wait for every child still running: none is left
        atexit.register(lambda: [process.kill_group() for process in _started if process.poll() is None])
    return _context


def _run(args: list[str], cwd: str, env: dict[str, str], stdout: str, stderr: str | None) -> None:
    """In the forked child: what `python -m rlft.cli ARGS` does, in a session of its own."""
    os.setsid()
    out = os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    err = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND) if stderr else out
    os.dup2(out, 1)
    os.dup2(err, 2)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(write_through=True)  # PYTHONUNBUFFERED, as the tests start the command
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a new interpreter's; the fork server ignores Ctrl-C
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    # `python -m` puts the working folder first, then PYTHONPATH's entries: reward modules are imported from them
    sys.path[:1] = [cwd, *(entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry)]
    sys.argv = ["rlft", *args]
    from rlft.cli import run_command

    try:
        run_command()  # exits with the command's code (SystemExit), which becomes this process's exit status
    finally:
        atexit._run_exitfuncs()  # the fork server's children end with os._exit: the interpreter's exit handlers


class CliProcess:
    """A running `rlft ARGS` (see the module's docstring), with the part of `subprocess.Popen`'s interface the tests
    use. `stdout` and `stderr` are files; without `stderr` both streams go to `stdout` (`stderr=STDOUT`)."""

    def __init__(self, *args: str, cwd: Path | str | None = None, env: dict[str, str] | None = None,
                 stdout: Path | str, stderr: Path | str | None = None):
        self.stdout_path, self.stderr_path = Path(stdout), Path(stderr) if stderr else None
        self.stdout_path.write_bytes(b"")
        if self.stderr_path:
            self.stderr_path.write_bytes(b"")
        self._process = _fork_server().Process(
            target=_run, args=([str(a) for a in args], str(Path(cwd or os.getcwd()).resolve()), dict(env or os.environ),
                               str(self.stdout_path), str(self.stderr_path) if self.stderr_path else None))
        self._process.start()
        _started.append(self)
        self.pid = self._process.pid
        self.args = args

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(["rlft", *self.args], timeout)
        return self._process.exitcode

    def output(self) -> tuple[str, str]:
        """What the command wrote so far: (stdout, stderr); stderr is "" when it goes to stdout."""
        err = self.stderr_path.read_text(errors="replace") if self.stderr_path else ""
        return self.stdout_path.read_text(errors="replace"), err

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for the end (subprocess.TimeoutExpired after `timeout` s; the process goes on), then its output."""
        self.wait(timeout)
        return self.output()

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def kill_group(self) -> None:
        """SIGKILL the command's whole process group (what it started too) and reap it."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._process.join(10)
