"""EBFT speed: strided-mode tokens/s per phase and the structured-mode step split by phase, one process.

There is no EBFT in TRL to compare with, so this benchmark measures rlft alone (DESIGN.md principle 5:
visible performance). Both modes train the same tiny Llama (`rlft.models.tiny`, size S by default:
hidden 128, 2 layers, byte tokenizer), one seeded random init saved once, with the real
`rlft.train.run.train` and the settings of the shipped examples. No eval, no periodic checkpoints,
`logging_steps: 1` so every step has a metrics.jsonl line.

Strided mode (`ebft.mode: strided`, examples/ebft-strided.yaml's settings): documents of six sums
(examples/ebft/data/train.jsonl, about 50 byte tokens each), sequence_len 64, micro batch 8
documents, stride 4, context_length 8, generate_max_len G = 4, n = 4 samples per document,
temperature 0.6, whitening on, feature layers [0.5, 1.0], ce_coef 0.03, rloo. Each step the recipe
generates every block of every row in parallel (B*n rows, K blocks, G tokens, G full forwards
without a KV cache), embeds the whole strided sequence (T = L + K*G columns) with the frozen copy,
and runs one policy forward + backward over the same T columns. Read from metrics.jsonl, where the
strided recipe also logs its rollout's size (`ebft/generated_tokens`, `ebft/sequence_tokens`):
  generate  time/generate; tokens/s = generated tokens (B*n*K*G) / time
  reward    time/reward (frozen-network forward over B*n*T columns, pooling, whitening, rewards,
            advantages); tokens/s = B*n*T / time
  update    time/forward_backward - time/generate - time/reward (the recipe's loss() generates and
            scores inside the loop's forward_backward timer) + time/optimizer; tokens/s = B*n*T / time

Structured mode (`ebft.mode: structured`, examples/ebft-structured.yaml's settings except the
lengths): "a+b=" prompts (rlft.tasks.addition), num_generations 4, 16 completions per step (4
prompts x 4, one micro-batch), max_completion_length 32 (a random model rarely samples EOS, so
completions are about 32 tokens; adaptive_max_tokens keeps the cap at 32), temperature 1.0,
loss_type grpo, completion_mean features of layers [0.5, 1.0], no whitening, ce_coef 0.03. Phases
from metrics.jsonl: time/generate, time/reward (the feature forward of the 16 completions and the
4 ground truths, plus the rewards), the rest of time/prepare (advantages, batch building),
time/forward_backward (policy loss + the ground-truth CE), time/optimizer, and step_time_s.

Each mode runs --repeat times (alternating) after a 2-step warm-up of each; the table shows each
mode's run with the smallest median step, the JSON keeps every run and the 1-minute load average
(a shared 2-core machine is noisy: check it before trusting a number).

Strided mode's two ways to the vocabulary (--compare-logits, with --vocab N for a real tokenizer's output layer; the
text keeps the byte tokenizer's ids): the policy's log-probs and document NLL read through the output layer at the
read positions only, a chunk at a time (rlft.rollout.strided_scores, the default for a vocabulary of 4,096 entries or
more, forced here for smaller ones), against the model's whole (B*n, T, V) logits (the path below that size, and the only one before). Alternating
runs of the strided mode alone; the median step of each, then one more run of each under a resident-memory sampler
for its peak above the start (bench/common.py `peak_memory`), and whether the losses agree.

Usage (from the repository root):
  .venv/bin/python bench/ebft.py --size S --steps 20
  .venv/bin/python bench/ebft.py --compare-logits --vocab 32768 --steps 10
Results: a table on stdout and bench/results/ebft-<size>.json (ebft-paths-<size>-v<vocab>.json with --compare-logits).
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("TQDM_DISABLE", "1")

import argparse
import datetime
import io
import json
import platform
import tempfile
import time
from pathlib import Path

import torch
import transformers
from rich.console import Console
from transformers import LlamaForCausalLM

import accelerate  # noqa: F401  (imported here so its import cost stays out of the timings)
import datasets
import rlft.data.prepare  # noqa: F401
import rlft.models.loading  # noqa: F401
import rlft.train.trainer  # noqa: F401
import rlft.train.recipes.ebft  # noqa: F401
import rlft.train.run
from common import RESULTS, make_model, median, peak_memory, quiet, rlft_keys, write_report
from rlft.models import head
from rlft.config import build_config
from rlft.models.tiny import SIZES
from rlft.tasks.addition import split_rows, write_jsonl

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ROOT / "examples" / "ebft" / "data" / "train.jsonl"

STRIDED = dict(stride=4, context_length=8, generate_max_len=4, n_samples_per_prompt=4, temperature=0.6,
               use_whitening=True, ce_coef=0.03, micro_batch_size=8, sequence_len=64)
STRUCTURED = dict(num_generations=4, completions_per_step=16, max_completion_length=32, temperature=1.0, ce_coef=0.03)
LR = 2e-4
STRUCTURED_PHASES = ("prepare", "generate", "reward", "logprobs", "rollout_total", "forward_backward", "optimizer")


def train_and_read(cfg) -> tuple[float, list[dict]]:
    console = Console(file=io.StringIO(), width=120)  # rendered like a non-terminal run, not shown
    start = time.perf_counter()
    rlft.train.run.train(cfg, console)
    wall = time.perf_counter() - start
    records = [json.loads(line) for line in (Path(cfg.output_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return wall, [r for r in records if "step_time_s" in r]


# --------------------------------------------------------------------------- strided


def run_strided(model_dir: Path, out_dir: Path, steps: int, seed: int) -> dict:
    s = STRIDED
    cfg = build_config({
        **rlft_keys(model_dir, out_dir, steps, seed, LR),
        "rl": "ebft",
        "ebft": {"mode": "strided", "stride": s["stride"], "context_length": s["context_length"],
                 "generate_max_len": s["generate_max_len"], "n_samples_per_prompt": s["n_samples_per_prompt"],
                 "temperature": s["temperature"], "feature_layers": [0.5, 1.0], "embed_method": "last_token",
                 "use_whitening": s["use_whitening"], "ce_coef": s["ce_coef"], "rl_coef": 1.0,
                 "advantage_estimator": "rloo"},
        "datasets": [{"path": str(DOCUMENTS)}],
        "sequence_len": s["sequence_len"],
        "micro_batch_size": s["micro_batch_size"],
    }, source="bench")

    wall, steps_ = train_and_read(cfg)
    per_step = []
    for record in steps_:  # the strided recipe logs its rollout's shape with every step
        generated, columns = record["ebft/generated_tokens"], record["ebft/sequence_tokens"]
        rows = cfg.micro_batch_size * s["n_samples_per_prompt"]
        shape = {"rows": rows, "blocks": generated / (rows * s["generate_max_len"]), "gen_len": s["generate_max_len"],
                 "total_len": columns / rows, "valid_blocks": record["ebft/num_blocks"]}
        generate, reward = record["time/generate"], record["time/reward"]
        forward_backward = record["time/forward_backward"] - generate - reward
        update = forward_backward + record["time/optimizer"]
        per_step.append({**shape, "generated_tokens": generated, "sequence_tokens": columns, "generate_s": generate,
                         "reward_s": reward, "policy_forward_backward_s": forward_backward,
                         "optimizer_s": record["time/optimizer"], "update_s": update, "step_s": record["step_time_s"]})
    summed = ("generated_tokens", "sequence_tokens", "generate_s", "reward_s", "update_s")
    total = {key: sum(p[key] for p in per_step) for key in summed}
    return {
        "wall_s": wall,
        "steps": len(per_step),
        "median_step_s": median(p["step_s"] for p in per_step),
        "median_generate_s": median(p["generate_s"] for p in per_step),
        "median_reward_s": median(p["reward_s"] for p in per_step),
        "median_policy_forward_backward_s": median(p["policy_forward_backward_s"] for p in per_step),
        "median_optimizer_s": median(p["optimizer_s"] for p in per_step),
        "median_update_s": median(p["update_s"] for p in per_step),
        "median_rows": median(p["rows"] for p in per_step),
        "median_blocks": median(p["blocks"] for p in per_step),
        "median_total_len": median(p["total_len"] for p in per_step),
        "median_generated_tokens": median(p["generated_tokens"] for p in per_step),
        "median_sequence_tokens": median(p["sequence_tokens"] for p in per_step),
        "generate_tokens_per_s": total["generated_tokens"] / total["generate_s"],
        "reward_tokens_per_s": total["sequence_tokens"] / total["reward_s"],
        "update_tokens_per_s": total["sequence_tokens"] / total["update_s"],
        "generated_tokens_per_step_s": total["generated_tokens"] / sum(p["step_s"] for p in per_step),
        "per_step": per_step,
        "losses": [r["loss"] for r in steps_],
        "ebft_reward": [r.get("ebft/reward") for r in steps_],
    }


# --------------------------------------------------------------------------- structured


def run_structured(model_dir: Path, prompts_file: Path, out_dir: Path, steps: int, seed: int) -> dict:
    s = STRUCTURED
    cfg = build_config({
        **rlft_keys(model_dir, out_dir, steps, seed, LR),
        "rl": "ebft",
        "ebft": {"mode": "structured", "feature_layers": [0.5, 1.0], "embed_method": "completion_mean",
                 "use_whitening": False, "alignment_coef": 1.0, "diversity_coef": 1.0, "ce_coef": s["ce_coef"]},
        "trl": {"num_generations": s["num_generations"], "max_completion_length": s["max_completion_length"],
                "temperature": s["temperature"], "loss_type": "grpo"},
        "datasets": [{"path": str(prompts_file)}],
        "sequence_len": 64,  # prompt (<= 7 tokens) + 32 completion tokens fit
        "micro_batch_size": s["completions_per_step"],
    }, source="bench")
    wall, steps_ = train_and_read(cfg)
    phases = {f"{name}_median_s": median(r.get(f"time/{name}", 0.0) for r in steps_) for name in STRUCTURED_PHASES}
    phases["prepare_rest_median_s"] = median(r.get("time/prepare", 0.0) - r.get("time/generate", 0.0) - r.get("time/reward", 0.0)
                                             - r.get("time/logprobs", 0.0) for r in steps_)
    phases["step_other_median_s"] = median(r["step_time_s"] - r.get("time/prepare", 0.0) - r.get("time/forward_backward", 0.0)
                                           - r.get("time/optimizer", 0.0) for r in steps_)
    generated = [r["completions/mean_length"] * s["completions_per_step"] for r in steps_]
    return {
        "wall_s": wall,
        "steps": len(steps_),
        "median_step_s": median(r["step_time_s"] for r in steps_),
        "step_times_s": [r["step_time_s"] for r in steps_],
        "phase_medians": phases,
        "generated_tokens_per_step": generated,
        "generate_tokens_per_s": sum(generated) / sum(r["time/generate"] for r in steps_),
        "completion_mean_length": median(r["completions/mean_length"] for r in steps_),
        "losses": [r["loss"] for r in steps_],
        "ebft_reward": [r.get("ebft/reward") for r in steps_],
    }


# --------------------------------------------------------------------------- report


def print_report(res: dict) -> None:
    st, sd = res["strided"], res["structured"]
    print(f"\nEBFT {res['size']} ({res['params']:,} params, random init), {res['steps']} steps per run, best of "
          f"{res['repeat']} by median step; {res['threads']} torch threads; 1-min load average before/after "
          f"{res['load_average_1m_before_after'][0]:.2f}/{res['load_average_1m_before_after'][1]:.2f}; torch "
          f"{res['versions']['torch']}, transformers {res['versions']['transformers']}")
    print(f"\nstrided: {st['median_rows']:.0f} rows (8 docs x n=4), K={st['median_blocks']:.0f} blocks x G=4, "
          f"T={st['median_total_len']:.0f} columns per row")
    rows = [
        ("generate", st["median_generate_s"], st["generate_tokens_per_s"], "generated tokens"),
        ("reward (features)", st["median_reward_s"], st["reward_tokens_per_s"], "sequence columns embedded"),
        ("update (fwd+bwd+opt)", st["median_update_s"], st["update_tokens_per_s"], "sequence columns trained"),
        ("whole step", st["median_step_s"], st["generated_tokens_per_step_s"], "generated tokens"),
    ]
    print(f"  {'phase':22s} {'median (ms)':>12s} {'tokens/s':>10s}  counting")
    for name, seconds, rate, what in rows:
        print(f"  {name:22s} {seconds * 1e3:12.1f} {rate:10,.0f}  {what}")
    ph = sd["phase_medians"]
    per_step, group = STRUCTURED["completions_per_step"], STRUCTURED["num_generations"]
    print(f"\nstructured: {per_step} completions/step ({per_step // group} prompts x G={group}), mean completion "
          f"{sd['completion_mean_length']:.1f} tokens")
    rows = [
        ("time/generate", ph["generate_median_s"]),
        ("time/reward", ph["reward_median_s"]),
        ("rest of time/prepare", ph["prepare_rest_median_s"]),
        ("time/forward_backward", ph["forward_backward_median_s"]),
        ("time/optimizer", ph["optimizer_median_s"]),
        ("step_time_s", sd["median_step_s"]),
    ]
    for name, seconds in rows:
        print(f"  {name:22s} {seconds * 1e3:12.1f} ms")
    print(f"  generated tokens/s over time/generate: {sd['generate_tokens_per_s']:,.0f}")


def compare_logits(args, model_dir: Path, tmp: Path) -> dict:
    """Strided runs through the output layer and through the model's logits, alternating; then each one's peak."""
    paths = {"output layer": 1, "model logits": 10**9}  # head.MIN_VOCAB for each path (1: also the byte vocabulary)

    def run(path: str, out: Path, steps: int) -> dict:
        head.MIN_VOCAB = paths[path]
        return run_strided(model_dir, out, steps, args.seed)

    for path in paths:
        run(path, tmp / f"warm-{path}", 2)
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {path: [] for path in paths}
    for index in range(args.repeat):
        for path in paths:
            runs[path].append(run(path, tmp / f"{path}-{index}", args.steps))
            print(f"run {index + 1}/{args.repeat} {path}: median step {runs[path][-1]['median_step_s'] * 1e3:.1f} ms", flush=True)
    peaks = {path: peak_memory(run, path, tmp / f"peak-{path}", 3) for path in paths}
    load_after = os.getloadavg()
    best = {path: min(path_runs, key=lambda r: r["median_step_s"]) for path, path_runs in runs.items()}
    first, second = (best[path]["losses"] for path in paths)
    agree = max(abs(a - b) / (1 + abs(b)) for a, b in zip(first, second))
    print(f"\nstrided EBFT {args.size}, vocabulary {args.vocab or 'byte (260)'}: T={best['output layer']['median_total_len']:.0f} "
          f"columns x {best['output layer']['median_rows']:.0f} rows; load {load_before[0]:.2f}/{load_after[0]:.2f}")
    print(f"  {'path':14s} {'median step (ms)':>17s} {'peak above start (MiB)':>23s}")
    for path in paths:
        print(f"  {path:14s} {best[path]['median_step_s'] * 1e3:17.1f} {peaks[path]:23.1f}")
    print(f"  step ratio (model logits / output layer) {best['model logits']['median_step_s'] / best['output layer']['median_step_s']:.2f}x; "
          f"largest relative loss difference over {len(first)} steps {agree:.1e}")
    return {"paths": {path: {"min_vocab": paths[path], "peak_memory_mib": peaks[path], **best[path]} for path in paths},
            "largest_relative_loss_difference": agree, "load_average_1m_before_after": [load_before[0], load_after[0]],
            "all_runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="S")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode, alternating; the fastest is shown")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results/ebft-<size>.json)")
    parser.add_argument("--vocab", type=int, default=None, help="output layer entries (default: the byte tokenizer's)")
    parser.add_argument("--compare-logits", action="store_true",
                        help="strided mode only: the output-layer path against the model's logits")
    args = parser.parse_args()
    quiet()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.compare_logits:
        with tempfile.TemporaryDirectory(prefix="rlft-bench-ebft-") as tmp:
            model_dir = make_model(Path(tmp) / "model", args.size, args.seed, args.vocab)
            result = compare_logits(args, model_dir, Path(tmp))
        report = {"benchmark": "ebft strided paths", "date": datetime.datetime.now().isoformat(timespec="seconds"),
                  "command": "bench/ebft.py " + " ".join(f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if v is not None),
                  "size": args.size, "vocab": args.vocab, "steps": args.steps, "repeat": args.repeat,
                  "strided_settings": STRIDED, "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
                  "machine": platform.processor() or platform.machine(),
                  "versions": {"torch": torch.__version__, "transformers": transformers.__version__}, **result}
        out = args.out or RESULTS / f"ebft-paths-{args.size}-v{args.vocab or 260}.json"
        write_report(out, report)
        return

    prompts = [{"prompt": row["prompt"], "completion": row["completion"]} for row in split_rows()[0]]
    with tempfile.TemporaryDirectory(prefix="rlft-bench-ebft-") as tmp:
        tmp = Path(tmp)
        model_dir = make_model(tmp / "model", args.size, args.seed)
        prompts_file = tmp / "prompts.jsonl"
        write_jsonl(prompts, prompts_file)
        params = sum(p.numel() for p in LlamaForCausalLM.from_pretrained(model_dir).parameters())
        run_strided(model_dir, tmp / "warm-strided", 2, args.seed)  # one-time costs, not reported
        run_structured(model_dir, prompts_file, tmp / "warm-structured", 2, args.seed)

        load_before = os.getloadavg()
        runs: dict[str, list[dict]] = {"strided": [], "structured": []}
        for index in range(args.repeat):
            for mode in ("strided", "structured"):
                out = tmp / f"{mode}-{index}"
                run = run_strided(model_dir, out, args.steps, args.seed) if mode == "strided" else \
                    run_structured(model_dir, prompts_file, out, args.steps, args.seed)
                runs[mode].append(run)
                print(f"run {index + 1}/{args.repeat} {mode}: wall {run['wall_s']:.2f} s, median step "
                      f"{run['median_step_s'] * 1e3:.1f} ms", flush=True)
        load_after = os.getloadavg()
    best = {mode: min(mode_runs, key=lambda run: run["median_step_s"]) for mode, mode_runs in runs.items()}
    report = {
        "benchmark": "ebft",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": "bench/ebft.py " + " ".join(f"--{k}={v}" for k, v in vars(args).items() if v is not None),
        "size": args.size,
        "params": params,
        "steps": args.steps,
        "repeat": args.repeat,
        "reported_run": "each mode's run with the smallest median step",
        "strided_settings": STRIDED,
        "structured_settings": STRUCTURED,
        "learning_rate": LR,
        "threads": torch.get_num_threads(),
        "load_average_1m_before_after": [load_before[0], load_after[0]],
        "cpu_count": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "accelerate": accelerate.__version__,
                     "datasets": datasets.__version__},
        **best,
        "all_runs": runs,
    }
    print_report(report)
    out = args.out or RESULTS / f"ebft-{args.size}.json"
    write_report(out, report)


if __name__ == "__main__":
    main()
