"""`rlft ...` as a process of its own without a fresh interpreter's imports, for tests that signal, kill or wait on it.

A new `python -m rlft.cli` process spends 4-6 s of CPU importing torch, transformers, datasets and accelerate before it
reads its config, and the suite starts dozens of them on two cores. Here each one is forked from a multiprocessing fork
server that this test process starts once, with those modules imported and nothing run, and the child runs the command
as `python -m rlft.cli` does (`rlft.cli.run_command`): in a session of its own (the test stops the whole group), in the
given folder and environment (OMP_NUM_THREADS sets torch's threads), unbuffered, its output written to files as it comes.
Exit codes, signals, process groups and everything the command starts (training processes, servers, reward workers)
are those of the real command. What differs from a fresh interpreter:
* the start and the imports are not repeated: a setting that a library reads once when it is imported (such as
  HF_HUB_CACHE) keeps the value this test process had when the fork server started;
* every child has the fork server's string-hash seed (PYTHONHASHSEED), so two runs cannot differ by set order;
* the child ends with `os._exit` after the exit handlers (atexit) have run, without the interpreter's finalisation.
Tests of the start and the end themselves exec a fresh interpreter: which modules a command imports
(`tests/unit/test_parallel.py`), Ctrl-C and SIGTERM at the entry point (`tests/integration/test_checkpoints.py`,
`test_interrupts.py`), the launched training processes (torch's launcher starts them), and `make quickstart`."""

from __future__ import annotations

import atexit
import contextlib
import io
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# imported by the fork server before it forks: what a training process, a launcher or a rollout server imports
PRELOAD = ["torch", "transformers.modeling_utils", "datasets", "peft", "accelerate", "rlft.cli", "rlft.train.run",
           "rlft.train.launch", "rlft.data.prepare", "rlft.models.loading", "rlft.rollout.server.app"]
_context = None
_started: list[CliProcess] = []


def _fork_server():
    global _context
    if _context is None:
        import torch

        if not torch.cuda.is_available():  # as `rlft.cli.environment` sets it on a CPU machine, before DeepSpeed is imported
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
        # before multiprocessing's own exit handler, which would wait for every child still running: none is left
        atexit.register(_stop_all)
    return _context


def _stop_all() -> None:
    for process in _started:
        with contextlib.suppress(RuntimeError):
            process.kill_group()


def _unbuffered(fd: int, like) -> io.TextIOWrapper:
    """A text stream on `fd` that writes at once, with the encoding and error handling of the interpreter's `like`."""
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=getattr(like, "encoding", "utf-8"),
                            errors=getattr(like, "errors", "backslashreplace"), write_through=True)


def _run(args: list[str], cwd: str, env: dict[str, str], stdout: str, stderr: str | None) -> None:
    """In the forked child: what `python -m rlft.cli ARGS` does, in a session of its own."""
    os.setsid()
    out = os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    err = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND) if stderr else out
    os.dup2(out, 1)
    os.dup2(err, 2)
    # unbuffered, as `python -u` (the tests read the output as it comes, and a SIGKILL loses nothing written)
    sys.stdout, sys.stderr = _unbuffered(1, sys.__stdout__), _unbuffered(2, sys.__stderr__)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a new interpreter's; the fork server ignores Ctrl-C
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    if env.get("OMP_NUM_THREADS"):  # torch read it when the fork server imported it
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    # `python -m` puts the working folder first, then PYTHONPATH's entries, then the interpreter's own: not the tests'
    # folders, nor the test folders that tests had put on this process's path when the fork server started
    foreign = (str(Path(__file__).resolve().parent), os.path.join(tempfile.gettempdir(), "pytest-of-"))
    sys.path[:] = [cwd, *(entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry),
                   *(entry for entry in sys.path[1:] if entry and not entry.startswith(foreign))]
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
        deadline = time.monotonic() + 30
        while self._process.exitcode is None and time.monotonic() < deadline:  # its session, before any signal is sent
            with contextlib.suppress(ProcessLookupError):
                if os.getpgid(self.pid) == self.pid:
                    break
            time.sleep(0.005)
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
        with contextlib.suppress(ProcessLookupError):  # also after the command itself ended: what it started goes too
            os.killpg(self.pid, signal.SIGKILL)
        self._process.join(10)
        if self._process.exitcode is None:
            raise RuntimeError(f"rlft {' '.join(map(str, self.args))} (pid {self.pid}) did not stop after SIGKILL")
