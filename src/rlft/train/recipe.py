"""What a training method supplies to the loop, with defaults: subclass `Recipe` and override what you need.

The loop calls, in order: `before_wrap(model)`, `start(model)` once the model is prepared and any checkpoint is loaded;
per step `prepare_step(model)` (None: the loop draws `gradient_accumulation_steps` micro-batches from
`train_plan`; a list of MicroBatch: the recipe built them, an empty list skips the update), `micro_batch_loss(model,
batch)` per micro-batch (by default `loss(model, batch.inputs)`), `after_optimizer_step(model, step)`; `evaluate` every eval_steps; `state_dict()` and
`save_files(folder)` at each checkpoint (`load_state_dict`, `load_files` on resume). `rlft train` (train/run.py)
calls `close()` when the loop ends, also on failure.
Recipes never print: `messages()` returns warnings for the loop to show, `final_warnings()` those
for the summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch

from rlft.data.batches import BatchPlan, MicroBatch


@dataclass
class LossOutput:
    """A micro-batch's loss *sum* and the loss units it sums over (target tokens, pairs, sequences...): the loop
    divides the accumulated gradient by the units of the whole step, so it equals one large batch's."""

    loss_sum: torch.Tensor
    units: float
    metrics: dict[str, float] = field(default_factory=dict)

    def plus_router_loss(self, router: tuple[torch.Tensor, float] | None) -> LossOutput:
        """With an MoE router's load-balancing loss and its weight (`rlft.models.head.router_loss`; None: as it is): the
        loss per unit gains coef x aux_loss, as transformers' and TRL's losses add it, and `aux_loss` is logged."""
        if router is None:
            return self
        aux, coef = router
        return LossOutput(self.loss_sum + coef * aux * self.units, self.units, {**self.metrics, "aux_loss": float(aux.detach())})


class Recipe:
    name: str = "recipe"
    train_plan: BatchPlan
    draws_per_step: Fraction | int | None = None  # plan batches per optimizer step; None = gradient_accumulation_steps
    plan_rows: tuple[tuple[str, str], ...] = ()  # (name, value) lines the run's plan shows
    prepare_phase = "prepare"  # the `time/...` metric of prepare_step's time

    @property
    def eval_batches(self) -> list[dict[str, Any]]:
        return []

    def before_wrap(self, model: torch.nn.Module) -> None:
        """The model holds its first (or resumed) weights, before DDP wraps or FSDP shards it: copy what you need whole."""

    def start(self, model: torch.nn.Module) -> None:
        """The model is prepared and any checkpoint (and `load_state_dict`) is loaded."""

    def prepare_step(self, model: torch.nn.Module) -> list[MicroBatch] | None:
        """This step's micro-batches where the recipe builds them (online RL), else None: on every step or on none,
        since the loop draws from `train_plan` one step ahead once a step returned None."""
        return None

    def loss(self, model: torch.nn.Module, batch: dict[str, Any]) -> LossOutput:
        """The loss of a micro-batch's inputs (`MicroBatch.inputs`)."""
        raise NotImplementedError

    def micro_batch_loss(self, model: torch.nn.Module, batch: MicroBatch) -> LossOutput:
        """What the loop calls per training micro-batch: `loss` of its inputs."""
        return self.loss(model, batch.inputs)

    def evaluate(self, model: torch.nn.Module, batches: list[dict[str, Any]]) -> dict[str, float]:
        return {}

    def after_optimizer_step(self, model: torch.nn.Module, step: int, changed: bool = True) -> bool:
        """Step `step` (1-based) is done: sync engines and references here. `changed`: it updated the weights (False
        for a step skipped for want of a learning signal, or by fp16's scaler). True asks the loop to start the
        optimizer's state again (rlft.train.optim.reset_state), as at a reference reset in online RL."""
        return False

    def step_metrics(self) -> dict[str, float]:
        return {}

    def epochs_done(self, loop_epochs: float) -> float:
        """Epochs of the data consumed; recipes that own their data cursor override it."""
        return loop_epochs

    def messages(self) -> list[str]:
        """Warnings for the loop to print (once each)."""
        return []

    def reports(self) -> list[str]:
        """Plain lines for the loop to print, e.g. sampled completions (`trl.num_completions_to_print`)."""
        return []

    def final_warnings(self) -> list[str]:
        return []

    def save_files(self, folder: Path) -> None:
        """Write into the checkpoint being saved (the main process only) what `state_dict`'s JSON cannot hold."""

    def saved_files_bytes(self) -> int:
        """About how much `save_files` writes (the disk-room check before the first checkpoint counts it)."""
        return 0

    def load_files(self, folder: Path) -> None:
        """Read `save_files`'s files back on resume (every process), after `load_state_dict`."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def engine_lost(self) -> None:
        """The rollout engine stopped answering: the checkpoint saved next must not need it."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved."""

    def close(self) -> None:
        """Release workers, engines and files."""
