"""A whole GRPO run's wall time, each tool in a fresh process: imports, set-up, the steps, the saves and the exit.

bench/grpo.py times the training call inside one process (imports excluded, the steps by median). This times what a
user waits for: `rlft train grpo.yaml` against a Python script that builds TRL's GRPOTrainer, trains and saves the
model (`trainer.save_model()`, as TRL's example scripts end), on grpo.py's workload and settings (grpo.rlft_settings
and grpo.trl_settings: the same model, prompts, reward, G = 4, 8 completions of 32 tokens per step). Each tool runs
eager and compiled (--rlft-compile, --trl-compile), the variants alternating over --repeat rounds (the order
reversed every other round) after a warm-up round that is not counted (it fills the file cache and inductor's
on-disk cache, as any earlier run on a machine would). Both children get OMP_NUM_THREADS=--threads.

Marks from each child's output split the wall: rlft's first line (`rlft train: ...`, the plan: imports, config,
data, model) and `rlft train: done`; TRL's script prints when its imports ended, when the trainer was built and when
`train()` returned. Ratios TRL/rlft of the wall time (common.fair_ratios, key wall_s): rlft at its best against TRL at
its best, against TRL as shipped (eager), and both eager (the defaults).

Usage (from the repository root):
  .venv/bin/python bench/grpo_wall.py --steps 20 --repeat 3
Results: a table on stdout and bench/results/grpo_wall-<size>-<steps>.json.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpo
import yaml
from common import (RESULTS, compile_choices, describe_ratios, fair_ratios, make_model, median, round_orders,
                    variant_name, write_report)

from rlft.models.tiny import SIZES
from rlft.tasks.addition import split_rows, write_jsonl

REPO = Path(__file__).resolve().parents[1]
CHILD_TIMEOUT_S = 900

TRL_SCRIPT = '''"""TRL's GRPO run as a user's script runs it (written by bench/grpo_wall.py)."""
import json
import sys
import time

marks = {{}}
import datasets
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

marks["imports"] = time.time()


{reward}

spec = json.load(open(sys.argv[1]))
prompts = datasets.Dataset.from_list([json.loads(line) for line in open(spec["prompts"])])
trainer = GRPOTrainer(model=spec["model"], reward_funcs=count_a_reward, args=GRPOConfig(**spec["config"]),
                      train_dataset=prompts, processing_class=AutoTokenizer.from_pretrained(spec["model"]))
marks["built"] = time.time()
trainer.train()
marks["trained"] = time.time()
trainer.save_model()
print("bench marks: " + json.dumps(marks), flush=True)
'''


def child_env(threads: int) -> dict:
    inherited = [str(Path(entry).resolve()) for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    paths = [str(REPO / "src"), *inherited]
    return dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1",
                TOKENIZERS_PARALLELISM="false", TQDM_DISABLE="1", PYTHONPATH=os.pathsep.join(paths))


def timed(command: list[str], cwd: Path, env: dict) -> tuple[float, float, list[tuple[float, str]]]:
    """Run a child to its end; its wall time, its start (time.time(), for the marks it prints) and its output lines,
    each with the seconds since the start at which it came."""
    started_at = time.time()
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in process.stdout:
            lines.append((time.perf_counter() - start, line.rstrip("\n")))
        process.wait(timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        raise SystemExit(f"{' '.join(command)} ran past {CHILD_TIMEOUT_S} s and was stopped")
    wall = time.perf_counter() - start
    if process.returncode != 0:
        tail = "\n".join(line for _, line in lines[-30:])
        raise SystemExit(f"{' '.join(command)} failed (exit {process.returncode}):\n{tail}")
    return wall, started_at, lines


def run_rlft(folder: Path, model_dir: Path, train_file: Path, args, compiled: bool, name: str) -> dict:
    out = folder / f"out-{name}"
    config = folder / f"{name}.yaml"
    config.write_text(yaml.safe_dump(grpo.rlft_settings(model_dir, train_file, out, args.steps, args, None, compiled)))
    wall, _, lines = timed([sys.executable, "-m", "rlft.cli", "train", str(config)], folder, child_env(args.threads))
    plan = next(at for at, line in lines if line.startswith("rlft train:"))
    done = next(at for at, line in lines if line.startswith("rlft train: done"))
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [record for record in steps if "step_time_s" in record]
    return {"variant": name, "wall_s": wall, "to_plan_s": plan, "plan_to_done_s": done - plan, "exit_s": wall - done,
            "steps": len(steps), "sum_of_steps_s": sum(r["step_time_s"] for r in steps),
            "median_step_s": median(r["step_time_s"] for r in steps)}


def run_trl(folder: Path, model_dir: Path, prompts_file: Path, args, compiled: bool, name: str) -> dict:
    spec = folder / f"{name}.json"
    spec.write_text(json.dumps({"model": str(model_dir), "prompts": str(prompts_file),
                                "config": grpo.trl_settings(folder / f"out-{name}", args.steps, args, compiled)}))
    wall, started_at, lines = timed([sys.executable, str(folder / "trl_grpo.py"), str(spec)], folder, child_env(args.threads))
    marks = json.loads(next(line for _, line in lines if line.startswith("bench marks: ")).removeprefix("bench marks: "))
    return {"variant": name, "wall_s": wall, "imports_s": marks["imports"] - started_at,
            "build_s": marks["built"] - marks["imports"], "train_s": marks["trained"] - marks["built"],
            "save_and_exit_s": started_at + wall - marks["trained"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="S")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="rounds (a warm-up round runs first, not counted)")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of both children (grpo.py's default, 1)")
    parser.add_argument("--rlft-compile", choices=["both", "on", "off"], default="both")
    parser.add_argument("--trl-compile", choices=["both", "on", "off"], default="both")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results/grpo_wall-<size>-<steps>.json)")
    args = parser.parse_args()
    # the workload of grpo.py's defaults
    args.bf16, args.force_length, args.long, args.vocab = False, True, False, None

    rlft_side = {compiled: variant_name("rlft", compiled) for compiled in compile_choices(args.rlft_compile)}
    trl_side = {compiled: variant_name("trl", compiled) for compiled in compile_choices(args.trl_compile)}
    variants = {name: ("rlft", compiled) for compiled, name in rlft_side.items()}
    variants.update({name: ("trl", compiled) for compiled, name in trl_side.items()})
    with tempfile.TemporaryDirectory(prefix="rlft-bench-wall-") as tmp:
        folder = Path(tmp)
        model_dir = make_model(folder / "model", args.size, args.seed)
        prompts_file = folder / "prompts.jsonl"
        write_jsonl([{"prompt": row["prompt"]} for row in split_rows()[0]], prompts_file)
        reward = inspect.getsource(grpo.count_a_reward)
        (folder / f"{grpo.REWARD_MODULE}.py").write_text(reward)  # rlft imports it from its working directory
        (folder / "trl_grpo.py").write_text(TRL_SCRIPT.format(reward=reward))

        def run(name: str) -> dict:
            tool, compiled = variants[name]
            if tool == "rlft":
                return run_rlft(folder, model_dir, prompts_file, args, compiled, name)
            return run_trl(folder, model_dir, prompts_file, args, compiled, name)

        for name in variants:
            run(name)
        load_before = os.getloadavg()
        runs: dict[str, list[dict]] = {name: [] for name in variants}
        for index, order in enumerate(round_orders(list(variants), args.repeat)):
            for name in order:
                runs[name].append(run(name))
                print(f"round {index + 1}/{args.repeat} {name}: wall {runs[name][-1]['wall_s']:.2f} s", flush=True)
        load_after = os.getloadavg()
    ratios = fair_ratios(runs, rlft_side, trl_side, key="wall_s")
    parts = {name: {key: median(run[key] for run in variant_runs) for key in variant_runs[0] if key.endswith("_s")}
             for name, variant_runs in runs.items()}
    report = {
        "benchmark": "grpo_wall",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "size": args.size, "steps": args.steps, "threads": args.threads, "repeat": args.repeat,
        "workload": "bench/grpo.py's defaults: G = 4, 8 completions of 32 tokens per step, fp32, beta 0",
        "variants": {name: {"tool": tool, "torch_compile": compiled} for name, (tool, compiled) in variants.items()},
        "round_orders": round_orders(list(variants), args.repeat),
        "load_average_1m_before_after": [load_before[0], load_after[0]],
        "cpu_count": os.cpu_count(), "machine": platform.processor() or platform.machine(),
        "ratios": ratios, "medians": parts, "all_runs": runs,
    }
    print(f"\nGRPO {args.size}, {args.steps} steps, each run a fresh process, {args.threads} thread(s), {args.repeat} rounds; "
          f"1-min load average before/after {load_before[0]:.2f}/{load_after[0]:.2f}; medians over the rounds (s):")
    for name, values in parts.items():
        print(f"  {name:14s} " + ", ".join(f"{key.removesuffix('_s')} {value:.2f}" for key, value in values.items()))
    print(describe_ratios(ratios).replace("TRL/rlft", "TRL/rlft wall") + "  (>1: rlft is faster)")
    out = args.out or RESULTS / f"grpo_wall-{args.size}-{args.steps}.json"
    write_report(out, report)


if __name__ == "__main__":
    main()
