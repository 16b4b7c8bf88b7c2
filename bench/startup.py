"""What a short `rlft train` costs around its steps: start-up to the plan, the steps, and the exit after the summary.

    .venv/bin/python bench/startup.py                      # 1 and 2 processes, 3 runs each
    .venv/bin/python bench/startup.py --against 12d6d21    # and the same runs of rlft at that commit, in turns

Each run is the real command (`rlft train CONFIG [--num-processes 2]`) on an XS model for 3 SFT steps, its output
read line by line as it comes: `plan` is when the plan's title line appears, `steps` the time from there to
`rlft train: done`, `exit` from there to the command's end. With `--against REV` the commit is checked out in a git
worktree and run with the same Python and packages (its `src/` first on PYTHONPATH), in turns with this tree, so
that both are measured on the same machine at the same time. Results: bench/results/startup.json. Not a test:
nothing asserts on timings.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import RESULTS, free_port, make_model, median, worktree  # noqa: E402

import yaml  # noqa: E402

from rlft.tasks.addition import split_rows, write_jsonl  # noqa: E402


def timed_run(config: Path, processes: int, src: Path) -> dict:
    command = [sys.executable, "-m", "rlft.cli", "train", str(config)]
    if processes > 1:
        command += ["--num-processes", str(processes), "--main-process-port", str(free_port())]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1" if processes > 1 else "2",
               PYTHONPATH=os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])]))
    where = subprocess.run([sys.executable, "-c", "import rlft; print(rlft.__file__)"], env=env, capture_output=True,
                           text=True, check=True).stdout.strip()
    if not where.startswith(str(src)):
        raise SystemExit(f"rlft comes from {where}, not from {src}")
    start = time.perf_counter()
    marks = {}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    for line in process.stdout:
        if line.startswith("rlft train: done"):
            marks["done"] = time.perf_counter() - start
        elif line.startswith("rlft train:") and "plan" not in marks:
            marks["plan"] = time.perf_counter() - start
    process.wait()
    end = time.perf_counter() - start
    if process.returncode != 0 or len(marks) != 2:
        raise SystemExit(f"{' '.join(command)} failed (exit {process.returncode})")
    return {"plan_s": round(marks["plan"], 3), "steps_s": round(marks["done"] - marks["plan"], 3),
            "exit_s": round(end - marks["done"], 3), "total_s": round(end, 3)}


def summary(runs: list[dict]) -> dict:
    return {key: round(median(run[key] for run in runs), 3) for key in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--against", help="a git revision to compare with, run in turns with this tree")
    parser.add_argument("--out", type=Path, default=RESULTS / "startup.json")
    args = parser.parse_args()
    folder = Path(os.environ.get("RLFT_BENCH_DIR", "/tmp/rlft-bench-startup"))
    folder.mkdir(parents=True, exist_ok=True)
    model = make_model(folder / "model-XS", "XS", seed=0)
    write_jsonl(split_rows()[0][:256], folder / "train.jsonl")
    head = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True,
                          check=True).stdout.strip()
    trees = {head: REPO / "src"}
    if args.against:
        trees[args.against] = worktree(args.against, folder) / "src"
    runs: dict[str, list[dict]] = {}
    for round_ in range(args.repeat + 1):  # round 0 warms the file cache and is not counted
        for processes in (1, 2):
            for name, src in trees.items():
                config = folder / f"{processes}.yaml"
                shutil.rmtree(folder / "out", ignore_errors=True)
                config.write_text(yaml.safe_dump({
                    "base_model": str(model), "datasets": [{"path": str(folder / "train.jsonl")}], "sequence_len": 32,
                    "micro_batch_size": 8, "max_steps": 3, "learning_rate": 1e-3, "logging_steps": 1, "seed": 0,
                    "output_dir": str(folder / "out")}))
                result = timed_run(config, processes, src)
                if round_:
                    runs.setdefault(f"{name}, {processes} process(es)", []).append(result)
                    print(f"{name:>12}, {processes} process(es): {result}", flush=True)
    report = {"machine": {"cpu": next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                                       if line.startswith("model name")), "unknown"), "cores": os.cpu_count(),
                          "load_average": os.getloadavg()},
              "repeat": args.repeat, "medians": {name: summary(rows) for name, rows in runs.items()}, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for name, values in report["medians"].items():
        print(f"{name:>32}: plan {values['plan_s']:.2f} s, steps {values['steps_s']:.2f} s, exit {values['exit_s']:.2f} s, "
              f"total {values['total_s']:.2f} s")


if __name__ == "__main__":
    main()
