"""`rlft train CONFIG --num-processes N`: start N training processes through accelerate's launcher.

accelerate's `--multi_gpu` launcher is torch's elastic launcher (torchrun) underneath; it starts the
processes on GPUs and on CPUs alike (each process then picks NCCL or gloo), stops the others when one
fails, and sets the environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) that the
processes read. Several nodes: run the same command on every node with `--nnodes`, its `--node-rank`
and the first node's `--main-process-ip` / `--main-process-port`.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
from typing import Any

from rlft.errors import ConfigError, RlftError, Terminated
from rlft.heap import collector_paused


def launch_command(config: str, overrides: list[str], processes: int, nodes: int = 1, node_rank: int = 0,
                   main_ip: str | None = None, main_port: int | None = None, debug: bool = False) -> list[str]:
    """The launcher's command (accelerate's launch command, through `launcher_main`) that starts `processes` training
    processes in all (over `nodes` nodes)."""
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
    command = [sys.executable, "-m", "rlft.train.launch", "--multi_gpu", "--num_processes", str(processes),
               "--num_machines", str(nodes), "--machine_rank", str(node_rank), "--mixed_precision", "no",
               "--dynamo_backend", "no"]
    if main_ip:
        command += ["--main_process_ip", main_ip]
    if main_port:
        command += ["--main_process_port", str(main_port)]
    command += ["-m", "rlft.cli", "train", config, *overrides]
    return command + (["--debug"] if debug else [])


def check_devices(per_node: int) -> None:
    """More processes on this node than visible GPUs cannot each have one: refused (CPU-only machines take any count)."""
    import torch  # seconds to import: this module stays light for the launching command (launcher_main)

    if torch.cuda.is_available() and per_node > torch.cuda.device_count():
        raise ConfigError(f"{per_node} training processes on this node but {torch.cuda.device_count()} visible GPU(s): start "
                          "at most one process per GPU (--num-processes, CUDA_VISIBLE_DEVICES)")


def run_launched(command: list[str], resume_hint: str) -> int:
    """Run the launcher and wait for it. Ctrl-C reaches every process (one process group): each saves a checkpoint
    and stops, and this waits for them. SIGTERM to this process alone (`kill PID`) is passed to the launcher, which
    stops every process (each says so), and raises Terminated. The launcher's own traceback (a child failed) is left
    out of stderr; its table of which rank failed, and every process's messages, are not."""
    env = dict(os.environ, ACCELERATE_LOG_LEVEL=os.environ.get("ACCELERATE_LOG_LEVEL", "error"))
    interrupted, terminated, launcher = [], [], []

    def note(*_: Any) -> None:  # the processes got the same Ctrl-C: wait for their checkpoint
        interrupted.append(True)

    def terminate(*_: Any) -> None:  # SIGTERM to this process alone (`kill PID`): the launcher stops every process
        terminated.append(True)
        if launcher:
            launcher[0].send_signal(signal.SIGTERM)

    # Flags, not exceptions: an exception can surface after wait() has returned (the kernel may hand the signal to
    # the relay thread, and Python runs the handler later), and then the run was reported as failed.
    previous = signal.signal(signal.SIGINT, note), signal.signal(signal.SIGTERM, terminate)
    try:
        process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True, bufsize=1)
        launcher.append(process)
        if terminated:  # it came while the launcher was starting
            process.send_signal(signal.SIGTERM)
        relay = threading.Thread(target=relay_stderr, args=(process.stderr, sys.stderr), daemon=True)
        relay.start()
        code = process.wait()
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


def launcher_main() -> None:
    """The launcher process: `accelerate launch ARGS`. Its imports run with the garbage collector paused, and on success
    it exits without the interpreter's last collections, which walk torch's million objects for nothing: 0.4 s of
    every launch's end on a 2-core machine. Failures raise as in accelerate's own command (the relay drops that
    traceback)."""
    with collector_paused():  # accelerate's launcher imports torch (seconds): only this launcher process needs it
        from accelerate.commands.launch import main  # noqa: PLC0415 (imports torch: the launcher only)
    sys.argv[0] = "accelerate launch"
    main()
    gc.freeze()


if __name__ == "__main__":
    launcher_main()
