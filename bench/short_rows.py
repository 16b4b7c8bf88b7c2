"""A compiled SFT step with short rows attending through SDPA's math path (rlft's default on a CPU) against the CPU
flash-attention kernel, alternating in one process.

    .venv/bin/python bench/short_rows.py                 # size S, 100 steps, 5 rounds, 2 torch threads

rlft's own SFT run (`bench/sft_vs_trl.py`'s settings: the addition rows, micro batch 32, `torch_compile: true`) is
trained `--rounds` times with each setting in turn; the flash-attention runs set `rlft.models.varlen.MATH_KEYS` to 0,
so that no row takes the math path. Each run compiles afresh (dynamo's caches are reset). The first round is a
warm-up and not reported. Results: a table on stdout and bench/results/short_rows-<size>.json.

`alternate` runs any two settings this way (`bench/optimizer_step.py` uses it), `sft_run` is the run
(`bench/step_profile.py` profiles it).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Callable, ContextManager

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sft_vs_trl  # noqa: E402
from common import RESULTS, make_model, quiet  # noqa: E402

import rlft.models.varlen as varlen  # noqa: E402
from rlft.tasks.addition import split_rows, write_jsonl  # noqa: E402


def parse(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--size", default="S")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


def sft_run(size: str, seed: int, steps: int, compile: bool = True):
    """`run(out_dir)`: rlft's SFT run of `bench/sft_vs_trl.py` (the addition rows, micro batch 32) on a seeded model of
    `size`, into `out_dir`; returns its result (`sft_vs_trl.run_rlft`)."""
    tmp = Path(tempfile.mkdtemp(prefix="rlft-bench-"))
    model_dir = make_model(tmp / "model", size, seed)
    train_file = tmp / "train.jsonl"
    write_jsonl(split_rows()[0], train_file)
    run_args = argparse.Namespace(steps=steps, seed=seed, lr=3e-3, bf16=False, long=False, group_by_length=False,
                                  flatten=False, micro_batch=32, vocab=None)
    return lambda out_dir: sft_vs_trl.run_rlft(model_dir, train_file, out_dir, run_args, compile)


def alternate(args, settings: dict[str, Callable[[], ContextManager]], benchmark: str, baseline: str,
              extra: dict | None = None) -> dict:
    """rlft's compiled SFT run under each setting in turn, `args.rounds` times, the first round a warm-up; prints each
    setting's median step, forward+backward and optimizer phases, and `baseline`'s median step over the first
    setting's; writes bench/results/<benchmark>-<size>.json (or --out), with `extra` in it, and returns the report."""
    quiet()
    torch.set_num_threads(args.threads)
    run = sft_run(args.size, args.seed, args.steps)
    tmp = Path(tempfile.mkdtemp(prefix=f"rlft-{benchmark}-"))
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {name: [] for name in settings}
    for index in range(args.rounds):
        for name, setting in settings.items():
            torch._dynamo.reset()
            with setting():
                result = run(tmp / f"out-{index}-{name}")
            if index:
                runs[name].append({"median_step_s": result["median_step_s"], "phase_medians": result["phase_medians"],
                                   "loss_last10_mean": result["loss_last10_mean"]})
    load_after = os.getloadavg()
    summary = {}
    for name, values in runs.items():
        steps = [v["median_step_s"] for v in values]
        phase = lambda key: statistics.median(v["phase_medians"][key] for v in values)  # noqa: E731
        optimizer = [v["phase_medians"]["optimizer_median_s"] for v in values]
        summary[name] = {"median_step_s": statistics.median(steps), "forward_backward_s": phase("forward_backward_median_s"),
                         "optimizer_s": phase("optimizer_median_s"), "loss_last10_mean": values[0]["loss_last10_mean"]}
        print(f"{name:10s} median step {summary[name]['median_step_s'] * 1e3:6.1f} ms (rounds: "
              f"{', '.join(f'{s * 1e3:.1f}' for s in steps)}), forward+backward {summary[name]['forward_backward_s'] * 1e3:.1f} ms, "
              f"optimizer {summary[name]['optimizer_s'] * 1e3:.2f} ms (rounds: "
              f"{', '.join(f'{o * 1e3:.2f}' for o in optimizer)}), "
              f"loss of the last 10 steps {summary[name]['loss_last10_mean']:.6f}")
    first = next(iter(settings))
    ratio = summary[baseline]["median_step_s"] / summary[first]["median_step_s"]
    print(f"{baseline}/{first} median step {ratio:.2f}x; load average before/after {load_before[0]:.2f}/{load_after[0]:.2f}")
    report = {"benchmark": benchmark, "date": datetime.datetime.now().isoformat(timespec="seconds"), "size": args.size,
              "steps": args.steps, "rounds_reported": args.rounds - 1, "threads": args.threads,
              **(extra or {}), "load_average_1m_before_after": [load_before[0], load_after[0]], "summary": summary,
              f"ratio_{baseline}_over_{first}": ratio, "runs": runs, "versions": {"torch": torch.__version__},
              "command": " ".join(["bench/" + Path(sys.argv[0]).name, *sys.argv[1:]])}
    out = args.out or RESULTS / f"{benchmark}-{args.size}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return report


def main() -> None:
    args = parse(__doc__.split("\n")[0])
    limit = varlen.MATH_KEYS

    @contextlib.contextmanager
    def keys(value: int):
        varlen.MATH_KEYS = value
        try:
            yield
        finally:
            varlen.MATH_KEYS = limit

    alternate(args, {"math": lambda: keys(limit), "flash": lambda: keys(0)}, "short_rows", "flash", {"math_keys": limit})


if __name__ == "__main__":
    main()
