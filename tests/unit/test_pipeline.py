"""The online-RL pipeline without the CLI: typed rollouts, the engine, weight sync, the producer, the frozen policy.

A fake engine and a fake scorer drive the producer and the GRPO recipe's queue; a real tiny policy checks that
sampling never touches the module being trained.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlft.config.settings import resolve
from rlft.data.batches import BatchPlan, PlanCursor
from rlft.errors import CheckpointError, RolloutError
from rlft.models.frozen import FrozenPolicy
from rlft.models.weights import merged_weights, trainable_weights
from rlft.rollout.local import LocalEngine
from rlft.rollout.producer import RolloutProducer
from rlft.rollout.scoring import make_scores
from rlft.rollout.types import Rollout, SamplingParams
from rlft.train.recipes.grpo import training_rows
from rlft.train.weight_sync import WeightSync

peft = pytest.importorskip("peft")
GROUP = 2


@pytest.fixture
def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=64, max_position_embeddings=64, pad_token_id=0, eos_token_id=1)
    return LlamaForCausalLM(config)


def lora(model) -> torch.nn.Module:
    return peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))


# ------------------------------------------------------------------------------------------ fakes


class FakeEngine:
    """Completion of prompt p, sample j: [p[0], j + 10]; versioned like a real engine."""

    def __init__(self):
        self.version, self.calls = 0, 0

    def generate(self, prompt_ids, params, num_samples=1, seed=None):
        self.calls += 1
        expanded = [p for p in prompt_ids for _ in range(num_samples)]
        completions = [[p[0], j % num_samples + 10] for j, p in enumerate(expanded)]
        return Rollout(expanded, completions, [[-0.5, -0.25] for _ in expanded], [False] * len(expanded),
                       weight_versions=[self.version] * len(expanded))

    def load_weights(self, weights, version):
        self.version = version

    def health(self):
        return {"ok": True, "version": self.version}


class FakeScorer:
    """Reward = the second completion token when the prompt's first token is odd (varies in a group), else 1.0."""

    needs_policy = False
    names, weights = ["r"], [1.0]

    def score(self, prompts, rollout, group, extra=None):
        values = [[float(c[1]) if c[0] % 2 else 1.0] for c in rollout.completion_ids]
        return make_scores(torch.tensor(values), self.names, self.weights)

    def close(self):
        pass


def settings(**overrides) -> SimpleNamespace:
    base = dict(num_generations=GROUP, prompts_per_step=2, steps_per_generation=1, filter_reward_metric=(),
                dynamic_sampling_max_retries=0, max_retry_for_on_policy=None, scale_rewards="group",
                multi_objective_aggregation="sum_then_normalize", advantage_estimator="grpo", skip_zero_advantage_batches=True,
                overlong_penalty=False, rollout_func=None, max_completion_length=4, streaming=False, streaming_min_groups=1)
    return SimpleNamespace(**{**base, **overrides})


def prompt_cursor(firsts: list[int], per_batch: int = 2) -> PlanCursor:
    rows = [{"prompt_ids": [first, 7], "prompt": f"p{first}", "columns": {}} for first in firsts]
    return PlanCursor(BatchPlan(rows, per_batch, seed=0, pad_id=0, collate=lambda r: {"prompts": r}))


def producer(engine=None, firsts=(3, 5, 2, 4), rollout_func=None, **overrides) -> RolloutProducer:
    tokenizer = SimpleNamespace(eos_token_id=1)
    return RolloutProducer(engine or FakeEngine(), FakeScorer(), prompt_cursor(list(firsts)), settings(**overrides), tokenizer,
                           SamplingParams(max_new_tokens=4), rollout_func=rollout_func)


# ------------------------------------------------------------------------------------------ typed rollouts


def test_rollout_select_and_concat_keep_every_field():
    rollout = Rollout([[1], [2], [3]], [[4, 5], [6], [7, 8]], [[-1.0, -2.0], [-3.0], [-4.0, -5.0]], [False, True, False],
                      env_mask=[[1, 0], [1], [0, 1]], weight_versions=[3, 3, 4])
    picked = Rollout.concat([rollout.select([2]), rollout.select([0])])
    assert picked.env_mask == [[0, 1], [1, 0]] and picked.weight_versions == [4, 3] and picked.logprobs[0] == [-4.0, -5.0]
    with pytest.raises(ValueError, match="env_mask"):
        Rollout([[1]], [[2]], [[0.0]], [False], env_mask=[[1], [1]])


def test_scores_of_chunks_add_their_failure_counts_and_average_the_rest():
    """Streamed scoring and dynamic-sampling draws concatenate chunks: `rewards/<fn>/failures` and `/unscorable` add
    up (only the last chunk's were kept), the scorer's own metrics are averaged over the rows."""
    from rlft.rollout.types import Scores

    def chunk(rows, metrics):
        return Scores(torch.zeros(rows, 1), ["f"], torch.ones(1), torch.zeros(rows), metrics, [{"function": "f"}] * rows)

    joined = Scores.concat([chunk(3, {"rewards/f/failures": 2.0, "rewards/f/unscorable": 4.0, "env/turns": 2.0}),
                            chunk(1, {"rewards/f/failures": 0.0, "rewards/f/unscorable": 0.0, "env/turns": 6.0})])
    assert joined.metrics == {"rewards/f/failures": 2.0, "rewards/f/unscorable": 4.0, "env/turns": 3.0}
    assert len(joined.failures) == 4 and joined.values.shape == (4, 1)


# ------------------------------------------------------------------------------------------ producer


def test_producer_yields_prompt_major_groups_with_versions_and_advantages():
    engine = FakeEngine()
    engine.load_weights({}, version=7)
    batch = producer(engine).produce()
    assert [r[0] for r in batch.rollout.prompt_ids] == [p["prompt_ids"][0] for p in batch.prompts for _ in range(GROUP)]
    assert batch.rollout.weight_versions == [7] * 4
    rewards = batch.scores.total.view(-1, GROUP)
    expected = (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-4)
    assert torch.allclose(batch.advantages, expected.flatten(), atol=1e-5)
    assert "time/generate" in batch.metrics.step
    assert batch.metrics.batch["reward"] == pytest.approx(float(batch.scores.total.mean()))


def test_reroll_injections_are_counted_on_the_batch_that_holds_them():
    """With prefetch, draws run ahead of scoring: the count travels with the sampled batch, not with the next one scored."""
    made = producer()
    counts = iter([1, 0])
    made.inject = lambda prompts: (prompts, next(counts))
    first, second = made.sample(*made.draw()), made.sample(*made.draw())  # drawn before either is scored
    assert made.score(first).metrics.batch["reroll_injected"] == 1.0
    assert "reroll_injected" not in made.score(second).metrics.batch


def test_dynamic_sampling_drops_constant_groups_and_draws_more():
    # prompts 3 and 5 vary (odd first token), 2 and 4 are constant: draws go on until both odd ones are kept
    made = producer(firsts=(3, 2, 5, 4), filter_reward_metric=("reward",), dynamic_sampling_max_retries=5)
    batch = made.produce()
    retries = int(batch.metrics.batch["dynamic_sampling/retries"])
    assert sorted(p["prompt_ids"][0] for p in batch.prompts) == [3, 5] and made.engine.calls == 1 + retries
    assert batch.dropped == {"zero_variance": 2 * (1 + retries) - 2}
    assert len(batch.rollout) == 2 * GROUP and batch.scores.values.shape == (4, 1)
    assert all(c[0] in (3, 5) for c in batch.rollout.completion_ids)


def test_dynamic_sampling_retries_are_bounded():
    made = producer(firsts=(2, 4, 6, 8), filter_reward_metric=("r",), dynamic_sampling_max_retries=1)
    batch = made.produce()
    assert made.engine.calls == 2 and batch.metrics.batch["dynamic_sampling/retries"] == 1.0
    assert batch.skip  # nothing varied: trained on the last draw, every advantage 0, the update is skipped


def test_unknown_filter_metric_names_the_choices():
    with pytest.raises(RolloutError, match="not a reward function name"):
        producer(filter_reward_metric=("nope",)).produce()


def test_rollout_func_env_mask_survives_dynamic_sampling_and_is_never_trained_on():
    """The bug this pipeline fixes: env_mask was lost when rollouts were selected or concatenated."""

    def rollout_func(prompts, trainer):
        # token 2 of every completion is a tool's output (env_mask 0); groups of even prompts get constant rewards
        count = len(prompts)
        firsts = [int(prompt[1:]) for prompt in prompts]
        return {"prompt_ids": [[first, 7] for first in firsts],
                "completion_ids": [[first, 10 + i % GROUP, 1] for i, first in enumerate(firsts)],
                "logprobs": [[-0.1, 0.0, -0.2] for _ in range(count)],
                "env_mask": [[1, 0, 1] for _ in range(count)]}

    made = producer(firsts=(3, 5, 2, 4), rollout_func=rollout_func, filter_reward_metric=("reward",),
                    dynamic_sampling_max_retries=2)
    batch = made.produce()
    assert sorted(p["prompt_ids"][0] for p in batch.prompts) == [3, 5]  # rows were selected and concatenated
    assert all(mask == [1, 0, 1] for mask in batch.rollout.env_mask)
    rows = training_rows(batch, mask_truncated=False)
    assert all(row.loss_mask == [1, 0, 1] and row.sampling_logps == [-0.1, 0.0, -0.2] for row in rows)


def test_a_rollout_func_completion_ending_at_any_end_id_is_not_truncated():
    """The run stops at the tokenizer's EOS (1) and at the generation config's or the config's stop ids (here 6): a
    completion of a rollout_func that ends at 6 was marked truncated (only EOS counted)."""
    def rollout_func(prompts, trainer):
        count = len(prompts)
        return {"prompt_ids": [[3, 7]] * count, "completion_ids": [[9, end] for end in (1, 6, 8, 8)] * (count // 4),
                "logprobs": [[-0.1, -0.2]] * count}

    made = producer(rollout_func=rollout_func)
    made.sampling = SamplingParams(max_new_tokens=4, stop_token_ids=(1, 6))
    rollout, _ = made._user_rollout([{"prompt_ids": [3, 7], "prompt": "p3", "columns": {}}] * 2)
    assert rollout.truncated[:4] == [False, False, True, True]


def test_rollout_func_with_a_short_env_mask_is_refused():
    def rollout_func(prompts, trainer):
        count = len(prompts)
        return {"prompt_ids": [[3, 7]] * count, "completion_ids": [[9, 10, 1]] * count,
                "logprobs": [[-0.1, 0.0, -0.2]] * count, "env_mask": [[1, 0]] * count}

    with pytest.raises(RolloutError, match=r"env_mask\[0\] with 2 entries for 3 completion tokens"):
        producer(rollout_func=rollout_func).produce()


def test_producer_never_touches_the_trained_module(tiny_llama):
    policy = lora(tiny_llama).train()
    engine = LocalEngine.from_policy(policy, pad_id=0, version=0)
    calls = []
    policy.register_forward_pre_hook(lambda module, args: calls.append(1))  # after the copy: the engine's has none
    made = RolloutProducer(engine, FakeScorer(), prompt_cursor([3, 5]), settings(), SimpleNamespace(eos_token_id=1),
                           SamplingParams(max_new_tokens=3))
    before = {k: v.clone() for k, v in trainable_weights(policy).items()}
    made.produce()
    assert calls == [] and policy.training and not policy.base_model.model.model.layers[0].self_attn.q_proj.disable_adapters
    assert all(torch.equal(before[k], v) for k, v in trainable_weights(policy).items())


# ------------------------------------------------------------------------------------------ engine and weight sync


def test_local_engine_shares_frozen_weights_and_copies_the_trained_ones(tiny_llama):
    policy = lora(tiny_llama)
    engine = LocalEngine.from_policy(policy, pad_id=0)
    base = dict(policy.named_parameters())
    own = dict(engine.model.named_parameters())
    frozen = [n for n, p in base.items() if not p.requires_grad]
    trained = [n for n, p in base.items() if p.requires_grad]
    assert all(own[n] is base[n] for n in frozen)
    assert all(own[n].data_ptr() != base[n].data_ptr() for n in trained) and not engine.model.training
    with torch.no_grad():
        for name in trained:
            base[name].add_(1.0)
    assert not torch.equal(own[trained[0]], base[trained[0]])  # the engine still samples with version 0
    sync = WeightSync(engine)
    assert sync.due(1)
    sync.prepare(policy, 1)()
    assert engine.version == 1
    assert all(torch.equal(own[n], base[n]) for n in trained)
    rollout = engine.generate([[2, 3]], SamplingParams(max_new_tokens=2, temperature=0.0), 2)
    assert rollout.weight_versions == [1, 1]
    with pytest.raises(RolloutError, match="no parameter"):
        engine.load_weights({"nope.weight": torch.zeros(1)}, version=2)


def test_a_weight_snapshot_keeps_the_weights_of_its_step_and_a_load_at_once_reads_them_as_they_are(tiny_llama):
    """With async prefetch the load runs later, while training goes on: it loads the weights of the step it was prepared
    at (a snapshot). A synchronous feed loads at once, before the next update: no snapshot, the weights themselves."""
    policy = lora(tiny_llama)
    trained = [name for name, p in policy.named_parameters() if p.requires_grad]
    for snapshot in (True, False):
        engine = LocalEngine.from_policy(policy, pad_id=0)
        at_step = {name: p.detach().clone() for name, p in policy.named_parameters() if p.requires_grad}
        load = WeightSync(engine).prepare(policy, 1, snapshot=snapshot)
        with torch.no_grad():
            for name, p in policy.named_parameters():
                if p.requires_grad:
                    p.add_(1.0)  # the next update, before the load runs
        load()
        own, now = dict(engine.model.named_parameters()), dict(policy.named_parameters())
        expected = at_step if snapshot else {name: now[name] for name in trained}
        assert engine.version == 1 and all(torch.equal(own[name], expected[name]) for name in trained)


def test_a_push_to_an_engine_that_shares_the_policy_s_tensors_sends_only_the_version(tiny_llama):
    engine = LocalEngine.from_policy(tiny_llama, pad_id=0, share=True)

    def refuse(weights, version):
        raise AssertionError("a sharing engine was sent weights")

    engine.load_weights = refuse
    sync = WeightSync(engine)
    sync.prepare(tiny_llama, 2)()
    assert engine.version == 2 and sync.pushed == 2
    assert all(p.requires_grad for p in tiny_llama.parameters())  # the policy's tensors still train


def test_weight_sync_refuses_an_engine_that_serves_another_version():
    class Stuck(FakeEngine):
        def load_weights(self, weights, version):
            pass

    with pytest.raises(RolloutError, match="serves version 0 after being sent version 2"):
        WeightSync(Stuck(), every=2).prepare(torch.nn.Linear(2, 2), 2)()
    assert WeightSync(Stuck(), every=2).due(2) and not WeightSync(Stuck(), every=2).due(1)


def test_merged_weights_equal_merge_and_unload(tiny_llama):
    policy = lora(tiny_llama)
    expected = copy.deepcopy(policy).merge_and_unload().state_dict()
    merged = merged_weights(policy)
    assert set(merged) == set(expected)
    assert all(torch.allclose(merged[k], expected[k], atol=1e-6) for k in expected)


# ------------------------------------------------------------------------------------------ frozen policy


def test_frozen_policy_of_a_full_model_is_a_frozen_copy(tiny_llama):
    frozen = FrozenPolicy.copy_of(tiny_llama)
    assert frozen.model is not tiny_llama and not frozen.model.training
    assert not any(p.requires_grad for p in frozen.model.parameters())
    with frozen.view(tiny_llama) as network:
        assert network is frozen.model
    with pytest.raises(ValueError, match="no adapter"):
        with FrozenPolicy.adapter_disabled().view(tiny_llama):
            pass


def test_frozen_policy_of_a_lora_model_disables_the_adapter(tiny_llama):
    ids = torch.tensor([[2, 3, 4, 5]])
    base_logits = copy.deepcopy(tiny_llama)(ids).logits
    policy = lora(copy.deepcopy(tiny_llama))
    adapted = policy(ids).logits
    assert not torch.allclose(adapted, base_logits, atol=1e-4)
    with FrozenPolicy.adapter_disabled().view(policy) as network:
        assert network is policy
        assert torch.allclose(network(ids).logits, base_logits, atol=1e-5)
    assert torch.allclose(policy(ids).logits, adapted)  # the adapter is back afterwards


# ------------------------------------------------------------------------------------------ the recipe's queue


def test_recipe_queue_windows_and_reuse(tiny_llama, tok):
    """steps_per_generation 2 x num_iterations 2: one generation feeds 4 steps, old log-probs cached once."""
    from rlft.config import build_config
    from rlft.train.recipes.grpo import GRPORecipe

    cfg = build_config({"base_model": "tiny", "datasets": [{"path": "x.jsonl"}], "rl": "grpo", "micro_batch_size": 2,
                        "gradient_accumulation_steps": 1, "trl": {"num_generations": 2, "steps_per_generation": 2,
                                                                   "num_iterations": 2, "reward_funcs": ["r.f"]}})
    prompts = [{"prompt_ids": [first, 7], "prompt": f"p{first}", "columns": {}} for first in (3, 5, 7, 9)]
    engine = FakeEngine()
    recipe = GRPORecipe(cfg, resolve(cfg), SimpleNamespace(train=prompts, eval=[]), tok, FakeScorer(), None,
                        make_engine=lambda policy, version: engine)
    recipe.start(tiny_llama)
    steps = [recipe.prepare_step(tiny_llama) for _ in range(4)]
    assert engine.calls == 1 and len(recipe.queue) == 0
    assert all(len(step) == 1 and step[0].inputs["input_ids"].shape[0] == 2 and "old_logps" in step[0].inputs
               for step in steps)
    assert torch.equal(steps[0][0].inputs["input_ids"], steps[2][0].inputs["input_ids"])  # the second pass reuses the first window
    state = recipe.state_dict()
    assert state["generations"] == 1 and state["prompts"] == {"epoch": 0, "batch_in_epoch": 2}


def test_merged_weights_of_a_dora_policy_equal_merge_and_unload(tiny_llama):
    policy = peft.get_peft_model(tiny_llama, peft.LoraConfig(r=4, target_modules=["q_proj"], use_dora=True,
                                                             init_lora_weights=False))
    expected = copy.deepcopy(policy).merge_and_unload().state_dict()
    merged = merged_weights(policy)
    assert set(merged) == set(expected) and all(torch.allclose(merged[k], expected[k], atol=1e-6) for k in expected)


def test_reference_mix_moves_a_tied_weight_once():
    config = LlamaConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=16, tie_word_embeddings=True)
    torch.manual_seed(0)
    policy, reference = LlamaForCausalLM(config), FrozenPolicy.copy_of(LlamaForCausalLM(config))
    before = reference.model.lm_head.weight.clone()
    reference.mix(merged_weights(policy), alpha=0.5)
    expected = 0.5 * before + 0.5 * policy.lm_head.weight.detach()
    assert torch.allclose(reference.model.lm_head.weight, expected, atol=1e-6)
    assert reference.model.lm_head.weight.data_ptr() == reference.model.model.embed_tokens.weight.data_ptr()


def test_a_moved_reference_round_trips_through_its_checkpoint_file(tmp_path):
    """ReferenceMoves saves the reference as it has moved (tied weights once) and loads it back; a damaged file is a
    CheckpointError; a checkpoint without the file (older rlft) leaves the starting weights and says so; a reference
    that never moves writes none."""
    from rlft.models.frozen import ReferenceMoves

    config = LlamaConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=16, tie_word_embeddings=True)
    torch.manual_seed(0)
    policy, start = LlamaForCausalLM(config), LlamaForCausalLM(config)
    soft = SimpleNamespace(reference_reset_interval=0, sync_ref_model=True, ref_model_sync_steps=1, ref_model_mixup_alpha=0.5)
    moved = ReferenceMoves(FrozenPolicy.copy_of(start), soft)
    moved.after_step(policy, 1)
    moved.save(tmp_path)
    written = (tmp_path / "reference.safetensors").stat().st_size  # what the disk-room check counts before a first save
    assert written - 4096 < moved.saved_bytes() <= written, (moved.saved_bytes(), written)
    resumed = ReferenceMoves(FrozenPolicy.copy_of(start), soft)
    assert resumed.load(tmp_path) == []
    for name, value in moved.reference.model.state_dict().items():
        assert torch.equal(resumed.reference.model.state_dict()[name], value), name
    (tmp_path / "reference.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="cannot restore the reference"):
        ReferenceMoves(FrozenPolicy.copy_of(start), soft).load(tmp_path)
    older = ReferenceMoves(FrozenPolicy.copy_of(start), soft)
    (tmp_path / "old").mkdir()
    assert "holds no reference.safetensors" in older.load(tmp_path / "old")[0]
    assert torch.equal(older.reference.model.lm_head.weight, start.lm_head.weight)
    still = ReferenceMoves(FrozenPolicy.copy_of(start), SimpleNamespace(reference_reset_interval=0, sync_ref_model=False))
    still.save(tmp_path / "old")
    assert still.saved_bytes() == 0
    assert not any((tmp_path / "old").iterdir()) and still.load(tmp_path / "old") == []


@pytest.mark.parametrize("recompute", [True, False])
def test_replayed_rows_keep_their_recorded_logps_only_when_asked(tiny_llama, tok, recompute):
    """replay_recompute_logps: false gives a replayed row the log-probs recorded with its group (no forward pass);
    true (the default) gives it the current policy's, like every other row."""
    from rlft.config import build_config
    from rlft.train.recipes.grpo import GRPORecipe

    cfg = build_config({"base_model": "tiny", "datasets": [{"path": "x.jsonl"}], "rl": "grpo", "micro_batch_size": 2,
                        "gradient_accumulation_steps": 1, "trl": {
                            "num_generations": 2, "steps_per_generation": 2, "reward_funcs": ["r.f"],
                            "replay_buffer_size": 4, "replay_recompute_logps": recompute}})
    prompts = [{"prompt_ids": [first, 7], "prompt": f"p{first}", "columns": {}} for first in (3, 4, 5, 6, 8, 10, 12, 14)]
    recipe = GRPORecipe(cfg, resolve(cfg), SimpleNamespace(train=prompts, eval=[]), tok, FakeScorer(), None,
                        make_engine=lambda policy, version: FakeEngine())
    recipe.start(tiny_llama)
    replayed = []
    for _ in range(12):  # odd first tokens have signal and are stored; even ones are replaced by stored groups
        if replayed:
            break
        recipe.queue.windows = []
        recipe.fill_queue(tiny_llama)
        rows = [row for window in recipe.queue.windows for row in window]
        assert all(row.old_logps is not None for row in rows)
        replayed += [row for row in rows if row.replayed]
        fresh = [row for row in rows if not row.replayed]
        assert all(row.old_logps != row.sampling_logps for row in fresh)  # the policy's own
    assert replayed, "no group was replayed: the test saw nothing"
    assert all((row.old_logps == row.sampling_logps) is (not recompute) for row in replayed)


@pytest.mark.parametrize("trl", [{"top_k": 5, "temperature": 0.7}, {"top_p": 0.7}, {"repetition_penalty": 1.4}])
def test_recipe_is_ratios_are_one_at_zero_staleness_with_sampling_filters(tiny_llama, tok, trl):
    """The in-process engine samples with the trained weights (version 0, nothing trained yet): every IS ratio the loss
    sees must be 1, also when the engine's distribution is filtered (the trainer evaluates the same distribution)."""
    from rlft.config import build_config
    from rlft.train.recipes.grpo import GRPORecipe

    cfg = build_config({"base_model": "tiny", "datasets": [{"path": "x.jsonl"}], "rl": "grpo", "micro_batch_size": 4,
                        "gradient_accumulation_steps": 1, "trl": {
                            "num_generations": 2, "reward_funcs": ["r.f"], "max_completion_length": 6,
                            "vllm_importance_sampling_correction": True, "vllm_importance_sampling_mode": "token_mask",
                            "vllm_importance_sampling_cap": 1.001, "generation_kwargs": {"ignore_eos": True}, **trl}})
    prompts = [{"prompt_ids": [first, 7, 9], "prompt": f"p{first}", "columns": {}} for first in (3, 5, 7, 9)]
    recipe = GRPORecipe(cfg, resolve(cfg), SimpleNamespace(train=prompts, eval=[]), tok, FakeScorer(), None)
    recipe.start(tiny_llama)
    assert recipe.compares_sampled
    [batch] = recipe.prepare_step(tiny_llama)
    metrics = recipe.loss(tiny_llama, batch.inputs).metrics
    assert metrics["sampling/importance_sampling_ratio/min"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["sampling/importance_sampling_ratio/max"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["sampling/is_masked_fraction"] == 0.0
    recipe.compares_sampled = False  # control: the temperature-only log-probs put the ratios off 1 (what TRL compares)
    control = recipe.loss(tiny_llama, batch.inputs).metrics
    assert control["sampling/importance_sampling_ratio/min"] < 1 - 1e-3


def test_weights_for_a_plain_engine_carry_every_name_of_a_tied_tensor():
    """A tied output layer is sent under its own name too: an engine that holds the names apart (vLLM) must not keep
    the old embedding as its output layer."""
    from rlft.train.weight_sync import plain_weights

    config = LlamaConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=16, tie_word_embeddings=True)
    full = plain_weights(LlamaForCausalLM(config))
    assert "lm_head.weight" in full and full["lm_head.weight"] is full["model.embed_tokens.weight"]
    untied = plain_weights(LlamaForCausalLM(LlamaConfig(**{**config.to_dict(), "tie_word_embeddings": False})))
    assert untied["lm_head.weight"] is not untied["model.embed_tokens.weight"]
    adapted = plain_weights(peft.get_peft_model(LlamaForCausalLM(config), peft.LoraConfig(
        r=2, target_modules=["q_proj", "embed_tokens"], init_lora_weights=False)))
    assert {"model.embed_tokens.weight", "lm_head.weight", "model.layers.0.self_attn.q_proj.weight"} == set(adapted)


@pytest.mark.parametrize("trl,steps,cached", [
    ({}, 1, False),  # one optimizer step: the loss's own log-probs are the old ones
    ({"generation_batch_size": 8}, 2, True),  # one generation feeds two steps: the policy moves in between
    ({"num_iterations": 2}, 2, True),
])
def test_old_logps_are_cached_exactly_when_the_policy_moves_before_the_rows_are_used(tiny_llama, tok, trl, steps, cached):
    from rlft.config import build_config
    from rlft.train.recipes.grpo import GRPORecipe

    cfg = build_config({"base_model": "tiny", "datasets": [{"path": "x.jsonl"}], "rl": "grpo", "micro_batch_size": 4,
                        "gradient_accumulation_steps": 1, "trl": {"num_generations": 2, "reward_funcs": ["r.f"], **trl}})
    prompts = [{"prompt_ids": [first, 7], "prompt": f"p{first}", "columns": {}} for first in (3, 5, 7, 9, 11, 13, 15, 17)]
    recipe = GRPORecipe(cfg, resolve(cfg), SimpleNamespace(train=prompts, eval=[]), tok, FakeScorer(), None,
                        make_engine=lambda policy, version: FakeEngine())
    recipe.start(tiny_llama)
    recipe.fill_queue(tiny_llama)
    rows = [row for window in recipe.queue.windows for row in window]
    assert len(recipe.queue) == steps and rows
    assert all((row.old_logps is not None) is cached for row in rows)


@pytest.mark.parametrize("base_updated", [False, True])
def test_a_quantized_base_is_never_sent_and_must_still_be_the_servers_own(tiny_llama, tmp_path, base_updated):
    """QLoRA: the 4-bit base cannot be sent; the server keeps base_model's own weights and gets the adapter only, which
    is right only while no earlier run replaced its base."""
    from rlft.train.weight_sync import WeightSync, is_quantized

    class Server:
        def __init__(self):
            self.version, self.calls = 0, []

        def weight_info(self):
            return {"base_updated": base_updated}

        def load_weights(self, weights, version):
            self.calls.append("weights")
            self.version = version

        def load_adapter(self, folder, version):
            self.calls.append("adapter")
            self.version = version

        def health(self):
            return {"ok": True, "version": self.version}

    policy = lora(tiny_llama)
    assert not is_quantized(policy)
    policy.get_base_model().model.register_buffer("packed_4bit", torch.zeros(4, dtype=torch.uint8))  # as bitsandbytes stores
    assert is_quantized(policy)
    server = Server()
    sync = WeightSync(server, plain=True, lora_folder=tmp_path)
    if base_updated:
        with pytest.raises(RolloutError, match="base weights were replaced by an earlier run.*restart the server"):
            sync.reset(policy, 0)
        assert server.calls == []
    else:
        sync.reset(policy, 0)
        assert server.calls == ["adapter"]
