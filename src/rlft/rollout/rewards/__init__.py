"""Reward functions for online RL: loading `trl.reward_funcs`, calling them as TRL does, workers, timeouts.

* `loading`: `trl.reward_funcs` (+ `trl.reward_weights`) -> RewardFunction: a built-in by name, `module.fn`
  from the working directory (rlft.usercode) or a trained reward-model folder (RewardModelScorer);
* `builtin`: Cosmos-RL's `boxed_math`, `single_choice` and `format`; `math_verify`: `math_verify_reward`;
* `calling`: the TRL calling convention, checking what a function returned, the in-process timeout;
* `workers`: the persistent pool of "spawn" worker processes used when `num_workers > 1`;
* `runner`: RewardRunner, which scores completions with every function; a function that raises or
  hangs must not kill the run silently (the rules are in its module docstring).

Nothing is imported here: the spawned worker processes import `workers` (and so this package) and need neither torch
nor the models that the runner and the reward-model scorer bring.
"""
