"""The data that flows through online RL, stage to stage.

    prompts --engine--> Rollout --scorer--> Scores --advantages, filters--> ScoredBatch
            --recipe (old / reference log-probs)--> TrainingRow --> micro-batches --> loss

Every row keeps what produced it: the sampling log-prob of each token, which tokens the model
produced (`env_mask`), and the weight version of the engine that sampled it. A `TrainingRow` can
therefore name where its advantage, its sampling log-probs and its weights came from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypedDict

import torch


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()


def sampling_params(settings, ends: tuple[int, ...]) -> SamplingParams:
    """The run's `SamplingParams` from its `rlft.config.rl.RLSettings`; a completion ends at any of `ends`
    (`rlft.data.tokenizer.end_ids`) unless `ignore_eos`, and at the config's own stop ids and strings."""
    return SamplingParams(
        max_new_tokens=settings.max_completion_length, temperature=settings.temperature, top_p=settings.top_p,
        top_k=settings.top_k, min_p=settings.min_p, repetition_penalty=settings.repetition_penalty,
        stop_token_ids=(() if settings.ignore_eos else tuple(ends)) + settings.stop_token_ids,
        stop_strings=settings.stop_strings,
    )


@dataclass
class Rollout:
    """N sampled rows, prompt-major (the G samples of prompt 0 first). Every field has one entry per row."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]  # including the stop token when one was produced
    logprobs: list[list[float]]  # sampling-distribution log-prob of each completion token (0.0 for environment tokens)
    truncated: list[bool]  # ended by max_new_tokens, not by a stop token or string
    env_mask: list[list[int]] = field(default_factory=list)  # per token: 1 = sampled by the model, 0 = from an environment
    weight_versions: list[int] = field(default_factory=list)  # version of the weights that sampled each row

    def __post_init__(self) -> None:
        rows = len(self.completion_ids)
        if not self.env_mask:
            self.env_mask = [[1] * len(ids) for ids in self.completion_ids]
        if not self.weight_versions:
            self.weight_versions = [0] * rows
        for name in ("prompt_ids", "logprobs", "truncated", "env_mask", "weight_versions"):
            if len(getattr(self, name)) != rows:
                raise ValueError(f"Rollout.{name} has {len(getattr(self, name))} rows, completion_ids has {rows}")

    def __len__(self) -> int:
        return len(self.completion_ids)

    def select(self, rows: list[int]) -> "Rollout":
        """These rows, every field kept (nothing a later stage needs can be lost on the way)."""
        return Rollout(**{f.name: [getattr(self, f.name)[i] for i in rows] for f in dataclasses.fields(self)})

    @staticmethod
    def concat(parts: list["Rollout"]) -> "Rollout":
        return Rollout(**{f.name: [item for part in parts for item in getattr(part, f.name)] for f in dataclasses.fields(Rollout)})


@dataclass
class SampledBatch:
    """One generation batch as the engine returned it, before any scoring: what a background sampler hands over."""

    prompts: list[dict[str, Any]]  # one per group
    rollout: Rollout
    extra: dict[str, list] = field(default_factory=dict)  # columns a rollout_func returned beside the rollout
    index: int = 0  # which draw of the run this is (seeds its sampling)
    generate_time: float = 0.0
    injected: int = 0  # prompts the re-roll queue put in place of drawn ones

    @staticmethod
    def join(first: "SampledBatch", second: "SampledBatch") -> "SampledBatch":
        """One draw sampled in two shares (its first prompts, then the others) as one batch, in prompt order."""
        extra = {key: list(values) + list(second.extra[key]) for key, values in first.extra.items()}  # the same columns
        return SampledBatch(first.prompts + second.prompts, Rollout.concat([first.rollout, second.rollout]), extra,
                            first.index, first.generate_time + second.generate_time, first.injected + second.injected)

    def to_state(self) -> dict[str, Any]:
        return {"prompts": self.prompts, "rollout": dataclasses.asdict(self.rollout), "extra": self.extra,
                "index": self.index, "generate_time": self.generate_time, "injected": self.injected}

    @staticmethod
    def from_state(state: dict[str, Any]) -> "SampledBatch":
        return SampledBatch(state["prompts"], Rollout(**state["rollout"]), state["extra"], state["index"], state["generate_time"],
                            state.get("injected", 0))


class RewardFailure(TypedDict, total=False):
    """How one reward function failed within one scoring call (`rlft.rollout.rewards.runner`), for the console."""

    function: str  # its name
    source: str  # where it is defined
    error: str  # the first row's error
    rows: int  # the rows it failed on
    example: dict[str, Any]  # the first failing row: {"row": index, "prompt": text, "completion": text}, shortened
    other_errors: list[str]  # the other distinct errors, when there were some
    summary: str  # all of the above as the warning the run prints


@dataclass
class Scores:
    """Rewards of N rows: one column per reward function (NaN = unscorable), their weights and the weighted total."""

    values: torch.Tensor  # (N, K)
    names: list[str]
    weights: torch.Tensor  # (K,)
    total: torch.Tensor  # (N,) NaN-skipping weighted sum; NaN where every function was unscorable
    metrics: dict[str, float] = field(default_factory=dict)  # failure counts and the scorer's own metrics
    failures: list[RewardFailure] = field(default_factory=list)  # one per reward function that failed, for the console

    def column(self, name: str) -> torch.Tensor | None:
        return self.total if name == "reward" else (self.values[:, self.names.index(name)] if name in self.names else None)

    def select(self, rows: list[int]) -> "Scores":
        return Scores(self.values[rows], self.names, self.weights, self.total[rows], self.metrics, self.failures)

    @staticmethod
    def concat(parts: list["Scores"]) -> "Scores":
        """Scores of row chunks (streamed scoring, dynamic-sampling draws) as one: failure and unscorable counts add up,
        the scorer's other metrics are averaged over the rows."""
        first, metrics = parts[0], {}
        for key in dict.fromkeys(k for p in parts for k in p.metrics):
            having = [p for p in parts if key in p.metrics]
            if key.endswith(("failures", "unscorable")):
                metrics[key] = float(sum(p.metrics[key] for p in having))
            else:
                rows = sum(len(p.total) for p in having)
                metrics[key] = float(sum(p.metrics[key] * len(p.total) for p in having) / rows) if rows else having[-1].metrics[key]
        return Scores(torch.cat([p.values for p in parts]), first.names, first.weights, torch.cat([p.total for p in parts]),
                      metrics, [f for p in parts for f in p.failures])


@dataclass
class BatchMetrics:
    """A generation batch's metrics, made by the producer with its ScoredBatch, in two parts. `batch` describes its rows
    (rewards, lengths, staleness): it repeats on every optimizer step that trains on them (num_iterations,
    steps_per_generation) and is saved with the recipe's state. `step` holds the current step's own phase times and
    events (the rollout's phases, the row queue's log-prob pass, weight sync, a skipped step): the later stages add to it
    through `add_phase` and `note`, and `take_step` hands it over once, with the description, as the step's metrics."""

    batch: dict[str, float] = field(default_factory=dict)
    step: dict[str, float] = field(default_factory=dict)

    def describe(self, values: dict[str, float]) -> None:
        """Add to the description of the batch's rows."""
        self.batch.update(values)

    def add_phase(self, name: str, seconds: float, within: str | None = None) -> None:
        """The step spent `seconds` (kept to 0.1 ms) on phase `name`; `within`: a phase whose total includes this one."""
        self.step[name] = round(seconds, 4)
        if within is not None:
            self.step[within] = round(self.step[within] + self.step[name], 4)

    def note(self, event: str, count: float = 1.0) -> None:
        """An event of this step (a skipped update, rows dropped), with how many times it happened."""
        self.step[event] = float(count)

    def take_step(self) -> dict[str, float]:
        """The step's metrics: the batch's description, then the step's own, which start empty for the next step."""
        step, self.step = self.step, {}
        return {**self.batch, **step}


@dataclass
class ScoredBatch:
    """One generation batch, ready to train on: prompt groups, their rollouts, rewards and advantages.

    `dropped` counts the groups left out and why (e.g. {"zero_variance": 3} from dynamic sampling);
    `metrics` describe these rows and the phases that made them, and travel with them.
    """

    prompts: list[dict[str, Any]]  # one per group: prompt_ids, prompt, columns (+ ground_truth_ids for EBFT)
    rollout: Rollout
    scores: Scores
    advantages: torch.Tensor  # (N,)
    group_size: int
    skip: bool = False  # no learning signal anywhere (skip_zero_advantage_batches): no update on these steps
    dropped: dict[str, int] = field(default_factory=dict)
    metrics: BatchMetrics = field(default_factory=BatchMetrics)
    replayed_rows: frozenset[int] = frozenset()  # rows the replay buffer put in place of a group without signal
    notes: list[str] = field(default_factory=list)  # what the user should read now (an environment's first failure)

    def prompt_of(self, row: int) -> dict[str, Any]:
        return self.prompts[row // self.group_size]


@dataclass(frozen=True)
class TrainingRow:
    """One completion as the loss sees it, with where each value came from. Never changed once made: a stage that adds a
    value (the row queue's cached log-probs) makes a new row (`dataclasses.replace`)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    loss_mask: list[int]  # env_mask, zeroed when truncated completions are masked
    advantage: float  # from ScoredBatch.advantages
    sampling_logps: list[float]  # from the engine that sampled the row (Rollout.logprobs)
    weight_version: int  # of that engine (Rollout.weight_versions)
    old_logps: list[float] | None = None  # the trainer's, cached when the policy moves before use (RowQueue)
    old_sampled_logps: list[float] | None = None  # the same under the engine's sampling filters (top-k/p, min-p, ...)
    ref_logps: list[float] | None = None  # the frozen reference (beta > 0)
    ground_truth_ids: list[int] | None = None  # EBFT structured with ce_coef
    replayed: bool = False  # from the replay buffer (its old log-probs may be the recorded ones)

    def to_state(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_state(state: dict[str, Any]) -> "TrainingRow":
        return TrainingRow(**state)


def prompt_seed(seed: int | None, index: int, num_samples: int) -> int | None:
    """The seed of prompt `index` of a seeded batch. vLLM seeds each prompt alone (its k-th sample draws from seed +
    k), so prompts seeded alike, or 1 apart, would share random draws; spaced by `num_samples` they do not."""
    return None if seed is None else (seed * 1_000_003 + index * num_samples) % (2**63 - 1)
