"""How an online-RL run evaluates (`rlft.train.recipes.validation`), resolved from the `validation:` section (Cosmos-RL's)
and the `trl:` options its unset keys take."""

from __future__ import annotations

from dataclasses import dataclass

from rlft.config.methods import method_spec
from rlft.config.rl import RLSettings


@dataclass(frozen=True)
class ValidationSettings:
    """The sampling, samples per prompt, rewards and pass rule of the evaluation, no None left."""

    temperature: float  # 0: greedy
    top_p: float
    top_k: int  # 0 or -1: off
    repetition_penalty: float
    max_new_tokens: int
    n_generation: int  # completions per prompt; pass@1 and pass@n_generation are logged
    reward_funcs: tuple[str, ...]  # empty: the training's reward functions
    reward_weights: tuple[float, ...]
    pass_threshold: float  # a completion passes when its weighted total reward is at least this

    @property
    def greedy(self) -> bool:
        """Every sample of a prompt is its most likely answer: temperature 0, or top-k 1 (Cosmos-RL's default)."""
        return self.temperature == 0 or self.top_k == 1


def validation_settings(cfg, rl: RLSettings) -> ValidationSettings | None:
    """The evaluation settings of a GRPO-family run with `validation.enable`; None otherwise (the run evaluates as it
    always does: one greedy completion per eval prompt, the training's rewards)."""
    section = cfg.validation
    if not section.enable or not method_spec(cfg.method).reward_functions:
        return None
    names, weights = section.reward_names_and_weights()
    return ValidationSettings(
        temperature=section.temperature, top_p=section.top_p if section.top_p is not None else rl.top_p,
        top_k=section.top_k if section.top_k is not None else rl.top_k,
        repetition_penalty=section.repetition_penalty if section.repetition_penalty is not None else rl.repetition_penalty,
        max_new_tokens=section.max_response_length or rl.max_completion_length, n_generation=section.n_generation,
        reward_funcs=names, reward_weights=weights, pass_threshold=section.pass_threshold)

