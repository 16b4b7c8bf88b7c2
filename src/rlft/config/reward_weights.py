"""Reward functions named with weights, Cosmos-RL's `{name: weight}` mapping: read the same way by `trl.reward_funcs`,
`validation.reward_function` and the Cosmos-RL translation of `train.train_policy.reward_function`."""

from __future__ import annotations

import math
from typing import Any

EXAMPLE = "{boxed_math: 0.9, format: 0.1}"


def names_and_weights(mapping: dict[Any, Any]) -> tuple[list[str], list[float]]:
    """The names and weights of a `{name: weight}` mapping, in its order. ValueError for a name that is empty or not a
    string, and for a weight that is not a finite number: true and false are refused (YAML reads `yes` as true), not
    read as 1 and 0."""
    for name, weight in mapping.items():
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"the key {name!r} is not a reward function's name; write e.g. {EXAMPLE}, or `module.fn` keys")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ValueError(f"the weight of {name!r} is {weight!r}; give a finite number ({name}: 1.0)")
    return list(mapping), [float(weight) for weight in mapping.values()]
