"""A compiled SFT step with short rows attending through SDPA's math path (rlft's default on a CPU) against the CPU
flash-attention kernel, alternating in one process.

    .venv/bin/python bench/short_rows.py                 # size S, 100 steps, 5 rounds, 2 torch threads

rlft's own SFT run (`bench/sft_vs_trl.py`'s settings: the addition rows, micro batch 32, `torch_compile: true`) is
trained `--rounds` times with each setting in turn; the flash-attention runs set `rlft.models.varlen.MATH_KEYS` to 0,
so that no row takes the math path. Each run compiles afresh (dynamo's caches are reset). The first round is a
warm-up and not reported. Results: a table on stdout and bench/results/short_rows-<size>.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sft_vs_trl  # noqa: E402
from common import RESULTS, make_model, quiet  # noqa: E402

import rlft.models.varlen as varlen  # noqa: E402
from rlft.tasks.addition import split_rows, write_jsonl  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="S")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    quiet()
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="rlft-short-rows-"))
    model_dir = make_model(tmp / "model", args.size, args.seed)
    train_file = tmp / "train.jsonl"
    write_jsonl(split_rows()[0], train_file)
    run_args = argparse.Namespace(steps=args.steps, seed=args.seed, lr=3e-3, bf16=False, long=False, group_by_length=False,
                                  flatten=False, micro_batch=32, compile=True, vocab=None)
    limit = varlen.MATH_KEYS
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {"math": [], "flash": []}
    for index in range(args.rounds):
        for setting in runs:
            varlen.MATH_KEYS = limit if setting == "math" else 0
            torch._dynamo.reset()
            result = sft_vs_trl.run_rlft(model_dir, train_file, tmp / f"out-{index}-{setting}", run_args)
            if index:
                runs[setting].append({"median_step_s": result["median_step_s"], "phase_medians": result["phase_medians"],
                                      "loss_last10_mean": result["loss_last10_mean"]})
    varlen.MATH_KEYS = limit
    load_after = os.getloadavg()
    summary = {}
    for setting, values in runs.items():
        steps = [v["median_step_s"] for v in values]
        passes = [v["phase_medians"]["forward_backward_median_s"] for v in values]
        summary[setting] = {"median_step_s": statistics.median(steps), "forward_backward_s": statistics.median(passes),
                            "loss_last10_mean": values[0]["loss_last10_mean"]}
        print(f"{setting:6s} median step {summary[setting]['median_step_s'] * 1e3:6.1f} ms (rounds: "
              f"{', '.join(f'{s * 1e3:.1f}' for s in steps)}), forward+backward {summary[setting]['forward_backward_s'] * 1e3:.1f} ms, "
              f"loss of the last 10 steps {summary[setting]['loss_last10_mean']:.6f}")
    ratio = summary["flash"]["median_step_s"] / summary["math"]["median_step_s"]
    print(f"flash/math median step {ratio:.2f}x; load average before/after {load_before[0]:.2f}/{load_after[0]:.2f}")
    report = {"benchmark": "short_rows", "date": datetime.datetime.now().isoformat(timespec="seconds"), "size": args.size,
              "steps": args.steps, "rounds_reported": args.rounds - 1, "threads": args.threads, "math_keys": limit,
              "load_average_1m_before_after": [load_before[0], load_after[0]], "summary": summary,
              "ratio_flash_over_math": ratio, "runs": runs, "versions": {"torch": torch.__version__}}
    out = args.out or RESULTS / f"short_rows-{args.size}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
