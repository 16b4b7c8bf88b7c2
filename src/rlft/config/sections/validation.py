"""The `validation:` section: Cosmos-RL's ValidationConfig (same names and defaults where they mean the same) for the
evaluation of online-RL runs (the GRPO family): its own prompts, sampling, samples per prompt and reward functions,
and pass@k. Cosmos-RL's `freq` and `batch_size` are Axolotl's `eval_steps` and `eval_batch_size` here. What it
logs: docs/grpo.md#evaluation."""

from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import field_validator, model_validator

from rlft.config.base import Section, field
from rlft.config.reward_weights import EXAMPLE, names_and_weights
from rlft.config.sections.datasets import DatasetConfig

# Cosmos-RL's validation keys that an Axolotl key already holds in rlft: the key to write instead
AXOLOTL_KEYS = {
    "freq": "eval_steps: N at the top level (evaluation every N optimizer steps, also at step 0 and at the end)",
    "batch_size": "eval_batch_size: N at the top level (prompts per engine call)",
    "dataset": "validation.datasets: [{path: ..., name: ..., split: ...}] (a list of dataset entries, as test_datasets)",
}


class ValidationConfig(Section):
    """The `validation:` section (Cosmos-RL's): how an online-RL run evaluates, on which prompts, with which rewards."""

    enable: bool = field(
        False, "Evaluate with the settings of this section. Off (the default): evaluation samples one greedy completion "
               "per prompt of the eval split (test_datasets or val_set_size) and scores it with trl.reward_funcs. When "
               "evaluation runs: eval_steps (Cosmos-RL's validation.freq), at step 0 and at the end. Default false.")
    datasets: Optional[list[DatasetConfig]] = field(
        None, "Prompt datasets to validate on, entries as in test_datasets (path, name, split, revision, type); each is "
              "one validation set with metrics of its own. Unset: the eval split (test_datasets or val_set_size, which "
              "is Cosmos-RL's dataset.test_size). Default unset.")
    temperature: float = field(
        0.0, "Sampling temperature; 0 samples greedily (whatever top_p and top_k say). Default 0.0 (Cosmos-RL's).",
        ge=0.0)
    top_p: Optional[float] = field(
        None, "Nucleus-sampling threshold. Default unset: trl.top_p (Cosmos-RL's rule).", gt=0.0, le=1.0)
    top_k: Optional[int] = field(
        None, "Top-k sampling (0 or -1: off). Default unset: trl.top_k. Cosmos-RL's default is 1, which samples "
              "greedily at any temperature: write top_k: 1 for its behaviour.", ge=-1)
    repetition_penalty: Optional[float] = field(
        None, "Repetition penalty. Default unset: trl.repetition_penalty (Cosmos-RL writes 1.0).", gt=0.0)
    n_generation: int = field(
        1, "Completions sampled per prompt; pass@n_generation is logged besides pass@1. Default 1.", ge=1)
    max_response_length: Optional[int] = field(
        None, "Maximum tokens per completion. Default unset: trl.max_completion_length.", ge=1)
    reward_function: Optional[Union[str, list[str], dict[str, float]]] = field(
        None, "Reward functions of the validation, named as trl.reward_funcs names them (built-ins boxed_math, "
              "single_choice, format; 'module.fn'; a reward-model folder): one name, a list (weights 1.0) or a mapping "
              "{name: weight}. Default unset: trl.reward_funcs with trl.reward_weights.")
    pass_threshold: float = field(
        1.0, "A completion passes (pass@k) when its weighted total reward is at least this. Default 1.0: a correct "
             "answer under the 0/1 rewards (boxed_math, single_choice, math_verify_reward) and their weighted sums "
             "whose weights add up to 1.")

    @model_validator(mode="before")
    @classmethod
    def _cosmos_keys_with_axolotl_names(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, instead in AXOLOTL_KEYS.items():
                if key in data:
                    raise ValueError(f"{key} is Cosmos-RL's key: in rlft write {instead}")
        return data

    @field_validator("reward_function", mode="before")
    @classmethod
    def _reward_names(cls, value: Any) -> Any:
        """Names as trl.reward_funcs takes them; a mapping's weights checked before the field reads them (it would read
        true as 1.0)."""
        if isinstance(value, dict):
            names_and_weights(value)
            return value
        names = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        if any(isinstance(name, str) and not name.strip() for name in names):
            raise ValueError(f"a reward function's name is empty: write e.g. boxed_math, [boxed_math, format] or {EXAMPLE}")
        return value

    def reward_names_and_weights(self) -> tuple[tuple[str, ...], tuple[float, ...]]:
        """`reward_function` as names and one weight each (1.0 for a name or a list); empty when unset."""
        value = self.reward_function
        if isinstance(value, dict):
            names, weights = names_and_weights(value)
            return tuple(names), tuple(weights)
        names = (value,) if isinstance(value, str) else tuple(value or ())
        return names, (1.0,) * len(names)


class ValidationFields(Section):
    """The validation key of the config file."""

    validation: ValidationConfig = field(
        default_factory=ValidationConfig, description="Evaluation of online-RL runs with settings of its own (Cosmos-RL's "
                                                      "section): docs/grpo.md#evaluation.")
