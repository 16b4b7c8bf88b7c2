"""The rollout producer: prompts -> engine -> scorer -> filters -> advantages -> ScoredBatch.

It owns its prompt cursor, the engine, the scorer and the filters, and never touches the module being
trained: it samples from an engine that holds its own weights (updated by the trainer through
`engine.load_weights`). Three stages: `draw()` takes the next prompts (main thread), `sample()` runs the
engine (anywhere: inline, or on the background thread of rollout/prefetch.py when prefetching) and
`score()` turns a SampledBatch into a ScoredBatch (main thread: reward functions may need its signals).
`produce()` chains the three for synchronous use.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable, Protocol

import torch

from rlft.data.prompts import PromptRow
from rlft.errors import RolloutError
from rlft.losses.advantages import group_advantages, zero_variance_groups
from rlft.phase_ranges import phase_range
from rlft.rollout.engine import RolloutEngine
from rlft.rollout.envs.multi_turn import tool_metrics
from rlft.rollout.scoring import Scorer, add_overlong_penalty, column_stats
from rlft.rollout.types import BatchMetrics, Rollout, SampledBatch, SamplingParams, ScoredBatch, Scores
from rlft.rollout.user_rollouts import call_user, completions_rollout, rollout_form

ROLLOUT_KEYS = ("prompt_ids", "completion_ids", "logprobs")


class PromptSource(Protocol):
    """A seeded cursor over prompt batches (`rlft.data.batches.PlanCursor`; its owner checkpoints it)."""

    def next(self) -> dict[str, Any]: ...

    def epoch_rows(self) -> int | None: ...  # the prompts of an epoch, where the source knows them


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


class Environment(Protocol):
    """Plays whole episodes instead of the engine sampling single answers (NeMo Gym's agents, which call the rollout
    server themselves; rlft's Python tools, `rlft.rollout.envs.multi_turn`, which sample each turn from `engine` with
    `seed`): G rows per prompt, with `env_mask` over what the environment wrote, and extra columns for the reward
    functions (`env_reward`, `num_turns`, `env_error`: a failed episode's reason, None otherwise)."""

    def rollout(self, prompts: list[PromptRow], group: int, sampling: SamplingParams, engine: RolloutEngine,
                seed: int | None = None) -> tuple[Rollout, dict[str, list]]: ...


class RolloutProducer:
    def __init__(self, engine: RolloutEngine, scorer: Scorer, prompts: PromptSource, settings, tokenizer,
                 sampling: SamplingParams, rollout_func: Callable | None = None,
                 sampling_for: Callable[[list[dict[str, Any]], SamplingParams], SamplingParams] | None = None,
                 seed: int = 0, environment: Environment | None = None,
                 inject: Callable[[list[dict[str, Any]]], tuple[list[dict[str, Any]], int]] | None = None,
                 after_scoring: Callable[[ScoredBatch], ScoredBatch] | None = None,
                 run_engine: Callable[[Callable[[], Any]], Any] | None = None):
        """`settings` is `rlft.config.rl.RLSettings`; `sampling_for(prompts, sampling)` may adapt the sampling
        parameters to a prompt batch (EBFT's adaptive_max_tokens). `seed` seeds every draw's sampling. The hooks of
        the trainer's feed (`rlft.train.rollout_feed`): `inject(prompts)` gives the prompts with re-rolled ones put
        in and how many; `after_scoring(scored)` the batch after the replay buffer; `run_engine(job)` runs engine
        work where the engine lives (its prefetch thread). Without them: no re-roll, no replay, work run inline."""
        self.environment = environment
        self.engine, self.scorer, self.prompts, self.settings = engine, scorer, prompts, settings
        self.tokenizer, self.sampling, self.rollout_func = tokenizer, sampling, rollout_func
        self.rollout_form = rollout_form(rollout_func, settings.rollout_func) if rollout_func is not None else None
        self.sampling_for = sampling_for or (lambda prompts, sampling: sampling)
        self.group = settings.num_generations
        self.seed = seed
        self.generations = 0  # generation batches scored so far
        self.draws = 0  # prompt batches drawn so far (a draw's index seeds its sampling)
        self.inject = inject or (lambda prompts: (prompts, 0))
        self.after_scoring = after_scoring or (lambda scored: scored)
        self.run_engine = run_engine or (lambda job: job())

    # ------------------------------------------------------------------ the batch
    def produce(self) -> ScoredBatch:
        """One generation batch, drawn, sampled and scored here: prompts_per_step x steps_per_generation prompts."""
        return self.score(self.sample(*self.draw()))

    def draw(self) -> tuple[list[dict[str, Any]], int, int]:
        """The next generation batch's prompts, the draw's index and how many prompts re-roll put in (main thread:
        the cursor lives here)."""
        s = self.settings
        prompts, injected = self.inject([p for _ in range(s.steps_per_generation) for p in self.prompts.next()["prompts"]])
        self.draws += 1
        return prompts, self.draws - 1, injected

    def sample(self, prompts: list[PromptRow], index: int, injected: int = 0, part: int = 0) -> SampledBatch:
        """Generate G completions per prompt. Touches only the engine: safe on a background thread. `part`: which share
        of draw `index` these prompts are, when it is sampled in two (the throttle's early prompts, then the rest)."""
        started = time.perf_counter()
        with phase_range("generate"):
            if self.environment is not None:
                rollout, extra = self.environment.rollout(prompts, self.group, self.sampling_for(prompts, self.sampling),
                                                          self.engine, seed=self.seed_of(index, part))
            elif self.rollout_func is not None:
                rollout, extra = self._user_rollout(prompts)
            else:
                params = self.sampling_for(prompts, self.sampling)
                rollout = self.engine.generate([p["prompt_ids"] for p in prompts], params, self.group,
                                               seed=self.seed_of(index, part))
                extra = {}
        return SampledBatch(prompts, rollout, extra, index, round(time.perf_counter() - started, 4), injected)

    def seed_of(self, index: int, part: int = 0) -> int:
        return (self.seed * 1_000_003 + index + part * 2**40) % (2**63 - 1)

    def score(self, sampled: SampledBatch) -> ScoredBatch:
        """Rewards, the overlong penalty, dynamic sampling, advantages, replay and metrics (main thread)."""
        s = self.settings
        needed = s.prompts_per_step * s.steps_per_generation
        started = time.perf_counter()
        prompts, rollout = sampled.prompts, sampled.rollout
        scores = self._score(prompts, rollout, sampled.extra)
        metrics, dropped = BatchMetrics(), {}
        metrics.add_phase("time/generate", sampled.generate_time)
        metrics.add_phase("time/reward", time.perf_counter() - started)
        if s.filter_reward_metric:  # DAPO dynamic sampling: keep groups whose filter reward varies, draw more (bounded)
            prompts, rollout, scores, dropped, retries = self._dynamic_sampling(prompts, rollout, scores, needed)
            metrics.describe({"dynamic_sampling/retries": float(retries),
                              "dynamic_sampling/dropped_groups": float(sum(dropped.values()))})
        advantages, frac_zero_std = self._advantages(scores)
        self.generations += 1
        skip = s.skip_zero_advantage_batches and bool((advantages == 0).all())
        if sampled.injected:
            metrics.describe({"reroll_injected": float(sampled.injected)})
        metrics.describe(rollout_metrics(scores, rollout, self.group, frac_zero_std, max(sampled.generate_time, 1e-9)))
        metrics.add_phase("time/rollout_total", sampled.generate_time + time.perf_counter() - started)
        notes = episode_metrics(sampled.extra, metrics)
        scored = ScoredBatch(prompts, rollout, scores, advantages, self.group, skip=skip, dropped=dropped, metrics=metrics,
                             notes=notes)
        return self.after_scoring(scored)

    def _advantages(self, scores: Scores) -> tuple[torch.Tensor, float]:
        """Group advantages over the whole batch, or chunk by chunk of `streaming_min_groups` groups when streaming
        (each chunk normalised on its own, as Axolotl's streaming scorer does)."""
        s = self.settings
        chunk = s.streaming_min_groups * self.group if s.streaming else len(scores.total)
        parts, zero = [], 0.0
        for start in range(0, len(scores.total), max(chunk, 1)):
            values = scores.values[start : start + chunk]
            result = group_advantages(values, scores.weights, self.group, scale=s.scale_rewards,
                                      aggregation=s.multi_objective_aggregation, estimator=s.advantage_estimator)
            parts.append(result.advantages)
            zero += float(result.frac_zero_std) * len(values)
        return torch.cat(parts), zero / max(1, len(scores.total))

    def evaluate(self, prompts: list[PromptRow], params: SamplingParams, samples: int = 1, scorer: Scorer | None = None,
                 seed: int | None = None) -> tuple[Rollout, Scores]:
        """`samples` completions (or episodes, with an environment) per prompt with `params` (greedy for the default
        eval), scored by `scorer` (None: the training's reward functions); `seed` seeds the engine's sampling."""
        scorer = scorer or self.scorer
        if self.environment is not None:
            rollout, extra = self.run_engine(lambda: self.environment.rollout(prompts, samples, params, self.engine, seed))
            return rollout, scorer.score(prompts, rollout, samples, extra)
        rollout = self.run_engine(lambda: self.engine.generate([p["prompt_ids"] for p in prompts], params, samples, seed=seed))
        return rollout, scorer.score(prompts, rollout, samples)

    # ------------------------------------------------------------------ stages
    def _score(self, prompts: list[PromptRow], rollout: Rollout, extra: dict[str, list]) -> Scores:
        """The scorer over the whole batch, or chunk by chunk of groups when streaming (bounded memory per call)."""
        with phase_range("reward"):
            s = self.settings
            if s.streaming and len(prompts) > s.streaming_min_groups:
                step = s.streaming_min_groups
                parts = []
                for start in range(0, len(prompts), step):
                    rows = list(range(start * self.group, min(len(prompts), start + step) * self.group))
                    part_extra = {k: [v[i] for i in rows] for k, v in extra.items()}
                    parts.append(self.scorer.score(prompts[start : start + step], rollout.select(rows), self.group, part_extra))
                scores = Scores.concat(parts)
            else:
                scores = self.scorer.score(prompts, rollout, self.group, extra)
            if s.overlong_penalty:
                scores = add_overlong_penalty(scores, rollout, s.max_completion_length, s.overlong_buffer_length,
                                              s.overlong_penalty_factor)
            return scores

    def _dynamic_sampling(self, prompts, rollout: Rollout, scores: Scores, needed: int):
        """Drop groups whose filter metric(s) are constant; draw more prompt batches until `needed` groups are kept,
        or `dynamic_sampling_max_retries` extra draws are spent (then what is kept trains). With
        `max_retry_for_on_policy` N > 0 (Cosmos-RL), at most N x `needed` prompts are drawn, and a batch still short then
        stops the run; N <= 0 draws until the batch is full, up to an epoch of prompts."""
        kept_prompts, kept_rollouts, kept_scores = [], [], []
        retries, dropped, drawn = 0, 0, len(prompts)
        limit = self.settings.max_retry_for_on_policy
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
            if len(kept_prompts) >= needed or (limit is None and retries >= self.settings.dynamic_sampling_max_retries):
                break
            if limit is not None:
                draw_limit(limit, drawn, needed, len(kept_prompts), self.prompts)
            retries += 1
            prompts = self.prompts.next()["prompts"]
            drawn += len(prompts)
            index = self.draws
            self.draws += 1
            sampled = self.run_engine(lambda: self.sample(prompts, index))
            rollout, scores = sampled.rollout, self._score(prompts, sampled.rollout, sampled.extra)
        if not kept_prompts:  # nothing varied even after retries: train on the last batch (it will have zero advantages)
            return prompts, rollout, scores, {"zero_variance": dropped - len(prompts)}, retries
        rows = list(range(min(needed, len(kept_prompts)) * self.group))
        return (kept_prompts[:needed], Rollout.concat(kept_rollouts).select(rows), Scores.concat(kept_scores).select(rows),
                {"zero_variance": dropped}, retries)

    def _user_rollout(self, prompts: list[PromptRow]) -> tuple[Rollout, dict[str, list]]:
        name = self.settings.rollout_func
        if self.rollout_form == "completions":
            rollout = completions_rollout(self.rollout_func, name, getattr(self.engine, "model", None), self.tokenizer, prompts,
                                          self.group, self.sampling_for(prompts, self.sampling), self.engine.version)
            return rollout, {}
        expanded = [p["prompt"] for p in prompts for _ in range(self.group)]
        result = call_user(self.rollout_func, name, copy.deepcopy(expanded),
                           RolloutContext(self.engine, self.tokenizer, self.settings, self.sampling))
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
        ends = {self.tokenizer.eos_token_id, *self.sampling.stop_token_ids}  # a completion without one was cut off
        rollout = Rollout(result["prompt_ids"], result["completion_ids"], result["logprobs"],
                          [not ends.intersection(ids) for ids in result["completion_ids"]],
                          env_mask=[list(mask) for mask in result["env_mask"]] if "env_mask" in result else [],
                          weight_versions=[self.engine.version] * count)
        extra = {k: (v if isinstance(v, list) else [v] * count) for k, v in result.items() if k not in ROLLOUT_KEYS + ("env_mask",)}
        return rollout, extra


def draw_limit(limit: int, drawn: int, needed: int, kept: int, prompts: PromptSource) -> None:
    """Cosmos-RL's `max_retry_for_on_policy`: stop the run when dynamic sampling would draw more than `limit` x `needed`
    prompts for one generation batch (limit <= 0: an epoch of prompts more than `needed`, where the source knows its
    data; a run that never fills a batch would otherwise draw for ever)."""
    epoch = prompts.epoch_rows()
    bound = limit * needed if limit > 0 else (epoch + needed if epoch else None)
    if bound is not None and drawn >= bound:
        what = (f"{limit} x the batch (trl.max_retry_for_on_policy)" if limit > 0 else
                "an epoch of prompts (trl.max_retry_for_on_policy <= 0 draws until the batch is full)")
        raise RolloutError(f"dynamic sampling kept {kept} of the {needed} prompt groups a generation batch needs after drawing "
                           f"{drawn} prompts, {what}: nearly every group's trl.filter_reward_metric is equal within it, so the "
                           "data may be too hard or too easy for the model. Check the reward functions on a few "
                           "completions, raise max_retry_for_on_policy, or remove it to train on the groups kept "
                           "(dynamic_sampling_max_retries)")


def episode_metrics(extra: dict[str, list], metrics: BatchMetrics) -> list[str]:
    """An environment's turns, tool calls and failures into the batch's description (Axolotl's rollout/num_turns/*, TRL's
    tools/*); the first failure's reason, to print."""
    turns = [t for t in extra.get("num_turns") or [] if t is not None]
    if turns:
        metrics.describe({"rollout/num_turns/mean": sum(turns) / len(turns), "rollout/num_turns/min": float(min(turns)),
                          "rollout/num_turns/max": float(max(turns))})
    metrics.describe(tool_metrics(extra))
    if "env_error" not in extra:
        return []
    errors = [e for e in extra["env_error"] if e]
    metrics.describe({"rollout/env_failures": float(len(errors))})
    return [f"{len(errors)} of {len(extra['env_error'])} episodes failed and are not trained on; the first: {errors[0]}"] if errors else []


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
