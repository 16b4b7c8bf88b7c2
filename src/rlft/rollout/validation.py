"""The numbers of an online-RL evaluation with `validation.enable`: pass@k, and the metrics of the completions a
validation set's prompts got (n per prompt), pooled over every set and, with several sets, per set."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from rlft.config.settings.validation import ValidationSettings
from rlft.rollout.types import Rollout, SamplingParams, Scores


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples of which c pass (Chen et al. 2021, https://arxiv.org/abs/2107.03374,
    eq. 1): 1 - C(n-c, k) / C(n, k), the chance that k samples drawn without replacement from the n hold at least one
    that passes. Exact integer binomials, one division: k = 1 gives c / n, k = n gives 1 when any passed, else 0."""
    if n < 1:
        raise ValueError(f"pass@k needs at least one sample, got n = {n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n: {n} samples cannot estimate it")
    if not 0 <= c <= n:
        raise ValueError(f"{c} passing samples out of {n} is not a count of them")
    if n - c < k:  # every draw of k holds a passing sample
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def validation_sampling(sampling: SamplingParams, settings: ValidationSettings) -> SamplingParams:
    """The training's sampling parameters (stop ids and strings, min_p) with the validation's temperature, top-p,
    top-k, repetition penalty and completion length."""
    return dataclasses.replace(sampling, temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k,
                               repetition_penalty=settings.repetition_penalty, max_new_tokens=settings.max_new_tokens)


@dataclass
class SetTally:
    """What one validation set's completions scored, prompt-major (a prompt's n completions one after another)."""

    totals: list[float] = field(default_factory=list)  # the weighted total per completion, NaN where unscorable
    columns: dict[str, list[float]] = field(default_factory=dict)  # per reward function
    lengths: list[int] = field(default_factory=list)  # completion tokens, the stop token included
    truncated: list[bool] = field(default_factory=list)

    def add(self, rollout: Rollout, scores: Scores) -> None:
        self.totals += scores.total.tolist()
        for index, name in enumerate(scores.names):
            self.columns.setdefault(name, []).extend(scores.values[:, index].tolist())
        self.lengths += [len(ids) for ids in rollout.completion_ids]
        self.truncated += list(rollout.truncated)

    @staticmethod
    def pooled(tallies: list[SetTally]) -> SetTally:
        pooled = SetTally()
        for tally in tallies:
            pooled.totals += tally.totals
            for name, values in tally.columns.items():
                pooled.columns.setdefault(name, []).extend(values)
            pooled.lengths += tally.lengths
            pooled.truncated += tally.truncated
        return pooled

    def metrics(self, n: int, threshold: float) -> dict[str, float]:
        """Cosmos-RL's reward statistics (val/reward_avg, _std, _max, _min, rollout_count) under rlft's names, each
        reward function's mean, pass@1 and pass@n (a completion passes when its total is at least `threshold`; an
        unscorable one fails), and the completions' lengths. An unscorable reward counts as 0, as in training."""
        totals = torch.tensor(self.totals, dtype=torch.float64)
        scored = torch.nan_to_num(totals, 0.0)
        passed = (totals >= threshold).view(-1, n).sum(-1).tolist()  # NaN >= threshold is false
        metrics = {"reward": float(scored.mean()), "reward_std": float(scored.std(unbiased=False)),
                   "reward_min": float(scored.min()), "reward_max": float(scored.max()), "rollout_count": float(len(totals))}
        for name, values in self.columns.items():
            metrics[f"rewards/{name}/mean"] = float(torch.nan_to_num(torch.tensor(values, dtype=torch.float64), 0.0).mean())
        for k in sorted({1, n}):
            metrics[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in passed) / len(passed)
        metrics["completions/mean_length"] = sum(self.lengths) / len(self.lengths)
        metrics["completions/clipped_ratio"] = sum(self.truncated) / len(self.truncated)
        return metrics


def validation_metrics(tallies: dict[str, SetTally], n: int, threshold: float) -> dict[str, float]:
    """`eval/<metric>` over every set's completions together (each prompt weighs the same) and, with more than one
    set, `eval/<set>/<metric>` per set; rounded to 6 places as the other eval metrics."""
    found = {name: tally for name, tally in tallies.items() if tally.totals}
    if not found:
        return {}
    out = {f"eval/{key}": value for key, value in SetTally.pooled(list(found.values())).metrics(n, threshold).items()}
    if len(found) > 1:
        for name, tally in found.items():
            out.update({f"eval/{name}/{key}": value for key, value in tally.metrics(n, threshold).items()})
    return {key: round(value, 6) for key, value in out.items()}
