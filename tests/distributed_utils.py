"""Running `rlft train` on several training processes from a test: the launcher in a session of its own on a free
rendezvous port, the 1-process reference run in the test process, and reading the runs' losses and evaluations."""

import os
import socket
import time
from pathlib import Path

import pytest
import yaml

from cli_process import CliProcess
from rlft.train.metrics import read_metrics
FSDP = {"fsdp": ["full_shard", "auto_wrap"], "fsdp_config": {"fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer"}}
# the files rlft ships, by the path Axolotl's configs use (zero2.json also moves the optimizer state to the CPU)
STRATEGIES = {"ddp": {}, "fsdp": FSDP, "zero2": {"deepspeed": "deepspeed_configs/zero2.json"},
              "zero3": {"deepspeed": "deepspeed_configs/zero3.json"}}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(config: Path, *flags: str, processes: int = 2, cwd: Path | None = None) -> CliProcess:
    """`rlft train` in a session of its own (the test stops the whole group), on a free rendezvous port, its output in
    a file next to the config; reward modules are imported from `cwd` (default: the config's folder). The command is
    forked with its imports done (`tests/cli_process.py`); the training processes it launches start afresh."""
    extra = ["--num-processes", str(processes), "--main-process-port", str(free_port())] if processes > 1 else []
    log = config.parent / f"{config.stem}-{time.monotonic_ns()}.log"
    return CliProcess("train", config, *extra, *flags, stdout=log, cwd=cwd or config.parent,
                      env=dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1"))


def wait_for_lines(path: Path, count: int, timeout: float = 240) -> None:
    """Until `path` has `count` lines (a run's metrics.jsonl: it has trained that many steps), or `timeout` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline and not (path.exists() and path.read_text().count("\n") >= count):
        time.sleep(0.2)


def stop(process: CliProcess) -> None:
    process.kill_group()


def train(config: Path, *flags: str, processes: int = 2, timeout: float = 300, cwd: Path | None = None) -> str:
    process = start(config, *flags, processes=processes, cwd=cwd)
    try:
        output, _ = process.communicate(timeout=timeout)
    finally:
        stop(process)
    assert process.returncode == 0, output[-4000:]
    return output


def train_here(config: Path, cwd: Path | None = None) -> None:
    """A 1-process reference run in this test process, with one torch thread as each launched process has: its
    imports are loaded already, so it starts seconds sooner than `train(config, processes=1)`. `cwd`: the folder it
    runs in and imports reward modules from, as `train(..., cwd=...)` does."""
    import sys

    import torch

    from rlft.cli import main

    threads, here = torch.get_num_threads(), os.getcwd()
    torch.set_num_threads(1)
    if cwd is not None:
        os.chdir(cwd)
        sys.path.insert(0, str(cwd))
    try:
        assert main(["train", str(config)]) == 0
    finally:
        torch.set_num_threads(threads)
        if cwd is not None:
            os.chdir(here)
            sys.path.remove(str(cwd))


def losses(out: Path) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in read_metrics(out / "metrics.jsonl") if "loss" in m}


def evals(out: Path) -> dict[int, dict[str, float]]:
    return {m["step"]: {k: v for k, v in m.items() if k.startswith("eval/")} for m in read_metrics(out / "metrics.jsonl")
            if any(k.startswith("eval/") for k in m)}


def assert_same_evals(got: dict, expected: dict, rel: float = 1e-5) -> None:
    """Evaluation is split over the processes and gathered: the same numbers as one process's (relative 1e-5: after
    some steps the weights differ in the last float32 bits, and log-prob sums are tens in size)."""
    assert got.keys() == expected.keys() and got, (got, expected)
    for step in got:
        assert got[step] == pytest.approx(expected[step], rel=rel, abs=1e-5), (step, got[step], expected[step])


def write(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


