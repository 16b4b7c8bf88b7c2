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

The throttle (Cosmos-RL's `allowed_outdated_steps`): a batch is sampled ahead only when it will start training at
most that many optimizer steps after the weights it is sampled with (the last load enqueued); otherwise the producer
waits, and tries again after the next weight push. When a batch starts training is known from the queue: the batch
being trained on was taken at step `taken_at`, and each batch trains at most `steps_per_batch` steps (fewer when rows
were dropped or dynamic sampling came up short), so a batch never starts later than estimated, and one the throttle
lets through is never dropped for age. A batch the trainer needs at once is sampled whatever the bound. With
`outdated_rollout_fetch_batch_size` N, a held batch's first N prompts are sampled at once all the same (the rest once
it is fresh enough); their rows are usually older than the bound when trained, and then dropped.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

from rlft.rollout.buffer import ReplayBuffer, RerollQueue
from rlft.rollout.prefetch import Prefetcher
from rlft.rollout.producer import RolloutProducer
from rlft.rollout.types import SampledBatch, ScoredBatch
from rlft.train.weight_sync import WeightSync


@dataclass
class HeldBatch:
    """A drawn batch the throttle holds back, its first `size` prompts sampled (or being sampled) already."""

    prompts: list[dict[str, Any]]
    index: int
    injected: int
    size: int
    part: Future

    def to_state(self) -> dict[str, Any]:
        return {"prompts": self.prompts, "index": self.index, "injected": self.injected, "size": self.size,
                "part": self.part.result().to_state()}

    @staticmethod
    def from_state(state: dict[str, Any]) -> HeldBatch:
        part: Future = Future()
        part.set_result(SampledBatch.from_state(state["part"]))
        return HeldBatch(state["prompts"], state["index"], state["injected"], state["size"], part)


class RolloutFeed:
    def __init__(self, make_producer: Callable[..., RolloutProducer], weight_sync: WeightSync, settings,
                 max_steps: int | None, seed: int, steps_per_batch: int = 1):
        """`make_producer(inject=, after_scoring=, run_engine=)` builds the producer with this feed's hooks: re-roll,
        the replay buffer, and engine work on the prefetcher. `steps_per_batch`: the optimizer steps a generation
        batch trains at most (the throttle's estimate)."""
        s = settings
        self.weight_sync, self.settings = weight_sync, s
        self.depth = s.prefetch_depth if s.async_prefetch else 0
        self.prefetcher = Prefetcher(self.depth)
        self.bound = s.allowed_outdated_steps if self.depth else None  # the throttle (on-demand batches need none)
        self.steps_per_batch = steps_per_batch
        self.version = 0  # the weights the next sample job samples with: the last load enqueued
        self.taken_at: int | None = None  # the optimizer step at which the batch being trained on was taken
        self.held: HeldBatch | None = None
        self.throttled = False  # the throttle held the producer back since the last batch was taken
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
            self._submit()  # needed now: sampled whatever its age
        sampled, waited = self.prefetcher.take()
        self.taken_at, throttled, self.throttled = self.step, self.throttled, False
        self._top_up()  # the engine starts on the next batches while this one is scored and trained on
        scored = self.producer.score(sampled)
        versions = scored.rollout.weight_versions
        staleness = [self.step - v for v in versions]
        scored.metrics.describe({
            "async/staleness/mean": round(sum(staleness) / max(1, len(staleness)), 4),
            "async/staleness/max": float(max(staleness, default=0)),
            "async/queue_depth": float(self.prefetcher.queued),
            **({"async/throttled": float(throttled)} if self.bound is not None else {}),
        })
        scored.metrics.add_phase("time/rollout_wait", waited)
        return scored

    def _top_up(self) -> None:
        """Sample ahead up to `depth` batches, each once the throttle lets it (or its first prompts, held)."""
        while self.prefetcher.queued < self.depth:
            if self.bound is None or self._starts_at() - self.version <= self.bound:
                self._submit()
                continue
            self.throttled = True
            early = self.settings.outdated_fetch_prompts
            if self.held is not None or not early:
                return
            drawn = self.producer.draw()
            if early < len(drawn[0]):
                self._hold(*drawn, early)
                return
            self._submit_drawn(*drawn)  # the early share is all of it

    def _starts_at(self) -> int:
        """The optimizer step at which the next batch sampled will be taken, at the latest."""
        if self.taken_at is None:  # none taken yet: the first is taken at once
            return self.step + self.steps_per_batch * self.prefetcher.queued
        return self.taken_at + self.steps_per_batch * (1 + self.prefetcher.queued)

    def _submit(self) -> None:
        if self.held is None:
            self._submit_drawn(*self.producer.draw())
            return
        held, self.held = self.held, None
        rest = held.prompts[held.size:]
        self.prefetcher.submit_sample(lambda: SampledBatch.join(
            held.part.result(), self.producer.sample(rest, held.index, held.injected, part=1)))

    def _submit_drawn(self, prompts: list[dict[str, Any]], index: int, injected: int) -> None:
        self.prefetcher.submit_sample(lambda: self.producer.sample(prompts, index, injected))

    def _hold(self, prompts: list[dict[str, Any]], index: int, injected: int, early: int) -> None:
        part = self.prefetcher.submit_part(lambda: self.producer.sample(prompts[:early], index))
        self.held = HeldBatch(prompts, index, injected, early, part)

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
        seconds = self.push(policy, step)
        self._top_up()  # fresher weights: a batch the throttle held may go now
        return seconds

    def push(self, policy, version: int) -> float:
        began = time.perf_counter()
        relabel = None if self.changed else self.weight_sync.prepare_relabel(version)
        # a synchronous feed loads at once, before training goes on: no snapshot of the weights
        load = relabel or self.weight_sync.prepare(policy, version, snapshot=self.prefetcher.depth > 0)
        self.prefetcher.submit_load(load)
        self.changed, self.version = False, version
        return time.perf_counter() - began

    def sync_now(self, policy) -> None:
        """Make the engine serve the current weights before anything else samples (evaluation, checkpoints)."""
        if self.weight_sync.pushed != self.step:
            self.push(policy, self.step)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self, policy) -> dict[str, Any]:
        throttle = {"taken_at": self.taken_at, "throttled": self.throttled}
        if self.lost:  # the engine stopped answering: nothing can be pushed or drained; a resume samples those again
            return {"pending": [], "draws": self.producer.draws, "weight_version": self.step, **throttle,
                    "reroll": self.reroll.state_dict(), "replay": self.replay.state_dict() if self.replay else {}}
        self.sync_now(policy)
        pending = self.prefetcher.drain()  # every batch in flight finishes; they are saved, not re-sampled
        return {"pending": [batch.to_state() for batch in pending], "draws": self.producer.draws,
                "weight_version": self.weight_sync.pushed, **throttle, "held": self.held.to_state() if self.held else None,
                "reroll": self.reroll.state_dict(), "replay": self.replay.state_dict() if self.replay else {}}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        self.step = step
        self.version = state.get("weight_version") or 0  # the weights the engine is built with (GRPOEngine.start)
        self.taken_at, self.throttled = state.get("taken_at"), state.get("throttled", False)
        self.held = HeldBatch.from_state(state["held"]) if state.get("held") else None
        self.producer.draws = state.get("draws", 0)
        self.prefetcher.replace_ready([SampledBatch.from_state(s) for s in state.get("pending", [])])
        self.reroll.load_state_dict(state.get("reroll", {}))
        if self.replay is not None:
            self.replay.load_state_dict(state.get("replay", {}))

    def close(self) -> None:
        self.prefetcher.close()

