"""How many optimizer steps `num_epochs` makes (`rlft.train.step_counts.total_steps_for`): num_epochs of data, rounded up to
one step, for the micro-batch recipes and for the GRPO family, whose plan batches each feed several steps."""

from fractions import Fraction
from types import SimpleNamespace

import pytest

from rlft.config.settings import resolve
from rlft.data.batches import BatchPlan, PlanCursor
from rlft.train.step_counts import steps_per_epoch, total_steps_for


def _cfg(**keys):
    """The run settings the step counts read (`rlft.config.settings.RunSettings`)."""
    return SimpleNamespace(**{"max_steps": None, "num_epochs": 1.0, "streamed": False, **keys})


@pytest.mark.parametrize("epochs, steps", [(1, 3), (3, 8), (0.5, 2), (2.5, 7)])
def test_num_epochs_of_micro_batches_rounded_up_to_one_step(epochs, steps):
    """10 micro-batches per epoch, 4 per step: 3 epochs are 30 micro-batches, 8 steps (32), not 3 x 3 = 9 steps (36,
    3.6 epochs, were each epoch rounded up on its own). The loop's cursor then ends where asked."""
    cfg = _cfg(num_epochs=epochs)
    assert total_steps_for(cfg, 10, 4) == steps and steps_per_epoch(10, 4) == 3
    cursor = PlanCursor(BatchPlan(list(range(10)), 1, seed=0, pad_id=0))
    for _ in range(steps * 4):
        cursor.next_indices()
    assert epochs <= cursor.epochs_done < epochs + 0.4  # at most one window (4 of 10 micro-batches) more
    assert total_steps_for(_cfg(num_epochs=epochs, max_steps=5), 10, 4) == 5  # max_steps wins


def test_a_grpo_epoch_counts_the_steps_each_plan_batch_feeds():
    """A plan batch is one step's prompts; num_iterations reuses each generation batch, and a generation_batch_size
    of k steps' rows splits into k windows: an epoch of 6 plan batches is 6 x 2 x 2 = 24 steps with both (it was 6)."""
    from rlft.config import build_config
    from rlft.data.tokenizer import byte_tokenizer
    from rlft.train.recipes.grpo import GRPORecipe

    prompts = [{"prompt_ids": [3, 4], "prompt": "p", "columns": {}}] * 12
    for trl, draws in (({}, Fraction(1)), ({"num_iterations": 2}, Fraction(1, 2)),
                       ({"num_iterations": 2, "generation_batch_size": 16}, Fraction(1, 4)),
                       ({"steps_per_generation": 2}, Fraction(1))):
        cfg = build_config({"base_model": "tiny", "datasets": [{"path": "x.jsonl"}], "rl": "grpo", "micro_batch_size": 4,
                            "gradient_accumulation_steps": 2, "num_epochs": 1,
                            "trl": {"num_generations": 4, "reward_funcs": ["r.f"], **trl}})
        recipe = GRPORecipe(cfg, resolve(cfg), SimpleNamespace(train=prompts, eval=[]), byte_tokenizer(), None, None)
        assert recipe.draws_per_step == draws, trl
        assert total_steps_for(resolve(cfg).run, len(recipe.train_plan), recipe.draws_per_step) == len(recipe.train_plan) / draws


def _recipe(rows: int, rank: int = 0, world: int = 1):
    return SimpleNamespace(train_plan=BatchPlan(list(range(rows)), 1, seed=0, pad_id=0, shard=(rank, world)),
                           draws_per_step=None)


def test_a_resume_counts_the_steps_the_micro_batches_left_take_now():
    """The steps done plus the micro-batches left at today's accumulation and process count: unchanged (the same total
    as a fresh count), another accumulation on as many processes, a second resume after 2 -> 1 processes, and the
    GRPO family and max_steps (left as counted)."""
    from rlft.train.checkpoint import TrainState
    from rlft.train.step_counts import total_steps_resumed

    cfg = _cfg(num_epochs=2)  # gradient_accumulation_steps 2
    same = TrainState(global_step=3, epoch=0, batch_in_epoch=6, world_size=1)  # 12 micro-batches an epoch, 2 a step
    assert total_steps_resumed(cfg, 2, _recipe(12), same, 1, total_steps_for(cfg, 12, 2)) == 12 == total_steps_for(cfg, 12, 2)
    smaller = _cfg(num_epochs=2)  # gradient_accumulation_steps 1: 6 done, 18 left, 1 a step
    assert total_steps_resumed(smaller, 1, _recipe(12), same, 1, total_steps_for(smaller, 12, 1)) == 3 + 18
    # written by 1 process after an earlier 2 -> 1 resume: 2 steps of 2 processes (4 micro-batches), then 4 of 1
    again = TrainState(global_step=6, epoch=0, batch_in_epoch=8, world_size=1)
    assert total_steps_resumed(smaller, 1, _recipe(12), again, 1, 24) == 6 + 16
    grpo = SimpleNamespace(train_plan=_recipe(12).train_plan, draws_per_step=Fraction(1, 2))
    assert total_steps_resumed(cfg, 2, grpo, same, 2, 99) == 99
    assert total_steps_resumed(_cfg(max_steps=7), 4, _recipe(12), same, 2, 7) == 7


def test_an_epoch_end_on_uneven_shards_is_not_counted_twice():
    """11 micro-batches on 2 processes: 6 each, rank 1's last one padding. A checkpoint at the end of epoch 0 holds
    6; resharded to 1 process that is 12, past the plan's 11: the cursor moves to the next epoch, and the count takes
    the whole second epoch (11 micro-batches, 6 steps of 2), none of it skipped."""
    from rlft.train.checkpoint import TrainState
    from rlft.train.step_counts import total_steps_resumed

    cfg = _cfg(num_epochs=2)  # gradient_accumulation_steps 2
    written = TrainState(global_step=3, epoch=0, batch_in_epoch=6, world_size=2)
    assert total_steps_resumed(cfg, 2, _recipe(11), written, 1, total_steps_for(cfg, 11, 2)) == 3 + 6


def test_a_resume_with_another_micro_batch_size_goes_on_from_the_same_rows():
    """40 rows in micro-batches of 4 (10 an epoch), saved after 5 (rows 0-19 of the epoch's order). Resumed with
    micro-batches of 8 (5 an epoch) it goes on at micro-batch 3 (rows 24-39 of the same order: 20-23 share a batch with
    rows already trained, so they are skipped rather than trained twice), and the run still ends with its epoch."""
    from rlft.train.checkpoint import TrainState
    from rlft.train.step_counts import continue_position, total_steps_resumed

    cfg = _cfg(num_epochs=1)  # micro_batch_size 8, gradient_accumulation_steps 1
    recipe = SimpleNamespace(train_plan=BatchPlan(list(range(40)), 8, seed=0, pad_id=0), draws_per_step=None)
    written = TrainState(global_step=5, epoch=0, batch_in_epoch=5, world_size=1, plan_batches=10, total_steps=8)
    assert total_steps_resumed(cfg, 1, recipe, written, 1, total_steps_for(cfg, 5, 1)) == 5 + 2
    note = continue_position(cfg, written, recipe, 1)
    assert (written.epoch, written.batch_in_epoch, written.plan_batches) == (0, 3, 5)
    assert "the checkpoint's data made 10 micro-batches an epoch, this run's makes 5" in note
    order, before = recipe.train_plan.epoch_order(0), BatchPlan(list(range(40)), 4, seed=0, pad_id=0).epoch_order(0)
    assert sum(order[3:], []) == sum(before[6:], [])  # the same permutation: rows 24-39, none of them trained before
    # the plan and the process count changed together: one rounding in global units (4 -> 5 of 101, on 1 process)
    both = TrainState(global_step=1, epoch=0, batch_in_epoch=1, world_size=4, plan_batches=100, total_steps=99)
    wider = SimpleNamespace(train_plan=BatchPlan(list(range(101)), 1, seed=0, pad_id=0), draws_per_step=None)
    continue_position(cfg, both, wider, 1)
    assert both.batch_in_epoch == 5
    unchanged = TrainState(global_step=5, epoch=0, batch_in_epoch=3, world_size=1, plan_batches=5)
    assert continue_position(cfg, unchanged, recipe, 1) == "" and unchanged.batch_in_epoch == 3
    older = TrainState(global_step=5, epoch=0, batch_in_epoch=3, world_size=1)  # written before plan_batches: as it was
    assert continue_position(cfg, older, recipe, 1) == "" and older.batch_in_epoch == 3
