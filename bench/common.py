"""What every benchmark shares: the tiny model, the training settings both tools get, quiet logging."""

from __future__ import annotations

import json
import gc
import os
import random
import socket
import statistics
import subprocess
import threading
import warnings
from pathlib import Path
from typing import Self

import torch
from transformers import AutoConfig, LlamaForCausalLM

from rlft.models.tiny import write_tiny_model

RESULTS = Path(__file__).resolve().parent / "results"


def quiet() -> None:
    """No warnings or progress bars in benchmark output."""
    import datasets
    import transformers

    if not torch.cuda.is_available():  # DeepSpeed, imported by transformers when installed, would warn
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()


class PeakMemory:
    """Peak resident memory of this process above its level at entry, in MiB, sampled every millisecond.

    Benchmarks run both tools in one process, so `ru_maxrss` (a lifetime high-water mark) cannot tell
    them apart; a sampler started at the beginning of a run can. Torch's CPU allocator returns large
    blocks to the OS when freed, so resident memory follows live tensors. A sampler costs a little CPU:
    the benches measure memory in a separate run of each tool, after the timed ones.
    """

    PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / 2**20

    def __init__(self) -> None:
        self.start = self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _resident(self) -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.PAGE_MIB

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, self._resident())

    def __enter__(self) -> "PeakMemory":
        self.start = self.peak = self._resident()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._resident())

    @property
    def above_start_mib(self) -> float:
        return self.peak - self.start


def fresh_memory_peak() -> None:
    """Collect garbage (an earlier run's model in reference cycles) and, on a GPU, start a new peak of allocated memory."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def peak_memory(run, *args, **kwargs) -> float:
    """MiB of memory a call (one tool's training run) adds at its peak over what the process held: resident memory on a
    CPU, allocated GPU memory (torch.cuda.max_memory_allocated) on a GPU.

    Garbage is collected first: an earlier run can leave its model in reference cycles (TRL's trainer does), and a
    run that frees it on the way (transformers' `train()` calls `gc.collect()` as it starts) would otherwise
    report its peak above a start that still held the other run's model."""
    fresh_memory_peak()
    if torch.cuda.is_available():
        start = torch.cuda.memory_allocated()
        run(*args, **kwargs)
        return round((torch.cuda.max_memory_allocated() - start) / 2**20, 1)
    with PeakMemory() as sampler:
        run(*args, **kwargs)
    return round(sampler.above_start_mib, 1)


def reset_between_runs() -> None:
    """Start a tool's run from the process state a fresh process has, so neither tool inherits the other's.

    accelerate keeps one `AcceleratorState` per process, and the first `Accelerator` made decides it for the later
    ones. transformers' TrainingArguments clears it when it sets up its device, so a TRL run starts clean; rlft's
    `Accelerator(dynamo_backend="no")` does not, so after a TRL run with `torch_compile=True` (transformers hands
    accelerate a dynamo plugin) accelerate's `prepare` would compile the model of every later rlft run, an eager one
    included. `AcceleratorState._reset_state(True)` (accelerate's own tests reset it so between cases) and
    `GradientState._reset_state()` clear it. dynamo keeps compiled graphs and recompile counts on shared code objects
    (`LlamaModel.forward`): `torch._dynamo.reset()` drops them, so each compiled run compiles as a new process would
    (inductor's on-disk cache of compiled graphs stays, as it does between processes)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    torch._dynamo.reset()
    gc.collect()


class OptimizerSteps:
    """When each optimizer step of a run ended, by torch's global optimizer post-step hook: one instrument for both
    tools. The interval between two consecutive steps' ends is everything a step costs in its tool's loop: fetching and
    collating the batch, forward, backward, clipping, the update, the scheduler, and the tool's per-step logging and
    callbacks. Each tool's own step timer leaves out different parts (rlft's `step_time_s` its logging after the
    update, TRL's `on_step_begin` -> `on_step_end` the batch fetch before `on_step_begin`), so the comparisons use
    the intervals: n steps give n - 1 of them. With `rlft.train.metrics.clock`, a GPU's queued work is waited for."""

    def __init__(self, clock):
        self.clock = clock
        self.ends: list[float] = []
        self.handle = None

    def __enter__(self) -> Self:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.ends = []
        self.handle = register_optimizer_step_post_hook(lambda *_: self.ends.append(self.clock()))
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()

    @property
    def intervals(self) -> list[float]:
        return [later - earlier for earlier, later in zip(self.ends, self.ends[1:])]


def variant_name(tool: str, compiled: bool, setting: str = "") -> str:
    """A run's name in the tables and JSON: tool, setting, eager or compiled ("trl-compiled", "rlft-copy-eager")."""
    return "-".join(part for part in (tool, setting, "compiled" if compiled else "eager") if part)


def compile_choices(flag: str) -> list[bool]:
    """--rlft-compile / --trl-compile: both (the default: measure each and report the faster), on, off."""
    return {"both": [False, True], "on": [True], "off": [False]}[flag]


def round_orders(names: list[str], rounds: int) -> list[list[str]]:
    """The run order of each round: `names` as given, reversed every other round, so no variant always runs first
    (right after the warm-ups, or right after the same neighbour)."""
    return [list(names) if index % 2 == 0 else list(reversed(names)) for index in range(rounds)]


def fair_ratios(runs: dict[str, list[dict]], rlft: dict[bool, str], trl: dict[bool, str],
                key: str = "median_step_s") -> dict:
    """TRL/rlft ratios of `key` (above 1: rlft is faster) from runs made in alternating rounds.

    `runs` maps a variant's name to its runs, one per round; `rlft` and `trl` map compiled (True/False) to the
    variant's name, for the settings measured. Each variant's median over the rounds decides its side's best setting.
    A ratio is given two ways: `median_of_rounds`, the median of the round-by-round ratios (each TRL run against the
    rlft run of its round: a machine whose speed drifts moves both), the headline; and `of_medians`, the ratio of the
    medians over the rounds. The ratios:
      fair          rlft at its best against TRL at its best (the faster of eager and torch_compile=True)
      vs_shipped    rlft at its best against TRL as shipped (eager, its default)
      eager         rlft's CPU default (eager) against TRL's default (eager)
      compiled      both compiled"""
    medians = {name: median(run[key] for run in runs[name]) for name in {*rlft.values(), *trl.values()}}
    best_rlft = min(rlft, key=lambda compiled: medians[rlft[compiled]])
    best_trl = min(trl, key=lambda compiled: medians[trl[compiled]])

    def ratio(ours: str, theirs: str) -> dict:
        by_round = [t[key] / r[key] for r, t in zip(runs[ours], runs[theirs])]
        return {"rlft": ours, "trl": theirs, "median_of_rounds": median(by_round),
                "of_medians": medians[theirs] / medians[ours], "by_round": by_round}

    result = {"key": key, "rounds": len(runs[rlft[best_rlft]]), "median_over_rounds_s": medians,
              "rlft_best": rlft[best_rlft], "trl_best": trl[best_trl],
              "fair": ratio(rlft[best_rlft], trl[best_trl])}
    if False in trl:
        result["vs_shipped"] = ratio(rlft[best_rlft], trl[False])
        if False in rlft:
            result["eager"] = ratio(rlft[False], trl[False])
    if True in rlft and True in trl:
        result["compiled"] = ratio(rlft[True], trl[True])
    return result


def describe_ratios(ratios: dict, label: str = "") -> str:
    """One line per ratio of `fair_ratios`, for a bench's printed report."""
    names = {"fair": "at its best vs TRL at its best", "vs_shipped": "at its best vs TRL as shipped (eager)",
             "eager": "eager vs TRL eager (both defaults)", "compiled": "compiled vs TRL compiled"}
    lines = []
    for name, words in names.items():
        if name in ratios:
            r = ratios[name]
            lines.append(f"{label}TRL/rlft, rlft {words}: {r['median_of_rounds']:.2f}x median of {ratios['rounds']} "
                         f"rounds ({r['of_medians']:.2f}x of the medians; {r['rlft']} vs {r['trl']}; by round "
                         + ", ".join(f"{x:.2f}" for x in r["by_round"]) + ")")
    return "\n".join(lines)


def device_name() -> str:
    """The GPU's name, or the CPU's."""
    import platform

    return torch.cuda.get_device_name() if torch.cuda.is_available() else (platform.processor() or platform.machine())


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (a rendezvous or a rollout server)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def worktree(revision: str, folder: Path) -> Path:
    """The repository at `revision` (a commit, or a name such as HEAD~1 resolved to one now), checked out once per
    commit in a git worktree under `folder`: its `src/` runs with this tree's Python and packages, for a comparison
    in turns on the same machine at the same time."""
    repository = str(Path(__file__).resolve().parents[1])
    commit = subprocess.run(["git", "-C", repository, "rev-parse", "--short", f"{revision}^{{commit}}"], check=True,
                            capture_output=True, text=True).stdout.strip()
    tree = folder / f"rlft-{commit}"
    if not tree.exists():
        subprocess.run(["git", "-C", repository, "worktree", "add", "--detach", str(tree), commit], check=True,
                       stdout=subprocess.DEVNULL)
    return tree


def median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else 0.0


def flop_params(model_dir: Path) -> int:
    """N of rlft's MFU (rlft.train.metrics.flop_parameters): the parameters in a product for every token."""
    from rlft.train.metrics import flop_parameters

    return flop_parameters(LlamaForCausalLM.from_pretrained(model_dir))[0]


def mfu(tokens_per_s: float, n: int, bf16: bool) -> float:
    """Model FLOPs utilisation as `rlft train` logs it (rlft.train.metrics): tokens/s x 6N (every parameter trained)
    over the device's peak (rlft.train.peak: a named GPU's data-sheet figure, else this machine's measured matmul
    rate). Both tools get the same formula and the same token count, so the ratio of their MFUs is the ratio of their
    tokens/s."""
    from rlft.train.metrics import flops_per_token
    from rlft.train.peak import device_peak

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return tokens_per_s * flops_per_token(n, n) / device_peak(device, "bf16" if bf16 else "fp32").flops


def plain_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss: torch.Tensor) -> float:
    """The update of a hand-written training loop (the benches' plain PyTorch loop): backward, clip at 1.0, step,
    zero_grad. Returns the loss."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss)


def make_model(folder: Path, size: str, seed: int, vocab: int | None = None) -> Path:
    """Config + byte tokenizer from rlft.models.tiny, seeded random weights, saved once for every run.

    `vocab` widens the embeddings and the output layer to a real tokenizer's size (e.g. 32768, Mistral's): the text
    still uses the byte tokenizer's ids, but every position's logits span the whole vocabulary, as in a real model."""
    write_tiny_model(folder, size)
    config = AutoConfig.from_pretrained(folder)
    if vocab:
        config.vocab_size = vocab
        config.save_pretrained(folder)
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    return folder


def rlft_keys(model_dir: Path, out_dir: Path, steps: int, seed: int, learning_rate: float, bf16: bool = False) -> dict:
    """rlft settings every benchmark shares: fp32 (or bf16 autocast over fp32 weights), constant lr, AdamW, clip 1.0,
    one metrics line per step."""
    return {
        "base_model": str(model_dir),
        "random_init": False,
        "gradient_accumulation_steps": 1,
        "max_steps": steps,
        "learning_rate": learning_rate,
        "lr_scheduler": "constant",
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "optimizer": "adamw_torch_fused",  # the default of both tools (and Axolotl's)
        "max_grad_norm": 1.0,
        "bf16": bf16,
        "logging_steps": 1,  # per-step times and losses
        "seed": seed,
        "output_dir": str(out_dir),
    }


def trl_keys(steps: int, seed: int, bf16: bool = False) -> dict:
    """The same settings for TRL, plus what TRL turns on by default and rlft does not (bf16, checkpointing)."""
    return {
        "max_steps": steps,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "optim": "adamw_torch_fused",  # TRL's default, and rlft's
        "max_grad_norm": 1.0,
        "bf16": bf16,  # TRL defaults to bf16=True
        "fp16": False,
        "gradient_checkpointing": False,  # TRL defaults to True
        "use_cpu": not torch.cuda.is_available(),
        "report_to": "none",
        "save_strategy": "no",
        "eval_strategy": "no",
        "disable_tqdm": True,
        "logging_steps": steps,
        "dataloader_num_workers": 0,
        "seed": seed,
    }


def write_report(out: Path, report: dict) -> None:
    """The run's JSON report at `out` (its folder made), and where it went."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


def print_table(names: list[str], rows: list, label_width: int, width: int = 15) -> None:
    """One column per run name, one line per (title, value(name), format) row."""
    print(f"{'':{label_width}s}" + "".join(f"{n:>{width}s}" for n in names))
    for title, value, fmt in rows:
        print(f"{title:{label_width}s}" + "".join(f"{fmt.format(value(n)):>{width}s}" for n in names))


def long_rows(count: int, seed: int) -> list[dict]:
    """Rows of very different lengths: a prompt of 64-600 characters of solved sums ("12+34=46; ...") before the asked
    one, whose answer is the completion (the only loss tokens). Random batches of these are mostly padding."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        target, parts = rng.randint(64, 600), []
        while sum(len(part) for part in parts) < target:
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            parts.append(f"{a}+{b}={a + b}; ")
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        rows.append({"prompt": "".join(parts) + f"{a}+{b}=", "completion": str(a + b)})
    return rows
