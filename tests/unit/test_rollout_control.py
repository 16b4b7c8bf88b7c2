"""Cosmos-RL's GRPO rollout control without the CLI: the allowed_outdated_steps throttle and its early prompts
(outdated_rollout_fetch_batch_size), on_policy, dynamic sampling's draw limit (max_retry_for_on_policy), the
shared-prefix filter (min_filter_prefix_tokens) and the optimizer reset with the reference.

A fake engine (tests/unit/fake_engines.py: it records each call's prompts and the weight version it sampled with)
stands in for the rollout engine; the real GRPO recipe, producer, feed and weight sync run around it.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaForCausalLM

from rlft.config import build_config
from rlft.config.settings import resolve
from rlft.errors import ConfigError, RolloutError
from rlft.rollout.prefix_filter import maximal_prefixes, shared_prefix_lengths
from rlft.rollout.scoring import make_scores

from fake_engines import VersionedEngine, tiny_llama_model

GROUP = 2


class Scorer:
    """`varies(first_token)`: whether that prompt's group gets rewards that differ (else all 1.0)."""

    needs_policy = False
    names, weights = ["r"], [1.0]

    def __init__(self, varies=lambda first: True):
        self.varies = varies

    def score(self, prompts, rollout, group, extra=None):
        values = [float(c[2]) if self.varies(c[0]) else 1.0 for c in rollout.completion_ids]
        return make_scores(torch.tensor([[v] for v in values]), self.names, self.weights)

    def close(self):
        pass


@pytest.fixture
def tiny_llama() -> LlamaForCausalLM:
    return tiny_llama_model()


def make_recipe(tok, engine, output_dir, scorer=None, micro_batch_size=2, reference=None, **trl):
    from rlft.train.recipes.grpo import GRPORecipe

    cfg = build_config({"base_model": "tiny", "datasets": [{"path": "x.jsonl"}], "rl": "grpo",
                        "micro_batch_size": micro_batch_size, "gradient_accumulation_steps": 1, "max_steps": 8,
                        "output_dir": str(output_dir),
                        "trl": {"num_generations": GROUP, "reward_funcs": ["r.f"], "max_completion_length": 3, **trl}})
    prompts = [{"prompt_ids": [first, 7], "prompt": f"p{first}", "columns": {}} for first in range(3, 19)]

    def make_engine(policy, version):
        engine.version = version
        return engine

    return GRPORecipe(cfg, resolve(cfg), SimpleNamespace(train=prompts, eval=[]), tok, scorer or Scorer(), reference,
                      make_engine=make_engine)


def run(recipe, model, steps: int, first_step: int = 0) -> list[dict]:
    """Per step: its metrics and its rows' weight versions (the window trained on)."""
    out = []
    for step in range(first_step + 1, first_step + steps + 1):
        batches = recipe.prepare_step(model)
        out.append({"metrics": recipe.step_metrics(), "ids": [b.inputs["input_ids"].tolist() for b in batches]})
        recipe.after_optimizer_step(model, step)
    return out


def staleness(steps: list[dict]) -> list[float]:
    return [s["metrics"]["async/staleness/max"] for s in steps]


# ------------------------------------------------------------------------------------------ the throttle


@pytest.mark.parametrize("bound, expected", [(None, [0, 1, 2, 3, 3, 3, 3]), (2, [0, 1, 2, 2, 2, 2, 2]),
                                             (1, [0, 1, 1, 1, 1, 1, 1]), (0, [0, 0, 0, 0, 0, 0, 0])])
def test_the_producer_never_samples_more_than_allowed_outdated_steps_ahead(tok, tiny_llama, tmp_path, bound, expected):
    """prefetch_depth 3 alone trains on batches 3 steps old; the bound makes the producer wait for fresher weights, so
    every batch starts training exactly `bound` steps after the weights that sampled it (no row is dropped: the
    throttle waits instead), and it still samples as far ahead as the bound lets it."""
    engine = VersionedEngine()
    recipe = make_recipe(tok, engine, tmp_path, async_prefetch=True, prefetch_depth=3, allowed_outdated_steps=bound)
    recipe.start(tiny_llama)
    steps = run(recipe, tiny_llama, 7)
    recipe.state_dict()  # a sync point: every batch enqueued has been sampled
    assert staleness(steps) == expected
    assert not any("async/stale_rows_dropped" in s["metrics"] for s in steps)
    if bound is not None:
        assert [s["metrics"]["async/throttled"] for s in steps] == [0.0] + [float(bound < 3)] * 6
    # batch j starts training after step j (one step each), `bound` versions after the weights that sampled it
    assert [j - version for j, (_, version) in enumerate(engine.calls[:7])] == expected
    recipe.close()


def test_the_throttle_counts_every_optimizer_step_of_a_batch(tok, tiny_llama, tmp_path):
    """num_iterations 2: a batch trains 2 steps, so with prefetch_depth 2 the next but one starts 4 steps on; a bound of
    2 holds it until the weights of step 2 are in the engine."""
    engine = VersionedEngine()
    recipe = make_recipe(tok, engine, tmp_path, async_prefetch=True, prefetch_depth=2, allowed_outdated_steps=2,
                         num_iterations=2)
    recipe.start(tiny_llama)
    steps = run(recipe, tiny_llama, 8)
    assert staleness(steps) == [0, 0, 2, 2, 2, 2, 2, 2]
    assert [version for _, version in engine.calls[:4]] == [0, 0, 2, 4]
    recipe.close()


def test_early_prompts_of_a_held_batch_are_sampled_then_dropped_for_age(tok, tiny_llama, tmp_path):
    """outdated_rollout_fetch_batch_size 1: while the throttle (here a bound of 0) holds the next batch, its first
    prompt is sampled at once with the weights there are; the other waits for the fresh weights. The early rows are a
    step too old when trained and are dropped (the bound's safety net), the fresh ones train."""
    engine = VersionedEngine()
    recipe = make_recipe(tok, engine, tmp_path, micro_batch_size=4, async_prefetch=True, prefetch_depth=1,
                         allowed_outdated_steps=0, outdated_rollout_fetch_batch_size=1)
    recipe.start(tiny_llama)
    steps = run(recipe, tiny_llama, 4)
    recipe.state_dict()
    sizes = [len(prompts) for prompts, _ in engine.calls]
    assert sizes[:5] == [2, 1, 1, 1, 1]  # the first batch whole, then each batch's early prompt, then its other one
    assert [version for _, version in engine.calls[:5]] == [0, 0, 1, 1, 2]
    assert [s["metrics"].get("async/stale_rows_dropped", 0.0) for s in steps] == [0.0, GROUP, GROUP, GROUP]
    assert all(len(s["ids"]) == 1 and len(s["ids"][0]) == (4 if i == 0 else GROUP) for i, s in enumerate(steps))
    recipe.close()


def test_a_held_batch_is_saved_and_the_resume_is_exact(tok, tiny_llama, tmp_path):
    """A checkpoint taken while the throttle holds a batch with its early prompts sampled keeps them: the resumed run
    trains on what the uninterrupted one does."""
    settings = dict(micro_batch_size=4, async_prefetch=True, prefetch_depth=2, allowed_outdated_steps=1, vllm_sync_interval=2,
                    outdated_rollout_fetch_batch_size=1)  # weights every 2 steps: a batch stays held past a step

    def straight():
        recipe = make_recipe(tok, VersionedEngine(), tmp_path / "a", **settings)
        recipe.start(tiny_llama)
        steps = run(recipe, tiny_llama, 3)
        recipe.state_dict()
        steps += run(recipe, tiny_llama, 3, first_step=3)
        recipe.close()
        return [s["ids"] for s in steps]

    expected = straight()
    recipe = make_recipe(tok, VersionedEngine(), tmp_path / "b", **settings)
    recipe.start(tiny_llama)
    head = run(recipe, tiny_llama, 3)
    state = json.loads(json.dumps(recipe.state_dict()))  # as the checkpoint stores it
    assert state["feed"]["held"] is not None and state["feed"]["held"]["size"] == 1
    recipe.close()
    resumed = make_recipe(tok, VersionedEngine(), tmp_path / "b", **settings)
    resumed.load_state_dict(state)
    resumed.start(tiny_llama)
    tail = run(resumed, tiny_llama, 3, first_step=3)
    resumed.close()
    assert [s["ids"] for s in head + tail] == expected


# ------------------------------------------------------------------------------------------ on_policy


def test_on_policy_samples_every_batch_with_the_weights_that_train_on_it(tok, tiny_llama, tmp_path):
    engine = VersionedEngine()
    recipe = make_recipe(tok, engine, tmp_path, async_prefetch=True, prefetch_depth=2, on_policy=True)
    assert recipe.settings.allowed_outdated_steps == 0
    recipe.start(tiny_llama)
    steps = run(recipe, tiny_llama, 5)
    assert staleness(steps) == [0.0] * 5
    assert [version for _, version in engine.calls[:5]] == [0, 1, 2, 3, 4]
    recipe.close()


@pytest.mark.parametrize("trl, message", [
    ({"on_policy": True, "vllm_sync_interval": 2}, "trl.on_policy samples every batch with the weights that start "
                                                   "training on it, .* set trl.vllm_sync_interval: 1 \\(it is 2\\)"),
    ({"on_policy": True, "allowed_outdated_steps": 3}, "trl.on_policy is a staleness bound of 0, and "
                                                       "trl.allowed_outdated_steps is 3: keep one of them"),
    ({"on_policy": True, "replay_buffer_size": 4}, "trl.on_policy trains only on rows sampled by the current weights"),
    ({"allowed_outdated_steps": 1, "vllm_sync_interval": 3}, "trl.allowed_outdated_steps = 1 is below "
                                                             "vllm_sync_interval - 1 = 2: .* raise allowed_outdated_steps"),
    ({"outdated_rollout_fetch_batch_size": 2}, "outdated_rollout_fetch_batch_size is how many prompts are sampled while "
                                               "allowed_outdated_steps holds the producer back"),
    ({"outdated_rollout_fetch_batch_size": 2, "async_prefetch": True}, "only happens with trl.async_prefetch: true and"),
    ({"max_retry_for_on_policy": 3}, "max_retry_for_on_policy limits the draws of dynamic sampling, which is off"),
    ({"reset_optimizer_with_reference": False}, "trl.reset_optimizer_with_reference says what a reference reset does to "
                                                "the optimizer, and trl.reference_reset_interval \\(unset or 0\\) makes no "
                                                "reset: set reference_reset_interval, or remove"),
    ({"reset_optimizer_with_reference": True, "reference_reset_interval": 0, "beta": 0.1},
     "trl.reference_reset_interval \\(unset or 0\\) makes no reset"),
    ({"max_retry_for_on_policy": 3, "filter_reward_metric": "r", "dynamic_sampling_max_retries": 2},
     "both limit dynamic sampling's draws"),
])
def test_combinations_that_cannot_run_are_refused(trl, message):
    base = {"base_model": "tiny", "datasets": [{"path": "x.jsonl"}], "rl": "grpo", "micro_batch_size": 4}
    with pytest.raises(ConfigError, match=message):
        build_config({**base, "trl": {"num_generations": 4, "reward_funcs": ["r.f"], **trl}})


def test_a_bound_below_the_prefetch_age_is_a_throttle_not_an_error():
    base = {"base_model": "tiny", "datasets": [{"path": "x.jsonl"}], "rl": "grpo", "micro_batch_size": 4}
    cfg = build_config({**base, "trl": {"num_generations": 4, "reward_funcs": ["r.f"], "async_prefetch": True,
                                        "prefetch_depth": 3, "allowed_outdated_steps": 0, "variant": "dapo",
                                        "outdated_rollout_fetch_batch_size": 1, "max_retry_for_on_policy": 2}})
    assert resolve(cfg).rl.allowed_outdated_steps == 0 and resolve(cfg).rl.max_retry_for_on_policy == 2


# ------------------------------------------------------------------------------------------ max_retry_for_on_policy


def test_max_retry_for_on_policy_stops_the_run_after_that_many_batches_of_prompts(tok, tiny_llama, tmp_path):
    engine = VersionedEngine()
    recipe = make_recipe(tok, engine, tmp_path, scorer=Scorer(varies=lambda first: False), micro_batch_size=4,
                         filter_reward_metric="r", max_retry_for_on_policy=3)
    recipe.start(tiny_llama)
    with pytest.raises(RolloutError, match=r"kept 0 of the 2 prompt groups .* after drawing 6 prompts, 3 x the batch"):
        recipe.prepare_step(tiny_llama)
    assert [len(prompts) for prompts, _ in engine.calls] == [2, 2, 2]  # the batch's prompts, drawn 3 times
    recipe.close()


def test_max_retry_for_on_policy_fills_the_batch_from_later_draws(tok, tiny_llama, tmp_path):
    """Only the groups of prompts 3 and 4 vary; with no limit the producer draws until both are in the batch, wherever
    the epoch's order put them."""
    engine = VersionedEngine()
    recipe = make_recipe(tok, engine, tmp_path, scorer=Scorer(varies=lambda first: first in (3, 4)), micro_batch_size=4,
                         filter_reward_metric="r", max_retry_for_on_policy=0)
    recipe.start(tiny_llama)
    recipe.fill_queue(tiny_llama)
    assert sorted({row.prompt_ids[0] for row in recipe.queue.windows[0]}) == [3, 4]
    assert recipe.metrics.batch["dynamic_sampling/retries"] == len(engine.calls) - 1
    assert recipe.metrics.batch["frac_reward_zero_std"] == 0.0
    recipe.close()


def test_without_a_limit_a_batch_that_never_fills_stops_after_an_epoch(tok, tiny_llama, tmp_path):
    engine = VersionedEngine()
    recipe = make_recipe(tok, engine, tmp_path, scorer=Scorer(varies=lambda first: False), micro_batch_size=4,
                         filter_reward_metric="r", max_retry_for_on_policy=-1)
    recipe.start(tiny_llama)
    with pytest.raises(RolloutError, match=r"after drawing 18 prompts, an epoch of prompts"):
        recipe.prepare_step(tiny_llama)
    recipe.close()


# ------------------------------------------------------------------------------------------ the shared-prefix filter


def test_maximal_prefixes_are_the_deepest_ones_shared_by_two_or_more():
    completions = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6], [7, 8], [7, 8]]
    assert sorted(maximal_prefixes(completions, 1)) == [(2, [3, 4]), (3, [0, 1])]
    assert sorted(maximal_prefixes(completions, 3)) == [(3, [0, 1])]
    assert maximal_prefixes([[1, 2], [3]], 1) == [] and maximal_prefixes([[1, 2]], 1) == []
    assert maximal_prefixes([[1, 2], [1, 2, 3]], 1) == [(2, [0, 1])]  # one completion is the prefix itself


def test_shared_prefix_lengths_mask_a_prefix_whose_completions_score_differently():
    completions = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6], [9], [1, 2, 7, 0], [1, 2, 0], [5, 5, 5], [5, 5, 5]]
    rewards = [1.0, 0.0, 1.0, 1.0, 1.0, 0.0, float("nan"), float("nan")]
    # group 1: [1 2 3] is shared by rows 0, 1 (rewards differ); group 2: [1 2] by rows 4, 5 (row 5 is the prefix plus
    # its end token 0: it keeps its tokens); rows 6, 7 share everything and tie (both unscorable)
    assert shared_prefix_lengths(completions, rewards, 4, 2, ends=[0]) == [3, 3, 0, 0, 2, 0, 0, 0]
    assert shared_prefix_lengths(completions, rewards, 4, 4, ends=[0]) == [0] * 8
    assert shared_prefix_lengths(completions, rewards, 4, 0, ends=[0]) == [0] * 8
    assert shared_prefix_lengths(completions, [1.0, 1.0] + rewards[2:], 4, 2, ends=[0])[:2] == [0, 0]


def test_the_filter_takes_the_prefix_out_of_the_loss_mask(tok, tiny_llama, tmp_path):
    """Every group's completions share [p0, 20 + version] and score 10 and 11: those two tokens leave the loss."""
    recipe = make_recipe(tok, VersionedEngine(), tmp_path, min_filter_prefix_tokens=2)
    recipe.start(tiny_llama)
    recipe.fill_queue(tiny_llama)
    rows = recipe.queue.windows[0]
    assert [row.loss_mask for row in rows] == [[0, 0, 1], [0, 0, 1]]
    assert recipe.metrics.batch["prefix_filter/masked_tokens"] == 4.0
    assert recipe.metrics.batch["prefix_filter/masked_rows"] == 2.0
    recipe.close()
    plain = make_recipe(tok, VersionedEngine(), tmp_path / "plain", min_filter_prefix_tokens=3)
    plain.start(tiny_llama)
    plain.fill_queue(tiny_llama)
    assert [row.loss_mask for row in plain.queue.windows[0]] == [[1, 1, 1], [1, 1, 1]]
    plain.close()


# ------------------------------------------------------------------------------------------ the optimizer reset


def adam_after_steps(model, steps: int) -> torch.optim.AdamW:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(steps):
        model(torch.tensor([[3, 4, 5]]), labels=torch.tensor([[3, 4, 5]])).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return optimizer


def test_reset_state_gives_a_new_optimizers_state_and_moves_no_weight(tiny_llama):
    """After reset_state the moments are zero and the step count 0, the weights untouched, and the next step is the
    first step of a new optimizer; a checkpoint save (torch.distributed.checkpoint) finds the state made and keeps it."""
    import copy

    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from rlft.train.optim import reset_state

    optimizer = adam_after_steps(tiny_llama, 2)
    weights = {k: v.clone() for k, v in tiny_llama.state_dict().items()}
    reset_state(tiny_llama, optimizer)
    assert all(torch.equal(v, weights[k]) for k, v in tiny_llama.state_dict().items())
    states = list(optimizer.state.values())
    assert len(states) == sum(1 for p in tiny_llama.parameters())
    assert all(float(s["step"]) == 0 and not s["exp_avg"].any() and not s["exp_avg_sq"].any() for s in states)
    assert all(g["lr"] == 1e-2 and g["weight_decay"] == 0.1 for g in optimizer.param_groups)
    get_optimizer_state_dict(tiny_llama, optimizer)  # what a checkpoint save calls: the state exists, nothing is stepped
    assert all(float(s["step"]) == 0 for s in optimizer.state.values())

    fresh_model = copy.deepcopy(tiny_llama)
    fresh = torch.optim.AdamW(fresh_model.parameters(), lr=1e-2, weight_decay=0.1)
    for model, opt in ((tiny_llama, optimizer), (fresh_model, fresh)):
        model(torch.tensor([[3, 4, 5]]), labels=torch.tensor([[3, 4, 5]])).loss.backward()
        opt.step()
    for (name, value), other in zip(tiny_llama.named_parameters(), fresh_model.parameters()):
        assert torch.equal(value, other), name


@pytest.mark.parametrize("reset_optimizer", [True, False])
def test_the_optimizer_resets_exactly_at_a_reference_reset(tok, tiny_llama, tmp_path, reset_optimizer):
    """reference_reset_interval 3: the recipe asks the loop to reset the optimizer after steps 3 and 6 only (unless
    reset_optimizer_with_reference is false); the loop's reset then leaves it as a new one."""
    from rlft.models.frozen import FrozenPolicy
    from rlft.train.optim import reset_state

    recipe = make_recipe(tok, VersionedEngine(), tmp_path, reference=FrozenPolicy.copy_of(tiny_llama), beta=0.1,
                         reference_reset_interval=3, reset_optimizer_with_reference=reset_optimizer)
    recipe.start(tiny_llama)
    optimizer = adam_after_steps(tiny_llama, 1)
    asked = []
    for step in range(1, 8):
        recipe.prepare_step(tiny_llama)
        if recipe.after_optimizer_step(tiny_llama, step):
            asked.append(step)
            reset_state(tiny_llama, optimizer)
            assert all(float(s["step"]) == 0 and not s["exp_avg"].any() for s in optimizer.state.values())
    assert asked == ([3, 6] if reset_optimizer else [])
    recipe.close()


def test_a_soft_reference_update_is_not_a_reset(tok, tiny_llama, tmp_path):
    from rlft.models.frozen import FrozenPolicy

    recipe = make_recipe(tok, VersionedEngine(), tmp_path, reference=FrozenPolicy.copy_of(tiny_llama), beta=0.1,
                         sync_ref_model=True, ref_model_sync_steps=1)
    recipe.start(tiny_llama)
    for step in range(1, 4):
        recipe.prepare_step(tiny_llama)
        assert recipe.after_optimizer_step(tiny_llama, step) is False
    recipe.close()


def test_schedule_free_optimizers_refuse_the_optimizer_reset():
    base = {"base_model": "tiny", "datasets": [{"path": "x.jsonl"}], "rl": "grpo", "micro_batch_size": 4,
            "optimizer": "schedule_free_adamw"}
    trl = {"num_generations": 4, "reward_funcs": ["r.f"], "beta": 0.1, "reference_reset_interval": 5}
    with pytest.raises(ConfigError, match="reset_optimizer_with_reference .* schedule_free_adamw keeps"):
        build_config({**base, "trl": trl})
    build_config({**base, "trl": {**trl, "reset_optimizer_with_reference": False}})
