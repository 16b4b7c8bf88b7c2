"""What only a GPU can show (issue 13), each run through the real `rlft train` command:

  strided  strided EBFT with flex_attention (the strided rule as a BlockMask) against SDPA with the identical dense
           mask: the same losses in fp32, then median step time, generation time and peak GPU memory in bf16.
  liger    SFT with Liger Kernel's RoPE, RMSNorm, SwiGLU and fused linear cross-entropy against rlft's own layers and
           chunked loss: the same losses in fp32, then median step time, tokens/s and peak GPU memory in bf16.

Models are built from a config (rlft.models.tiny size L: hidden 1024, 8 layers; the byte tokenizer, with a 32768-entry
output layer for the SFT runs as a real tokenizer has), seeded, saved once; data is made here (sums, "12+34=46").
Each run is an `rlft train` process of its own: precision is set per process (accelerate), and Liger patches the model
classes of the process it runs in.

Usage (a CUDA GPU; from the repository root):
  python bench/gpu_check.py [--steps 12] [--out bench/results/gpu_check.json]
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("TQDM_DISABLE", "1")

import argparse
import datetime
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, device_name, make_model, quiet  # noqa: E402

SEQUENCE_LEN = 512
RUN_TIMEOUT_S = 300


def documents(count: int, length: int, seed: int) -> list[dict]:
    """Raw-text rows of solved sums, about `length` characters (= byte tokens) each."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        parts = []
        while sum(map(len, parts)) < length:
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            parts.append(f"{a}+{b}={a + b}\n")
        rows.append({"text": "".join(parts)[:length]})
    return rows


def write_rows(rows: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def run(settings: dict, out: Path) -> dict:
    """One `rlft train` process (precision and Liger's patches are per process); its per-step records from
    metrics.jsonl and the wall time of the command."""
    out.mkdir(parents=True, exist_ok=True)
    config = out / "config.yaml"  # JSON is YAML
    config.write_text(json.dumps({**settings, "output_dir": str(out / "run")}))
    command = [sys.executable, "-c", "from rlft.cli import run_command; run_command()", "train", str(config)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"rlft train {config} exited with {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    records = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {"wall_s": round(wall, 2), "steps": [r for r in records if "step_time_s" in r]}


def summary(result: dict, skip: int) -> dict:
    """Medians over the steps after the first `skip` (compilation, autotuning), and the run's peak GPU memory."""
    steps = result["steps"][skip:] or result["steps"]
    median = lambda key: round(statistics.median(s.get(key, 0.0) for s in steps), 5)  # noqa: E731
    return {"median_step_s": median("step_time_s"), "median_tokens_per_s": median("tokens_per_s"),
            "median_generate_s": median("time/generate"), "median_reward_s": median("time/reward"),
            "median_forward_backward_s": median("time/forward_backward"), "median_mfu": median("mfu"),
            "peak_memory_mb": max(s["peak_memory_mb"] for s in result["steps"]), "first_step_s": result["steps"][0]["step_time_s"],
            "losses": [s["loss"] for s in result["steps"]], "wall_s": result["wall_s"]}


def strided_check(tmp: Path, args) -> dict:
    model = make_model(tmp / "model-strided", args.size, args.seed)
    data = write_rows(documents(256, SEQUENCE_LEN - 8, args.seed), tmp / "documents.jsonl")
    base = {"base_model": str(model), "rl": "ebft", "datasets": [{"path": str(data)}], "sequence_len": SEQUENCE_LEN,
            "ebft": {"mode": "strided", "stride": 8, "context_length": 8, "generate_max_len": 8, "n_samples_per_prompt": 4,
                     "temperature": 0.6, "feature_layers": [0.5, 1.0], "embed_method": "last_token", "use_whitening": True,
                     "rl_coef": 1.0, "ce_coef": 0.03, "advantage_estimator": "rloo"},
            "micro_batch_size": 4, "learning_rate": 1e-5, "lr_scheduler": "constant", "logging_steps": 1, "seed": args.seed,
            "save_steps": 10_000}
    report = {}
    for precision, steps in (("fp32", 3), ("bf16", args.steps)):
        for attention in ("flex", "sdpa"):
            settings = {**base, "max_steps": steps, "bf16": precision == "bf16", "flex_attention": attention == "flex"}
            result = summary(run(settings, tmp / f"strided-{precision}-{attention}"), skip=2)
            report[f"{precision}_{attention}"] = result
            print(f"strided {precision} {attention}: median step {result['median_step_s'] * 1e3:.1f} ms, generate "
                  f"{result['median_generate_s'] * 1e3:.1f} ms, peak {result['peak_memory_mb']:.0f} MiB, first step "
                  f"{result['first_step_s']:.1f} s, losses {result['losses'][:3]}", flush=True)
    fp32 = [abs(a - b) for a, b in zip(report["fp32_flex"]["losses"], report["fp32_sdpa"]["losses"])]
    report["fp32_max_loss_difference"] = max(fp32)
    report["bf16_speedup_flex_over_sdpa"] = round(report["bf16_sdpa"]["median_step_s"] / report["bf16_flex"]["median_step_s"], 3)
    report["tokens"] = {"sequence_len": SEQUENCE_LEN, "rows": 16, "blocks": (SEQUENCE_LEN - 8 - 8) // 8 + 1,
                        "strided_sequence_columns": SEQUENCE_LEN + ((SEQUENCE_LEN - 8 - 8) // 8 + 1) * 8}
    return report


def liger_check(tmp: Path, args) -> dict:
    import importlib.metadata

    model = make_model(tmp / "model-sft", args.size, args.seed, vocab=32768)
    rows = [{"prompt": row["text"][:40], "completion": row["text"][40:]} for row in documents(512, 1000, args.seed + 1)]
    data = write_rows(rows, tmp / "sft.jsonl")
    base = {"base_model": str(model), "datasets": [{"path": str(data)}], "sequence_len": 1024, "train_on_inputs": True,
            "micro_batch_size": 8, "learning_rate": 1e-4, "lr_scheduler": "constant", "logging_steps": 1, "seed": args.seed,
            "save_steps": 10_000}
    kernels = {"liger_rope": True, "liger_rms_norm": True, "liger_glu_activation": True, "liger_fused_linear_cross_entropy": True}
    report = {"liger_kernel": importlib.metadata.version("liger-kernel") if torch.cuda.is_available() else None}
    for kernel in ("rlft", "liger"):
        for precision, steps in (("fp32", 3), ("bf16", args.steps)):
            on = kernel == "liger" and torch.cuda.is_available()  # a CPU rehearsal (--size XS) runs the plumbing only
            settings = {**base, "max_steps": steps, "bf16": precision == "bf16", **(kernels if on else {})}
            result = summary(run(settings, tmp / f"sft-{kernel}-{precision}"), skip=2)
            report[f"{precision}_{kernel}"] = result
            print(f"sft {precision} {kernel}: median step {result['median_step_s'] * 1e3:.1f} ms, "
                  f"{result['median_tokens_per_s']:,.0f} tokens/s, MFU {result['median_mfu']:.3f}, peak "
                  f"{result['peak_memory_mb']:.0f} MiB, losses {result['losses'][:3]}", flush=True)
    report["fp32_max_loss_difference"] = max(abs(a - b) for a, b in zip(report["fp32_rlft"]["losses"], report["fp32_liger"]["losses"]))
    report["bf16_speedup_liger_over_rlft"] = round(report["bf16_rlft"]["median_step_s"] / report["bf16_liger"]["median_step_s"], 3)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=12, help="bf16 steps per run (the first two are not timed)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=["strided", "liger"], default=None)
    parser.add_argument("--size", default="L", help="model size (rlft.models.tiny.SIZES); XS rehearses the script on a CPU")
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu_check.json")
    args = parser.parse_args()
    if not torch.cuda.is_available() and args.size != "XS":
        raise SystemExit("bench/gpu_check.py needs a CUDA GPU (--size XS rehearses it on a CPU)")
    quiet()
    report = {"benchmark": "gpu_check", "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "machine": device_name(), "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                                                     "cuda": torch.version.cuda}}
    with tempfile.TemporaryDirectory(prefix="rlft-gpu-") as tmp:
        for name, check in (("strided", strided_check), ("liger", liger_check)):
            if args.only and name != args.only:
                continue
            started = time.perf_counter()
            try:
                report[name] = check(Path(tmp), args)
            except Exception as exc:  # one check failing must not lose the others' numbers
                traceback.print_exc()
                report[name] = {"error": f"{type(exc).__name__}: {exc}"}
            report[name]["check_s"] = round(time.perf_counter() - started, 1)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items()}, indent=1)[:4000])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
