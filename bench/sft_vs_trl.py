"""SFT speed: rlft vs TRL's SFTTrainer on the same tiny model, data and hyperparameters, in one process.

Both tools load identical weights (one seeded random init, saved once with save_pretrained), train on
the addition task (prompt "12+34=", completion "46", loss on the completion + EOS only) with micro
batch 32, no accumulation, AdamW lr 3e-3 (--lr) constant, no warm-up, no weight decay, grad clip 1.0, fp32,
sequence length 32, no packing, no eval and no periodic checkpoints. Data order differs (each tool
shuffles with its own sampler), so losses agree only roughly.

Measured per tool:
  wall      the training call: rlft `train(cfg, console)` (tokenizer + data preparation + model load
            + loop + its final checkpoint + final model save); TRL `SFTTrainer(...)` (model load +
            dataset tokenisation) + `trainer.train()`. Imports and row generation are excluded.
  step      the median interval between consecutive optimizer steps' ends, by one hook for both tools
            (common.OptimizerSteps): the batch fetch, forward, backward, update and the tool's per-step logging.
            Each tool's own timer is in the JSON (`own_median_step_s`): rlft `step_time_s` (without its logging
            after the update), TRL on_step_begin -> on_step_end (without the batch fetch before on_step_begin).
  tokens/s  non-padding tokens trained per step (the mean) / the median step (a compiling first step does not count).
  MFU       tokens/s x 6N / the device's peak, as `rlft train` logs it (rlft.train.metrics; N without the input
            embedding, a lookup); the same formula and tokens for both tools.
  loss      last step's loss, and the mean over the last 10 steps (less noisy).

Each tool runs eager and compiled (rlft `torch_compile: true`, TRL `torch_compile=True`; --rlft-compile and
--trl-compile choose), and the variants alternate over --repeat rounds (default 5, the order reversed every other
round) after a short warm-up run of each. Before every run the process state a tool leaves is cleared
(common.reset_between_runs: accelerate's state, which would carry one run's compile setting into the next, and dynamo's
graphs). Each side's best setting is the one with the smaller median step over the rounds; the ratios TRL/rlft are the
median of the round-by-round ratios (common.fair_ratios): rlft at its best against TRL at its best, against TRL as
shipped (eager), and both eager (the defaults). The JSON keeps every run and the 1-minute load average, because a
shared 2-core machine is noisy (OpenMP threads stall badly when another process competes).

Usage (from the repository root):
  .venv/bin/python bench/sft_vs_trl.py --size S --steps 100 --threads 2
  .venv/bin/python bench/sft_vs_trl.py --size S --steps 100 --vocab 32768 --rlft-compile off --trl-compile off
      # a real tokenizer's output layer, both eager
  .venv/bin/python bench/sft_vs_trl.py --long --vocab 32768 --micro-batch 8 --steps 20 [--group-by-length]
      # 64-600-character prompts (chains of solved sums before the asked one), sequences up to 640 tokens
Results: a table on stdout and bench/results/sft_vs_trl-<size>[-long][-grouped][-v<vocab>].json. Peak memory (resident memory a
run adds at its peak) is measured in one more run of each variant, after the timed ones.

Each round also times a plain PyTorch loop on the batches rlft trains on (run_plain_loop: the model's logits,
cross-entropy, backward, clip, AdamW; nothing else), what a hand-written script does. Each tool's median step over it
says how much the tool adds, or saves (with a real vocabulary rlft never computes every position's logits).
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse
import datetime
import io
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers
from rich.console import Console
from transformers import AutoTokenizer, LlamaForCausalLM, PrinterCallback, TrainerCallback

import trl
from trl import SFTConfig, SFTTrainer

import accelerate  # noqa: F401  (imported here so its import cost stays out of the timings)
import datasets
import rlft.data.prepare  # noqa: F401
import rlft.models.loading  # noqa: F401
import rlft.train.trainer  # noqa: F401
import rlft.train.recipes.sft  # noqa: F401
import rlft.train.run
from rlft.train.metrics import clock  # perf_counter once queued GPU work is done
from accelerate.utils import is_compiled_module
from common import (RESULTS, OptimizerSteps, compile_choices, describe_ratios, device_name, fair_ratios, flop_params,
                    fresh_memory_peak, long_rows, make_model, mfu, peak_memory, plain_update, print_table, quiet,
                    reset_between_runs, rlft_keys, round_orders, trl_keys, variant_name, write_report)
from rlft.config import build_config
from rlft.data.collate import pad_multiple
from rlft.models.tiny import SIZES
from rlft.tasks.addition import split_rows, write_jsonl

LONG_LENGTH = 640  # --long: sequence_len / max_length
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # both tools train on the GPU when there is one
BENCH_CONFIG = argparse.Namespace(pad_to_multiple_of=None)  # rlft's default padding multiple, for TRL's pad_to_multiple_of


def warm_up(model_dir: Path, micro_batch: int, bf16: bool = False) -> None:
    """A few forward/backward passes so one-time kernel setup is charged to neither tool."""
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, 256, (micro_batch, 9), device=DEVICE)
    for _ in range(3):
        with torch.autocast(DEVICE.type, torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def last_mean(values: list[float], n: int = 10) -> float:
    tail = values[-n:]
    return sum(tail) / max(1, len(tail))


# --------------------------------------------------------------------------- rlft


def run_rlft(model_dir: Path, train_file: Path, out_dir: Path, args, compiled: bool, steps: int | None = None) -> dict:
    cfg = build_config({
        **rlft_keys(model_dir, out_dir, steps or args.steps, args.seed, args.lr, args.bf16),
        "datasets": [{"path": str(train_file)}],
        "sequence_len": LONG_LENGTH if args.long else 32,
        "sample_packing": False,
        "group_by_length": args.group_by_length,
        "batch_flattening": args.flatten,  # rows without padding, attention per row (rlft.models.varlen on SDPA)
        "micro_batch_size": args.micro_batch,
        "torch_compile": compiled,  # the compiled forward: compiled in each run's first steps
    }, source="bench")

    console = Console(file=io.StringIO(), width=120)  # rendered like a non-terminal run, not shown
    reset_between_runs()
    fresh_memory_peak()  # on a GPU metrics.jsonl's peak_memory_mb is then this run's
    start = time.perf_counter()
    with OptimizerSteps(clock) as ends:
        result = rlft.train.run.train(cfg, console)
    wall = time.perf_counter() - start

    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in records if "step_time_s" in r]
    step_times = [r["step_time_s"] for r in steps]
    losses = [r["loss"] for r in steps]
    tokens = sum(r["tokens"] for r in steps)
    phases = {}
    for key in ("time/data", "time/forward_backward", "time/optimizer"):
        values = [r.get(key, 0.0) for r in steps]
        phases[key.split("/")[1] + "_median_s"] = statistics.median(values)
    in_steps = sum(step_times)
    loop_total = result.ended_at - result.started_at
    checkpoint = result.save_time
    return {
        "variant": variant_name("rlft", compiled),
        "wall_s": wall,
        "setup_s": result.started_at - start,  # tokenizer, data preparation, model load, plan table
        "loop_s": loop_total,
        "steps_s": in_steps,
        "checkpoint_save_s": checkpoint,  # the loop's final save: model, tokenizer, optimizer, RNG, fsync
        "final_model_save_s": start + wall - result.ended_at,  # run.py: save_pretrained + tokenizer + summary
        "loop_other_s": loop_total - in_steps - checkpoint,  # optimizer/accelerate setup, logging, progress
        "steps": len(steps),
        "median_step_s": statistics.median(ends.intervals),  # end to end, as TRL's (common.OptimizerSteps)
        "own_median_step_s": statistics.median(step_times),  # rlft's step_time_s: without the logging after the update
        "first_step_s": step_times[0],
        "phase_medians": phases,
        "steps_peak_memory_mb": max(r.get("peak_memory_mb", 0.0) for r in steps),  # GPU: allocated at the peak of the steps
        "tokens": tokens,
        "tokens_per_s": tokens / len(steps) / statistics.median(ends.intervals),
        "final_loss": losses[-1],
        "loss_last10_mean": last_mean(losses),
        "loss_mean": sum(losses) / len(losses),
        "global_step": result.state.global_step,
    }


# --------------------------------------------------------------------------- a plain PyTorch loop (what a hand-written script does)


def run_plain_loop(model_dir: Path, train_file: Path, args) -> dict:
    """A hand-written training step on rlft's own batches (tokenised and padded before the clock starts): the model's
    logits, cross-entropy on the targets, backward, clip, AdamW (transformers' adamw_torch), zero_grad; no scheduler,
    metrics, logging or checkpoints. A tool's median step over this one's says how much the tool adds to (or saves on)
    the model's own arithmetic."""
    from rlft.data.batches import BatchPlan, PlanCursor
    from rlft.data.prepare import prepare_data

    cfg = build_config({
        **rlft_keys(model_dir, Path(tempfile.gettempdir()) / "rlft-plain-loop-unused", args.steps, args.seed, args.lr),
        "datasets": [{"path": str(train_file)}], "sequence_len": LONG_LENGTH if args.long else 32,
        "sample_packing": False, "micro_batch_size": args.micro_batch,
    }, source="bench")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    data = prepare_data(cfg, tokenizer)
    cursor = PlanCursor(BatchPlan(data.train, args.micro_batch, args.seed, tokenizer.pad_token_id,
                                  lengths=[len(e["input_ids"]) for e in data.train] if args.group_by_length else None))
    batches = [cursor.next() for _ in range(args.steps)]  # the batches rlft trains on, in its order
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM.from_pretrained(model_dir).to(DEVICE)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, fused=True)  # rlft's and TRL's default (adamw_torch_fused)
    times, losses = [], []
    for batch in batches:
        batch = {key: value.to(DEVICE) if isinstance(value, torch.Tensor) else value for key, value in batch.items()}
        start = clock()
        with torch.autocast(DEVICE.type, torch.bfloat16, enabled=args.bf16):
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), batch["labels"][:, 1:].flatten())
        losses.append(plain_update(model, optimizer, loss))
        times.append(clock() - start)
    return {"steps": len(times), "median_step_s": statistics.median(times), "first_step_s": times[0],
            "final_loss": losses[-1], "loss_last10_mean": last_mean(losses), "wall_s": sum(times)}


# --------------------------------------------------------------------------- TRL


class StepTimer(TrainerCallback):
    """TRL's own step: on_step_begin -> on_step_end (after its batch fetch), kept beside the end-to-end step."""

    def __init__(self) -> None:
        self.begin = None
        self.durations: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.begin = clock()

    def on_step_end(self, args, state, control, **kwargs):
        self.durations.append(clock() - self.begin)


class RecordingSFTTrainer(SFTTrainer):
    """Records each micro-batch's loss and non-padding tokens (TRL logs only the mean over logging_steps)."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.bench_losses.append(float(loss))
        self.bench_tokens += int(inputs["attention_mask"].sum())
        return loss


def run_trl(model_dir: Path, rows: list[dict], out_dir: Path, args, compiled: bool, steps: int | None = None) -> dict:
    dataset = datasets.Dataset.from_list(rows)  # row generation, not timed (rlft's jsonl is written untimed too)
    reset_between_runs()
    config = SFTConfig(
        output_dir=str(out_dir),
        **trl_keys(steps or args.steps, args.seed, args.bf16),
        torch_compile=compiled,  # transformers' compile: accelerate's prepare wraps the model in torch.compile
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=1,
        learning_rate=args.lr,
        max_length=LONG_LENGTH if args.long else 32,
        train_sampling_strategy="group_by_length" if args.group_by_length else "random",  # transformers 5's name
        packing=False,  # and padded with --flatten: TRL's padding_free relies on flash-attention to keep documents apart
        completion_only_loss=True,
        pad_to_multiple_of=pad_multiple(BENCH_CONFIG) if DEVICE.type == "cuda" else "auto",  # rlft's: 64 on a GPU
    )
    timer = StepTimer()
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = RecordingSFTTrainer(
        model=str(model_dir), args=config, train_dataset=dataset, processing_class=tokenizer, callbacks=[timer]
    )
    trainer.bench_losses, trainer.bench_tokens = [], 0
    trainer.remove_callback(PrinterCallback)  # the per-log dict print; not part of the comparison
    init_done = time.perf_counter()
    with OptimizerSteps(clock) as ends:
        output = trainer.train()
    wall = time.perf_counter() - start
    durations = timer.durations
    losses = trainer.bench_losses
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {
        "variant": variant_name("trl", compiled),
        "model_compiled": is_compiled_module(trainer.model_wrapped),  # the compile setting took effect (or did not)
        "wall_s": wall,
        "setup_s": init_done - start,  # tokenizer, model load, dataset tokenisation
        "train_call_s": wall - (init_done - start),
        "steps_s": sum(durations),
        "train_other_s": wall - (init_done - start) - sum(durations),  # dataloader, optimizer setup, logging
        "steps": len(durations),
        "median_step_s": statistics.median(ends.intervals),  # end to end, as rlft's (common.OptimizerSteps)
        "own_median_step_s": statistics.median(durations),  # on_step_begin -> on_step_end: without the batch fetch
        "first_step_s": durations[0],
        "tokens": trainer.bench_tokens,
        "tokens_per_s": trainer.bench_tokens / len(durations) / statistics.median(ends.intervals),
        "final_loss": losses[-1],
        "loss_last10_mean": last_mean(losses),
        "loss_mean": sum(losses) / len(losses),
        "trl_logged_mean_loss": logged[-1] if logged else None,
        "trl_train_loss": output.training_loss,
        "global_step": trainer.state.global_step,
    }


# --------------------------------------------------------------------------- report


def print_report(res: dict) -> None:
    runs = res["median_run"]
    names = list(runs)
    rows = [
        ("median step, median of rounds (ms)", lambda n: res["ratios"]["median_over_rounds_s"][n] * 1e3, "{:.1f}"),
        ("wall time of the training call (s)", lambda n: runs[n]["wall_s"], "{:.2f}"),
        ("  setup: model, tokenizer, data (s)", lambda n: runs[n]["setup_s"], "{:.2f}"),
        ("  sum of step times (s)", lambda n: runs[n]["steps_s"], "{:.2f}"),
        ("first step (ms)", lambda n: runs[n]["first_step_s"] * 1e3, "{:.1f}"),
        ("tokens/s (over the median step)", lambda n: runs[n]["tokens_per_s"], "{:,.0f}"),
        ("MFU (tokens/s x 6N / peak)", lambda n: runs[n]["mfu"], "{:.4f}"),
        ("loss, mean of last 10 steps", lambda n: runs[n]["loss_last10_mean"], "{:.4f}"),
        ("peak memory above start (MiB)", lambda n: res["peak_memory_mib"][n], "{:.1f}"),
    ]
    print(f"\n{res['repeat']} rounds; each variant's run at its median (the round whose median step is the median); "
          f"1-min load average before/after: {res['load_average_1m_before_after'][0]:.2f}/"
          f"{res['load_average_1m_before_after'][1]:.2f}")
    print(f"SFT {res['size']} ({res['params']:,} params), {res['steps']} steps, micro batch {res['micro_batch']}, "
          f"{res['machine']}{', bf16' if res['bf16'] else ''}, {res['threads']} threads; torch {res['versions']['torch']}, "
          f"transformers {res['versions']['transformers']}, trl {res['versions']['trl']}")
    print_table(names, rows, 38)
    for n in names:
        r = runs[n]
        if n.startswith("rlft"):
            print(f"{n}: step_time_s {r['own_median_step_s'] * 1e3:.1f} ms, checkpoint save {r['checkpoint_save_s']:.3f} s, "
                  f"final model save {r['final_model_save_s']:.3f} s, other loop {r['loop_other_s']:.3f} s; phase medians (ms): "
                  + ", ".join(f"{k.removesuffix('_median_s')} {v * 1e3:.1f}" for k, v in r["phase_medians"].items()))
        else:
            print(f"{n}: model compiled {r['model_compiled']}, on_step_begin -> on_step_end (without the batch fetch) "
                  f"{r['own_median_step_s'] * 1e3:.1f} ms, train() outside steps {r['train_other_s']:.3f} s")
    print(describe_ratios(res["ratios"]) + "  (>1: rlft is faster)")
    plain = res["plain_loop"]
    if plain:
        print(f"plain PyTorch loop on rlft's batches (model logits, cross-entropy, backward, clip, AdamW): median step "
              f"{plain['median_step_s'] * 1e3:.1f} ms (median of rounds); "
              + ", ".join(f"{n} {v:.2f}x it" for n, v in res["over_plain_loop"].items()))


def median_run(runs: list[dict]) -> dict:
    """The run whose median step is the median over the rounds (the lower one of the middle two for an even count)."""
    return sorted(runs, key=lambda run: run["median_step_s"])[(len(runs) - 1) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="S")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", type=int, default=None,
                        help="output-layer width (default: the byte tokenizer's; 32768 for a real tokenizer's logits)")
    parser.add_argument("--repeat", type=int, default=5,
                        help="rounds: every variant runs once per round, in alternating order (a shared 2-core machine "
                             "is noisy; the ratios are medians over the rounds, every run is kept in the JSON)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--rlft-compile", choices=["both", "on", "off"], default="both",
                        help="rlft with torch_compile: false, true or both (its first steps compile; compare median steps)")
    parser.add_argument("--trl-compile", choices=["both", "on", "off"], default="both",
                        help="TRL with torch_compile=False (as shipped), True, or both")
    parser.add_argument("--no-plain-loop", dest="plain_loop", action="store_false",
                        help="skip the plain PyTorch loop's run in each round")
    parser.add_argument("--long", action="store_true", help="rows of 64-600 characters (sequences up to 640 tokens)")
    parser.add_argument("--flatten", action="store_true",
                        help="rlft with batch_flattening: true (each micro-batch as one sequence without padding); TRL "
                             "stays padded: its padding_free needs flash-attention (under SDPA the documents of a "
                             "flattened row would attend to each other)")
    parser.add_argument("--group-by-length", action="store_true",
                        help="both tools batch rows of similar length together (group_by_length)")
    parser.add_argument("--lr", type=float, default=3e-3,
                        help="learning rate of both tools (3e-3 suits the tiny sizes; size L in bf16 diverged at it once)")
    parser.add_argument("--bf16", action="store_true", help="both tools in bf16 mixed precision (autocast over fp32 weights)")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results/sft_vs_trl-<size>...json)")
    args = parser.parse_args()
    quiet()
    if args.threads:
        torch.set_num_threads(args.threads)

    rlft_variants = {compiled: variant_name("rlft", compiled) for compiled in compile_choices(args.rlft_compile)}
    trl_variants = {compiled: variant_name("trl", compiled) for compiled in compile_choices(args.trl_compile)}
    variants = {name: ("rlft", compiled) for compiled, name in rlft_variants.items()}
    variants.update({name: ("trl", compiled) for compiled, name in trl_variants.items()})
    train_rows = long_rows(2000, args.seed) if args.long else split_rows()[0]
    with tempfile.TemporaryDirectory(prefix="rlft-bench-") as tmp:
        tmp = Path(tmp)
        model_dir = make_model(tmp / "model", args.size, args.seed, args.vocab)
        train_file = tmp / "train.jsonl"
        write_jsonl(train_rows, train_file)
        params = sum(p.numel() for p in LlamaForCausalLM.from_pretrained(model_dir).parameters())
        n = flop_params(model_dir)
        warm_up(model_dir, args.micro_batch, args.bf16)

        def run(name: str, out: Path, steps: int | None = None) -> dict:
            tool, compiled = variants[name]
            if tool == "rlft":
                return run_rlft(model_dir, train_file, out, args, compiled, steps)
            return run_trl(model_dir, train_rows, out, args, compiled, steps)

        for name in variants:  # warm-up runs, not reported: one-time costs (imports inside the tools, compile workers)
            run(name, tmp / f"warm-{name}", 3)
        load_before = os.getloadavg()
        runs: dict[str, list[dict]] = {name: [] for name in variants}
        plain_runs: list[dict] = []
        for index, order in enumerate(round_orders(list(variants), args.repeat)):
            for name in order:
                runs[name].append(run(name, tmp / f"{name}-{index}"))
                print(f"round {index + 1}/{args.repeat} {name}: wall {runs[name][-1]['wall_s']:.2f} s, "
                      f"median step {runs[name][-1]['median_step_s'] * 1e3:.1f} ms", flush=True)
            if args.plain_loop:
                reset_between_runs()
                plain_runs.append(run_plain_loop(model_dir, train_file, args))
        load_after = os.getloadavg()
        # Peak memory in a run of its own per variant (the sampler thread would perturb the timed runs).
        memory = {name: peak_memory(run, name, tmp / f"mem-{name}") for name in variants}
    ratios = fair_ratios(runs, rlft_variants, trl_variants)
    middle = {name: median_run(variant_runs) for name, variant_runs in runs.items()}
    for name, chosen in middle.items():
        chosen["mfu"] = mfu(chosen["tokens_per_s"], n, args.bf16)
    plain = {"median_step_s": statistics.median(run["median_step_s"] for run in plain_runs)} if plain_runs else None

    report = {
        "benchmark": "sft_vs_trl",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "size": args.size,
        "vocab": args.vocab,
        "long": args.long,
        "group_by_length": args.group_by_length,
        "rlft_batch_flattening": args.flatten,
        "variants": {name: {"tool": tool, "torch_compile": compiled} for name, (tool, compiled) in variants.items()},
        "params": params,
        "flop_params": n,
        "steps": args.steps,
        "learning_rate": args.lr,
        "micro_batch": args.micro_batch,
        "train_rows": len(train_rows),
        "repeat": args.repeat,
        "round_orders": round_orders(list(variants), args.repeat),
        "reported": "medians over the rounds; ratios TRL/rlft, the median of the round-by-round ratios (fair_ratios)",
        "threads": torch.get_num_threads(),
        "load_average_1m_before_after": [load_before[0], load_after[0]],
        "cpu_count": os.cpu_count(),
        "machine": device_name(),
        "device": DEVICE.type,
        "bf16": args.bf16,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "trl": trl.__version__,
                     "accelerate": accelerate.__version__, "datasets": datasets.__version__},
        "ratios": ratios,
        "median_run": middle,
        "plain_loop": plain,  # a plain PyTorch loop on the same batches (run_plain_loop): the median over the rounds
        "over_plain_loop": ({name: ratios["median_over_rounds_s"][name] / plain["median_step_s"] for name in variants}
                            if plain else {}),
        "peak_memory_mib": memory,
        "all_runs": runs,
        "plain_loop_runs": plain_runs,
    }
    print_report(report)
    vocab = f"-v{args.vocab}" if args.vocab else ""
    shape = ("-long" if args.long else "") + ("-grouped" if args.group_by_length else "") + ("-flat" if args.flatten else "")
    device = ("-cuda" if DEVICE.type == "cuda" else "") + ("-bf16" if args.bf16 else "")
    out = args.out or RESULTS / f"sft_vs_trl-{args.size}{shape}{vocab}{device}.json"
    write_report(out, report)


if __name__ == "__main__":
    main()
