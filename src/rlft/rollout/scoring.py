"""Scorers: a Rollout (+ its prompts) -> Scores. Reward functions, or EBFT's feature matching.

A scorer has `names` and `weights` (one per reward column), `needs_policy` (True when it runs a
network that shares weights with the module being trained, so it may only run where training
does, never in a background producer), `score(prompts, rollout, group, extra)` and `close()`.
"""

from __future__ import annotations

from typing import Protocol

import torch

from rlft.data.prompts import PromptRow
from rlft.losses.advantages import overlong_penalty
from rlft.rollout.envs.multi_turn import COMPLETION_MESSAGES
from rlft.rollout.types import RewardFailure, Rollout, Scores


class Scorer(Protocol):
    names: list[str]
    weights: list[float]
    needs_policy: bool

    def score(self, prompts: list[PromptRow], rollout: Rollout, group: int,
              extra: dict[str, list] | None = None) -> Scores: ...

    def close(self) -> None: ...


def column_stats(column: torch.Tensor) -> tuple[float, float]:
    """Mean and std (Bessel) of one reward column over its scorable (non-NaN) rows: TRL's nanmean / nanstd, so
    NaN when nothing (mean) or fewer than two rows (std) could be scored. The one place these are computed."""
    valid = column[~torch.isnan(column)]
    mean = float(valid.mean()) if valid.numel() else float("nan")
    std = float(valid.std(unbiased=True)) if valid.numel() > 1 else float("nan")
    return mean, std


def weighted_total(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """NaN-skipping weighted sum per row; NaN where no function could score the row."""
    total = (torch.nan_to_num(values, 0.0) * weights).sum(-1)
    total[torch.isnan(values).all(-1)] = float("nan")
    return total


def make_scores(values: torch.Tensor, names: list[str], weights: list[float], metrics: dict[str, float] | None = None,
                failures: list[RewardFailure] | None = None) -> Scores:
    weight_tensor = torch.tensor(weights, dtype=torch.float32)
    return Scores(values, list(names), weight_tensor, weighted_total(values, weight_tensor), dict(metrics or {}), list(failures or []))


class FunctionScorer:
    """`trl.reward_funcs` through a RewardRunner, called as TRL calls them (decoded text, dataset columns)."""

    needs_policy = False

    def __init__(self, runner, tokenizer):
        self.runner = runner
        self.tokenizer = tokenizer
        self.names = [f.name for f in runner.functions]
        self.weights = [f.weight for f in runner.functions]

    def score(self, prompts: list[PromptRow], rollout: Rollout, group: int, extra: dict[str, list] | None = None) -> Scores:
        """A chat prompt's completion is a message list: the answer as one assistant message, or an episode's messages
        (assistant turns with their tool calls, tool results) where the environment gives them (`completion_messages`);
        a string prompt's is the decoded text of the tokens the model sampled (an environment's tokens left out)."""
        sampled = [ids if all(mask) else [t for t, own in zip(ids, mask) if own]
                   for ids, mask in zip(rollout.completion_ids, rollout.env_mask)]
        texts = self.tokenizer.batch_decode(sampled, skip_special_tokens=True)
        expanded = [p for p in prompts for _ in range(group)]
        extra = dict(extra or {})
        episodes = extra.pop(COMPLETION_MESSAGES, None) or [None] * len(texts)
        completions = [(episode or [{"role": "assistant", "content": t}]) if isinstance(p["prompt"], list) else t
                       for t, p, episode in zip(texts, expanded, episodes)]
        columns: dict[str, list] = {name: [p["columns"].get(name) for p in expanded] for name in (expanded[0]["columns"] if expanded else [])}
        columns.update(extra)
        result = self.runner.score([p["prompt"] for p in expanded], completions, rollout.completion_ids, columns)
        return make_scores(result.values, self.names, self.weights, result.metrics, result.failures)

    def close(self) -> None:
        self.runner.close()


def add_overlong_penalty(scores: Scores, rollout: Rollout, max_completion_length: int, buffer_length: int, factor: float) -> Scores:
    """DAPO's soft overlong penalty as one more reward column, `overlong`, of weight 1. A row no reward function could
    score stays unscorable (NaN): the penalty alone would make it a scored row of its group."""
    lengths = torch.tensor([len(c) for c in rollout.completion_ids], dtype=torch.float32)
    penalty = overlong_penalty(lengths, max_completion_length, buffer_length, factor)
    penalty = penalty.masked_fill(torch.isnan(scores.values).all(-1), float("nan")) if scores.values.numel() else penalty
    values = torch.cat([scores.values, penalty[:, None]], 1)
    weights = torch.cat([scores.weights, torch.ones(1)])
    return Scores(values, scores.names + ["overlong"], weights, weighted_total(values, weights), scores.metrics, scores.failures)
