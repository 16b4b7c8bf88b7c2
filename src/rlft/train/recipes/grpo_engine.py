"""The rollout side of online RL: the engine built from the trained policy, the feed that samples and scores
generation batches with it (`RolloutFeed`), weight sync after optimizer steps, and rank 0's full copy of a sharded
policy (FSDP2, ZeRO-3) that the engine and weight sync read.

Rank 0 draws, samples and scores every process's prompts (prompts_per_step counts them all) and broadcasts the
scored batch: one engine, one prompt order, the same batch as one process with the same global batch size.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

from rlft.config.parallel import partitioned
from rlft.config.rl import RLSettings
from rlft.config.settings.model import ModelSettings
from rlft.data.batches import PlanCursor
from rlft.models.compile import compile_options
from rlft.rollout.engine import RolloutEngine
from rlft.rollout.local import LocalEngine
from rlft.rollout.producer import Environment, RolloutProducer
from rlft.rollout.scoring import Scorer
from rlft.rollout.types import BatchMetrics, SamplingParams, ScoredBatch
from rlft.train.parallel import broadcast_object, gathered_state_dict
from rlft.train.rollout_feed import RolloutFeed
from rlft.train.weight_sync import WeightSync, sync_due


class GRPOEngine:
    def __init__(self, cfg, settings: RLSettings, model: ModelSettings, tokenizer, scorer: Scorer, prompts: PlanCursor, sampling: SamplingParams,
                 shard: tuple[int, int], sampling_for: Callable | None, make_engine: Callable[..., RolloutEngine] | None,
                 remote_engine: bool, environment: Environment | None, rollout_func: Callable | None, steps_per_batch: int = 1):
        """`make_engine(policy, version)` builds the rollout engine in `start` (default: an in-process LocalEngine,
        sharing the policy's weights when synchronous with a push every step, else holding a copy of the trained
        ones); `remote_engine`: that engine holds a plain model of its own (a rollout server, or vLLM colocated),
        which gets the checkpoint's weights before it samples; `environment`
        plays episodes in place of the engine's single answers (NeMo Gym's agents, calling that server; the Python
        tools of trl.multi_turn_config, sampling each turn from the engine). `settings`: the trl: options; `model`: the
        model's settings, which say how the in-process engine compiles; `steps_per_batch`: the optimizer steps a
        generation batch trains at most (the feed's throttle)."""
        self.cfg, self.settings, self.tokenizer, self.scorer, self.prompts = cfg, settings, tokenizer, scorer, prompts
        self.sampling, self.sampling_for, self.rollout_func, self.environment = sampling, sampling_for, rollout_func, environment
        self.rank, self.world = shard
        self.sharded = partitioned(cfg, self.world)
        # the in-process engine shares the policy's tensors where it samples only between optimizer steps with the
        # weights of every step (synchronous, a push every step, a policy whole on this process): no copy, no pushes
        share = (make_engine is None and not remote_engine and not settings.async_prefetch and settings.sync_interval == 1
                 and not self.sharded)
        self.make_engine = make_engine or (lambda policy, version: LocalEngine.from_policy(
            policy, tokenizer.pad_token_id, tokenizer, version=version, compiled=compile_options(model), share=share))
        self.remote_engine, self.steps_per_batch = remote_engine, steps_per_batch
        self.producer: RolloutProducer | None = None  # made in start(), from the loaded policy
        self.feed: RolloutFeed | None = None
        self.twin = None  # rank 0's full copy of a sharded (FSDP2, ZeRO-3) policy, which the engine and weight sync read

    def before_wrap(self, model) -> None:
        if self.rank == 0 and self.sharded:
            self.twin = copy.deepcopy(model)  # taken before sharding: a plain model, refreshed by `whole`

    def whole(self, model):
        """The policy with whole weights, for the engine and weight sync (on rank 0); gathers a sharded one (every rank
        must call it together)."""
        if not self.sharded:  # whole on every rank: nothing to gather (and no parameter walk at every push)
            return model
        weights = gathered_state_dict(model)
        if weights is None:  # whole on every rank already
            return model
        if self.twin is not None:
            self.twin.load_state_dict(weights)
        return self.twin

    def current(self, model):
        """The policy to bring the engine up to date from (evaluation, checkpoints): gathered only when rank 0's engine
        serves older weights than these, which rank 0 tells every process."""
        behind = broadcast_object(self.feed.weight_sync.pushed != self.feed.step if self.feed else None)
        return self.whole(model) if behind else model

    def runnable(self, model):
        """A policy that runs alone on rank 0: the unwrapped model, or the full copy of a sharded one."""
        return self.twin if self.twin is not None else model

    def start(self, model, version: int, generations: int, feed_state: dict[str, Any], step: int) -> None:
        """Build the engine from the policy (weight `version`) and the feed; a resume restores the feed's state."""
        s = self.settings
        policy = self.whole(model)
        if self.rank != 0:  # the other processes train on what rank 0 broadcasts
            return
        engine = self.make_engine(policy, version)
        # the in-process engine copies only what trains (the adapter, for LoRA) already: vllm_lora_sync is its default
        lora_folder = Path(self.cfg.output_dir) / "lora_sync" if s.lora_sync and self.remote_engine else None
        sync = WeightSync(engine, every=s.sync_interval, plain=self.remote_engine, lora_folder=lora_folder)
        self.feed = RolloutFeed(lambda **hooks: RolloutProducer(
            engine, self.scorer, self.prompts, s, self.tokenizer, self.sampling, self.rollout_func, self.sampling_for,
            seed=self.cfg.seed, environment=self.environment, **hooks), sync, s, self.cfg.max_steps, self.cfg.seed,
            self.steps_per_batch)
        self.producer = self.feed.producer
        self.producer.generations = generations
        self.feed.load_state_dict(feed_state, step)
        if self.remote_engine:  # it serves whatever it held before (another run's weights or adapter): send all of ours
            sync.reset(policy, version)

    @property
    def generations(self) -> int:
        """Generation batches sampled so far."""
        return self.producer.generations if self.producer else 0

    def next_batch(self) -> ScoredBatch:
        """The next scored generation batch, on every process (on the main thread, as every collective)."""
        return broadcast_object(self.feed.next_batch() if self.rank == 0 else None)

    def after_optimizer_step(self, model, step: int, changed: bool = True) -> float:
        """Push the new weights when due (`changed`: this step changed them); the seconds the main thread spent."""
        policy = self.whole(model) if sync_due(step, self.settings.sync_interval) else model
        return self.feed.after_optimizer_step(policy, step, changed) if self.feed else 0.0

    def add_sync_phases(self, metrics: BatchMetrics, elapsed: float, main_thread: float) -> None:
        """`time/weight_sync`: the step's time after the update (`elapsed`), or with a background feed the main thread's
        share; `async/weight_load_s`: the engine's load time in the background."""
        background = bool(self.feed and self.feed.depth)
        metrics.add_phase("time/weight_sync", main_thread if background else elapsed)
        if background and self.feed.weight_sync.seconds:
            metrics.add_phase("async/weight_load_s", self.feed.weight_sync.seconds)

    def synced_policy(self, model):
        """For evaluation: the engine brought up to the trained weights (every process calls it), and the policy that
        runs alone on rank 0."""
        policy = self.current(model)
        if self.rank == 0:
            self.feed.sync_now(policy)
        return self.runnable(model)

    def state_dict(self, model) -> dict[str, Any]:
        """The feed's state (batches in flight, draws, weight version); `model`: None before `start`."""
        policy = self.current(model) if model is not None else None
        return self.feed.state_dict(policy) if self.feed else {}

    def engine_lost(self) -> None:
        if self.feed is not None:
            self.feed.lost = True

    def close(self) -> None:
        if self.feed is not None:
            self.feed.close()
        self.scorer.close()
