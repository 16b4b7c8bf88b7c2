"""The rollout producer: prompts -> engine -> scorer -> filters -> advantages -> ScoredBatch.

It owns its prompt cursor, the engine, the scorer and the filters, and never touches the module being
trained: it samples from an engine that holds its own weights (updated by the trainer through
`engine.load_weights`). Synchronous: `produce()` returns the next generation batch when asked.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable, Protocol

import torch

from rlft.errors import RolloutError
from rlft.losses.advantages import group_advantages, zero_variance_groups
from rlft.rollout.engine import RolloutEngine
from rlft.rollout.scoring import Scorer, add_overlong_penalty, column_stats
from rlft.rollout.types import Rollout, SamplingParams, ScoredBatch, Scores

ROLLOUT_KEYS = ("prompt_ids", "completion_ids", "logprobs")


class PromptSource(Protocol):
    """A seeded cursor over prompt batches (`rlft.data.batches.PlanCursor`; its owner checkpoints it)."""

    def next(self) -> dict[str, Any]: ...


class RolloutContext:
    """What a user `rollout_func(prompts, trainer)` receives as `trainer` (the parts of TRL's trainer it reads)."""

    def __init__(self, engine: RolloutEngine, tokenizer, settings, sampling: SamplingParams):
        self.model = getattr(engine, "model", None)  # the engine's own weights, not the module being trained
        self.processing_class = tokenizer
        self.args = settings
        self._engine, self._sampling = engine, sampling

    def generate(self, prompt_ids: list[list[int]], num_samples: int = 1) -> Rollout:
        """Sample with the run's sampling settings (for rollout functions that drive their own turns)."""
        return self._engine.generate(prompt_ids, self._sampling, num_samples)


class RolloutProducer:
    def __init__(self, engine: RolloutEngine, scorer: Scorer, prompts: PromptSource, settings, tokenizer,
                 sampling: SamplingParams, rollout_func: Callable | None = None,
                 sampling_for: Callable[[list[dict[str, Any]], SamplingParams], SamplingParams] | None = None):
        """`settings` is `rlft.config.rl.RLSettings`; `sampling_for(prompts, sampling)` may adapt the sampling
        parameters to a prompt batch (EBFT's adaptive_max_tokens)."""
        self.engine, self.scorer, self.prompts, self.settings = engine, scorer, prompts, settings
        self.tokenizer, self.sampling, self.rollout_func = tokenizer, sampling, rollout_func
        self.sampling_for = sampling_for or (lambda prompts, sampling: sampling)
        self.group = settings.num_generations
        self.generations = 0  # generation batches produced so far

    # ------------------------------------------------------------------ the batch
    def produce(self) -> ScoredBatch:
        """One generation batch: prompts_per_step x steps_per_generation prompts, G completions each."""
        s = self.settings
        needed = s.prompts_per_step * s.steps_per_generation
        started = time.perf_counter()
        prompts = [p for _ in range(s.steps_per_generation) for p in self.prompts.next()["prompts"]]
        rollout, scores, timings = self._sample_and_score(prompts)
        dropped, metrics = {}, {}
        if s.filter_reward_metric:  # DAPO dynamic sampling: keep groups whose filter reward varies, draw more (bounded)
            prompts, rollout, scores, dropped, retries = self._dynamic_sampling(prompts, rollout, scores, needed)
            metrics["dynamic_sampling/retries"] = float(retries)
            metrics["dynamic_sampling/dropped_groups"] = float(sum(dropped.values()))
        result = group_advantages(scores.values, scores.weights, self.group, scale=s.scale_rewards,
                                  aggregation=s.multi_objective_aggregation, estimator=s.advantage_estimator)
        self.generations += 1
        skip = s.skip_zero_advantage_batches and bool((result.advantages == 0).all())
        metrics.update(timings)
        metrics.update(rollout_metrics(scores, rollout, self.group, float(result.frac_zero_std), timings["time/generate"]))
        metrics["time/rollout_total"] = round(time.perf_counter() - started, 4)
        return ScoredBatch(prompts, rollout, scores, result.advantages, self.group, skip=skip, dropped=dropped, metrics=metrics)

    def evaluate(self, prompts: list[dict[str, Any]], params: SamplingParams) -> tuple[Rollout, Scores]:
        """One completion per prompt with `params` (greedy for eval), scored."""
        rollout = self.engine.generate([p["prompt_ids"] for p in prompts], params, 1)
        return rollout, self.scorer.score(prompts, rollout, 1)

    # ------------------------------------------------------------------ stages
    def _sample_and_score(self, prompts: list[dict[str, Any]]) -> tuple[Rollout, Scores, dict[str, float]]:
        started = time.perf_counter()
        if self.rollout_func is not None:
            rollout, extra = self._user_rollout(prompts)
        else:
            params = self.sampling_for(prompts, self.sampling)
            rollout, extra = self.engine.generate([p["prompt_ids"] for p in prompts], params, self.group), {}
        generated = time.perf_counter()
        scores = self.scorer.score(prompts, rollout, self.group, extra)
        s = self.settings
        if s.overlong_penalty:
            scores = add_overlong_penalty(scores, rollout, s.max_completion_length, s.overlong_buffer_length, s.overlong_penalty_factor)
        timings = {"time/generate": round(generated - started, 4), "time/reward": round(time.perf_counter() - generated, 4)}
        return rollout, scores, timings

    def _dynamic_sampling(self, prompts, rollout: Rollout, scores: Scores, needed: int):
        """Drop groups whose filter metric(s) are constant; draw more prompt batches until `needed` groups are kept
        or `dynamic_sampling_max_retries` extra draws are spent."""
        kept_prompts, kept_rollouts, kept_scores = [], [], []
        retries, dropped = 0, 0
        while True:
            flat = None
            for name in self.settings.filter_reward_metric:  # a group is dropped when every listed metric is constant in it
                values = scores.column(name)
                if values is None:
                    raise RolloutError(f"trl.filter_reward_metric {name!r} is not a reward function name "
                                       f"(have: {sorted(scores.names)}) nor 'reward'")
                constant = zero_variance_groups(values, self.group)
                flat = constant if flat is None else flat & constant
            keep = (~flat).nonzero().flatten().tolist()
            dropped += len(prompts) - len(keep)
            rows = [g * self.group + i for g in keep for i in range(self.group)]
            kept_prompts += [prompts[g] for g in keep]
            kept_rollouts.append(rollout.select(rows))
            kept_scores.append(scores.select(rows))
            if len(kept_prompts) >= needed or retries >= self.settings.dynamic_sampling_max_retries:
                break
            retries += 1
            prompts = self.prompts.next()["prompts"]
            rollout, scores, _ = self._sample_and_score(prompts)
        if not kept_prompts:  # nothing varied even after retries: train on the last batch (it will have zero advantages)
            return prompts, rollout, scores, {"zero_variance": dropped - len(prompts)}, retries
        rows = list(range(min(needed, len(kept_prompts)) * self.group))
        return (kept_prompts[:needed], Rollout.concat(kept_rollouts).select(rows), Scores.concat(kept_scores).select(rows),
                {"zero_variance": dropped}, retries)

    def _user_rollout(self, prompts: list[dict[str, Any]]) -> tuple[Rollout, dict[str, list]]:
        name = self.settings.rollout_func
        expanded = [p["prompt"] for p in prompts for _ in range(self.group)]
        result = self.rollout_func(copy.deepcopy(expanded), RolloutContext(self.engine, self.tokenizer, self.settings, self.sampling))
        missing = [key for key in ROLLOUT_KEYS if key not in (result or {})]
        if missing:
            raise RolloutError(f"trl.rollout_func {name} returned no {', '.join(missing)}: it must return a dict with "
                               "prompt_ids, completion_ids and logprobs (one entry per prompt, G per prompt in order)")
        count = len(expanded)
        if any(len(result[key]) != count for key in ROLLOUT_KEYS + (("env_mask",) if "env_mask" in result else ())):
            raise RolloutError(f"trl.rollout_func {name} returned lists of the wrong length: expected {count} "
                               "(prompts x num_generations) for prompt_ids, completion_ids, logprobs and env_mask")
        for key in ("logprobs", "env_mask") if "env_mask" in result else ("logprobs",):
            bad = next((i for i, (ids, values) in enumerate(zip(result["completion_ids"], result[key])) if len(values) != len(ids)), None)
            if bad is not None:
                raise RolloutError(f"trl.rollout_func {name} returned {key}[{bad}] with {len(result[key][bad])} entries for "
                                   f"{len(result['completion_ids'][bad])} completion tokens: give one per completion token")
        eos = self.tokenizer.eos_token_id
        rollout = Rollout(result["prompt_ids"], result["completion_ids"], result["logprobs"],
                          [eos not in ids for ids in result["completion_ids"]],
                          env_mask=[list(mask) for mask in result["env_mask"]] if "env_mask" in result else [],
                          weight_versions=[self.engine.version] * count)
        extra = {k: (v if isinstance(v, list) else [v] * count) for k, v in result.items() if k not in ROLLOUT_KEYS + ("env_mask",)}
        return rollout, extra


def rollout_metrics(scores: Scores, rollout: Rollout, group: int, frac_zero_std: float, generate_time: float) -> dict[str, float]:
    """TRL's metric names for one generation batch: rewards, their spread, completion lengths, sampling speed."""
    total = scores.total
    lengths = torch.tensor([len(c) for c in rollout.completion_ids], dtype=torch.float32)
    group_std = torch.nan_to_num(total.view(-1, group).std(-1), 0.0) if total.numel() >= group > 1 else torch.zeros(1)
    m = {"reward": float(torch.nan_to_num(total, 0.0).mean()), "reward_std": float(group_std.mean()),
         "frac_reward_zero_std": frac_zero_std}
    for name in scores.names:
        m[f"rewards/{name}/mean"], m[f"rewards/{name}/std"] = column_stats(scores.column(name))
    m.update({k: v for k, v in scores.metrics.items() if k.endswith(("failures", "unscorable")) or not k.startswith("rewards/")})
    m["completions/mean_length"] = float(lengths.mean())
    m["completions/min_length"] = float(lengths.min())
    m["completions/max_length"] = float(lengths.max())
    m["completions/clipped_ratio"] = float(sum(rollout.truncated) / max(1, len(rollout.truncated)))
    m["generate_tokens_per_s"] = round(float(lengths.sum()) / max(generate_time, 1e-9), 1)
    return m
