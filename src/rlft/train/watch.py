"""Axolotl's run guards: `loss_watchdog_threshold` / `loss_watchdog_patience` and `early_stopping_patience`.

The loss and eval values they see are the ones every process agrees on (all-reduced), so all processes
stop at the same step. Their counters live in the checkpoint's trainer state, so a resumed run
stops where the uninterrupted one would.
"""

from __future__ import annotations

from typing import Any


class RunGuards:
    def __init__(self, cfg, state: dict[str, Any] | None = None):
        self.threshold = cfg.loss_watchdog_threshold
        self.patience = cfg.loss_watchdog_patience or 3
        self.early_patience = cfg.early_stopping_patience
        state = state or {}
        self.high = state.get("high", 0)  # consecutive steps above the threshold
        self.best = state.get("best")  # lowest eval/loss so far
        self.stale = state.get("stale", 0)  # evaluations since it improved

    def loss_breakdown(self, loss: float) -> str | None:
        """Why training stops now, when the loss has stayed above the threshold for `patience` steps in a row."""
        if self.threshold is None:
            return None
        self.high = self.high + 1 if loss > self.threshold else 0
        if self.high < self.patience:
            return None
        return (f"the loss stayed above loss_watchdog_threshold={self.threshold} for {self.high} steps in a row "
                f"(now {loss:.4f}): training has broken down. Lower learning_rate, or raise the threshold")

    def stop_early(self, result: dict[str, float]) -> bool:
        """After an evaluation: whether eval/loss has not improved for `early_stopping_patience` evaluations."""
        value = result.get("eval/loss")
        if not self.early_patience or value is None:
            return False
        if self.best is None or value < self.best:
            self.best, self.stale = value, 0
            return False
        self.stale += 1
        return self.stale >= self.early_patience

    def state_dict(self) -> dict[str, Any]:
        return {"high": self.high, "best": self.best, "stale": self.stale}
