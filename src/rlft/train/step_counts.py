"""How many optimizer steps a run takes, how often it evaluates and saves, and where a resumed run goes on in its
data: pure functions of the run's settings and the plan."""

from __future__ import annotations

import math
from fractions import Fraction

from rlft.config.settings.training import RunSettings
from rlft.data.batches import PlanCursor
from rlft.train.checkpoint import TrainState
from rlft.train.recipe import Recipe


def steps_per_epoch(micro_batches_per_epoch: int, draws_per_step: Fraction | int) -> int:
    """Optimizer steps in one epoch of `micro_batches_per_epoch` plan batches, `draws_per_step` per step
    (gradient_accumulation_steps, or the recipe's: a fraction where one plan batch feeds several steps), rounded up."""
    return max(1, math.ceil(micro_batches_per_epoch / Fraction(draws_per_step)))


def epochs_steps(run: RunSettings, micro_batches_per_epoch: int, draws_per_step: Fraction | int) -> int:
    """Optimizer steps of num_epochs of plan batches (max_steps aside), rounded up to a whole step. A step's window of
    micro-batches runs on into the next epoch's order rather than ending short at an epoch's end, so rounding each
    epoch up instead would train the first batches of one more epoch per epoch. A stream has no epochs: its run's
    max_steps stand for one, whatever num_epochs says (Axolotl counts max_steps)."""
    if run.streamed:
        return run.max_steps
    return max(1, math.ceil(Fraction(str(run.num_epochs)) * micro_batches_per_epoch / Fraction(draws_per_step)))


def total_steps_for(run: RunSettings, micro_batches_per_epoch: int, draws_per_step: Fraction | int) -> int:
    """Optimizer steps of the run: max_steps, else `epochs_steps`."""
    return run.max_steps or epochs_steps(run, micro_batches_per_epoch, draws_per_step)


def plan_batches(recipe: Recipe) -> int:
    """Micro-batches an epoch of the loop's plan over all processes (0: the recipe draws its own, or streams)."""
    return getattr(recipe.train_plan, "global_batches", 0) if recipe.draws_per_step is None else 0


def total_steps_resumed(run: RunSettings, accumulation: int, recipe: Recipe, written: TrainState, world: int,
                        total_steps: int) -> int:
    """A resumed num_epochs run whose recipe draws from the loop's cursor (the GRPO family's prompts are not split by
    process): the steps done plus the steps that the micro-batches left take at today's process count and
    accumulation. `total_steps_for` alone counts the whole run at today's global batch, and trains past (or stops
    short of) the last epoch when the process count or `gradient_accumulation_steps` changed, at this resume or an
    earlier one. With nothing changed both give the same count."""
    if run.max_steps or recipe.draws_per_step is not None:
        return total_steps
    cursor = PlanCursor(recipe.train_plan, written.epoch, written.batch_in_epoch)
    cursor.reshard(written.world_size, world, written.plan_batches, plan_batches(recipe))
    plan = len(recipe.train_plan)
    # an epoch's end on uneven shards: the padding batch resharded can count past the plan's length
    left = Fraction(str(run.num_epochs)) * plan - (cursor.epoch * plan + min(cursor.batch_in_epoch, plan))
    return written.global_step + max(0, math.ceil(left / accumulation))


def continue_position(run: RunSettings, state: TrainState, recipe: Recipe, world: int) -> str:
    """Moves a resumed run's data position (read from its checkpoint into `state`) to where it goes on in today's plan,
    and says what changed: the plan (another micro_batch_size, sequence_len, packing or data: the same share of the
    epoch) and the process count (the global micro-batches consumed kept, the optimizer state re-sharded)."""
    note, now = "", plan_batches(recipe)
    replanned = bool(state.plan_batches and now and state.plan_batches != now)
    before = state.batch_in_epoch
    cursor = PlanCursor(recipe.train_plan, state.epoch, state.batch_in_epoch)
    cursor.reshard(state.world_size, world, state.plan_batches, now)
    state.batch_in_epoch = cursor.batch_in_epoch
    if replanned:
        note += (f" (the checkpoint's data made {state.plan_batches} micro-batches an epoch, this run's makes {now}: "
                 "micro_batch_size, sequence_len, packing or the data changed. It goes on from the same share of epoch "
                 f"{state.epoch + 1}, global micro-batch {state.batch_in_epoch * world} of today's plan, rounded up; "
                 "today's batches are not those of the checkpoint's plan, so rows around that point may be skipped or "
                 "trained again)")
    if state.world_size != world:
        skipped = 0 if replanned else state.batch_in_epoch * world - before * state.world_size
        note += (f" (written by {state.world_size} processes, continued by {world}: optimizer state re-sharded"
                 + (f", {skipped} micro-batch(es) of this epoch skipped to keep the split even" if skipped else "")
                 + (f"; {state.total_steps} steps in all)" if not run.max_steps else ")"))
    state.plan_batches, state.world_size = now, world
    return note


def every(steps: int | None, per_epoch: int | None, epoch_steps: int) -> int | None:
    """Steps between evals (or saves): `eval_steps`, or an epoch's steps split `evals_per_epoch` ways (at least 1)."""
    if steps:
        return steps
    return max(1, epoch_steps // per_epoch) if per_epoch else None


def schedules(run: RunSettings, epoch_steps: int) -> tuple[int | None, int | None]:
    """Steps between evaluations and between saves (None: none before the end): the *_steps and *_per_epoch keys,
    or `eval_strategy` / `save_strategy: epoch`, once an epoch, or `save_every_n_epochs`, once every N epochs."""
    def per_epoch(count, strategy):
        return count or (1 if strategy == "epoch" else None)

    saves = run.save_every_n_epochs * epoch_steps if run.save_every_n_epochs else \
        every(run.save_steps, per_epoch(run.saves_per_epoch, run.save_strategy), epoch_steps)
    return every(run.eval_steps, per_epoch(run.evals_per_epoch, run.eval_strategy), epoch_steps), saves
