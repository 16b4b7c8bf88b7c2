"""The trainer's side of the rollout pipeline: scored generation batches in, weights out.

    main thread                                   engine work (inline, or one background thread)
    draw prompts (cursor, re-roll) --submit-->    sample with the engine's weights
    take the oldest sampled batch  <--------      (finished in order)
    score: rewards, advantages, replay            ...
    train; after optimizer steps: snapshot --->   load the weights into the engine (between two batches)

Synchronous GRPO is depth 0: each batch is drawn, sampled and scored when the trainer needs it, and every
weight push lands at once. With `async_prefetch`, `prefetch_depth` batches are sampled ahead, so the
engine works while the trainer trains; a batch is sampled with the weights of every push enqueued before
it, which makes its staleness exact (depth generation batches, plus the sync interval) and a run
reproducible. A checkpoint is a sync point: the current weights are pushed, the queue is drained, and the
finished batches are saved with the recipe state, so a resume continues with exactly the same rollouts.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from rlft.rollout.buffer import ReplayBuffer, RerollQueue
from rlft.rollout.prefetch import Prefetcher
from rlft.rollout.producer import RolloutProducer
from rlft.rollout.types import SampledBatch, ScoredBatch
from rlft.train.weight_sync import WeightSync


class RolloutFeed:
    def __init__(self, make_producer: Callable[..., RolloutProducer], weight_sync: WeightSync, settings,
                 max_steps: int | None, seed: int):
        """`make_producer(inject=, after_scoring=, run_engine=)` builds the producer with this feed's hooks: re-roll,
        the replay buffer, and engine work on the prefetcher."""
        s = settings
        self.weight_sync, self.settings = weight_sync, s
        self.depth = s.prefetch_depth if s.async_prefetch else 0
        self.prefetcher = Prefetcher(self.depth)
        self.replay = ReplayBuffer(s.replay_buffer_size, seed) if s.replay_buffer_size > 0 else None
        start = max(1, int(max_steps * s.reroll_start_fraction)) if max_steps and s.reroll_start_fraction < 1.0 else None
        self.reroll = RerollQueue(start, s.reroll_max_groups)
        self.step = 0  # optimizer steps done (the policy's weight version)
        self.changed = False  # an optimizer step changed the weights since the last push
        self.lost = False  # the engine stopped answering (a checkpoint is still written, without it)
        self.producer = make_producer(inject=self._inject, after_scoring=self._after_scoring, run_engine=self.prefetcher.call)

    # ------------------------------------------------------------------ batches
    def next_batch(self) -> ScoredBatch:
        """The next scored generation batch. Keeps `depth` batches sampling ahead of it."""
        if not self.prefetcher.queued:
            self._submit()
        sampled, waited = self.prefetcher.take()
        while self.prefetcher.queued < self.depth:
            self._submit()  # the engine starts on the next batches while this one is scored and trained on
        scored = self.producer.score(sampled)
        versions = scored.rollout.weight_versions
        staleness = [self.step - v for v in versions]
        scored.metrics.describe({
            "async/staleness/mean": round(sum(staleness) / max(1, len(staleness)), 4),
            "async/staleness/max": float(max(staleness, default=0)),
            "async/queue_depth": float(self.prefetcher.queued),
        })
        scored.metrics.add_phase("time/rollout_wait", waited)
        return scored

    def _submit(self) -> None:
        prompts, index, injected = self.producer.draw()
        self.prefetcher.submit_sample(lambda: self.producer.sample(prompts, index, injected))

    def _inject(self, prompts: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
        return self.reroll.inject(prompts, self.step)

    def _after_scoring(self, scored: ScoredBatch) -> ScoredBatch:
        extra = self.reroll.collect(scored)
        if self.replay is not None:
            scored, replay_metrics = self.replay.apply(scored)
            extra.update(replay_metrics)
        scored.metrics.describe(extra)
        return scored

    def engine_call(self, job: Callable[[], Any]) -> Any:
        """Run engine work in order with the sampling (evaluation)."""
        return self.prefetcher.call(job)

    # ------------------------------------------------------------------ weights
    def after_optimizer_step(self, policy, step: int, changed: bool = True) -> float:
        """Push the new weights when due; when no step since the last push changed them (skipped steps), only the
        engine's version moves on. Returns the seconds the main thread spent (snapshot, or the whole load when
        synchronous)."""
        self.step = step
        self.changed = self.changed or changed
        if not self.weight_sync.due(step):
            return 0.0
        return self.push(policy, step)

    def push(self, policy, version: int) -> float:
        began = time.perf_counter()
        relabel = None if self.changed else self.weight_sync.prepare_relabel(version)
        self.prefetcher.submit_load(relabel or self.weight_sync.prepare(policy, version))
        self.changed = False
        return time.perf_counter() - began

    def sync_now(self, policy) -> None:
        """Make the engine serve the current weights before anything else samples (evaluation, checkpoints)."""
        if self.weight_sync.pushed != self.step:
            self.push(policy, self.step)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self, policy) -> dict[str, Any]:
        if self.lost:  # the engine stopped answering: nothing can be pushed or drained; a resume samples those again
            return {"pending": [], "draws": self.producer.draws, "weight_version": self.step,
                    "reroll": self.reroll.state_dict(), "replay": self.replay.state_dict() if self.replay else {}}
        self.sync_now(policy)
        pending = self.prefetcher.drain()  # every batch in flight finishes; they are saved, not re-sampled
        return {"pending": [batch.to_state() for batch in pending], "draws": self.producer.draws,
                "weight_version": self.weight_sync.pushed, "reroll": self.reroll.state_dict(),
                "replay": self.replay.state_dict() if self.replay else {}}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        self.step = step
        self.producer.draws = state.get("draws", 0)
        self.prefetcher.replace_ready([SampledBatch.from_state(s) for s in state.get("pending", [])])
        self.reroll.load_state_dict(state.get("reroll", {}))
        if self.replay is not None:
            self.replay.load_state_dict(state.get("replay", {}))

    def close(self) -> None:
        self.prefetcher.close()

