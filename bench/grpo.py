"""GRPO speed: rlft vs TRL's GRPOTrainer (no vLLM) on the same tiny model, prompts and settings, in one process.

Both tools load identical weights (one seeded random init of `rlft.models.tiny`, saved once with
save_pretrained) and draw prompts from the addition task (`rlft.tasks.addition.split_rows`, the "a+b="
strings as plain, non-conversational prompts). Settings shared by both:
num_generations G = 4, 8 completions per optimizer step (2 prompts x 4, one micro-batch, no
accumulation, steps_per_generation 1, num_iterations 1), max_completion_length 32, temperature 1.0,
top-p 1, top-k off, beta 0.0 (no reference model), loss_type "grpo", epsilon 0.2, scale_rewards
"group", AdamW (adamw_torch) lr 1e-4 constant, no warm-up, no weight decay, grad clip 1.0, fp32, no
gradient checkpointing, no eval, no periodic checkpoints. Reward: count("a") / 10 - 0.01 * len(text),
the same Python function for both, in-process.

Full-length completions (default; --no-force-length turns it off): every completion is exactly
32 tokens in both tools, so both generate and train on the same number of tokens. TRL:
`generation_kwargs={"min_new_tokens": 32}` (transformers suppresses EOS until then). rlft has no
min_new_tokens, so the bench sets `trl.generation_kwargs: {ignore_eos: true}` (vLLM's name: a
sampled EOS is then an ordinary token). The generated tokens per step are measured and reported for both.

Measured per run:
  wall      the training call: rlft `train(cfg, console)` (tokenizer + prompt preparation + model
            load + loop + its final checkpoint + final model save); TRL `GRPOTrainer(...)` (model
            load, dataset) + `trainer.train()`. Imports and row generation are excluded.
  step      the median interval between consecutive optimizer steps' ends, by one hook for both tools
            (common.OptimizerSteps): the prompt fetch, generation, rewards, advantages, forward/backward, the
            optimizer, rlft's weight push into its engine, and each tool's per-step logging. Each tool's own
            timer is in the JSON (`own_median_step_s`): rlft `step_time_s` (without its logging after the
            update), TRL on_step_begin -> on_step_end (it generates inside training_step; its prompt fetch
            comes before on_step_begin).
  phases    rlft: time/prepare (rollout: generate, reward, advantages, batch building),
            time/generate, time/reward, time/logprobs (old/ref log-probs; 0 here), time/forward_backward,
            time/optimizer, from metrics.jsonl. TRL: its own profiling timers (_prepare_inputs,
            transformers.generate, _calculate_rewards, compute_loss = the forward) captured in-process,
            training_step (prepare + forward + backward), optimizer = training_step end -> on_step_end
            (grad clip, optimizer.step, scheduler, zero_grad).
  MFU       trained tokens (prompt + completion of every row) per step x 6N / the median step / the device's
            peak, as `rlft train` logs it (rlft.train.metrics): generation's FLOPs are not counted.
  tokens/s  generated tokens / generate time, the median over steps (so the compiling first step of
            torch_compile does not count; until 2026-11-28 it was the sum over all steps, which did).
  ratio     TRL/rlft of the median step (common.fair_ratios): the median of the round-by-round ratios, with
            the ratio of the medians over the rounds and of all steps of all runs pooled beside it.

Each tool runs eager and compiled (rlft `torch_compile: true`: static KV cache and compiled decode step, and the
compiled training forward; TRL `torch_compile=True`: accelerate compiles the trained model; --rlft-compile and
--trl-compile choose), the variants alternating over --repeat rounds (default 5, the order reversed every other
round) after a short warm-up run of each. Before every run the process state a tool leaves is cleared
(common.reset_between_runs). Each side's best setting is the one with the smaller median step over the rounds; the
ratios are rlft at its best against TRL at its best, against TRL as shipped (eager), and both eager (the defaults).
The table shows each variant's run at its median; the JSON keeps every run and the 1-minute load average (a shared
2-core machine is noisy). Both tools run with one torch thread by default (--threads): with two threads on a
2-core VM any other busy process makes OpenMP spin-waits stall every small op (measured: generate 44 ms
with 1 thread vs 180-430 ms with 2 while another process ran), which drowns the comparison.
bench/grpo_wall.py times whole runs instead, each tool in a fresh process, start-up included.

rlft shares each group's prompt by default (`share_prompts`, docs/grpo.md): where its FLOPs estimate says so, a
micro-batch runs each prompt once with its G completions after it. --compare-sharing adds a third tool to the
alternation, "rlft-separate": rlft with `share_prompts: false` (every completion in a row of its own, as TRL runs them).
--long leads each prompt with 64-600 characters of solved sums, as preference.py --long (prompts up to about 220 tokens).

Usage (from the repository root):
  .venv/bin/python bench/grpo.py --size S --steps 10
  .venv/bin/python bench/grpo.py --long --compare-sharing --steps 5 --repeat 2
  .venv/bin/python bench/grpo.py --size S --vocab 32768   # a real tokenizer's output layer (sampled ids past the
                                                          # byte range decode to nothing in both tools)
Results: a table on stdout and bench/results/grpo-<size>[-c<length>][-v<vocab>][-compiled].json.
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
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import torch
import transformers
from rich.console import Console
from transformers import AutoTokenizer, LlamaForCausalLM, PrinterCallback, TrainerCallback

import trl
import trl.extras.profiling
from trl import GRPOConfig, GRPOTrainer

import accelerate  # noqa: F401  (imported here so its import cost stays out of the timings)
import datasets
import rlft.data.prepare  # noqa: F401
import rlft.models.loading  # noqa: F401
import rlft.rollout.rewards.runner  # noqa: F401
import rlft.train.recipes.grpo  # noqa: F401
import rlft.train.run
from rlft.config import build_config
from rlft.models.tiny import SIZES
from rlft.tasks.addition import split_rows, write_jsonl
from accelerate.utils import is_compiled_module
from common import (RESULTS, OptimizerSteps, compile_choices, describe_ratios, fair_ratios, flop_params, long_rows,
                    make_model, median, mfu, peak_memory, print_table, quiet, reset_between_runs, rlft_keys, round_orders,
                    trl_keys, variant_name, write_report)
from sft_vs_trl import DEVICE, LONG_LENGTH, median_run, warm_up
from rlft.train.metrics import clock

GROUP = 4
COMPLETIONS_PER_STEP = 8
MAX_COMPLETION = 32
LR = 1e-4
BETA = 0.0
LOSS_TYPE = "grpo"
REWARD_MODULE = "rlft_bench_grpo_rewards"  # registered in sys.modules so rlft's `module.fn` loader finds it
RLFT_PHASES = ("prepare", "generate", "reward", "logprobs", "rollout_total", "forward_backward", "optimizer")


def count_a_reward(completions, **kwargs) -> list[float]:
    """The TRL baseline reward: count of 'a' / 10 - 0.01 * length (characters)."""
    return [text.count("a") / 10 - 0.01 * len(text) for text in completions]


sys.modules[REWARD_MODULE] = types.ModuleType(REWARD_MODULE)
sys.modules[REWARD_MODULE].count_a_reward = count_a_reward


# --------------------------------------------------------------------------- rlft


def rlft_settings(model_dir: Path, train_file: Path, out_dir: Path, steps: int, args, share: bool | None = None,
                  compiled: bool = False) -> dict:
    """rlft's config keys for this benchmark (what a YAML file would hold)."""
    return {
        **rlft_keys(model_dir, out_dir, steps, args.seed, LR, args.bf16),
        "rl": "grpo",
        "trl": {
            "num_generations": GROUP,
            "max_completion_length": MAX_COMPLETION,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": 0,
            "beta": BETA,
            "loss_type": LOSS_TYPE,
            "epsilon": 0.2,
            "scale_rewards": "group",
            "num_iterations": 1,
            "steps_per_generation": 1,
            "reward_funcs": [f"{REWARD_MODULE}.count_a_reward"],
            # no min_new_tokens in rlft: sample past EOS instead (vLLM's ignore_eos), so every completion is 32 tokens
            "generation_kwargs": {"ignore_eos": True} if args.force_length else None,
        },
        "datasets": [{"path": str(train_file)}],
        "sequence_len": (LONG_LENGTH if args.long else 32) + MAX_COMPLETION,  # the prompt + the completion fit
        "share_prompts": share,  # None: rlft's default
        "micro_batch_size": COMPLETIONS_PER_STEP,
        "torch_compile": compiled,  # static KV cache + compiled decode step (compiled in the run's first step)
    }


def run_rlft(model_dir: Path, train_file: Path, out_dir: Path, steps: int, args, share: bool | None = None,
             compiled: bool = False) -> dict:
    cfg = build_config(rlft_settings(model_dir, train_file, out_dir, steps, args, share, compiled), source="bench")
    console = Console(file=io.StringIO(), width=120)  # rendered like a non-terminal run, not shown
    reset_between_runs()
    start = time.perf_counter()
    with OptimizerSteps(clock) as ends:
        result = rlft.train.run.train(cfg, console)
    wall = time.perf_counter() - start

    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps_ = [r for r in records if "step_time_s" in r]
    step_times = [r["step_time_s"] for r in steps_]
    generated = [r["completions/mean_length"] * COMPLETIONS_PER_STEP for r in steps_]
    phases = {f"{name}_median_s": median(r.get(f"time/{name}", 0.0) for r in steps_) for name in RLFT_PHASES}
    # what the step spends outside the named phases (advantages, batch building, metrics, device moves)
    phases["other_median_s"] = median(r["step_time_s"] - r.get("time/prepare", 0.0) - r.get("time/forward_backward", 0.0)
                                      - r.get("time/optimizer", 0.0) for r in steps_)
    phases["prepare_minus_generate_reward_median_s"] = median(
        r.get("time/prepare", 0.0) - r.get("time/generate", 0.0) - r.get("time/reward", 0.0) - r.get("time/logprobs", 0.0)
        for r in steps_)
    in_steps = sum(step_times)
    loop_total = result.ended_at - result.started_at
    checkpoint = result.save_time
    return {
        "variant": variant_name("rlft", compiled, "separate" if share is False else ""),
        "wall_s": wall,
        "setup_s": result.started_at - start,  # tokenizer, prompt preparation, model load, reward import
        "loop_s": loop_total,
        "steps_s": in_steps,
        "checkpoint_save_s": checkpoint,
        "final_model_save_s": start + wall - result.ended_at,
        "loop_other_s": loop_total - in_steps - checkpoint,
        "steps": len(steps_),
        "median_step_s": median(ends.intervals),  # end to end, as TRL's (common.OptimizerSteps)
        "own_median_step_s": median(step_times),  # rlft's step_time_s: without the logging after the update
        "first_step_s": step_times[0],
        "step_times_s": ends.intervals,
        "phase_medians": phases,
        "generated_tokens_per_step": generated,
        "generated_tokens": sum(generated),
        "generate_tokens_per_s": median(n / r["time/generate"] for n, r in zip(generated, steps_)),
        "trained_tokens_per_step": median(r["tokens"] for r in steps_),  # prompt + completion of every row
        "completion_length_min": min(r["completions/min_length"] for r in steps_),
        "rewards": [r["reward"] for r in steps_],
        "losses": [r["loss"] for r in steps_],
        "global_step": result.state.global_step,
        "share_prompts": share,
    }


# --------------------------------------------------------------------------- TRL


PROFILED: dict[str, list[float]] = {}  # TRL's profiling_context timings, by name, captured in-process
_original_log_metrics = trl.extras.profiling.ProfilingContext._log_metrics


def _capture_profiling(self, duration: float) -> None:
    PROFILED.setdefault(self.name.removeprefix("RecordingGRPOTrainer."), []).append(duration)
    _original_log_metrics(self, duration)


trl.extras.profiling.ProfilingContext._log_metrics = _capture_profiling


class GRPOStepTimer(TrainerCallback):
    """on_step_begin -> on_step_end per optimizer step, and when training_step ended inside it."""

    def __init__(self) -> None:
        self.begin = None
        self.durations: list[float] = []
        self.optimizer: list[float] = []  # last training_step end -> on_step_end (clip, step, scheduler, zero_grad)
        self.training_step_end = None

    def on_step_begin(self, args, state, control, **kwargs):
        self.begin = clock()  # waits for the GPU once CUDA is in use

    def on_step_end(self, args, state, control, **kwargs):
        now = clock()
        self.durations.append(now - self.begin)
        self.optimizer.append(now - self.training_step_end)


class RecordingGRPOTrainer(GRPOTrainer):
    """Records each step's training_step time, generated tokens, loss and reward."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        start = clock()
        loss = super().training_step(model, inputs, num_items_in_batch)
        end = clock()
        self.bench["training_step"].append(end - start)
        self.bench_timer.training_step_end = end
        self.bench["losses"].append(float(loss))
        self.bench["rewards"].append(self._metrics["train"]["reward"][-1])
        return loss

    def _generate_single_turn(self, prompt_ids, *a, **k):
        completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *a, **k)
        self.bench["generated_tokens"].append(sum(len(ids) for ids in completion_ids))
        self.bench["prompt_ids"].extend(prompt_ids)
        self.bench["prompt_tokens"].append(sum(len(ids) for ids in prompt_ids))
        return completion_ids, logprobs


def trl_settings(out_dir: Path, steps: int, args, compiled: bool = False) -> dict:
    """GRPOConfig's keyword arguments for this benchmark."""
    return dict(
        output_dir=str(out_dir),
        **trl_keys(steps, args.seed, args.bf16),
        torch_compile=compiled,  # transformers' compile: accelerate's prepare wraps the trained model in torch.compile
        per_device_train_batch_size=COMPLETIONS_PER_STEP,
        gradient_accumulation_steps=1,
        num_generations=GROUP,
        steps_per_generation=1,
        num_iterations=1,
        max_completion_length=MAX_COMPLETION,
        generation_kwargs={"min_new_tokens": MAX_COMPLETION} if args.force_length else None,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=BETA,
        loss_type=LOSS_TYPE,  # TRL 1.16 defaults to "dapo"
        epsilon=0.2,
        scale_rewards="group",
        use_vllm=False,
        learning_rate=LR,
    )


def run_trl(model_dir: Path, prompts: list[dict], out_dir: Path, steps: int, args, compiled: bool = False) -> dict:
    dataset = datasets.Dataset.from_list(prompts)  # row generation, not timed (rlft's jsonl is written untimed too)
    reset_between_runs()
    config = GRPOConfig(**trl_settings(out_dir, steps, args, compiled))
    timer = GRPOStepTimer()
    PROFILED.clear()
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = RecordingGRPOTrainer(
        model=str(model_dir), reward_funcs=count_a_reward, args=config, train_dataset=dataset,
        processing_class=tokenizer, callbacks=[timer],
    )
    trainer.bench = {"training_step": [], "generated_tokens": [], "losses": [], "rewards": [], "prompt_ids": [],
                     "prompt_tokens": []}
    trainer.bench_timer = timer
    trainer.remove_callback(PrinterCallback)  # the per-log dict print; not part of the comparison
    init_done = time.perf_counter()
    with OptimizerSteps(clock) as ends:
        trainer.train()
    wall = time.perf_counter() - start
    durations = timer.durations
    bench = trainer.bench
    prepare = PROFILED.get("_prepare_inputs", [])
    forward = PROFILED.get("compute_loss", [])
    generate = PROFILED.get("transformers.generate", [])
    phases = {
        "prepare_inputs_median_s": median(prepare),
        "generate_median_s": median(generate),
        "reward_median_s": median(PROFILED.get("_calculate_rewards", [])),
        "forward_median_s": median(forward),
        "backward_median_s": median(t - p - f for t, p, f in zip(bench["training_step"], prepare, forward)),
        "training_step_median_s": median(bench["training_step"]),
        "optimizer_median_s": median(timer.optimizer),
        "prepare_minus_generate_reward_median_s": median(
            p - g - r for p, g, r in zip(prepare, generate, PROFILED.get("_calculate_rewards", []))),
    }
    return {
        "variant": variant_name("trl", compiled),
        "model_compiled": is_compiled_module(trainer.model_wrapped),  # the compile setting took effect (or did not)
        "wall_s": wall,
        "setup_s": init_done - start,  # tokenizer, model load, dataset, generation config
        "train_call_s": wall - (init_done - start),
        "steps_s": sum(durations),
        "train_other_s": wall - (init_done - start) - sum(durations),  # dataloader, optimizer setup, logging
        "steps": len(durations),
        "median_step_s": median(ends.intervals),  # end to end, as rlft's (common.OptimizerSteps)
        "own_median_step_s": median(durations),  # on_step_begin -> on_step_end: without the prompt fetch
        "first_step_s": durations[0],
        "step_times_s": ends.intervals,
        "phase_medians": phases,
        "profiling_calls": {name: len(values) for name, values in PROFILED.items()},
        "generated_tokens_per_step": bench["generated_tokens"],
        "generated_tokens": sum(bench["generated_tokens"]),
        # prompt + completion of every row, as rlft counts them (one generation call per step here)
        "trained_tokens_per_step": median(p + n for p, n in zip(bench["prompt_tokens"], bench["generated_tokens"])),
        "generate_tokens_per_s": median(n / max(t, 1e-9) for n, t in zip(bench["generated_tokens"], generate)),
        "rewards": bench["rewards"],
        "losses": bench["losses"],
        "prompt_lengths": sorted({len(ids) for ids in bench["prompt_ids"]}),
        "global_step": trainer.state.global_step,
    }


# --------------------------------------------------------------------------- report


def print_report(res: dict) -> None:
    runs = res["median_run"]
    names = list(runs)
    print(f"\n{res['repeat']} rounds; each variant's run at its median (the round whose median step is the median); "
          f"1-min load average before/after: {res['load_average_1m_before_after'][0]:.2f}/"
          f"{res['load_average_1m_before_after'][1]:.2f}")
    print(f"GRPO {res['size']} ({res['params']:,} params), {res['steps']} steps, {COMPLETIONS_PER_STEP} completions/step "
          f"({COMPLETIONS_PER_STEP // GROUP} prompts x G={GROUP}), max completion {MAX_COMPLETION}, force length "
          f"{res['force_length']}, {res['threads']} threads; torch {res['versions']['torch']}, transformers "
          f"{res['versions']['transformers']}, trl {res['versions']['trl']}")

    def phase(name: str, rlft_key: str, trl_key) -> float:
        p = runs[name]["phase_medians"]
        if name.startswith("rlft"):
            return p[rlft_key]
        return sum(p[key] for key in trl_key) if isinstance(trl_key, tuple) else p[trl_key]

    rows = [
        ("median step, median of rounds (ms)", lambda n: res["median_over_rounds_s"][n] * 1e3, "{:.1f}"),
        ("median step, all steps pooled (ms)", lambda n: res["median_step_pooled_s"][n] * 1e3, "{:.1f}"),
        ("wall time of the training call (s)", lambda n: runs[n]["wall_s"], "{:.2f}"),
        ("  setup: model, tokenizer, data (s)", lambda n: runs[n]["setup_s"], "{:.2f}"),
        ("  sum of step times (s)", lambda n: runs[n]["steps_s"], "{:.2f}"),
        ("first step (ms)", lambda n: runs[n]["first_step_s"] * 1e3, "{:.1f}"),
        ("  rollout: generate+reward+batch (ms)", lambda n: phase(n, "prepare_median_s", "prepare_inputs_median_s") * 1e3,
         "{:.1f}"),
        ("    generate (ms)", lambda n: phase(n, "generate_median_s", "generate_median_s") * 1e3, "{:.1f}"),
        ("    reward (ms)", lambda n: phase(n, "reward_median_s", "reward_median_s") * 1e3, "{:.2f}"),
        ("  forward+backward (ms)",
         lambda n: phase(n, "forward_backward_median_s", ("forward_median_s", "backward_median_s")) * 1e3, "{:.1f}"),
        ("  optimizer (ms)", lambda n: phase(n, "optimizer_median_s", "optimizer_median_s") * 1e3, "{:.1f}"),
        ("generated tokens per step (median)", lambda n: median(runs[n]["generated_tokens_per_step"]), "{:.0f}"),
        ("generated tokens/s (median step)", lambda n: runs[n]["generate_tokens_per_s"], "{:,.0f}"),
        ("MFU of training over the step", lambda n: runs[n]["mfu"], "{:.4f}"),
        ("mean reward", lambda n: statistics.fmean(runs[n]["rewards"]), "{:.4f}"),
        ("peak memory above start (MiB)", lambda n: res["peak_memory_mib"][n], "{:.1f}"),
    ]
    print_table(names, rows, 40, max(15, *(len(n) + 2 for n in names)))
    for n in names:
        r = runs[n]
        if n.startswith("rlft"):
            print(f"{n}: step_time_s {r['own_median_step_s'] * 1e3:.1f} ms, time/logprobs "
                  f"{r['phase_medians']['logprobs_median_s'] * 1e3:.1f} ms, step outside prepare/fb/"
                  f"optimizer {r['phase_medians']['other_median_s'] * 1e3:.1f} ms, "
                  f"checkpoint {r['checkpoint_save_s'] * 1e3:.0f} ms, "
                  f"final save {r['final_model_save_s'] * 1e3:.0f} ms, loop outside steps {r['loop_other_s']:.3f} s")
        else:
            print(f"{n}: model compiled {r['model_compiled']}, on_step_begin -> on_step_end (without the prompt fetch) "
                  f"{r['own_median_step_s'] * 1e3:.1f} ms, train() outside steps {r['train_other_s']:.3f} s, prompt "
                  f"lengths {min(r['prompt_lengths'])}-{max(r['prompt_lengths'])}")
    print(describe_ratios(res["ratios"]) + "  (>1: rlft is faster)")
    print(describe_ratios(res["wall_ratios"]).replace("TRL/rlft", "TRL/rlft wall of the training call"))
    for key, value in res.get("sharing", {}).items():
        print(f"{key}: {value}")


def main() -> None:
    global MAX_COMPLETION
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="S")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per run (5-20 is plenty)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=5,
                        help="rounds: every variant runs once per round, in alternating order; ratios are medians over "
                             "the rounds, every run is kept in the JSON")
    parser.add_argument("--no-force-length", dest="force_length", action="store_false",
                        help="let completions stop at EOS (then generated tokens per step differ by tool)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: decoding B=8 one token at a time is latency-bound, and on a shared "
                             "2-core VM two OpenMP threads stall 3-10x whenever another process runs; 0 = torch's choice)")
    parser.add_argument("--max-completion", type=int, default=32,
                        help="tokens per completion (default 32; 512 for the long-sequence case)")
    parser.add_argument("--vocab", type=int, default=None,
                        help="widen the model's embeddings and output layer to this many entries (e.g. 32768)")
    parser.add_argument("--rlft-compile", choices=["both", "on", "off"], default="both",
                        help="rlft with torch_compile: false, true or both (static KV cache, compiled decode step; the "
                             "compile falls in each run's first step, so compare median steps)")
    parser.add_argument("--trl-compile", choices=["both", "on", "off"], default="both",
                        help="TRL with torch_compile=False (as shipped), True, or both")
    parser.add_argument("--long", action="store_true", help="prompts led by 64-600 characters of solved sums")
    parser.add_argument("--bf16", action="store_true", help="both tools in bf16 autocast over fp32 weights")
    parser.add_argument("--compare-sharing", action="store_true",
                        help="also run rlft with share_prompts: false (more variants in the alternation)")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON path (default bench/results/grpo-<size>[-long][-c<length>][-v<vocab>].json)")
    args = parser.parse_args()
    MAX_COMPLETION = args.max_completion
    quiet()
    if args.threads:
        torch.set_num_threads(args.threads)

    variants = {variant_name("rlft", compiled): ("rlft", None, compiled) for compiled in compile_choices(args.rlft_compile)}
    variants.update({variant_name("trl", compiled): ("trl", None, compiled) for compiled in compile_choices(args.trl_compile)})
    if args.compare_sharing:
        variants.update({variant_name("rlft", compiled, "separate"): ("rlft", False, compiled)
                         for compiled in compile_choices(args.rlft_compile)})
    prompts = [{"prompt": row["prompt"]} for row in split_rows()[0]]
    if args.long:  # the same sums behind long leads of solved ones
        prompts = [{"prompt": lead["prompt"].rsplit("; ", 1)[0] + "; " + row["prompt"]}
                   for row, lead in zip(prompts, long_rows(len(prompts), args.seed))]
    with tempfile.TemporaryDirectory(prefix="rlft-bench-") as tmp:
        tmp = Path(tmp)
        model_dir = make_model(tmp / "model", args.size, args.seed, args.vocab)
        train_file = tmp / "prompts.jsonl"
        write_jsonl(prompts, train_file)
        params = sum(p.numel() for p in LlamaForCausalLM.from_pretrained(model_dir).parameters())
        n = flop_params(model_dir)
        warm_up(model_dir, COMPLETIONS_PER_STEP)

        def run(name: str, out: Path, steps: int) -> dict:
            tool, share, compiled = variants[name]
            if tool == "trl":
                return run_trl(model_dir, prompts, out, steps, args, compiled)
            return run_rlft(model_dir, train_file, out, steps, args, share, compiled)

        for name in variants:  # warm-up runs, not reported: one-time costs (imports inside the tools, first generate)
            run(name, tmp / f"warm-{name}", 2)
        load_before = os.getloadavg()
        runs: dict[str, list[dict]] = {name: [] for name in variants}
        for index, order in enumerate(round_orders(list(variants), args.repeat)):
            for name in order:
                result = run(name, tmp / f"{name}-{index}", args.steps)
                runs[name].append(result)
                print(f"round {index + 1}/{args.repeat} {name}: wall {result['wall_s']:.2f} s, median step "
                      f"{result['median_step_s'] * 1e3:.1f} ms, generated tokens/step "
                      f"{median(result['generated_tokens_per_step']):.0f}", flush=True)
        load_after = os.getloadavg()
        # Peak memory in a run of its own per variant (the sampler thread would perturb the timed runs).
        memory = {name: peak_memory(run, name, tmp / f"mem-{name}", args.steps) for name in variants}
    middle = {name: median_run(variant_runs) for name, variant_runs in runs.items()}
    for result in middle.values():
        result["mfu"] = mfu(result["trained_tokens_per_step"] / result["median_step_s"], n, args.bf16)

    def pooled(name: str) -> float:  # the median of every step of every run of a variant
        return statistics.median(t for result in runs[name] for t in result["step_times_s"])

    rlft_side = {compiled: variant_name("rlft", compiled) for compiled in compile_choices(args.rlft_compile)}
    trl_side = {compiled: variant_name("trl", compiled) for compiled in compile_choices(args.trl_compile)}
    ratios = fair_ratios(runs, rlft_side, trl_side)
    for key in ("fair", "vs_shipped", "eager", "compiled"):
        if key in ratios:
            ratios[key]["pooled"] = pooled(ratios[key]["trl"]) / pooled(ratios[key]["rlft"])
    report = {
        "benchmark": "grpo",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "size": args.size,
        "params": params,
        "flop_params": n,
        "steps": args.steps,
        "num_generations": GROUP,
        "completions_per_step": COMPLETIONS_PER_STEP,
        "max_completion_length": MAX_COMPLETION,
        "vocab": args.vocab,
        "force_length": args.force_length,
        "variants": {name: {"tool": tool, "torch_compile": compiled, "share_prompts": share}
                     for name, (tool, share, compiled) in variants.items()},
        "device": DEVICE.type,
        "device_name": torch.cuda.get_device_name() if DEVICE.type == "cuda" else None,
        "bf16": args.bf16,
        "beta": BETA,
        "loss_type": LOSS_TYPE,
        "learning_rate": LR,
        "prompts": len(prompts),
        "repeat": args.repeat,
        "round_orders": round_orders(list(variants), args.repeat),
        "reported": "medians over the rounds; ratios TRL/rlft, the median of the round-by-round ratios (fair_ratios)",
        "threads": torch.get_num_threads(),
        "load_average_1m_before_after": [load_before[0], load_after[0]],
        "cpu_count": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "trl": trl.__version__,
                     "accelerate": accelerate.__version__, "datasets": datasets.__version__},
        "ratios": ratios,
        # the training call's wall (set-up, steps with the compile, saves; imports excluded): bench/grpo_wall.py times
        # whole processes
        "wall_ratios": fair_ratios(runs, rlft_side, trl_side, key="wall_s"),
        "median_over_rounds_s": {name: median(result["median_step_s"] for result in variant_runs)
                                 for name, variant_runs in runs.items()},
        "median_step_pooled_s": {name: pooled(name) for name in runs},
        "median_run": middle,
        "long_prompts": args.long,
        "peak_memory_mib": memory,
        "all_runs": runs,
    }
    if args.compare_sharing:
        report["sharing"] = {
            f"{variant_name('rlft', compiled, 'separate')} over {variant_name('rlft', compiled)} (all steps pooled)":
                round(pooled(variant_name("rlft", compiled, "separate")) / pooled(variant_name("rlft", compiled)), 3)
            for compiled in compile_choices(args.rlft_compile)}
    print_report(report)
    length = ("-long" if args.long else "") + (f"-c{MAX_COMPLETION}" if MAX_COMPLETION != 32 else "")
    vocab = f"-v{args.vocab}" if args.vocab else ""
    device = ("-cuda" if DEVICE.type == "cuda" else "") + ("-bf16" if args.bf16 else "")
    out = args.out or RESULTS / f"grpo-{args.size}{length}{vocab}{device}.json"
    write_report(out, report)


if __name__ == "__main__":
    main()
