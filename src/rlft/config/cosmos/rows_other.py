"""Rows of Cosmos-RL's `[validation]`, `[profiler]`, `[distillation]` and top-level keys."""

from __future__ import annotations

from typing import Any

from rlft.config.cosmos.rows import Row, View, refused_when, rows_to, to, unused
from rlft.config.cosmos.schema import SCHEMA

V = "validation"
OFF = "validation is off (validation.enable)"
# validation's sampling keys: rlft's `validation:` section has each under the same name
SAMPLING = ("temperature", "top_p", "top_k", "repetition_penalty", "n_generation", "max_response_length", "reward_function")
LAUNCHER = "a setting of Cosmos-RL's launcher (its controller and workers); rlft starts its processes itself"


def _on(convert):
    return lambda value, view: convert(value, view) if view.get(f"{V}.enable") else {}


def _validation_sets(value: Any, view: View) -> dict[str, Any]:
    """validation.dataset, one entry per split (Cosmos-RL joins them): rlft's validation.datasets for GRPO, test_datasets
    for SFT (whose evaluation is its loss on them)."""
    name = view.get(f"{V}.dataset.name")
    if not name:
        return {}
    split = view.get(f"{V}.dataset.split")
    entry = {"path": name, **{key: view.get(f"{V}.dataset.{key}") for key in ("subset", "revision")
                              if view.get(f"{V}.dataset.{key}")}}
    entry = {("name" if key == "subset" else key): item for key, item in entry.items()}
    splits = [split] if isinstance(split, str) else list(split or []) or [""]
    target = "validation.datasets" if view.method == "grpo" else "test_datasets"
    return {target: [{**entry, "split": s or "train"} for s in splits]}


def _enable(value: Any, view: View) -> dict[str, Any]:
    """On: evaluation on validation.dataset, else on the first train_policy.dataset.test_size rows of the training data
    (Cosmos-RL's default 0.1; rlft's val_set_size holds out the last rows)."""
    if not value:
        return {}
    out = {"validation.enable": True} if view.method == "grpo" else {}
    if not view.get(f"{V}.dataset.name"):
        test_size = view.get("train.train_policy.dataset.test_size")
        out["val_set_size"] = 0.1 if test_size is None else test_size
    return out


def _sampling(key: str) -> Row:
    """A validation sampling key: rlft's `validation:` key of the same name, read by GRPO with validation on."""
    target = f"{V}.{key}"

    def convert(value: Any, view: View) -> dict[str, Any]:
        if not view.get(f"{V}.enable") or view.method != "grpo" or value in (None, []):
            return {}
        return {target: value}  # top_k 1, Cosmos-RL's default, keeps the evaluation greedy at any temperature

    return Row(target, (target,), convert, carry=True, unused=lambda value, view: (
        OFF if not view.get(f"{V}.enable") else "SFT evaluates the loss on held-out rows" if view.method == "sft" else
        "what rlft's evaluation does"), note="GRPO with validation on")


VALIDATION_ROWS: list[Row] = [
    Row(f"{V}.enable", ("validation.enable", "val_set_size"), _enable,
        note="true: evaluation every validation.freq steps (and before the first step)"),
    rows_to(f"{V}.freq", ("eval_steps",), _on(lambda value, view: {"eval_steps": value}), carry=True),
    rows_to(f"{V}.batch_size", ("eval_batch_size",), _on(lambda value, view: {} if value is None else
                                                          {"eval_batch_size": value})),
    Row(f"{V}.dataset.name", ("validation.datasets", "test_datasets"), _on(_validation_sets), carry=True,
        note="one entry per split: validation.datasets (GRPO), test_datasets (SFT)"),
    Row(f"{V}.dataset.subset", ("validation.datasets", "test_datasets"), _on(_validation_sets)),
    Row(f"{V}.dataset.revision", ("validation.datasets", "test_datasets"), _on(_validation_sets)),
    Row(f"{V}.dataset.split", ("validation.datasets", "test_datasets"), _on(_validation_sets)),
    unused(f"{V}.dataset.test_size", "Cosmos-RL reads the test_size of train.train_policy.dataset only (with no "
                                     "validation.dataset.name)"),
    Row(f"{V}.val_before_train", convert=lambda value, view: {}, refuse=lambda value, view: (
        "rlft evaluates before the first step whenever it evaluates (the baseline in metrics.jsonl) and has no key to "
        "skip it: set val_before_train = true (what rlft does), or remove it") if value is False and view.get(
        f"{V}.enable") else None, unused=lambda value, view: OFF if not view.get(f"{V}.enable") else "what rlft does",
        note="true: what rlft does; false is refused (rlft evaluates before the first step, also where the key is left "
             "out)"),
] + [_sampling(key) for key in SAMPLING]

PROFILING_OFF = "a setting of the profiler, which is off (profiler.enable_profiler, profiler.enable_nsys)"
MODULES = ("torch.profiler records module hierarchies for TorchScript models only, and rlft trains eager models (so does "
           "Cosmos-RL): with_stack shows each nn.Module call as a range")


def _profiling(key: str) -> Row:
    """A `[profiler.sub_profiler_config]` key: rlft's key of the same name, where a profiler is on."""
    target = f"profiler.sub_profiler_config.{key}"
    on = ("profiler.enable_profiler", "profiler.enable_nsys")
    return Row(target, (target,), lambda value, view: {target: value} if any(view.get(k) for k in on) else {},
               unused=PROFILING_OFF, note="read where profiler.enable_profiler or enable_nsys is on")


PROFILER_ROWS: list[Row] = [to(f"profiler.{key}", f"profiler.{key}") for key in ("enable_profiler", "enable_nsys")] + [
    to("profiler.sub_profiler_config.do_profile", "profiler.sub_profiler_config.do_profile"),
    unused("profiler.sub_profiler_config.with_modules", MODULES)] + [
    _profiling(key) for key in SCHEMA["SubProfilerConfig"] if key not in ("do_profile", "with_modules")]

TOP_ROWS: list[Row] = [
    unused("custom", "options that a Cosmos-RL launch script reads: rlft runs no script"),
    unused("redis", LAUNCHER),
    unused("eth_ips", LAUNCHER),
    unused("mode", "rlft samples in the trainer's process, or with vLLM through `rlft vllm-serve FILE` and trl.use_vllm "
                   "= true: there is no placement of rollout workers to choose"),
    refused_when("distillation.enable", bool, "on-policy distillation from a teacher model is not built in rlft; nearest: "
                 "GRPO with rewards (train.train_policy), or SFT on the teacher's answers (`rlft generate` writes them)",
                 otherwise="distillation is off"),
]
for _key in SCHEMA["DistillationConfig"]:
    if _key not in ("enable", "parallelism"):
        TOP_ROWS.append(unused(f"distillation.{_key}", "a setting of distillation (distillation.enable)"))
for _key in SCHEMA["ParallelismConfig"]:
    TOP_ROWS.append(unused(f"distillation.parallelism.{_key}", "a setting of distillation (distillation.enable)"))
