"""DPO speed: rlft vs TRL's DPOTrainer on the same tiny model, data, batches and hyperparameters, in one process.

Both tools load identical weights (one seeded random init, saved once with save_pretrained) and train on
the addition preference pairs (`rlft.tasks.addition.preference_rows` of the first --rows training rows, as
plain prompt/chosen/rejected strings, TRL's standard non-conversational format; the default 1,000 rows are
examples/preference/data/pairs.jsonl). Sigmoid DPO loss, beta 0.1, micro batch 8 pairs, no accumulation,
AdamW lr 5e-4 constant, no warm-up, no weight decay, grad clip 1.0, fp32, max length 32, dropout off, no
eval, no periodic checkpoints.

Same batches: TRL gets the rows in the order of rlft's first epoch (`recipe.train_plan.epoch_order(0)`,
length-grouped micro-batches) with `train_sampling_strategy="sequential"`, so step k of both tools sees the
same 8 pairs, padded to the same width; the first batch's token ids are compared. With policy == reference
at step 1 the step-1 loss must be log 2 in every run (asserted); the loss curves are then compared step by
step (they should agree to float noise, since the weights, data and optimizer are the same).

Settings, each eager and compiled (rlft `torch_compile: true`, TRL `torch_compile=True`; --rlft-compile and
--trl-compile choose), alternating over --repeat rounds (the order reversed every other round) after a short warm-up
run of each:
  rlft  ref=copy        the frozen reference copy runs a forward every step (rlft's default)
  rlft  ref=precompute  `precompute_ref_log_probs: true`: reference log-probs computed once before training
  TRL   ref=model       TRL's default: a reference model (loaded from the saved path) runs every step
  TRL   ref=precompute  `precompute_ref_log_probs=True` (same precompute batch size, 8, as rlft)
  rlft  ref=copy, twice `share_prompts: false`: each prompt computed twice, in 2B padded rows, as TRL does
                        (with --compare-sharing)
rlft's other two settings share each pair's prompt (its default, docs/preference.md): one sequence per pair.
Before every run the process state a tool leaves is cleared (common.reset_between_runs). For the reference every step
and precomputed each, each side's best compile setting is the one with the smaller median step over the rounds; the
ratios TRL/rlft are the median of the round-by-round ratios (common.fair_ratios): rlft at its best against TRL at its
best, against TRL as shipped (eager), and both eager (the defaults).

Measured per run:
  wall      the training call: rlft `train(cfg, console)` (tokenizer + data preparation + model and reference
            load + precompute + loop + its final checkpoint + final model save); TRL `DPOTrainer(...)` (model
            and reference load, dataset tokenisation, precompute) + `trainer.train()`. Imports and row
            generation are excluded.
  step      the median interval between consecutive optimizer steps' ends, by one hook for both tools
            (common.OptimizerSteps): the batch fetch, the reference and policy forwards, backward, update and the
            tool's per-step logging. Each tool's own timer is in the JSON (`own_median_step_s`): rlft `step_time_s`
            (without its logging after the update), TRL on_step_begin -> on_step_end (without the batch fetch).
  tokens/s  non-padding tokens trained per step (the mean) / the median step (both tools see the same tokens).
  MFU       tokens/s x 6N / the device's peak, as `rlft train` logs it (rlft.train.metrics; N without the input
            embedding, a lookup; the reference model's forward not counted); the same formula for every setting.

The table shows each variant's run at its median (the round whose median step is the median); the JSON keeps every
run and the load average (a shared 2-core machine is noisy).

Usage (from the repository root):
  .venv/bin/python bench/preference.py --size S --steps 40 --threads 2
  .venv/bin/python bench/preference.py --size S --steps 40 --vocab 32768   # a real tokenizer's output layer
  .venv/bin/python bench/preference.py --long --vocab 32768 --rows 64 --steps 4 --repeat 1
      # prompts of 64-600 characters (solved sums before the asked one), sequences up to 640 tokens
Results: a table on stdout and bench/results/preference-<size>[-long][-v<vocab>].json.

Each round also times a plain PyTorch loop on rlft's batches, reference every step (run_plain_loop: the two forwards,
the sigmoid loss, backward, clip, AdamW; nothing else), what a hand-written script does. Each tool's median step over
it says how much the tool adds to (or saves on) the model's own arithmetic.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("TQDM_DISABLE", "1")  # TRL's precompute progress bar

import argparse
import datetime
import io
import json
import math
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers
from rich.console import Console
from transformers import AutoTokenizer, LlamaForCausalLM, PrinterCallback

import trl
from trl import DPOConfig, DPOTrainer

import accelerate  # noqa: F401  (imported here so its import cost stays out of the timings)
import datasets
import rlft.data.prepare  # noqa: F401
import rlft.models.loading  # noqa: F401
import rlft.train.trainer  # noqa: F401
import rlft.train.recipes.preference  # noqa: F401
import rlft.train.run
from rlft.config import build_config
from rlft.models.tiny import SIZES
from rlft.tasks.addition import preference_rows, split_rows, write_jsonl
from accelerate.utils import is_compiled_module
from common import (RESULTS, OptimizerSteps, compile_choices, describe_ratios, fair_ratios, flop_params, long_rows,
                    make_model, mfu, peak_memory, plain_update, quiet, reset_between_runs, rlft_keys, round_orders, trl_keys,
                    write_report)
from rlft.train.metrics import clock
from sft_vs_trl import DEVICE, LONG_LENGTH, StepTimer, median_run, warm_up

LR = 5e-4
BETA = 0.1
MAX_LENGTH = 32
LOG2 = math.log(2)
# (tool, precompute, rlft's share_prompts): the run order within a compile setting. rlft shares each pair's prompt by
# default; "-twice" (--compare-sharing) is rlft with share_prompts: false, the 2B padded rows TRL computes too
SETTINGS = [("rlft", False, None), ("trl", False, None), ("rlft", True, None), ("trl", True, None)]
TWICE = ("rlft", False, False)


def label(tool: str, precompute: bool, share: bool | None = None, compiled: bool = False) -> str:
    """A variant's name: rlft-copy-eager, trl-model-compiled, rlft-precompute-compiled, rlft-copy-twice-eager, ..."""
    reference = "precompute" if precompute else ("copy" if tool == "rlft" else "model")
    return f"{tool}-{reference}{'-twice' if share is False else ''}-{'compiled' if compiled else 'eager'}"


# --------------------------------------------------------------------------- rlft


def run_rlft(model_dir: Path, train_file: Path, out_dir: Path, steps: int, precompute: bool, args, share: bool | None = None,
             compiled: bool = False) -> dict:
    cfg = build_config({
        **rlft_keys(model_dir, out_dir, steps, args.seed, LR, args.bf16),
        "rl": "dpo",
        "rl_beta": BETA,
        "dpo_loss_type": ["sigmoid"],
        "precompute_ref_log_probs": precompute,
        "share_prompts": share,  # None: rlft's default, which shares these pairs' prompts (its plan says so)
        "datasets": [{"path": str(train_file)}],
        "sequence_len": MAX_LENGTH,
        "micro_batch_size": args.micro_batch,
        "torch_compile": compiled,  # the compiled forward: compiled in each run's first steps
    }, source="bench")

    console = Console(file=io.StringIO(), width=120)  # rendered like a non-terminal run, not shown
    reset_between_runs()
    start = time.perf_counter()
    with OptimizerSteps(clock) as ends:
        result = rlft.train.run.train(cfg, console)
    wall = time.perf_counter() - start

    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps_ = [r for r in records if "step_time_s" in r]
    step_times = [r["step_time_s"] for r in steps_]
    tokens = sum(r["tokens"] for r in steps_)
    phases = {}
    for key in ("time/data", "time/forward_backward", "time/optimizer"):
        phases[key.split("/")[1] + "_median_s"] = statistics.median(r.get(key, 0.0) for r in steps_)
    # Reference forwards inside the loop's steps (none when precomputed), as the recipe logs them
    in_loop_reference = [r["time/reference"] for r in steps_ if "time/reference" in r]
    phases["reference_forward_median_s"] = statistics.median(in_loop_reference) if in_loop_reference else 0.0
    in_steps = sum(step_times)
    loop_total = result.ended_at - result.started_at
    checkpoint = result.save_time
    return {
        "setting": label("rlft", precompute, share, compiled),
        "wall_s": wall,
        "setup_s": result.started_at - start,  # tokenizer, data, model + reference, precompute, plan table
        "precompute_s": result.recipe.precompute_time,
        "loop_s": loop_total,
        "steps_s": in_steps,
        "checkpoint_save_s": checkpoint,
        "final_model_save_s": start + wall - result.ended_at,
        "loop_other_s": loop_total - in_steps - checkpoint,
        "steps": len(steps_),
        "median_step_s": statistics.median(ends.intervals),  # end to end, as TRL's (common.OptimizerSteps)
        "own_median_step_s": statistics.median(step_times),  # rlft's step_time_s: without the logging after the update
        "first_step_s": step_times[0],
        "phase_medians": phases,
        "reference_forwards_in_loop": len(in_loop_reference),
        "tokens": tokens,
        "tokens_per_s": tokens / len(steps_) / statistics.median(ends.intervals),
        "losses": [r["loss"] for r in steps_],
        "margins": [r.get("rewards/margins") for r in steps_],
        "global_step": result.state.global_step,
        "_recipe": result.recipe,  # dropped before the JSON is written
    }


def rlft_order(recipe, tokenizer, rows: list[dict], steps: int) -> tuple[list[dict], dict]:
    """The training rows in the order rlft's first epoch feeds them, plus rlft's first batch (for a check)."""
    plan = recipe.train_plan
    order = plan.epoch_order(0)
    used = order[:steps]
    if any(len(batch) != plan.micro_batch_size for batch in used):
        raise SystemExit("a short micro-batch falls inside the measured steps: choose --rows divisible by --micro-batch")
    by_prompt = {row["prompt"]: row for row in rows}
    flat = [i for batch in order for i in batch]
    ordered = [by_prompt[tokenizer.decode(plan.items[i]["prompt_ids"])] for i in flat]
    if len(ordered) != len(rows) or len({r["prompt"] for r in ordered}) != len(rows):
        raise SystemExit("could not map rlft's examples back to the rows one to one")
    first = plan.batch(order[0])
    widths = [max(len(plan.items[i]["prompt_ids"]) + max(len(plan.items[i]["chosen_ids"]), len(plan.items[i]["rejected_ids"]))
                  for i in batch) for batch in used]
    return ordered, {"first_input_ids": first["input_ids"], "batch_widths": widths}


def padding_stats(recipe, steps: int, seed: int) -> dict:
    """Padding share of rlft's length-grouped batches vs the same rows batched in a plain random order."""
    plan = recipe.train_plan
    items = plan.items
    size = plan.micro_batch_size

    def share(batches):
        real = padded = 0
        for batch in batches:
            width = max(len(items[i]["prompt_ids"]) + max(len(items[i]["chosen_ids"]), len(items[i]["rejected_ids"])) for i in batch)
            for i in batch:
                for side in ("chosen_ids", "rejected_ids"):
                    real += len(items[i]["prompt_ids"]) + len(items[i][side])
                    padded += width
        return 1 - real / padded

    grouped = plan.epoch_order(0)
    random_order = torch.randperm(len(items), generator=torch.Generator().manual_seed(seed)).tolist()
    plain = [random_order[i : i + size] for i in range(0, len(random_order), size)]
    return {"grouped_first_steps": share(grouped[:steps]), "grouped_epoch": share(grouped),
            "random_epoch": share(plain)}


# --------------------------------------------------------------------------- TRL


class RecordingDPOTrainer(DPOTrainer):
    """Records each step's loss, margin and non-padding tokens, the first batch, and the precompute time."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.bench["first_input_ids"] is None:
            self.bench["first_input_ids"] = inputs["input_ids"].detach().cpu().clone()
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.bench["losses"].append(float(loss))
        self.bench["margins"].append(self._metrics["train"]["rewards/margins"][-1])
        self.bench["tokens"] += int(inputs["attention_mask"].sum())
        return loss

    def _precompute_ref_logps(self, dataset, name, batch_size):
        start = time.perf_counter()
        try:
            return super()._precompute_ref_logps(dataset, name, batch_size)
        finally:
            PRECOMPUTE_TIMES.append(time.perf_counter() - start)

    def compute_ref_log_probs(self, model, inputs):  # the precompute pass only; proves it was not a cache hit
        PRECOMPUTE_BATCHES.append(1)
        return super().compute_ref_log_probs(model, inputs)


PRECOMPUTE_TIMES: list[float] = []  # _precompute_ref_logps runs inside DPOTrainer.__init__, before self.bench exists
PRECOMPUTE_BATCHES: list[int] = []


def run_trl(model_dir: Path, ordered_rows: list[dict], out_dir: Path, steps: int, precompute: bool, args,
            compiled: bool = False) -> dict:
    dataset = datasets.Dataset.from_list(ordered_rows)  # row generation, not timed (rlft's jsonl is written untimed too)
    reset_between_runs()
    config = DPOConfig(
        output_dir=str(out_dir),
        **trl_keys(steps, args.seed, args.bf16),
        torch_compile=compiled,  # transformers' compile: accelerate's prepare wraps the model in torch.compile
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=1,
        learning_rate=LR,
        beta=BETA,
        loss_type=["sigmoid"],
        max_length=MAX_LENGTH,
        precompute_ref_log_probs=precompute,
        train_sampling_strategy="sequential",  # rlft's batch order, fed in as the row order
    )
    timer = StepTimer()
    PRECOMPUTE_TIMES.clear()
    PRECOMPUTE_BATCHES.clear()
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # model as the saved path: TRL loads the reference from the same path (ref_model=None); with precompute it
    # keeps no reference model. (TRL's DPOTrainer crashes on a config-built model without ref_model.)
    trainer = RecordingDPOTrainer(
        model=str(model_dir), ref_model=None, args=config, train_dataset=dataset, processing_class=tokenizer, callbacks=[timer]
    )
    trainer.bench = {"losses": [], "margins": [], "tokens": 0, "first_input_ids": None}
    trainer.remove_callback(PrinterCallback)  # the per-log dict print; not part of the comparison
    init_done = time.perf_counter()
    with OptimizerSteps(clock) as ends:
        trainer.train()
    wall = time.perf_counter() - start
    durations = timer.durations
    bench = trainer.bench
    if precompute and not PRECOMPUTE_BATCHES:
        raise SystemExit("TRL reused cached reference log-probs: the precompute timing would be wrong")
    return {
        "setting": label("trl", precompute, None, compiled),
        "model_compiled": is_compiled_module(trainer.model_wrapped),  # the compile setting took effect (or did not)
        "wall_s": wall,
        "setup_s": init_done - start,  # tokenizer, model + reference load, dataset tokenisation, precompute
        "precompute_s": sum(PRECOMPUTE_TIMES),
        "precompute_batches": len(PRECOMPUTE_BATCHES),
        "train_call_s": wall - (init_done - start),
        "steps_s": sum(durations),
        "train_other_s": wall - (init_done - start) - sum(durations),
        "steps": len(durations),
        "median_step_s": statistics.median(ends.intervals),  # end to end, as rlft's (common.OptimizerSteps)
        "own_median_step_s": statistics.median(durations),  # on_step_begin -> on_step_end: without the batch fetch
        "first_step_s": durations[0],
        "tokens": bench["tokens"],
        "tokens_per_s": bench["tokens"] / len(durations) / statistics.median(ends.intervals),
        "losses": bench["losses"],
        "margins": bench["margins"],
        "global_step": trainer.state.global_step,
        "_first_input_ids": bench["first_input_ids"],
    }


# --------------------------------------------------------------------------- a plain PyTorch loop (what a hand-written script does)


def run_plain_loop(model_dir: Path, recipe, steps: int, bf16: bool = False) -> dict:
    """A hand-written DPO step, reference every step, on rlft's batches (built before the clock starts): a no-grad
    reference forward, the policy forward, each sequence's summed log-probs of its completion (log_softmax over the
    whole vocabulary), the sigmoid loss, backward, clip, AdamW (transformers' adamw_torch); nothing else."""
    from rlft.data.batches import PlanCursor

    cursor = PlanCursor(recipe.train_plan)
    batches = [{k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in cursor.next().items()} for _ in range(steps)]
    model = LlamaForCausalLM.from_pretrained(model_dir).to(DEVICE)
    model.train()
    reference = LlamaForCausalLM.from_pretrained(model_dir).to(DEVICE).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, fused=True)  # rlft's and TRL's default (adamw_torch_fused)

    def sequence_logps(network, batch) -> torch.Tensor:
        with torch.autocast(DEVICE.type, torch.bfloat16, enabled=bf16):
            logits = network(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
        targets = batch["labels"][:, 1:]
        per_token = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, targets.clamp_min(0)[..., None]).squeeze(-1)
        return (per_token * (targets != -100)).sum(-1)

    times, losses = [], []
    for batch in batches:
        start = clock()  # waits for the GPU once CUDA is in use
        with torch.no_grad():
            ref = sequence_logps(reference, batch)
        policy = sequence_logps(model, batch)
        pairs = policy.size(0) // 2  # chosen rows first, then rejected (rlft.data.preference.pair_batch)
        margin = (policy[:pairs] - ref[:pairs]) - (policy[pairs:] - ref[pairs:])
        losses.append(plain_update(model, optimizer, -torch.nn.functional.logsigmoid(BETA * margin).mean()))
        times.append(clock() - start)
    return {"median_step_s": statistics.median(times), "first_step_s": times[0], "losses": losses}


# --------------------------------------------------------------------------- report


def curve_check(runs: dict[str, dict]) -> dict:
    """Step-1 losses (must be log 2) and the step-by-step agreement of matched settings, for each compile setting that
    both runs of a pair have."""
    step1 = {name: run["losses"][0] for name, run in runs.items()}
    bad = {name: loss for name, loss in step1.items() if abs(loss - LOG2) > 1e-4}
    assert not bad, f"step-1 loss is not log(2) = {LOG2:.6f}: {bad}"
    pairs = {"copy_vs_model": ("rlft-copy", "trl-model"), "precompute_vs_precompute": ("rlft-precompute", "trl-precompute"),
             "rlft_copy_vs_rlft_precompute": ("rlft-copy", "rlft-precompute"),
             "rlft_prompt_once_vs_twice": ("rlft-copy", "rlft-copy-twice"),
             "rlft_eager_vs_compiled": ("rlft-copy", "rlft-copy")}
    compared = {}
    for key, (a, b) in pairs.items():
        for suffix_a, suffix_b in (("eager", "compiled"),) if a == b else (("eager", "eager"), ("compiled", "compiled")):
            first, second = f"{a}-{suffix_a}", f"{b}-{suffix_b}"
            if first not in runs or second not in runs:
                continue
            la, lb = runs[first]["losses"], runs[second]["losses"]
            ma, mb = runs[first]["margins"], runs[second]["margins"]
            compared[f"{key}-{suffix_a}" if a != b else key] = {
                "runs": [first, second],
                "loss_step2": [la[1], lb[1]],
                "margin_step2": [ma[1], mb[1]],
                "max_abs_loss_diff": max(abs(x - y) for x, y in zip(la, lb)),
                "max_abs_margin_diff": max(abs(x - y) for x, y in zip(ma, mb)),
                "final_loss": [la[-1], lb[-1]],
            }
    return {"step1_loss": step1, "log2": LOG2, "pairs": compared}


def print_report(res: dict) -> None:
    r = res["median_run"]
    names = list(r)
    print(f"\n{res['repeat']} rounds; each variant's run at its median (the round whose median step is the median); "
          f"1-min load average before/after: {res['load_average_1m_before_after'][0]:.2f}/"
          f"{res['load_average_1m_before_after'][1]:.2f}")
    print(f"DPO {res['size']} ({res['params']:,} params), {res['steps']} steps, {res['micro_batch']} pairs/step, "
          f"{res['rows']} rows, {res['threads']} threads; torch {res['versions']['torch']}, "
          f"transformers {res['versions']['transformers']}, trl {res['versions']['trl']}")
    rows = [
        ("median step, median of rounds (ms)", None, 1e3, "{:.1f}"),
        ("wall time of the training call (s)", "wall_s", 1, "{:.2f}"),
        ("  setup incl. precompute (s)", "setup_s", 1, "{:.2f}"),
        ("  of which precompute (s)", "precompute_s", 1, "{:.2f}"),
        ("first step (ms)", "first_step_s", 1e3, "{:.1f}"),
        ("tokens/s (over the median step)", "tokens_per_s", 1, "{:,.0f}"),
        ("MFU (tokens/s x 6N / peak)", "mfu", 1, "{:.4f}"),
    ]
    for group in range(0, len(names), 5):  # five variants a table, for an 120-column terminal
        chunk = names[group:group + 5]
        print(f"{'':36s}" + "".join(f"{n:>24s}" for n in chunk))
        for title, key, scale, fmt in rows:
            values = [res["median_over_rounds_s"][n] if key is None else r[n][key] for n in chunk]
            print(f"{title:36s}" + "".join(f"{fmt.format(v * scale):>24s}" for v in values))
        for title, index in (("loss at step 2", 1), ("loss at the last step", -1)):
            print(f"{title:36s}" + "".join(f"{r[n]['losses'][index]:>24.6f}" for n in chunk))
        print(f"{'peak memory above start (MiB)':36s}" + "".join(f"{res['peak_memory_mib'][n]:>24.1f}" for n in chunk))
    for n in names:
        if n.startswith("rlft"):
            p = r[n]["phase_medians"]
            print(f"{n}: step_time_s {r[n]['own_median_step_s'] * 1e3:.1f} ms; phase medians (ms): data "
                  f"{p['data_median_s'] * 1e3:.1f}, forward+backward "
                  f"{p['forward_backward_median_s'] * 1e3:.1f} (reference forward {p['reference_forward_median_s'] * 1e3:.1f}), "
                  f"optimizer {p['optimizer_median_s'] * 1e3:.1f}; checkpoint {r[n]['checkpoint_save_s'] * 1e3:.0f} ms, "
                  f"final save {r[n]['final_model_save_s'] * 1e3:.0f} ms")
        else:
            print(f"{n}: model compiled {r[n]['model_compiled']}, on_step_begin -> on_step_end (without the batch fetch) "
                  f"{r[n]['own_median_step_s'] * 1e3:.1f} ms, train() outside steps {r[n]['train_other_s']:.2f} s")
    pad = res["padding"]
    print(f"padding share: rlft length-grouped {pad['grouped_epoch']:.1%} (first {res['steps']} steps "
          f"{pad['grouped_first_steps']:.1%}; TRL is fed the same batches) vs random batches {pad['random_epoch']:.1%}")
    check = res["curve_check"]
    print(f"step-1 loss is log 2 = {LOG2:.4f} in every run; first batch identical: {res['first_batch_identical']}")
    for key, c in check["pairs"].items():
        print(f"  {key}: step-2 loss {c['loss_step2'][0]:.6f} vs {c['loss_step2'][1]:.6f}, margin "
              f"{c['margin_step2'][0]:.5f} vs {c['margin_step2'][1]:.5f}; max |loss diff| over all steps "
              f"{c['max_abs_loss_diff']:.2e}")
    for key, ratios in res["ratios"].items():
        print(describe_ratios(ratios, f"{key}: "))
    print("(>1: rlft is faster)")
    plain = res["plain_loop"]
    if plain:
        print(f"plain PyTorch loop on rlft's batches (reference every step): median step {plain['median_step_s'] * 1e3:.1f} ms "
              "(median of rounds); " + ", ".join(f"{n} {v:.2f}x it" for n, v in res["over_plain_loop"].items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="S")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--micro-batch", type=int, default=8, help="pairs per step")
    parser.add_argument("--rows", type=int, default=1000, help="training pairs (the precompute pass covers all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", type=int, default=None,
                        help="output-layer width (default: the byte tokenizer's; 32768 for a real tokenizer's logits)")
    parser.add_argument("--repeat", type=int, default=5,
                        help="rounds: every variant runs once per round, in alternating order; ratios are medians over "
                             "the rounds, every run is kept in the JSON")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--rlft-compile", choices=["both", "on", "off"], default="both",
                        help="rlft with torch_compile: false, true or both (its first steps compile; compare median steps)")
    parser.add_argument("--trl-compile", choices=["both", "on", "off"], default="both",
                        help="TRL with torch_compile=False (as shipped), True, or both")
    parser.add_argument("--compare-sharing", action="store_true",
                        help="also run rlft with share_prompts: false (each prompt twice, as TRL runs it)")
    parser.add_argument("--no-plain-loop", dest="plain_loop", action="store_false",
                        help="skip the plain PyTorch loop's run in each round")
    parser.add_argument("--bf16", action="store_true", help="both tools (and the plain loop) in bf16 autocast over fp32 weights")
    parser.add_argument("--long", action="store_true",
                        help="each prompt led by 64-600 characters of solved sums (sequences up to 640 tokens)")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results/preference-<size>...json)")
    args = parser.parse_args()
    quiet()
    if args.threads:
        torch.set_num_threads(args.threads)

    global MAX_LENGTH
    rows = preference_rows(split_rows()[0][: args.rows])
    if args.long:  # the same pairs behind long prompts: chosen and rejected answers stay the short sums
        MAX_LENGTH = LONG_LENGTH
        rows = [{**row, "prompt": lead["prompt"].rsplit("; ", 1)[0] + "; " + row["prompt"]}
                for row, lead in zip(rows, long_rows(len(rows), args.seed))]
    variants = {}  # name -> (tool, precompute, share, compiled)
    for tool, precompute, share in SETTINGS + ([TWICE] if args.compare_sharing else []):
        for compiled in compile_choices(args.rlft_compile if tool == "rlft" else args.trl_compile):
            variants[label(tool, precompute, share, compiled)] = (tool, precompute, share, compiled)
    with tempfile.TemporaryDirectory(prefix="rlft-bench-") as tmp:
        tmp = Path(tmp)
        model_dir = make_model(tmp / "model", args.size, args.seed, args.vocab)
        train_file = tmp / "pairs.jsonl"
        write_jsonl(rows, train_file)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        params = sum(p.numel() for p in LlamaForCausalLM.from_pretrained(model_dir).parameters())
        n = flop_params(model_dir)
        warm_up(model_dir, 2 * args.micro_batch)

        # rlft's batch order for TRL, from a short run (not reported)
        first = run_rlft(model_dir, train_file, tmp / "order-rlft", 3, False, args)
        recipe = first.pop("_recipe")
        ordered, rlft_first = rlft_order(recipe, tokenizer, rows, args.steps)
        padding = padding_stats(recipe, args.steps, args.seed)

        def run(name: str, out: Path, steps: int) -> dict:
            tool, precompute, share, compiled = variants[name]
            if tool == "rlft":
                result = run_rlft(model_dir, train_file, out, steps, precompute, args, share, compiled)
                result.pop("_recipe")
                return result
            return run_trl(model_dir, ordered, out, steps, precompute, args, compiled)

        for name in variants:  # warm-up runs, not reported: one-time costs (imports inside the tools, compile workers)
            run(name, tmp / f"warm-{name}", 3).pop("_first_input_ids", None)
        load_before = os.getloadavg()
        plain_runs: list[dict] = []
        runs: dict[str, list[dict]] = {name: [] for name in variants}
        first_batch_identical = True
        for index, order in enumerate(round_orders(list(variants), args.repeat)):
            for name in order:
                result = run(name, tmp / f"{name}-{index}", args.steps)
                if name.startswith("trl"):
                    first_batch_identical &= torch.equal(result.pop("_first_input_ids"), rlft_first["first_input_ids"])
                runs[name].append(result)
                print(f"round {index + 1}/{args.repeat} {name:26s}: wall {result['wall_s']:.2f} s, median step "
                      f"{result['median_step_s'] * 1e3:.1f} ms, step-1 loss {result['losses'][0]:.6f}", flush=True)
            if args.plain_loop:
                reset_between_runs()
                plain_runs.append(run_plain_loop(model_dir, recipe, args.steps, args.bf16))
                print(f"round {index + 1}/{args.repeat} plain PyTorch loop: median step "
                      f"{plain_runs[-1]['median_step_s'] * 1e3:.1f} ms, step-1 loss {plain_runs[-1]['losses'][0]:.6f}",
                      flush=True)
        load_after = os.getloadavg()
        # Peak memory in a run of its own per variant (the sampler thread would perturb the timed runs).
        memory = {name: peak_memory(lambda name=name: run(name, tmp / f"mem-{name}", args.steps).pop("_first_input_ids", None))
                  for name in variants}
    middle = {name: median_run(variant_runs) for name, variant_runs in runs.items()}
    for result in middle.values():  # the trained tokens of the policy: the reference's forward is not counted, as in rlft's log
        result["mfu"] = mfu(result["tokens_per_s"], n, args.bf16)
    check = curve_check(middle)
    bad = [(result["setting"], result["losses"][0]) for variant_runs in runs.values() for result in variant_runs
           if abs(result["losses"][0] - LOG2) > 1e-4]
    assert not bad, f"step-1 loss is not log(2) = {LOG2:.6f} in every run: {bad}"

    def side(tool: str, precompute: bool, share: bool | None = None) -> dict[bool, str]:
        return {compiled: label(tool, precompute, share, compiled)
                for compiled in compile_choices(args.rlft_compile if tool == "rlft" else args.trl_compile)}

    ratios = {"reference_every_step": fair_ratios(runs, side("rlft", False), side("trl", False)),
              "precomputed": fair_ratios(runs, side("rlft", True), side("trl", True))}
    if args.compare_sharing:
        ratios["reference_every_step_prompt_twice"] = fair_ratios(runs, side("rlft", False, False), side("trl", False))
    medians = {name: statistics.median(result["median_step_s"] for result in variant_runs) for name, variant_runs in runs.items()}
    plain = {"median_step_s": statistics.median(result["median_step_s"] for result in plain_runs)} if plain_runs else None
    report = {
        "benchmark": "preference",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "size": args.size,
        "vocab": args.vocab,
        "variants": {name: {"tool": tool, "precompute_ref_log_probs": precompute, "share_prompts": share,
                            "torch_compile": compiled} for name, (tool, precompute, share, compiled) in variants.items()},
        "device": DEVICE.type,
        "device_name": torch.cuda.get_device_name() if DEVICE.type == "cuda" else None,
        "bf16": args.bf16,
        "params": params,
        "flop_params": n,
        "steps": args.steps,
        "micro_batch": args.micro_batch,
        "rows": len(rows),
        "beta": BETA,
        "learning_rate": LR,
        "max_length": MAX_LENGTH,
        "long": args.long,
        "repeat": args.repeat,
        "round_orders": round_orders(list(variants), args.repeat),
        "reported": "medians over the rounds; ratios TRL/rlft, the median of the round-by-round ratios (fair_ratios)",
        "data_order": "TRL fed rlft's first-epoch batch order with sequential sampling",
        "first_batch_identical": first_batch_identical,
        "rlft_batch_widths": rlft_first["batch_widths"],
        "padding": padding,
        "threads": torch.get_num_threads(),
        "load_average_1m_before_after": [load_before[0], load_after[0]],
        "cpu_count": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "trl": trl.__version__,
                     "accelerate": accelerate.__version__, "datasets": datasets.__version__},
        "ratios": ratios,
        "median_over_rounds_s": medians,
        "median_run": middle,
        "curve_check": check,
        "peak_memory_mib": memory,
        "plain_loop": plain,  # a plain PyTorch loop on rlft's batches, reference every step: the median over the rounds
        "over_plain_loop": {name: medians[name] / plain["median_step_s"] for name in variants
                            if not variants[name][1]} if plain else {},
        "all_runs": runs,
        "plain_loop_runs": plain_runs,
    }
    if plain_runs and "rlft-copy-eager" in middle:  # the hand-written loop trains on the same batches: the same losses
        report["plain_loop_max_abs_loss_diff_vs_rlft_copy_eager"] = max(
            abs(a - b) for a, b in zip(plain_runs[0]["losses"], middle["rlft-copy-eager"]["losses"]))
    print_report(report)
    vocab = f"-v{args.vocab}" if args.vocab else ""
    long = "-long" if args.long else ""
    device = ("-cuda" if DEVICE.type == "cuda" else "") + ("-bf16" if args.bf16 else "")
    out = args.out or RESULTS / f"preference-{args.size}{long}{vocab}{device}.json"
    write_report(out, report)


if __name__ == "__main__":
    main()
