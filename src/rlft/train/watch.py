"""What stops a run between two steps: Axolotl's guards (`loss_watchdog_threshold` / `loss_watchdog_patience`,
`early_stopping_patience`) and Ctrl-C.

The loss and eval values the guards see are the ones every process agrees on (all-reduced), so all processes
stop at the same step. Their counters live in the checkpoint's trainer state, so a resumed run
stops where the uninterrupted one would.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from rlft.config.best_model import best_metric
from rlft.train.best import better, metric_value


class SetupInterrupts:
    """`with SetupInterrupts():` around a run. A Ctrl-C before the training loop raises KeyboardInterrupt at once, as
    Python's own handler does, and is also remembered: one swallowed on the way (a bare `except:` in a library's
    import-time probe, a `__del__` that was running when it arrived) would otherwise let the run go on to train as if
    nothing had been pressed. The loop raises a remembered one again before its first step (StopRequest)."""

    current: SetupInterrupts | None = None

    def __enter__(self) -> SetupInterrupts:
        self.pressed = False
        self._previous = signal.signal(signal.SIGINT, self._note)
        SetupInterrupts.current = self
        return self

    def _note(self, *_: Any) -> None:
        self.pressed = True
        raise KeyboardInterrupt

    def __exit__(self, *exc: Any) -> None:
        signal.signal(signal.SIGINT, self._previous)
        SetupInterrupts.current = None


class StopAfterStep(Exception):
    """Ctrl-C was noted and the step in progress has finished: the loop saves and stops."""


class StopRequest:
    """Ctrl-C during training. A step stopped half-way cannot be saved (its batch is drawn, its update half-made),
    so the first Ctrl-C is only noted: the loop finishes the step it is in and saves the state after it, which a
    resume continues exactly. With several processes (the launcher passes the Ctrl-C to each) they agree at the
    next step's reduction and save together. A second Ctrl-C with one process stops at once, saving nothing more
    (the last checkpoint stays); with several, the launcher kills them 30 s after the first."""

    def __init__(self, world: int, announce: bool):
        if SetupInterrupts.current is not None and SetupInterrupts.current.pressed:
            raise KeyboardInterrupt  # a Ctrl-C during set-up that something swallowed
        self.requested = False
        self.world, self.announce = world, announce
        self._previous = signal.signal(signal.SIGINT, self._note)

    def _note(self, *_: Any) -> None:
        if self.requested and self.world == 1:
            raise KeyboardInterrupt
        self.requested = True
        if self.announce:  # raw write: the interrupted code may hold the console's lock
            again = "; Ctrl-C again stops at once without saving it" if self.world == 1 else ""
            os.write(2, f"\nCtrl-C: finishing this step, then saving a checkpoint{again}\n".encode())

    def close(self) -> None:
        signal.signal(signal.SIGINT, self._previous)


class RunGuards:
    def __init__(self, cfg, state: dict[str, Any] | None = None):
        self.threshold = cfg.loss_watchdog_threshold
        self.patience = cfg.loss_watchdog_patience or 3
        self.early_patience = cfg.early_stopping_patience
        self.key, self.higher = best_metric(cfg)  # eval/loss unless metric_for_best_model names another
        state = state or {}
        self.high = state.get("high", 0)  # consecutive steps above the threshold
        same_metric = (state.get("key", "eval/loss"), state.get("higher", False)) == (self.key, self.higher)
        self.best = state.get("best") if same_metric else None  # the best eval metric so far
        self.stale = state.get("stale", 0) if same_metric else 0  # evaluations since it improved

    def loss_breakdown(self, loss: float) -> str | None:
        """Why training stops now, when the loss has stayed above the threshold for `patience` steps in a row."""
        if self.threshold is None:
            return None
        self.high = self.high + 1 if loss > self.threshold else 0
        if self.high < self.patience:
            return None
        return (f"the loss stayed above loss_watchdog_threshold={self.threshold} for {self.high} steps in a row "
                f"(now {loss:.4f}): training has broken down. Lower learning_rate, or raise the threshold")

    def check(self, result: dict[str, float]) -> None:
        """After every evaluation, the untrained baseline's included: the metric early stopping watches is there."""
        if self.early_patience and result:
            metric_value(result, self.key, "early_stopping_patience")

    def stop_early(self, result: dict[str, float]) -> bool:
        """After an evaluation: whether its metric has not improved for `early_stopping_patience` evaluations."""
        if not self.early_patience or not result:
            return False
        value = metric_value(result, self.key, "early_stopping_patience")
        if better(value, self.best, self.higher):
            self.best, self.stale = value, 0
            return False
        self.stale += 1
        return self.stale >= self.early_patience

    def stopped_early(self) -> bool:
        """Whether the run these counters come from ended by early stopping (a resume then has nothing to train)."""
        return bool(self.early_patience) and self.stale >= self.early_patience

    def state_dict(self) -> dict[str, Any]:
        return {"high": self.high, "best": self.best, "stale": self.stale, "key": self.key, "higher": self.higher}
