"""Rows of Cosmos-RL's `[validation]`, `[profiler]`, `[distillation]` and top-level keys."""

from __future__ import annotations

from typing import Any

from rlft.config.cosmos.rows import Row, View, refused_when, rows_to, to, unused
from rlft.config.cosmos.schema import SCHEMA

V = "validation"
OFF = "validation is off (validation.enable)"
# validation's sampling keys at the values that are what rlft's evaluation does (greedy, one answer, the training
# rewards and completion length)
SAME_AS_RLFT = {"temperature": 0.0, "top_p": None, "top_k": 1, "repetition_penalty": 1.0, "n_generation": 1,
                "max_response_length": None, "reward_function": []}
LAUNCHER = "a setting of Cosmos-RL's launcher (its controller and workers); rlft starts its processes itself"


def _on(convert):
    return lambda value, view: convert(value, view) if view.get(f"{V}.enable") else {}


def _splits(view: View) -> list[str]:
    split = view.get(f"{V}.dataset.split")
    return ([split] if isinstance(split, str) else list(split or [])) or [""]


def _sliced(split: str, size: Any) -> str:
    """`test_size` rows of a split: rlft reads them as a slice (the first rows, where Cosmos-RL draws them)."""
    split = split or "train"
    if size is None:
        return split
    return f"{split}[:{round(size * 100)}%]" if isinstance(size, float) else f"{split}[:{size}]"


def _test_datasets(value: Any, view: View) -> dict[str, Any]:
    """One test dataset per split of validation.dataset (its name, split and test_size rows)."""
    name = view.get(f"{V}.dataset.name")
    if not name:
        return {}
    size = view.get(f"{V}.dataset.test_size")
    return {"test_datasets": [{"path": name, "split": _sliced(split, size)} for split in _splits(view)]}


def _no_data(value: Any, view: View) -> str | None:
    if value and not view.get(f"{V}.dataset.name") and view.get("train.train_policy.dataset.test_size") is None:
        return ("validation without validation.dataset.name or train.train_policy.dataset.test_size has no rows to "
                "evaluate on: name a dataset, or hold rows out with test_size")
    return None


def _sampling(key: str):
    """A validation sampling key: rlft's evaluation is greedy, one answer per prompt, scored by the training rewards."""
    same = SAME_AS_RLFT[key]

    def refuse(value: Any, view: View) -> str | None:
        if not view.get(f"{V}.enable") or value == same or (key == "reward_function" and not value):
            return None
        return (f"validation.{key} = {value!r}: validation with its own sampling settings has no rlft key yet; rlft's "
                "evaluation samples greedily one answer per prompt, scored by the training rewards (leave the key out)")

    return Row(f"{V}.{key}", refuse=refuse, unused=lambda value, view: OFF if not view.get(f"{V}.enable") else
               "what rlft's evaluation does")


VALIDATION_ROWS: list[Row] = [
    Row(f"{V}.enable", ("test_datasets",), lambda value, view: {}, refuse=_no_data,
        note="true: evaluation on test_datasets every validation.freq steps"),
    rows_to(f"{V}.freq", ("eval_steps",), _on(lambda value, view: {"eval_steps": value}), carry=True),
    rows_to(f"{V}.batch_size", ("eval_batch_size",), _on(lambda value, view: {} if value is None else
                                                          {"eval_batch_size": value})),
    Row(f"{V}.dataset.name", ("test_datasets[*].path",), _on(_test_datasets), carry=True),
    rows_to(f"{V}.dataset.subset", ("test_datasets[*].name",), _on(lambda value, view: {"test_datasets[*].name": value}
                                                                    if value else {})),
    rows_to(f"{V}.dataset.revision", ("test_datasets[*].revision",),
            _on(lambda value, view: {"test_datasets[*].revision": value} if value else {})),
    Row(f"{V}.dataset.split", ("test_datasets[*].split",), _on(_test_datasets)),
    Row(f"{V}.dataset.test_size", ("test_datasets[*].split",), _on(_test_datasets),
        note="the first rows of the split, as a slice (Cosmos-RL draws them)"),
    refused_when(f"{V}.val_before_train", bool, "an evaluation before the first step has no rlft key yet: rlft evaluates "
                 "every validation.freq steps and at the end", otherwise="no evaluation before training"),
] + [_sampling(key) for key in SAME_AS_RLFT]

PROFILER_ROWS: list[Row] = [to(f"profiler.{key}", f"profiler.{key}") for key in ("enable_profiler", "enable_nsys")] + [
    to(f"profiler.sub_profiler_config.{key}", f"profiler.sub_profiler_config.{key}")
    for key in SCHEMA["SubProfilerConfig"]]

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
