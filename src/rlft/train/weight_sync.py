"""Trainer-side weight sync: after optimizer steps, send the policy's new weights to the rollout engine.

The weight version is the number of optimizer steps the weights have seen; every rollout row carries
the version that sampled it, and the checkpoint records the engine's version. After each push the
engine must report the version it was sent, or the run stops: sampling from weights other than
the ones the trainer thinks it sent is how off-policy bugs start.
"""

from __future__ import annotations

from rlft.errors import RolloutError
from rlft.models.weights import trainable_weights
from rlft.rollout.engine import RolloutEngine


class WeightSync:
    def __init__(self, engine: RolloutEngine, every: int = 1):
        self.engine = engine
        self.every = every

    def after_optimizer_step(self, policy, step: int) -> bool:
        """Push when `step` is due (every `every` steps). Returns whether it pushed."""
        if step % self.every:
            return False
        self.engine.load_weights(trainable_weights(policy), version=step)
        served = self.engine.health().get("version")
        if served != step:
            raise RolloutError(f"weight sync: the engine serves version {served} after being sent version {step}")
        return True
