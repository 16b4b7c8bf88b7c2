"""rlft against TRL on a CUDA GPU, both compiled, in one short script: SFT, DPO and GRPO at size L in bf16, and decode.

Each part is one of the CPU benches run as a process of its own, with the GPU settings:
  decode  bench/decode.py --device cuda --bf16 --size L --vocab 32768 --rows 32 --new-tokens 128: rlft's engine
          eager and compiled (its step as CUDA graphs) against transformers' generate; tokens/s
  sft     bench/sft_vs_trl.py --size L --bf16 --long --vocab 32768 --micro-batch 8 --lr 3e-4: rows of 64-640 tokens
  dpo     bench/preference.py --size L --bf16 --long --vocab 32768 --rows 64: prompts up to 640 tokens
  grpo    bench/grpo.py --size L --bf16 --long --vocab 32768: prompts of 75-601 tokens, 32-token completions
The training parts run rlft with `torch_compile: true` against TRL with `torch_compile=True` (--with-trl-eager adds
TRL as shipped, eager), alternating over --repeat rounds, each run after common.reset_between_runs; each bench's JSON
holds its median steps, ratios (common.fair_ratios) and peak GPU memory (torch.cuda.max_memory_allocated). This
script gathers them into one file, with the machine.

The parts run in the order above, each with a time limit, and the whole within --budget-s (default 450 s, meant to
leave a lent GPU's 8 minutes room for the start-up); a part that would not fit is skipped and named in the output.
Without a CUDA GPU the script stops at once and says so: nothing here runs on a CPU (the CPU benches are the scripts
above, run without these settings).

Usage (a CUDA GPU; from the repository root):
  python bench/gpu_fair.py [--budget-s 450] [--repeat 2] [--only decode sft dpo grpo] [--with-trl-eager]
Results: bench/results/gpu_fair-<GPU>.json and each bench's own JSON under bench/results/gpu_fair-<GPU>/.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PARTS = ("decode", "sft", "dpo", "grpo")
# each part's least time to be worth starting (its compiles alone take most of it on an H200)
LEAST_S = {"decode": 45, "sft": 90, "dpo": 90, "grpo": 90}


def fail(message: str) -> None:
    print(f"bench/gpu_fair.py: {message}", file=sys.stderr)
    raise SystemExit(2)


def check_machine() -> str:
    """The GPU's name; stops with a clear message where there is none, or where TRL is missing."""
    try:
        import torch
    except ImportError:
        fail("PyTorch is not installed in this Python; run it with the project's environment (.venv/bin/python)")
    if not torch.cuda.is_available():
        fail(f"needs a CUDA GPU, and torch {torch.__version__} sees none on this machine (torch.cuda.is_available() is "
             "False). Run it on a machine with an NVIDIA GPU and a CUDA build of PyTorch; on a CPU run the benches "
             "themselves: bench/sft_vs_trl.py, bench/preference.py, bench/grpo.py")
    try:
        import trl  # noqa: F401
    except ImportError:
        fail("needs TRL to compare against: pip install 'trl==1.16.0' (the project's `bench` extra)")
    return torch.cuda.get_device_name()


def commands(repeat: int, trl_compile: str, folder: Path) -> dict[str, list[str]]:
    python = sys.executable
    training = ["--size", "L", "--bf16", "--long", "--vocab", "32768", "--rlft-compile", "on", "--trl-compile", trl_compile,
                "--repeat", str(repeat)]
    return {
        "decode": [python, str(BENCH / "decode.py"), "--device", "cuda", "--bf16", "--size", "L", "--vocab", "32768",
                   "--rows", "32", "--new-tokens", "128", "--repeat", "5", "--out", str(folder / "decode.json")],
        "sft": [python, str(BENCH / "sft_vs_trl.py"), *training, "--micro-batch", "8", "--lr", "3e-4", "--steps", "20",
                "--no-plain-loop", "--out", str(folder / "sft.json")],
        "dpo": [python, str(BENCH / "preference.py"), *training, "--rows", "64", "--steps", "8", "--no-plain-loop",
                "--out", str(folder / "dpo.json")],
        "grpo": [python, str(BENCH / "grpo.py"), *training, "--steps", "8", "--out", str(folder / "grpo.json")],
    }


def summary(part: str, result: dict) -> dict:
    """The numbers the README quotes from a part's JSON."""
    if part == "decode":
        return {key: result.get(key) for key in ("tokens_per_s", "peak_memory_mib", "first_compiled_call_s", "parity")}
    ratios = result["ratios"]
    groups = ratios.items() if part == "dpo" else [("", ratios)]
    out = {"peak_memory_mib": result["peak_memory_mib"]}
    for name, group in groups:
        prefix = f"{name}/" if name else ""
        out[f"{prefix}median_step_ms"] = {k: round(v * 1e3, 2) for k, v in group["median_over_rounds_s"].items()}
        out[f"{prefix}ratio_trl_over_rlft"] = {k: round(group[k]["median_of_rounds"], 3)
                                               for k in ("fair", "vs_shipped", "eager", "compiled") if k in group}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--repeat", type=int, default=2, help="rounds of each training bench")
    parser.add_argument("--budget-s", type=float, default=450, help="seconds for all parts together")
    parser.add_argument("--with-trl-eager", action="store_true", help="also TRL as shipped (eager): more runs per round")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    gpu = check_machine()
    name = gpu.replace("NVIDIA ", "").split()[0]
    folder = BENCH / "results" / f"gpu_fair-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    report = {"benchmark": "gpu_fair", "date": datetime.datetime.now().isoformat(timespec="seconds"), "gpu": gpu,
              "command": " ".join(sys.argv), "parts": {}, "skipped": {}}
    for part, command in commands(args.repeat, "both" if args.with_trl_eager else "on", folder).items():
        if part not in args.only:
            continue
        left = args.budget_s - (time.monotonic() - start)
        if left < LEAST_S[part]:
            report["skipped"][part] = f"{left:.0f} s left of --budget-s, under the {LEAST_S[part]} s it needs"
            print(f"{part}: skipped ({report['skipped'][part]})", flush=True)
            continue
        print(f"{part}: {' '.join(command[1:])} (at most {left:.0f} s)", flush=True)
        began = time.monotonic()
        try:
            done = subprocess.run(command, cwd=REPO, env=env, timeout=left, capture_output=True, text=True,
                                  check=False)
        except subprocess.TimeoutExpired:
            report["skipped"][part] = f"stopped after {left:.0f} s (the budget ran out)"
            print(f"{part}: {report['skipped'][part]}", flush=True)
            continue
        out = Path(command[command.index("--out") + 1])
        if done.returncode != 0 or not out.exists():
            report["skipped"][part] = f"exit {done.returncode}: " + "\n".join(done.stderr.strip().splitlines()[-15:])
            print(f"{part}: failed\n{report['skipped'][part]}", flush=True)
            continue
        print("\n".join(done.stdout.strip().splitlines()[-25:]), flush=True)
        report["parts"][part] = {"seconds": round(time.monotonic() - began, 1), "json": str(out.relative_to(REPO)),
                                 **summary(part, json.loads(out.read_text()))}
    report["seconds"] = round(time.monotonic() - start, 1)
    path = args.out or BENCH / "results" / f"gpu_fair-{name}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path} ({report['seconds']} s; skipped: {', '.join(report['skipped']) or 'none'})")


if __name__ == "__main__":
    main()
