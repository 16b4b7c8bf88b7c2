"""Reward functions for online RL: loading `trl.reward_funcs`, calling them as TRL does, workers, timeouts.

* `loading`: `trl.reward_funcs` (+ `trl.reward_weights`) -> RewardFunction: `module.fn` from the
  working directory (rlft.usercode) or a trained reward-model folder (RewardModelScorer);
* `calling`: the TRL calling convention, checking what a function returned, the in-process timeout;
* `workers`: the persistent pool of "spawn" worker processes used when `num_workers > 1`;
* `runner`: RewardRunner, which scores completions with every function; a function that raises or
  hangs must not kill the run silently (the rules are in its module docstring).
"""

from __future__ import annotations

from rlft.rollout.rewards.calling import (
    EXCLUDED_COLUMNS,
    RESERVED_ARGUMENTS,
    BadReturn,
    as_trl_completions,
    coerce_scores,
    describe_exception,
    is_conversational_prompt,
)
from rlft.rollout.rewards.loading import RewardFunction, RewardModelScorer, load_reward_functions
from rlft.rollout.rewards.runner import RewardRunner, RewardScores

__all__ = [
    "EXCLUDED_COLUMNS",
    "RESERVED_ARGUMENTS",
    "BadReturn",
    "RewardFunction",
    "RewardModelScorer",
    "RewardRunner",
    "RewardScores",
    "as_trl_completions",
    "coerce_scores",
    "describe_exception",
    "is_conversational_prompt",
    "load_reward_functions",
]
