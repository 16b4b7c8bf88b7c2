"""How rlft's cost grows: step time, peak memory and tokens/s of SFT, DPO and GRPO over model size and sequence length.

Two sweeps, each point a real `rlft.train.run.train` run in a fresh process of its own (so one point's memory cannot
hide another's), on a CPU:
  size     the tiny Llama sizes S, M, L (rlft.models.tiny) and bench/weight_sync.py's "0.5B" (its `build`: a Qwen2
           model of Qwen2-0.5B's shape, 151,936-entry tied vocabulary, at most 1,024 positions), at --size-length
           tokens (default 128); every run starts from random weights (`random_init: true`, nothing is downloaded);
  length   sequence lengths --lengths (default 128 to 2,048) at --length-size (default M).
Every run: fp32, eager, AdamW, --batch rows per step (default 4: SFT rows, DPO pairs, GRPO completions of one prompt,
G = 4), --steps steps (default 3; the first, which allocates and warms up, is left out of the median). Rows are
exactly the length asked for, made of digits: SFT a prompt of half the length and a completion of the rest (EOS
included); DPO the same prompt with a chosen and a rejected answer of the rest; GRPO a 16-token prompt and
completions of the rest (`ignore_eos`, so every completion is full length) under a random reward
(every step trains).

Measured per point:
  step        median `step_time_s` from metrics.jsonl (GRPO: generation included)
  tokens/s    trained tokens per step (metrics.jsonl `tokens`) / the median step
  peak        the child's peak resident memory (VmHWM, which starts afresh at exec, unlike ru_maxrss, which keeps the
              parent's level at the fork) above its resident memory before `train()`: the model,
              its gradients and AdamW state, the reference copy (DPO), activations, logits, the KV cache (GRPO)
  work        model FLOPs per step: 6N per trained token plus PaLM's attention term 12 x layers x hidden x length
              (Chowdhery et al. 2022, appendix B), plus for DPO the reference's forward (a third of that) and for
              GRPO the generation's forward (2N + 4 x layers x hidden x length per generated token)
  s/TFLOP     the median step over the work: flat where the cost grows as the work does
Weight-sync time over size is bench/weight_sync.py's measurement: when its JSON (results/weight_sync.json, or
--weight-sync-json) exists, the size plot draws its full and LoRA sync times beside these, as that file has them.

Usage (from the repository root):
  .venv/bin/python bench/cost_curves.py                                   # both sweeps, ~15 minutes on 2 cores
  .venv/bin/python bench/cost_curves.py --sizes S --lengths 128 256 --length-size S --steps 2   # a smoke run
  .venv/bin/python bench/cost_curves.py --plot-only                       # redraw the plots from the JSON
Results: bench/results/cost_curves.json and bench/results/cost_curves-size.png, cost_curves-length.png.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
METHODS = ("sft", "dpo", "grpo")
SIZES = ("XS", "S", "M", "L", "0.5B")  # XS for a quick rehearsal; the default sweep is S, M, L, 0.5B
GRPO_PROMPT = 16  # tokens of a GRPO prompt; completions fill the rest of the length
POINT_TIMEOUT_S = 900
HALF_B_POSITIONS = 1024  # weight_sync.build's max_position_embeddings


# --------------------------------------------------------------------------- models and rows (the parent writes them)


def write_model(folder: Path, size: str, max_positions: int) -> Path:
    """config.json and the byte tokenizer of one size (runs use random_init, so weights in the folder are not read)."""
    if size == "0.5B":
        try:
            from weight_sync import build  # Qwen2-0.5B's shape, as bench/weight_sync.py syncs it
        except ImportError as exc:
            raise SystemExit(f"size 0.5B is bench/weight_sync.py's model, and importing it failed ({exc}): run the "
                             "other sizes (--sizes S M L)") from exc
        return build(folder, "0.5B")
    from rlft.models.tiny import write_tiny_model

    return write_tiny_model(folder, size, max_positions)


def write_rows(path: Path, method: str, length: int, count: int, seed: int) -> Path:
    """`count` rows of digits whose tokens (the byte tokenizer: one per character, EOS after the answer) fill `length`."""
    rng = random.Random(seed)

    def digits(n: int) -> str:
        return "".join(rng.choice("0123456789") for _ in range(n))

    prompt = length // 2
    answer = length - prompt - 1  # EOS
    if method == "sft":
        rows = [{"prompt": digits(prompt), "completion": digits(answer)} for _ in range(count)]
    elif method == "dpo":
        rows = [{"prompt": digits(prompt), "chosen": digits(answer), "rejected": digits(answer)} for _ in range(count)]
    else:
        rows = [{"prompt": digits(GRPO_PROMPT)} for _ in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def settings(point: dict, model_dir: Path, rows: Path, out_dir: Path) -> dict:
    """rlft's config keys for one point."""
    keys = {
        "base_model": str(model_dir), "random_init": True, "datasets": [{"path": str(rows)}],
        "sequence_len": point["length"], "micro_batch_size": point["batch"], "gradient_accumulation_steps": 1,
        "max_steps": point["steps"], "learning_rate": 1e-5, "lr_scheduler": "constant", "warmup_steps": 0,
        "optimizer": "adamw_torch_fused", "max_grad_norm": 1.0, "bf16": False, "torch_compile": False,
        "logging_steps": 1, "seed": 0, "output_dir": str(out_dir), "save_strategy": "no",
    }
    if point["method"] == "dpo":
        keys.update({"rl": "dpo", "rl_beta": 0.1})
    elif point["method"] == "grpo":
        keys.update({"rl": "grpo", "trl": {
            "num_generations": point["batch"], "max_completion_length": point["length"] - GRPO_PROMPT, "beta": 0.0,
            "temperature": 1.0, "reward_funcs": ["cost_curves_reward.length_reward"],
            "generation_kwargs": {"ignore_eos": True}}})
    return keys


REWARD = '''import random


def length_reward(completions, **kwargs):
    """A random reward: the cost does not depend on it, and a reward that varies within every group makes every step
    train (a group of equal rewards has no advantage, and its step is skipped). Random weights sample tokens that
    decode to nothing often (ids past the byte tokenizer's range), so a reward of the text would often be equal."""
    return [random.random() for _ in completions]
'''


# --------------------------------------------------------------------------- one point (in a child process)


def work_flops(point: dict, config, n: int, tokens: float, generated: float) -> float:
    """Model FLOPs of one step (see the module's docstring)."""
    attention = 12 * config.num_hidden_layers * config.hidden_size * point["length"]
    trained = tokens * (6 * n + attention)
    if point["method"] == "dpo":
        return trained * 4 / 3  # the reference's forward: a third of the policy's forward and backward
    if point["method"] == "grpo":
        return trained + generated * (2 * n + attention / 3)
    return trained


def high_water_mark() -> int:
    """This process's peak resident memory in bytes since it was exec'd (VmHWM of /proc/self/status)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))


def run_point(point: dict, folder: Path) -> dict:
    """Train one point in this process and measure it."""
    import io

    import torch
    from rich.console import Console
    from transformers import AutoConfig, AutoModelForCausalLM

    import rlft.train.run
    from rlft.config import build_config
    from rlft.train.metrics import flop_parameters

    torch.set_num_threads(point["threads"])
    out = folder / "out"
    cfg = build_config(settings(point, folder / "model", folder / "rows.jsonl", out), source="bench")
    config = AutoConfig.from_pretrained(folder / "model")
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    params, n = sum(p.numel() for p in meta.parameters()), flop_parameters(meta)[0]
    del meta
    with open("/proc/self/statm") as f:
        before = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    start = time.perf_counter()
    rlft.train.run.train(cfg, Console(file=io.StringIO(), width=120))
    wall = time.perf_counter() - start
    peak = high_water_mark()
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in steps if "step_time_s" in r]
    timed = steps[1:] or steps  # the first step allocates and warms up
    step = sorted(r["step_time_s"] for r in timed)[(len(timed) - 1) // 2]
    tokens = sorted(r["tokens"] for r in timed)[(len(timed) - 1) // 2]
    generated = (sorted(r["completions/mean_length"] for r in timed)[(len(timed) - 1) // 2] * point["batch"]
                 if point["method"] == "grpo" else 0.0)
    work = work_flops(point, config, n, tokens, generated)
    result = {
        **point, "params": params, "flop_params": n, "steps_run": len(steps), "median_step_s": step,
        "first_step_s": steps[0]["step_time_s"], "step_times_s": [r["step_time_s"] for r in steps],
        "tokens_per_step": tokens, "tokens_per_s": tokens / step, "peak_above_start_mib": (peak - before) / 2**20,
        "resident_before_train_mib": before / 2**20, "work_tflop_per_step": work / 1e12,
        "s_per_tflop": step / (work / 1e12), "wall_s": wall,
    }
    if point["method"] == "grpo":
        result["generated_tokens_per_step"] = generated
        result["generate_median_s"] = sorted(r["time/generate"] for r in timed)[(len(timed) - 1) // 2]
    return result


# --------------------------------------------------------------------------- the sweeps (the parent)


def measure(point: dict, folder: Path, model_dir: Path) -> dict:
    """Write the point's rows and train it on `model_dir` in a fresh process; a point that fails is kept with its error."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model").symlink_to(model_dir)
    count = max(64, 4 * point["batch"] * point["steps"])
    write_rows(folder / "rows.jsonl", point["method"], point["length"], count, seed=0)
    (folder / "cost_curves_reward.py").write_text(REWARD)
    inherited = [str(Path(entry).resolve()) for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    env = dict(os.environ, OMP_NUM_THREADS=str(point["threads"]), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(REPO / "src"), *inherited]))
    command = [sys.executable, str(Path(__file__).resolve()), "--point", json.dumps(point), "--folder", str(folder)]
    try:
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=POINT_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired:
        return {**point, "error": f"ran past {POINT_TIMEOUT_S} s"}
    result_file = folder / "result.json"
    if done.returncode != 0 or not result_file.exists():
        return {**point, "error": f"exit {done.returncode}: " + "\n".join(done.stderr.strip().splitlines()[-5:])}
    return json.loads(result_file.read_text())


def growth(points: list[dict], x: str, y: str) -> list[float]:
    """The exponent k of y ~ x^k between successive points (1: y grows as x does)."""
    import itertools
    import math

    pairs = list(itertools.pairwise(points))
    return [round(math.log(b[y] / a[y]) / math.log(b[x] / a[x]), 2) for a, b in pairs if a[y] > 0 and b[y] > 0]


def summarise(report: dict) -> dict:
    """Per method and sweep: growth exponents of step time, work, memory and tokens against the swept quantity."""
    summary = {}
    for sweep, x in (("size", "params"), ("length", "length")):
        for method in report["methods"]:
            points = sorted((p for p in report[sweep] if p["method"] == method and "error" not in p), key=lambda p: p[x])
            if len(points) < 2:
                continue
            summary[f"{sweep}/{method}"] = {
                "x": x, "values": [p[x] for p in points],
                "step_time_exponent": growth(points, x, "median_step_s"),
                "work_exponent": growth(points, x, "work_tflop_per_step"),
                "peak_memory_exponent": growth(points, x, "peak_above_start_mib"),
                "tokens_exponent": growth(points, x, "tokens_per_step"),
            }
    return summary


def weight_sync_panel(axis, path: Path) -> None:
    """bench/weight_sync.py's seconds per sync over parameters (its full-weight HTTP push and LoRA adapter), from its
    JSON as that file has them."""
    sync = json.loads(path.read_text())
    for way, label in (("http", "full weights, HTTP"), ("lora", "LoRA adapter")):
        line = sorted((r for r in sync["results"] if isinstance(r.get(way), dict)), key=lambda r: r["parameters"])
        if line:
            axis.plot([r["parameters"] for r in line], [r[way]["seconds"] for r in line], marker="s", label=label)
            for r in line:
                axis.annotate(r["size"], (r["parameters"], r[way]["seconds"]), fontsize=7, xytext=(3, 3),
                              textcoords="offset points")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("parameters")
    axis.set_title(f"weight sync to rlft vllm-serve (s), from {path.name}", fontsize=10)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend()


def plot(report: dict, folder: Path, weight_sync: Path | None = None) -> list[Path]:
    """Two PNGs, one per sweep: step time, peak memory, tokens/s and seconds per TFLOP of work, a line per method; the
    size sweep's also bench/weight_sync.py's sync times when `weight_sync` (its JSON) exists."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    panels = [("median_step_s", "median step (s)"), ("peak_above_start_mib", "peak memory above start (MiB)"),
              ("tokens_per_s", "trained tokens/s"), ("s_per_tflop", "step time per TFLOP of work (s)")]
    for sweep, x, label in (("size", "params", "parameters"), ("length", "length", "sequence length (tokens)")):
        points = [p for p in report[sweep] if "error" not in p]
        if not points:
            continue
        sync = sweep == "size" and weight_sync is not None and weight_sync.exists()
        figure, axes = plt.subplots(2, 3 if sync else 2, figsize=(16 if sync else 11, 8))
        if sync:
            weight_sync_panel(axes[0, 2], weight_sync)
            axes[1, 2].axis("off")
        for axis, (key, title) in zip([axes[0, 0], axes[0, 1], axes[1, 0], axes[1, 1]], panels):
            for method in report["methods"]:
                line = sorted((p for p in points if p["method"] == method), key=lambda p: p[x])
                if line:
                    axis.plot([p[x] for p in line], [p[key] for p in line], marker="o", label=method.upper())
                    if sweep == "size":
                        for p in line:
                            axis.annotate(p["size"], (p[x], p[key]), fontsize=7, xytext=(3, 3), textcoords="offset points")
            axis.set_xscale("log", base=2 if sweep == "length" else 10)
            axis.set_yscale("log")
            axis.set_xlabel(label)
            axis.set_title(title, fontsize=10)
            axis.grid(True, which="both", alpha=0.3)
        axes[0, 0].legend()
        where = (f"size sweep at {report['size_length']} tokens" if sweep == "size"
                 else f"length sweep at size {report['length_size']}")
        figure.suptitle(f"rlft on {report['machine']} ({report['cpu_count']} cores), {report['threads']} threads, fp32, eager, "
                        f"batch {report['batch']}: {where}",
                        fontsize=10)
        figure.tight_layout()
        path = folder / f"cost_curves-{sweep}.png"
        figure.savefig(path, dpi=100)
        plt.close(figure)
        written.append(path)
    return written


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform says."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--sizes", nargs="*", choices=SIZES, default=list(SIZES[1:]), help="the size sweep (none: skip it)")
    parser.add_argument("--size-length", type=int, default=128, help="sequence length of the size sweep")
    parser.add_argument("--lengths", nargs="*", type=int, default=[128, 256, 512, 1024, 2048],
                        help="the length sweep (none: skip it)")
    parser.add_argument("--length-size", choices=SIZES, default="M", help="model size of the length sweep")
    parser.add_argument("--batch", type=int, default=4, help="rows per step (SFT rows, DPO pairs, GRPO completions)")
    parser.add_argument("--steps", type=int, default=3, help="steps per point (the first is left out of the median)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of every point")
    parser.add_argument("--out", type=Path, default=RESULTS / "cost_curves.json")
    parser.add_argument("--weight-sync-json", type=Path, default=RESULTS / "weight_sync.json",
                        help="bench/weight_sync.py's results, drawn in the size plot when the file exists")
    parser.add_argument("--plot-only", action="store_true", help="draw the plots from --out's JSON, measure nothing")
    parser.add_argument("--point", help=argparse.SUPPRESS)  # a child: one point, as JSON
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.point:
        result = run_point(json.loads(args.point), args.folder)
        (args.folder / "result.json").write_text(json.dumps(result))
        return
    if args.plot_only:
        report = json.loads(args.out.read_text())
        for path in plot(report, args.out.parent, args.weight_sync_json):
            print(f"wrote {path}")
        return
    if any(length <= GRPO_PROMPT + 1 for length in [args.size_length, *args.lengths]):
        raise SystemExit(f"every length must be above {GRPO_PROMPT + 1} (a GRPO prompt is {GRPO_PROMPT} tokens)")
    common = {"batch": args.batch, "steps": args.steps, "threads": args.threads}
    plan = [("size", {"method": m, "size": s, "length": args.size_length, **common}) for s in args.sizes for m in args.methods]
    plan += [("length", {"method": m, "size": args.length_size, "length": n, **common}) for n in args.lengths
             for m in args.methods]
    max_positions = max([args.size_length, *args.lengths]) + 64
    if "0.5B" in {point["size"] for _, point in plan} and max(point["length"] for _, point in plan
                                                              if point["size"] == "0.5B") > HALF_B_POSITIONS:
        raise SystemExit(f"the 0.5B model (bench/weight_sync.py's build) has {HALF_B_POSITIONS} positions: keep its "
                         "lengths at or below that")
    report = {"benchmark": "cost_curves", "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "machine": cpu_name(), "cpu_count": os.cpu_count(),
              "threads": args.threads, "batch": args.batch, "steps": args.steps, "methods": args.methods,
              "size_length": args.size_length, "length_size": args.length_size, "grpo_prompt_tokens": GRPO_PROMPT,
              "command": " ".join(sys.argv), "size": [], "length": []}
    import torch
    import transformers

    report["versions"] = {"python": platform.python_version(), "torch": torch.__version__,
                          "transformers": transformers.__version__}
    load = [os.getloadavg()[0]]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rlft-cost-") as tmp:
        models = {}
        for index, (sweep, point) in enumerate(plan):
            if point["size"] not in models:  # one folder per size, written once
                models[point["size"]] = write_model(Path(tmp) / f"model-{point['size']}", point["size"], max_positions)
            result = measure(point, Path(tmp) / str(index), models[point["size"]])
            report[sweep].append(result)
            load.append(os.getloadavg()[0])
            said = result.get("error") or (f"step {result['median_step_s'] * 1e3:.1f} ms, "
                                           f"peak {result['peak_above_start_mib']:.0f} "
                                           f"MiB, {result['tokens_per_s']:,.0f} tokens/s, {result['s_per_tflop']:.2f} s/TFLOP")
            print(f"[{time.perf_counter() - started:6.0f} s] {sweep} {point['method']} {point['size']} {point['length']}: {said}",
                  flush=True)
    report["load_average_1m"] = {"before": load[0], "max": max(load), "after": load[-1]}
    report["growth"] = summarise(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    for key, values in report["growth"].items():
        print(f"{key}: over {values['x']} {values['values']}: step time ^{values['step_time_exponent']}, work "
              f"^{values['work_exponent']}, peak memory ^{values['peak_memory_exponent']}")
    for path in plot(report, args.out.parent, args.weight_sync_json):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
