"""The checkpoint a run ends with when `load_best_model_at_end` is on (rlft.config.best_model): which checkpoint is
best, kept through `save_total_limit`'s rotation and in the trainer state, and the final model written from it.

Only a checkpoint whose own step was evaluated can be best: while the key is on, a save at a step that is not an
eval step evaluates first. transformers instead records the best *eval* step and loads it only if that step was also
saved, so with evaluations between the saves it can end on a checkpoint that is not the best of those saved.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

from rlft.config.best_model import best_metric, loads_best_model
from rlft.errors import ConfigError
from rlft.train.checkpoint import weights_problem
from rlft.train.metrics import read_metrics


def metric_value(results: dict[str, float], key: str, reader: str) -> float:
    """`results[key]`, or a ConfigError naming what the evaluation reports (it runs before the first step)."""
    if key not in results:
        raise ConfigError(f"{reader} watches {key}, which this run's evaluation does not report (it reports "
                          f"{', '.join(sorted(results))}): set metric_for_best_model to one of those")
    return results[key]


def check_logged_metric(cfg, log: Path) -> None:
    """A resumed run has no evaluation before its first step, where a fresh run learns whether its evaluation reports
    the metric that load_best_model_at_end, save_strategy: best or early_stopping_patience watch: the run's log tells
    (its evaluations so far), so a misspelt metric_for_best_model stops the run before it trains steps it cannot keep."""
    readers = [name for name, on in (("load_best_model_at_end", loads_best_model(cfg)), ("save_strategy: best",
               cfg.save_strategy == "best"), ("early_stopping_patience", bool(cfg.early_stopping_patience))) if on]
    evaluated = {key for line in read_metrics(log) for key in line if key.startswith("eval/")}
    if readers and evaluated:
        metric_value({key: 0.0 for key in evaluated}, best_metric(cfg)[0], readers[0])


def better(value: float, best: float | None, higher: bool) -> bool:
    """Strictly better than `best` (None: nothing yet); a tie keeps the earlier one, as in transformers, and NaN is
    never better."""
    if math.isnan(value):
        return False
    return best is None or (value > best if higher else value < best)


class BestCheckpoint:
    """The best checkpoint of load_best_model_at_end, and the evaluations after which `save_strategy: best` saves."""

    def __init__(self, cfg, state: dict[str, Any] | None = None):
        self.enabled = loads_best_model(cfg)
        self.save_on_best = cfg.save_strategy == "best"
        self.key, self.higher = best_metric(cfg)
        state = state or {}
        if (state.get("key", self.key), state.get("higher", self.higher)) != (self.key, self.higher):
            state = {}  # resumed with another metric_for_best_model or greater_is_better: its scores do not compare
        self.step, self.value = state.get("step"), state.get("value")
        self.eval_best = state.get("eval_best")  # the best evaluation so far (save_strategy: best)
        self.evaluated: tuple[int, float] | None = None  # the latest evaluation: its step and metric
        self.improved_at: int | None = None  # the step of the latest evaluation that beat every earlier one

    def note(self, step: int, results: dict[str, float]) -> None:
        """After every evaluation."""
        if not results or not (self.enabled or self.save_on_best):
            return
        value = metric_value(results, self.key, "load_best_model_at_end" if self.enabled else "save_strategy: best")
        self.evaluated = (step, value)
        if self.save_on_best and step > 0 and better(value, self.eval_best, self.higher):  # not the untrained baseline
            self.eval_best, self.improved_at = value, step

    def save_now(self, step: int) -> bool:
        """`save_strategy: best`: whether this step's evaluation was the best so far."""
        return self.save_on_best and self.improved_at == step

    def needs_eval(self, step: int) -> bool:
        """Before a save: whether this step still lacks its evaluation."""
        return self.enabled and (self.evaluated is None or self.evaluated[0] != step)

    def saving(self, step: int) -> None:
        """Before checkpoint-`step` is written (the trainer state in it names the best)."""
        if self.enabled and self.evaluated is not None and self.evaluated[0] == step and \
                better(self.evaluated[1], self.value, self.higher):
            self.step, self.value = step, self.evaluated[1]

    def folder(self, output_dir: Path) -> Path | None:
        """The best checkpoint, which rotation keeps."""
        return output_dir / f"checkpoint-{self.step}" if self.enabled and self.step is not None else None

    def state_dict(self) -> dict[str, Any]:
        state = {"step": self.step, "value": self.value} if self.enabled and self.step is not None else {}
        state = {**state, "eval_best": self.eval_best} if self.save_on_best else state
        return {**state, "key": self.key, "higher": self.higher} if state else {}


def final_checkpoint(state, output_dir: Path, warn) -> Path | None:
    """The checkpoint whose weights become the final model, when it is not the last step's; None otherwise. A best
    checkpoint that is gone or incomplete (removed by hand) is named in a warning and the last step's weights stay."""
    best = state.best
    if best.get("step") is None or best["step"] == state.global_step:  # (save_strategy: best keeps only eval_best)
        return None
    folder = output_dir / f"checkpoint-{best['step']}"
    problem = weights_problem(folder) if folder.is_dir() else "it is gone"  # save_only_model's checkpoints do
    if problem:
        warn(f"load_best_model_at_end: the best checkpoint {folder} ({best['key']} {best['value']:.4f}) cannot be read "
             f"({problem}): the final model is the last step's weights")
        return None
    return folder


def copy_model_files(source: Path, output_dir: Path) -> None:
    """The final model as the checkpoint saved it: its model/ folder's files (weights or adapter, config, tokenizer)."""
    for file in source.iterdir():
        if file.is_file():
            shutil.copy2(file, output_dir / file.name)
