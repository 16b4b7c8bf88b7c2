"""`rlft train CONFIG --num-processes N`: start N training processes through accelerate's launcher.

accelerate's `--multi_gpu` launcher is torch's elastic launcher (torchrun) underneath; it starts the
processes on GPUs and on CPUs alike (each process then picks NCCL or gloo), stops the others when one
fails, and sets the environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) that the
processes read. Several nodes: run the same command on every node with `--nnodes`, its `--node-rank`
and the first node's `--main-process-ip` / `--main-process-port`.

The launcher is forked from the `rlft train` process, which has imported torch and accelerate already: a fresh
interpreter would import them again (a second or more of every launch's start). It touches no device itself: it only
starts the training processes, which are fresh interpreters.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import threading
import traceback
from typing import Any

from rlft.errors import ConfigError, RlftError, Terminated
from rlft.heap import collector_paused


def launch_arguments(config: str, overrides: list[str], processes: int, nodes: int = 1, node_rank: int = 0,
                     main_ip: str | None = None, main_port: int | None = None, debug: bool = False) -> list[str]:
    """accelerate's `launch` arguments that start `processes` training processes in all (over `nodes` nodes), each
    running `python -m rlft.cli train CONFIG OVERRIDES`."""
    if processes < 1 or nodes < 1:
        raise ConfigError(f"--num-processes {processes} --nnodes {nodes}: both must be at least 1")
    if processes % nodes:
        raise ConfigError(f"--num-processes {processes} is the total over all nodes and must divide by --nnodes {nodes} "
                          f"(e.g. --num-processes {nodes * max(1, processes // nodes)})")
    if not 0 <= node_rank < nodes:
        raise ConfigError(f"--node-rank {node_rank}: expected 0 to {nodes - 1} (one per node, 0 on the first)")
    if nodes > 1 and not main_ip:
        raise ConfigError("--nnodes > 1 needs --main-process-ip: the address of the node with --node-rank 0, reachable from "
                          "every node")
    arguments = ["--multi_gpu", "--num_processes", str(processes), "--num_machines", str(nodes), "--machine_rank",
                 str(node_rank), "--mixed_precision", "no", "--dynamo_backend", "no"]
    if main_ip:
        arguments += ["--main_process_ip", main_ip]
    if main_port:
        arguments += ["--main_process_port", str(main_port)]
    arguments += ["-m", "rlft.cli", "train", config, *overrides]
    return arguments + (["--debug"] if debug else [])


def check_devices(per_node: int) -> None:
    """More processes on this node than visible GPUs cannot each have one: refused (CPU-only machines take any count)."""
    import torch  # seconds to import: this module stays light for the launching command (launcher_main)

    if torch.cuda.is_available() and per_node > torch.cuda.device_count():
        raise ConfigError(f"{per_node} training processes on this node but {torch.cuda.device_count()} visible GPU(s): start "
                          "at most one process per GPU (--num-processes, CUDA_VISIBLE_DEVICES)")


def run_launched(arguments: list[str], resume_hint: str) -> int:
    """Run the launcher (accelerate's `launch` with `arguments`) and wait for it. Ctrl-C reaches every process (one
    process group): each saves a checkpoint and stops, and this waits for them. SIGTERM to this process alone
    (`kill PID`) is passed to the launcher, which stops every process (each says so), and raises Terminated. The
    launcher's own traceback (a child failed) is left out of stderr; its table of which rank failed, and every
    process's messages, are not."""
    interrupted, terminated, launcher = [], [], []

    def note(*_: Any) -> None:  # the processes got the same Ctrl-C: wait for their checkpoint
        interrupted.append(True)

    def terminate(*_: Any) -> None:  # SIGTERM to this process alone (`kill PID`): the launcher stops every process
        terminated.append(True)
        if launcher:
            os.kill(launcher[0], signal.SIGTERM)

    # Flags, not exceptions: an exception can surface after the wait has returned (the kernel may hand the signal to
    # the relay thread, and Python runs the handler later), and then the run was reported as failed.
    previous = signal.signal(signal.SIGINT, note), signal.signal(signal.SIGTERM, terminate)
    try:
        pid, stderr = fork_launcher(arguments)
        launcher.append(pid)
        if terminated:  # it came while the launcher was starting
            os.kill(pid, signal.SIGTERM)
        relay = threading.Thread(target=relay_stderr, args=(stderr, sys.stderr), daemon=True)
        relay.start()
        code = _wait(pid)
        relay.join(timeout=5)
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])
    if code == 0:
        return 0
    if interrupted or code == 130:  # rank 0 said where the checkpoint is
        return 130
    if terminated:  # each process said it was stopped by SIGTERM; the command says it too, and exits with 143
        raise Terminated
    reason = f"were stopped by {signal.Signals(-code).name}" if code < 0 else f"failed (exit code {code})"
    raise LaunchFailed(f"the training processes {reason}: the first error above names the rank that failed. Checkpoints "
                       f"are written whole or not at all: {resume_hint}")


def fork_launcher(arguments: list[str]) -> tuple[int, io.TextIOWrapper]:
    """Fork the launcher, its stderr a pipe this process reads (line by line) and relays. Output either process
    holds in its buffers is written first, or the child would write it again."""
    sys.stdout.flush()
    sys.stderr.flush()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the launcher: never returns
        os.close(read)
        os.dup2(write, 2)
        os.close(write)
        _launcher(arguments)
    os.close(write)
    return pid, io.TextIOWrapper(os.fdopen(read, "rb"), errors="replace", line_buffering=True)


def _launcher(arguments: list[str]) -> None:
    """The forked launcher: accelerate's `launch` command, the default signal handling (the `rlft train` process's
    handlers are its own), and the process ends with `os._exit`, without the interpreter's last collections that walk
    torch's million objects for nothing. A failure prints its traceback (the relay drops the launcher's)."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), errors="replace", line_buffering=True)
        os.environ.setdefault("ACCELERATE_LOG_LEVEL", "error")  # read by the launcher and the training processes
        with collector_paused():
            from accelerate.commands.launch import launch_command, launch_command_parser  # the launcher's
        sys.argv = ["accelerate launch", *arguments]
        launch_command(launch_command_parser().parse_args(arguments))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 (the launcher's own failure: printed for the relay, which drops it)
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _wait(pid: int) -> int:
    """The launcher's exit code (negative: the signal that stopped it); a signal handled meanwhile resumes the wait."""
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def relay_stderr(source, sink) -> None:
    """Copy lines, holding each Python traceback until it ends: the launcher's (frames in torch.distributed's elastic
    launcher or accelerate's launch command) is dropped, any other is copied whole."""
    held: list[str] = []
    for line in source:
        if line.startswith("Traceback (most recent call last):"):
            held = [line]
            continue
        if held:
            held.append(line)
            if line.startswith((" ", "\t")):
                continue
            block, held = "".join(held), []
            if "torch/distributed/elastic" in block or "accelerate/commands/launch" in block:
                continue
            line = block
        sink.write(line)
        sink.flush()
    if held:
        sink.write("".join(held))


class LaunchFailed(RlftError):
    pass
