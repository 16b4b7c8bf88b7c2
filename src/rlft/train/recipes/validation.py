"""The evaluation of a GRPO-family run with `validation.enable` (Cosmos-RL's validation): n_generation completions per
prompt of each validation set, sampled by the run's rollout engine (in-process or the rollout server) with the
section's temperature, top-p, top-k and length, scored by its own reward functions or the training's, then the mean
reward and pass@k per set (`rlft.rollout.validation`)."""

from __future__ import annotations

from typing import Any

from rlft.config.settings.validation import ValidationSettings
from rlft.data.validation_sets import ValidationSet
from rlft.rollout.producer import RolloutProducer
from rlft.rollout.scoring import Scorer
from rlft.rollout.types import SamplingParams
from rlft.rollout.validation import SetTally, validation_metrics, validation_sampling


class Validation:
    """The validation sets, their batches, one evaluation's metrics, and the plan's line."""

    def __init__(self, sets: list[ValidationSet], settings: ValidationSettings, scorer: Scorer | None, batch_size: int,
                 seed: int):
        """`scorer`: the validation's own reward functions (None: the training's); `batch_size`: prompts per engine
        call (eval_batch_size); `seed`: the run's, from which each batch's sampling seed comes."""
        self.sets, self.settings, self.scorer = sets, settings, scorer
        self.batch_size, self.seed = batch_size, seed

    def batches(self) -> list[dict[str, Any]]:
        """Every set's prompts in order, `batch_size` at a time, each batch naming its set."""
        size = self.batch_size
        return [{"prompts": s.prompts[start : start + size], "set": s.name}
                for s in self.sets for start in range(0, len(s.prompts), size)]

    def evaluate(self, producer: RolloutProducer, batches: list[dict[str, Any]],
                 sampling: SamplingParams) -> tuple[dict[str, float], list[str]]:
        """The metrics of one evaluation, and the reward functions' failure reports. `sampling`: the training's
        parameters, of which the validation keeps the stop ids and strings and min_p. Batch i samples with the same
        seed at every evaluation, so two evaluations differ by the weights, not by the draw."""
        params, n = validation_sampling(sampling, self.settings), self.settings.n_generation
        tallies: dict[str, SetTally] = {s.name: SetTally() for s in self.sets}
        notes: list[str] = []
        for index, batch in enumerate(batches):
            seed = None if self.settings.greedy else (self.seed * 1_000_003 + 500_009 + index) % (2**63 - 1)
            rollout, scores = producer.evaluate(batch["prompts"], params, n, self.scorer, seed)
            tallies[batch["set"]].add(rollout, scores)
            notes += [f"evaluation: {failure['summary']}" for failure in scores.failures]
        return validation_metrics(tallies, n, self.settings.pass_threshold), notes

    def describe(self) -> str:
        """One line for the run's plan: the sets, the sampling, the rewards and what passes."""
        s = self.settings
        sets = ", ".join(f"{v.name} {len(v.prompts)} prompts" + (f" ({v.report.dropped_text()} dropped)" if v.report and
                                                                   any(v.report.dropped.values()) else "") for v in self.sets)
        sampling = ("greedy" if s.greedy else
                    f"temperature {s.temperature:g}, top_p {s.top_p:g}, top_k {s.top_k if s.top_k > 0 else 'off'}")
        rewards = ", ".join(f"{name} x{weight:g}" for name, weight in zip(s.reward_funcs, s.reward_weights)) \
            if s.reward_funcs else "trl.reward_funcs"
        k = f"pass@1 and pass@{s.n_generation}" if s.n_generation > 1 else "pass@1"
        return (f"{sets}; {s.n_generation} completion(s) per prompt, {sampling}, up to {s.max_new_tokens} tokens; rewards "
                f"{rewards}; {k} with reward >= {s.pass_threshold:g}")

    def close(self) -> None:
        if self.scorer is not None:
            self.scorer.close()
