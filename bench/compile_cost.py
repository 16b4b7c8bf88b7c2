"""What `torch_compile: true` costs and saves in an SFT or GRPO run on a CPU: the numbers behind its default (false).

    .venv/bin/python bench/compile_cost.py               # SFT, size S, 100 steps, 2 torch threads
    .venv/bin/python bench/compile_cost.py --size M
    .venv/bin/python bench/compile_cost.py --method grpo # GRPO, size S, 100 steps, 1 torch thread

rlft's SFT run of `bench/sft_vs_trl.py` (the addition rows, micro batch 32), or its GRPO run of `bench/grpo.py` (2
prompts x 4 completions of 32 tokens; compiling covers the decode step and the training forward), trains in fresh
processes: eager, then compiled with an empty inductor cache (a first run on a machine), then compiled again with that
cache filled (a later run of the same model). A compiled run compiles in its first steps (the first shape, then a
dynamic-shape graph); the steps after show what compiling saves. The break-even is the step count from which a
compiled run ends first: its compile time, (compiled - eager) training-call time + steps x (eager - compiled) median
step, over the median step it saves. Writes bench/results/compile_cost-<size>[-grpo].json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, write_report  # noqa: E402

CHILD = """
import argparse, json, statistics, sys, tempfile
from pathlib import Path
sys.path.insert(0, {bench!r})
import torch
from common import make_model, quiet
quiet()
torch.set_num_threads({threads})
folder = Path(tempfile.mkdtemp())
out = folder / "out"
if {method!r} == "sft":
    from short_rows import sft_run
    result = sft_run({size!r}, 0, {steps}, compile={compiled})(out)
else:
    import grpo
    from rlft.tasks.addition import split_rows, write_jsonl
    write_jsonl([{{"prompt": row["prompt"]}} for row in split_rows()[0]], folder / "prompts.jsonl")
    settings = argparse.Namespace(seed=0, bf16=False, force_length=True, long=False)
    result = grpo.run_rlft(make_model(folder / "model", {size!r}, 0), folder / "prompts.jsonl", out, {steps}, settings,
                           compiled={compiled})
steps = [json.loads(line)["step_time_s"] for line in (out / "metrics.jsonl").read_text().splitlines() if "step_time_s" in line]
print("RESULT " + json.dumps({{"first_step_s": steps[0], "median_step_s": statistics.median(steps[10:]),
                               "wall_s": result["wall_s"]}}))
"""


def child(args, compiled: bool, cache: str) -> dict:
    code = CHILD.format(bench=str(Path(__file__).resolve().parent), threads=args.threads, size=args.size,
                        steps=args.steps, compiled=compiled, method=args.method)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache})
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="S")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default 2 for SFT, 1 for GRPO, as their benches)")
    parser.add_argument("--method", choices=("sft", "grpo"), default="sft")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    args.threads = args.threads or (2 if args.method == "sft" else 1)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rlft-inductor-") as cache:
        runs = {"eager": child(args, False, cache), "compiled, empty cache": child(args, True, cache),
                "compiled, filled cache": child(args, True, cache)}
    eager = runs["eager"]
    for name, run in runs.items():
        saved = eager["median_step_s"] - run["median_step_s"]
        run["compile_s"] = run["wall_s"] - eager["wall_s"] + args.steps * saved if name != "eager" else 0.0
        run["break_even_steps"] = run["compile_s"] / saved if name != "eager" and saved > 0 else None
        print(f"{name:24s} first step {run['first_step_s']:7.3f} s, median step {run['median_step_s'] * 1e3:6.1f} ms, "
              f"training call {run['wall_s']:6.2f} s"
              + (f", compiling {run['compile_s']:.1f} s, ends first from step {run['break_even_steps']:,.0f}"
                 if run["break_even_steps"] else ""))
    report = {"benchmark": "compile_cost", "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "method": args.method, "size": args.size, "steps": args.steps, "threads": args.threads, "runs": runs,
              "load_average_1m_before_after": [load_before[0], os.getloadavg()[0]],
              "versions": {"torch": torch.__version__},
              "command": " ".join(["bench/compile_cost.py", *sys.argv[1:]])}
    suffix = "-grpo" if args.method == "grpo" else ""
    write_report(args.out or RESULTS / f"compile_cost-{args.size}{suffix}.json", report)


if __name__ == "__main__":
    main()
