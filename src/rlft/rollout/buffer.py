"""What the producer keeps between generation batches: the replay buffer and the re-roll queue.

* Replay (`replay_buffer_size`, as Axolotl's fast async GRPO trainer keeps it): prompt groups with a
  learning signal are kept, scored by how much they teach, score = sum_i |A_i| * sum_k std_k (advantages of
  the group's rows, per-reward-function std across the group). A group with no signal (every reward function
  constant within it) is replaced by a stored group drawn with probability proportional to its score. Unlike
  Axolotl, a replayed group is moved in whole (prompt, completions, sampling log-probs, rewards, advantages,
  weight version): rows are lists of their own length, so nothing is re-padded or misaligned. Its old
  log-probs are the current policy's like every other row's (replay_recompute_logps: true), or, with
  replay_recompute_logps: false, the sampling log-probs recorded with the group (no forward pass for it; the
  PPO ratio then measures the whole distance from the weights that sampled it). Its weight version stays the
  one that sampled it, so the importance-sampling correction and allowed_outdated_steps see how stale it is.
* Re-roll (`reroll_start_fraction`, `reroll_max_groups`, as Axolotl names them): a prompt whose every completion scored 0
  on every reward function is queued; from `reroll_start_fraction * max_steps` on, up to `reroll_max_groups`
  queued prompts replace the last prompts of each new draw, so they are sampled again. (Axolotl queues them
  but never injects them back.)

Both are checkpointed with the recipe state and change nothing when disabled.
"""

from __future__ import annotations

import copy
import heapq
import itertools
from typing import Any

import torch

from rlft.rollout.scoring import weighted_total
from rlft.rollout.types import Rollout, ScoredBatch, Scores


def group_std(values: torch.Tensor, group: int) -> torch.Tensor:
    """(groups, K) per-function std (Bessel) within each group; NaN rewards are ignored, fewer than 2 -> 0."""
    rows = values.view(-1, group, values.size(-1))
    valid = ~torch.isnan(rows)
    count = valid.sum(1).clamp_min(1)
    mean = torch.nan_to_num(rows, 0.0).sum(1) / count
    spread = (torch.where(valid, rows - mean[:, None], torch.zeros_like(rows)) ** 2).sum(1)
    return torch.where(valid.sum(1) > 1, (spread / (count - 1).clamp_min(1)).sqrt(), torch.zeros_like(mean))


class ReplayBuffer:
    """A bounded store of high-signal prompt groups (a min-heap on score: the least useful one is evicted)."""

    def __init__(self, size: int, seed: int = 0):
        self.size = size
        self._heap: list[tuple[float, int, dict[str, Any]]] = []
        self._counter = itertools.count()
        self._generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return len(self._heap)

    def offer(self, score: float, entry: dict[str, Any]) -> None:
        if self.size <= 0:
            return
        item = (score, next(self._counter), entry)
        if len(self._heap) < self.size:
            heapq.heappush(self._heap, item)
        elif score > self._heap[0][0]:
            heapq.heapreplace(self._heap, item)

    def sample(self, count: int) -> list[dict[str, Any]]:
        """`count` stored groups, drawn with probability proportional to their score (kept in the buffer)."""
        if not self._heap or count <= 0:
            return []
        weights = torch.tensor([max(score, 1e-8) for score, _, _ in self._heap])
        picks = torch.multinomial(weights / weights.sum(), count, replacement=count > len(self._heap), generator=self._generator)
        return [copy.deepcopy(self._heap[i][2]) for i in picks.tolist()]

    def apply(self, scored: ScoredBatch) -> tuple[ScoredBatch, dict[str, float]]:
        """Store this batch's groups with signal; replace its groups without signal by stored ones."""
        group = scored.group_size
        stds = group_std(scored.scores.values, group)  # (groups, K)
        has_signal = (stds > 0).any(-1)
        advantages = scored.advantages.view(-1, group)
        empty = (~has_signal).nonzero().flatten().tolist()
        drawn = self.sample(len(empty))  # groups stored by earlier batches only
        for g in has_signal.nonzero().flatten().tolist():
            self.offer(float(advantages[g].abs().sum() * stds[g].sum()), group_entry(scored, g))
        replacements = len(drawn)
        if drawn:
            scored = replace_groups(scored, dict(zip(empty, drawn)))
        return scored, {"replay_buffer_replacements": float(replacements), "replay_buffer_size": float(len(self._heap))}

    def state_dict(self) -> dict[str, Any]:
        # the heap's own array order: `sample` draws by position in it, so a resume must see the same order
        return {"heap": [[score, number, entry] for score, number, entry in self._heap],
                "generator": self._generator.get_state().tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._heap = [(score, number, entry) for score, number, entry in state.get("heap", [])]
        for score, entry in state.get("entries", []):  # a state of (score, entry) pairs without their heap order
            heapq.heappush(self._heap, (score, next(self._counter), entry))
        self._counter = itertools.count(max((number for _, number, _ in self._heap), default=-1) + 1)
        if "generator" in state:
            self._generator.set_state(torch.tensor(state["generator"], dtype=torch.uint8))


def group_entry(scored: ScoredBatch, g: int) -> dict[str, Any]:
    """Everything of group g, as plain lists (JSON-able for checkpoints)."""
    rows = list(range(g * scored.group_size, (g + 1) * scored.group_size))
    part = scored.rollout.select(rows)
    return {"prompt": scored.prompts[g], "rollout": {name: getattr(part, name) for name in Rollout.__dataclass_fields__},
            "values": scored.scores.values[rows].tolist(), "advantages": scored.advantages[rows].tolist()}


def replace_groups(scored: ScoredBatch, replacements: dict[int, dict[str, Any]]) -> ScoredBatch:
    """A copy of `scored` whose groups g in `replacements` hold the stored groups instead."""
    group = scored.group_size
    prompts, parts, values, advantages = [], [], [], []
    for g in range(len(scored.prompts)):
        rows = list(range(g * group, (g + 1) * group))
        entry = replacements.get(g)
        if entry is None:
            prompts.append(scored.prompts[g])
            parts.append(scored.rollout.select(rows))
            values.append(scored.scores.values[rows])
            advantages.append(scored.advantages[rows])
        else:
            prompts.append(entry["prompt"])
            parts.append(Rollout(**entry["rollout"]))
            values.append(torch.tensor(entry["values"], dtype=scored.scores.values.dtype))
            advantages.append(torch.tensor(entry["advantages"], dtype=scored.advantages.dtype))
    old = scored.scores
    value_tensor = torch.cat(values)
    scores = Scores(value_tensor, old.names, old.weights, weighted_total(value_tensor, old.weights), old.metrics, old.failures)
    advantage_tensor = torch.cat(advantages)
    replayed = frozenset(g * group + i for g in replacements for i in range(group)) | scored.replayed_rows
    return ScoredBatch(prompts, Rollout.concat(parts), scores, advantage_tensor, group,
                       skip=scored.skip and bool((advantage_tensor == 0).all()), dropped=scored.dropped, metrics=scored.metrics,
                       replayed_rows=replayed)


class RerollQueue:
    """Prompts whose whole group scored 0 everywhere, waiting to be sampled again (FIFO)."""

    def __init__(self, start_step: int | None, max_groups: int):
        self.start_step = start_step  # None: re-roll is off
        self.max_groups = max_groups
        self.waiting: list[dict[str, Any]] = []

    @property
    def enabled(self) -> bool:
        return self.start_step is not None

    def collect(self, scored: ScoredBatch) -> dict[str, float]:
        if not self.enabled:
            return {}
        values = scored.scores.values.view(-1, scored.group_size, scored.scores.values.size(-1))
        failed = (torch.nan_to_num(values, 0.0).abs() < 1e-6).all(-1).all(-1)
        added = [scored.prompts[g] for g in failed.nonzero().flatten().tolist()]
        self.waiting.extend(copy.deepcopy(added))
        return {"reroll_buffered": float(len(added)), "reroll_buffer_size": float(len(self.waiting))}

    def inject(self, prompts: list[dict[str, Any]], step: int) -> tuple[list[dict[str, Any]], int]:
        """`prompts` with up to max_groups of its last entries replaced by waiting prompts (from start_step on)."""
        if not self.enabled or step < self.start_step or not self.waiting:
            return prompts, 0
        count = min(self.max_groups, len(self.waiting), len(prompts))
        taken, self.waiting = self.waiting[:count], self.waiting[count:]
        return prompts[: len(prompts) - count] + taken, count

    def state_dict(self) -> dict[str, Any]:
        return {"waiting": self.waiting}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.waiting = list(state.get("waiting", []))
