"""Scaling from 1 to N training processes: the same per-process batch, so N processes train N times the tokens.

    .venv/bin/python bench/scaling.py                          # SFT, size S, 1 vs 2 processes, DDP and FSDP2
    .venv/bin/python bench/scaling.py --size M --steps 60 --processes 4

Each run is `rlft train CONFIG --num-processes N` in a fresh process group (on GPUs: one process per GPU; on
CPU: gloo, one torch thread per process). Reported per run: median step time (steps 3..N), tokens/s over all
processes (metrics.jsonl's `tokens_per_s` counts every process's tokens), and the scaling efficiency
tokens/s(N) / (N x tokens/s(1)). On a 2-core CPU, 2 processes share the cores that 1 process had: expect no
speed-up there; the number that matters comes from a machine with one GPU per process. Results go to
bench/results/scaling-<device>-<size>.json. Nothing here is a test: no assertion on timings.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import RESULTS, free_port, make_model, median  # noqa: E402

from rlft.tasks.addition import split_rows, write_jsonl  # noqa: E402
from rlft.train.metrics import read_metrics  # noqa: E402

FSDP = {"fsdp": ["full_shard", "auto_wrap"], "fsdp_config": {"fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer"}}


def run(folder: Path, model: Path, data: Path, name: str, processes: int, steps: int, micro: int, extra: dict) -> dict:
    out = folder / name
    config = folder / f"{name}.yaml"
    config.write_text(yaml.safe_dump({
        "base_model": str(model), "datasets": [{"path": str(data)}], "sequence_len": 64, "micro_batch_size": micro,
        "max_steps": steps, "learning_rate": 1e-3, "logging_steps": 1, "seed": 0, "output_dir": str(out),
        "bf16": "auto", **extra}))
    command = [sys.executable, "-m", "rlft.cli", "train", str(config)]
    if processes > 1:
        command += ["--num-processes", str(processes), "--main-process-port", str(free_port())]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1" if processes > 1 else "2"))
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    rows = [m for m in read_metrics(out / "metrics.jsonl") if "loss" in m][2:]
    return {"processes": processes, "strategy": "fsdp" if extra else ("ddp" if processes > 1 else "single"),
            "step_time_s": round(median(r["step_time_s"] for r in rows), 4),
            "tokens_per_s": round(median(r["tokens_per_s"] for r in rows), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="S")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--micro-batch-size", type=int, default=32)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    folder = Path(os.environ.get("RLFT_BENCH_DIR", "/tmp/rlft-bench-scaling"))
    folder.mkdir(parents=True, exist_ok=True)
    model = make_model(folder / f"model-{args.size}", args.size, seed=0)
    train, _ = split_rows()
    data = folder / "train.jsonl"
    write_jsonl(train * 4, data)
    results = [run(folder, model, data, "single", 1, args.steps, args.micro_batch_size, {}),
               run(folder, model, data, "ddp", args.processes, args.steps, args.micro_batch_size, {}),
               run(folder, model, data, "fsdp", args.processes, args.steps, args.micro_batch_size, FSDP)]
    base = results[0]["tokens_per_s"]
    for result in results:
        result["efficiency"] = round(result["tokens_per_s"] / (result["processes"] * base), 3)
        print(f"{result['strategy']:>7} x{result['processes']}: step {result['step_time_s']:.3f} s, "
              f"{result['tokens_per_s']:,.0f} tok/s, scaling efficiency {result['efficiency']:.2f}")
    device = torch.cuda.get_device_name(0).replace(" ", "-") if torch.cuda.is_available() else "cpu"
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"scaling-{device}-{args.size}.json"
    path.write_text(json.dumps({"size": args.size, "steps": args.steps, "micro_batch_size": args.micro_batch_size,
                                "results": results}, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
