"""Asynchronous rollouts without the CLI: the ordered prefetcher, exact staleness, determinism, resume, replay, re-roll.

A fake engine (tests/unit/fake_engines.py) stands in for the rollout engine; the real GRPO recipe, producer, feed and
weight sync run around it.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlft.config.settings import resolve
from rlft.errors import RolloutError
from rlft.rollout.buffer import ReplayBuffer, RerollQueue, group_std
from rlft.rollout.prefetch import Prefetcher
from rlft.rollout.scoring import make_scores
from rlft.rollout.types import Rollout, ScoredBatch

from fake_engines import VersionedEngine, tiny_llama_model

GROUP = 2


class FakeScorer:
    needs_policy = False
    names, weights = ["r"], [1.0]

    def score(self, prompts, rollout, group, extra=None):
        return make_scores(torch.tensor([[float(c[2])] for c in rollout.completion_ids]), self.names, self.weights)

    def close(self):
        pass


@pytest.fixture
def tiny_llama() -> LlamaForCausalLM:
    return tiny_llama_model()


def make_recipe(tok, engine, output_dir, **trl):
    from rlft.config import build_config
    from rlft.train.recipes.grpo import GRPORecipe

    cfg = build_config({"base_model": "tiny", "datasets": [{"path": "x.jsonl"}], "rl": "grpo", "micro_batch_size": 2,
                        "gradient_accumulation_steps": 1, "max_steps": 8, "output_dir": str(output_dir),
                        "trl": {"num_generations": GROUP, "reward_funcs": ["r.f"], "max_completion_length": 3, **trl}})
    prompts = [{"prompt_ids": [first, 7], "prompt": f"p{first}", "columns": {}} for first in range(3, 19)]
    def make_engine(policy, version):  # like LocalEngine.from_policy: a copy of the (resumed) policy at that version
        engine.version = version
        return engine

    return GRPORecipe(cfg, resolve(cfg), SimpleNamespace(train=prompts, eval=[]), tok, FakeScorer(), None, make_engine=make_engine)


def run_steps(recipe, model, steps: int, first_step: int = 0) -> list[dict]:
    out = []
    for step in range(first_step + 1, first_step + steps + 1):
        batches = recipe.prepare_step(model)
        out.append({"ids": [b.inputs["input_ids"].tolist() for b in batches], "metrics": recipe.step_metrics()})
        recipe.after_optimizer_step(model, step)
    return out


# ------------------------------------------------------------------------------------------ prefetcher


def test_prefetcher_runs_jobs_and_loads_in_the_order_enqueued():
    order = []
    fetch = Prefetcher(depth=2)
    fetch.submit_sample(lambda: (time.sleep(0.05), order.append("s0"))[1] or "s0")
    fetch.submit_load(lambda: order.append("load1"))
    fetch.submit_sample(lambda: order.append("s1") or "s1")
    assert fetch.take()[0] == "s0" and fetch.take()[0] == "s1"
    assert order == ["s0", "load1", "s1"]
    fetch.close()


def test_prefetcher_hands_a_worker_failure_to_the_main_thread_and_stops_later_work():
    fetch = Prefetcher(depth=1)
    fetch.submit_load(lambda: (_ for _ in ()).throw(RolloutError("server died")))
    fetch.submit_sample(lambda: "never")
    with pytest.raises(RolloutError, match="server died"):
        fetch.take()
    fetch.close()


def test_prefetcher_depth_zero_raises_a_failed_weight_load_at_once():
    """Synchronous rollouts: a weight load that fails (an engine that refuses the weights, a checksum mismatch) or a
    Ctrl-C during it stops the run there; the failure was kept in a future nobody read, and sampling went on from the
    old weights."""
    fetch = Prefetcher(depth=0)
    with pytest.raises(RolloutError, match="refused"):
        fetch.submit_load(lambda: (_ for _ in ()).throw(RolloutError("refused")))
    with pytest.raises(KeyboardInterrupt):
        fetch.submit_load(lambda: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert fetch.submit_load(lambda: 3).result() == 3


def test_prefetcher_depth_zero_runs_inline_on_this_thread():
    seen = []
    fetch = Prefetcher(depth=0)
    fetch.submit_sample(lambda: seen.append(threading.current_thread()) or 1)
    assert fetch.take()[0] == 1 and seen == [threading.main_thread()]


# ------------------------------------------------------------------------------------------ the async recipe


def test_async_batches_are_exactly_one_step_stale_and_overlap_training(tok, tiny_llama, tmp_path):
    engine = VersionedEngine(delay=0.05)
    recipe = make_recipe(tok, engine, tmp_path, async_prefetch=True, prefetch_depth=1)
    recipe.start(tiny_llama)
    steps = run_steps(recipe, tiny_llama, 5)
    staleness = [s["metrics"]["async/staleness/max"] for s in steps]
    assert staleness == [0.0, 1.0, 1.0, 1.0, 1.0]  # the first batch is fresh, then every batch is one step old
    assert [version for _, version in engine.calls[:4]] == [0, 0, 1, 2]  # batch j sampled after weights j-1 landed
    recipe.close()


def test_sync_interval_two_keeps_the_engine_on_even_versions(tok, tiny_llama, tmp_path):
    engine = VersionedEngine()
    recipe = make_recipe(tok, engine, tmp_path, async_prefetch=True, prefetch_depth=1, vllm_sync_interval=2)
    recipe.start(tiny_llama)
    run_steps(recipe, tiny_llama, 6)
    assert {version for _, version in engine.calls} <= {0, 2, 4, 6}
    recipe.close()


class RelabellingEngine(VersionedEngine):
    """Records full loads and relabels (a version moved on without weights)."""

    def __init__(self):
        super().__init__()
        self.loads, self.relabels = [], []

    def load_weights(self, weights, version):
        self.loads.append(version)
        super().load_weights(weights, version)

    def relabel(self, version):
        with self.lock:
            self.relabels.append(version)
            self.version = version


@pytest.mark.parametrize("interval", [1, 2])
def test_steps_that_change_no_weight_move_the_engine_version_without_sending_them(tok, tiny_llama, tmp_path, interval):
    engine = RelabellingEngine()
    recipe = make_recipe(tok, engine, tmp_path, async_prefetch=True, prefetch_depth=1, vllm_sync_interval=interval)
    recipe.start(tiny_llama)
    changed = {1: True, 2: False, 3: False, 4: False, 5: True, 6: False}  # e.g. steps skipped for zero advantage
    for step in range(1, 7):
        recipe.prepare_step(tiny_llama)
        recipe.after_optimizer_step(tiny_llama, step, changed[step])
    recipe.state_dict()  # a sync point: everything handed to the engine has landed
    pushes = [step for step in range(1, 7) if step % interval == 0]
    sent = [step for step in pushes if any(changed[s] for s in range(step - interval + 1, step + 1))]
    assert [v for v in engine.loads if v > 0] == sent and engine.relabels == [v for v in pushes if v not in sent]
    assert engine.version == 6
    recipe.close()


def test_async_run_is_reproducible_and_resumes_exactly(tok, tiny_llama, tmp_path):
    def uninterrupted():
        recipe = make_recipe(tok, VersionedEngine(delay=0.01), tmp_path / "a", async_prefetch=True, prefetch_depth=2)
        recipe.start(tiny_llama)
        steps = run_steps(recipe, tiny_llama, 3)
        recipe.state_dict()  # a checkpoint at step 3 is a sync point in both runs
        steps += run_steps(recipe, tiny_llama, 3, first_step=3)
        recipe.close()
        return [s["ids"] for s in steps]

    first, second = uninterrupted(), uninterrupted()
    assert first == second

    recipe = make_recipe(tok, VersionedEngine(delay=0.01), tmp_path / "b", async_prefetch=True, prefetch_depth=2)
    recipe.start(tiny_llama)
    head = run_steps(recipe, tiny_llama, 3)
    state = recipe.state_dict()
    assert len(state["feed"]["pending"]) == 2  # the batches in flight were finished and saved, not dropped
    recipe.close()
    import json

    state = json.loads(json.dumps(state))  # as the checkpoint stores it
    engine = VersionedEngine(delay=0.01)
    resumed = make_recipe(tok, engine, tmp_path / "b", async_prefetch=True, prefetch_depth=2)
    resumed.load_state_dict(state)
    resumed.start(tiny_llama)
    tail = run_steps(resumed, tiny_llama, 3, first_step=3)
    resumed.close()
    assert [s["ids"] for s in head + tail] == first


def test_closing_the_prefetcher_cancels_the_queued_rollouts():
    """On an error or Ctrl-C the run ends: the rollout being generated finishes, the ones queued behind it never start
    (they ran one after the other before, holding shutdown and the engine for their whole length)."""
    fetch, ran = Prefetcher(depth=2), []

    def job(index):
        return lambda: (time.sleep(0.4), ran.append(index))

    for index in range(3):
        fetch.submit_sample(job(index))
    time.sleep(0.1)  # the worker has taken the first
    began = time.perf_counter()
    fetch.close()
    assert ran == [0] and time.perf_counter() - began < 0.8


def test_a_bound_below_the_sync_interval_is_refused(tok, tmp_path):
    """Weights reach the engine every 3 steps: a batch sampled when the trainer needs it can be 2 steps old, which a
    bound of 1 would drop (a bound below the prefetch age is a throttle: tests/unit/test_rollout_control.py)."""
    from rlft.errors import ConfigError

    with pytest.raises(ConfigError, match="is below vllm_sync_interval - 1 = 2"):
        make_recipe(tok, VersionedEngine(), tmp_path, async_prefetch=True, prefetch_depth=1, vllm_sync_interval=3,
                    allowed_outdated_steps=1)


def test_rows_older_than_allowed_outdated_steps_are_dropped_and_counted(tok, tiny_llama, tmp_path):
    recipe = make_recipe(tok, VersionedEngine(), tmp_path, async_prefetch=True, prefetch_depth=1, allowed_outdated_steps=1,
                         replay_buffer_size=4)
    recipe.start(tiny_llama)
    rows, dropped = recipe.queue.within_staleness([SimpleNamespace(weight_version=v) for v in (1, 4, 5)], 5)
    assert [r.weight_version for r in rows] == [4, 5] and dropped == 1
    recipe.close()


# ------------------------------------------------------------------------------------------ replay and re-roll


def scored_batch(rewards: list[list[float]], firsts: list[int], version: int = 0) -> ScoredBatch:
    prompts = [{"prompt_ids": [f, 7], "prompt": f"p{f}", "columns": {}} for f in firsts]
    expanded = [p["prompt_ids"] for p in prompts for _ in range(GROUP)]
    rollout = Rollout(expanded, [[f, 9] for f in firsts for _ in range(GROUP)], [[-0.1, -0.2]] * len(expanded),
                      [False] * len(expanded), weight_versions=[version] * len(expanded))
    values = torch.tensor([[r] for group in rewards for r in group])
    advantages = torch.cat([torch.tensor(g) - torch.tensor(g).mean() for g in rewards])
    return ScoredBatch(prompts, rollout, make_scores(values, ["r"], [1.0]), advantages, GROUP)


def test_group_std_ignores_nan_and_single_values():
    values = torch.tensor([[1.0], [3.0], [2.0], [float("nan")]])
    assert torch.allclose(group_std(values, 2), torch.tensor([[2 ** 0.5], [0.0]]))


def test_replay_moves_a_whole_stored_group_into_a_group_without_signal():
    buffer = ReplayBuffer(size=4)
    first, _ = buffer.apply(scored_batch([[0.0, 1.0], [1.0, 1.0]], [3, 5], version=0))
    assert len(buffer) == 1 and first.prompts[1]["prompt"] == "p5"  # nothing stored yet: no replacement
    second, metrics = buffer.apply(scored_batch([[1.0, 1.0], [0.0, 2.0]], [7, 9], version=4))
    assert metrics["replay_buffer_replacements"] == 1.0
    assert second.prompts[0]["prompt"] == "p3"  # the no-signal group 0 now holds the stored group, whole
    assert second.rollout.completion_ids[:2] == [[3, 9], [3, 9]] and second.rollout.weight_versions[:2] == [0, 0]
    assert second.advantages[:2].tolist() == [-0.5, 0.5] and second.scores.values[:2, 0].tolist() == [0.0, 1.0]
    assert second.prompts[1]["prompt"] == "p9"  # groups with signal are kept
    state = buffer.state_dict()
    restored = ReplayBuffer(size=4)
    restored.load_state_dict(state)
    assert len(restored) == 2 and restored.sample(1) == buffer.sample(1)


def test_replay_draws_the_same_groups_after_a_restore_whatever_the_heap_layout():
    """`sample` draws by position in the heap array; a restore must rebuild that array, not re-push the entries
    (re-pushing after evictions gives another layout and other draws: an inexact resume)."""
    import json

    buffer = ReplayBuffer(size=4, seed=3)
    for index, score in enumerate([2.5, 1.4, 3.9, 1.8, 1.1, 3.9, 8.3, 7.3]):  # evictions reshape the heap
        buffer.apply(scored_batch([[0.0, score]], [index]))
    restored = ReplayBuffer(size=4, seed=0)
    restored.load_state_dict(json.loads(json.dumps(buffer.state_dict())))  # through JSON, as in a checkpoint
    names = lambda drawn: [entry["prompt"]["prompt"] for entry in drawn]  # noqa: E731
    assert [names(restored.sample(2)) for _ in range(8)] == [names(buffer.sample(2)) for _ in range(8)]
    restored.offer(9.0, {"prompt": {"prompt": "late"}})  # numbering goes on after the restored entries
    assert len({number for _, number, _ in restored._heap}) == 4


def test_replay_keeps_the_highest_scoring_groups():
    buffer = ReplayBuffer(size=1)
    buffer.apply(scored_batch([[0.0, 1.0]], [3]))
    buffer.apply(scored_batch([[0.0, 4.0]], [5]))  # more signal: evicts the first
    buffer.apply(scored_batch([[0.0, 0.5]], [7]))  # less: not stored
    assert [entry["prompt"]["prompt"] for entry in buffer.sample(1)] == ["p5"]


def test_reroll_queues_all_zero_groups_and_injects_them_from_the_start_step():
    queue = RerollQueue(start_step=2, max_groups=1)
    metrics = queue.collect(scored_batch([[0.0, 0.0], [0.0, 1.0]], [3, 5]))
    assert metrics == {"reroll_buffered": 1.0, "reroll_buffer_size": 1.0}
    fresh = [{"prompt": "a"}, {"prompt": "b"}]
    assert queue.inject(fresh, step=1) == (fresh, 0)
    injected, count = queue.inject(fresh, step=2)
    assert count == 1 and [p["prompt"] for p in injected] == ["a", "p3"] and not queue.waiting


def test_reroll_is_off_at_the_default_start_fraction(tok, tmp_path):
    recipe = make_recipe(tok, VersionedEngine(), tmp_path)
    recipe.start(torch.nn.Linear(1, 1))
    assert not recipe.engine.feed.reroll.enabled and recipe.engine.feed.replay is None


def test_colocate_without_vllm_says_how_to_install_it_or_use_the_transformers_engine():
    import importlib.util

    from rlft.config import build_config
    from rlft.config.settings import resolve
    from rlft.errors import ConfigError
    from rlft.train.engines import engine_factory

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    cfg = build_config({"base_model": "tiny", "datasets": [{"path": "x.jsonl"}], "rl": "grpo", "micro_batch_size": 4,
                        "trl": {"num_generations": 4, "reward_funcs": ["r.f"], "use_vllm": True, "vllm_mode": "colocate"}})
    with pytest.raises(ConfigError, match=r"pip install 'rlft\[vllm\]'.*use_vllm: false"):
        engine_factory(cfg, resolve(cfg), None)


def test_the_trainer_connects_where_the_same_configs_server_listens():
    from rlft.config import build_config
    from rlft.config.rl import rl_settings

    base = {"base_model": "tiny", "datasets": [{"path": "x.jsonl"}], "rl": "grpo", "micro_batch_size": 4,
            "vllm": {"host": "0.0.0.0", "port": 8123}, "trl": {"num_generations": 4, "reward_funcs": ["r.f"], "use_vllm": True}}
    s = rl_settings(build_config(base))
    assert (s.server_host, s.server_port) == ("127.0.0.1", 8123)
    explicit = rl_settings(build_config({**base, "trl": {**base["trl"], "vllm_server_port": 9000, "vllm_server_host": "gpu7"}}))
    assert (explicit.server_host, explicit.server_port) == ("gpu7", 9000)


def test_several_training_processes_refuse_only_what_is_not_built(monkeypatch):
    """A rollout server and EBFT with several processes are built (rank 0 samples for all); context parallelism is not."""
    from rlft.config import build_config
    from rlft.errors import NotImplementedYet
    from rlft.train.unbuilt import refuse_unbuilt

    base = {"base_model": "tiny", "datasets": [{"path": "x.jsonl"}], "micro_batch_size": 4}
    grpo = build_config({**base, "rl": "grpo", "trl": {"num_generations": 4, "reward_funcs": ["r.f"], "use_vllm": True}})
    monkeypatch.setenv("WORLD_SIZE", "2")
    refuse_unbuilt(grpo)
    refuse_unbuilt(build_config({**base, "rl": "ebft", "ebft": {"mode": "strided", "stride": 4, "context_length": 4, "generate_max_len": 4}}))
    with pytest.raises(NotImplementedYet, match="context_parallel_size: 2: .*needs CUDA GPUs"):
        refuse_unbuilt(build_config({**base, "context_parallel_size": 2}))


def test_a_server_that_is_neither_rlfts_nor_vllms_is_named_as_such():
    """Another HTTP server on the port (TRL's server): a clear RolloutError, not a KeyError, from the engine and from
    the trainer's search for which kind of server answers."""
    import http.server
    import threading

    from rich.console import Console

    from rlft.config import build_config
    from rlft.errors import RolloutError
    from rlft.rollout.remote import RemoteEngine
    from rlft.train.engines import engine_factory

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/health":  # TRL's server redirects to /health/; vLLM answers 200 with an empty body
                self.send_response(307)
                self.send_header("Location", "/health/")
                self.end_headers()
                return
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        engine = RemoteEngine("127.0.0.1", server.server_address[1])
        with pytest.raises(RolloutError, match=r"answers /health but is not an rlft rollout server.*rlft vllm-serve CONFIG"):
            engine.wait_until_ready(timeout=5)
        engine.close()
        cfg = build_config({"base_model": "tiny", "datasets": [{"path": "x.jsonl"}], "rl": "grpo", "micro_batch_size": 4,
                            "trl": {"num_generations": 4, "reward_funcs": ["r.f"], "use_vllm": True, "vllm_server_timeout": 5,
                                    "vllm_server_port": server.server_address[1]}})
        connect, _ = engine_factory(cfg, resolve(cfg), Console(quiet=True))
        with pytest.raises(RolloutError, match=r"neither rlft's rollout server .* nor a vLLM OpenAI server .*rlft vllm-serve CONFIG"):
            connect(None, 0)
    finally:
        server.shutdown()


def test_samples_must_come_from_weights_this_client_sent():
    from rlft.errors import RolloutError
    from rlft.rollout.remote import RemoteEngine

    engine = RemoteEngine("127.0.0.1", 9)  # no call reaches the network here
    engine._check_served(0, None)  # nothing sent yet: a plain sampler takes the server's own weights
    engine._sent[1] = "abc"
    engine._check_served(1, "abc")
    with pytest.raises(RolloutError, match="another process changed its weights"):
        engine._check_served(1, "xyz")
    with pytest.raises(RolloutError, match="which this trainer never sent"):
        engine._check_served(0, None)  # e.g. a restarted server back at its initial version
    with pytest.raises(RolloutError, match="unknown state"):
        engine._check_served(-1, None)
    engine.close()


# ------------------------------------------------------------------------------------------ the in-process engine's weights


def test_a_synchronous_engine_samples_from_the_policy_s_own_tensors_as_a_copy_pushed_every_step_would(tok, tmp_path):
    """Synchronous GRPO with a push every step: the in-process engine shares the policy's tensors (its parameters are
    the policy's, which keep their gradients; a push is a version number, nothing is copied) and samples exactly what
    an engine holding a copy, loaded after every step, samples. With async prefetch it holds a copy (the trainer
    changes the weights while it samples)."""
    from rlft.config import build_config
    from rlft.rollout.local import LocalEngine
    from rlft.train.recipes.grpo import GRPORecipe

    def recipe_for(make_engine, **trl):
        cfg = build_config({"base_model": "tiny", "datasets": [{"path": "x.jsonl"}], "rl": "grpo", "micro_batch_size": 4,
                            "gradient_accumulation_steps": 1, "max_steps": 8, "output_dir": str(tmp_path), "seed": 3,
                            "trl": {"num_generations": GROUP, "reward_funcs": ["r.f"], "max_completion_length": 6,
                                    "temperature": 1.0, **trl}})
        prompts = [{"prompt_ids": [first, 7], "prompt": f"p{first}", "columns": {}} for first in range(3, 19)]
        return GRPORecipe(cfg, resolve(cfg), SimpleNamespace(train=prompts, eval=[]), tok, FakeScorer(), None,
                          make_engine=make_engine)

    def sampled(make_engine, updates: bool) -> tuple[list, LocalEngine, torch.nn.Module]:
        torch.manual_seed(0)
        policy = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                              num_key_value_heads=1, intermediate_size=32, max_position_embeddings=64))
        recipe = recipe_for(make_engine)
        recipe.start(policy)
        noise, ids = torch.Generator().manual_seed(1), []
        for step in range(1, 4):
            ids.append([batch.inputs["input_ids"].tolist() for batch in recipe.prepare_step(policy)])
            if updates:  # an optimizer step: new weights in the same tensors
                with torch.no_grad():
                    for param in policy.parameters():
                        param.add_(torch.randn(param.shape, generator=noise))
            recipe.after_optimizer_step(policy, step)
        return ids, recipe.engine.feed.producer.engine, policy

    def copying(policy, version):
        return LocalEngine.from_policy(policy, tok.pad_token_id, tok, version=version)

    shared_ids, shared, policy = sampled(None, updates=True)
    assert shared.shares_weights and shared.version == 3
    assert all(own is theirs for own, theirs in zip(shared.model.parameters(), policy.parameters()))
    assert all(p.requires_grad for p in policy.parameters()) and not shared.model.training
    copied_ids, copied, policy = sampled(copying, updates=True)
    assert not copied.shares_weights and not any(own is theirs for own, theirs in zip(copied.model.parameters(),
                                                                                      policy.parameters()))
    assert shared_ids == copied_ids
    assert sampled(None, updates=False)[0][1:] != shared_ids[1:]  # the updates change what is sampled
    async_engine = recipe_for(None, async_prefetch=True, prefetch_depth=1).engine.make_engine(policy, 0)
    assert not async_engine.shares_weights and async_engine.model.lm_head.weight is not policy.lm_head.weight
