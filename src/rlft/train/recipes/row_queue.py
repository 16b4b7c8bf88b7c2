"""The rows of a generation batch waiting to be trained on, one window per optimizer step.

A generation batch holds `steps_per_generation` optimizer steps of completions and is trained on `num_iterations`
times, as in TRL: its rows are split into windows of one step's rows, and the windows are queued that many times.
Rows sampled more than `allowed_outdated_steps` steps ago are dropped. Old log-probs are cached when the policy
moves before the rows are used up, and reference log-probs when beta > 0: the queue puts them on its rows (new
TrainingRows: a row is never changed once made).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from rlft.models.frozen import FrozenPolicy
from rlft.models.logprobs import completion_logps, completion_scores, sampled_logps
from rlft.phase_ranges import phase_range
from rlft.rollout.types import BatchMetrics, SamplingParams, TrainingRow
from rlft.train.metrics import clock
from rlft.train.micro_batches import chunks
from rlft.train.parallel import gather_objects, max_across

Logps = tuple[list[float], list[float] | None]  # a row's log-probs, and under the sampling filters (or None)


def row_length(row: TrainingRow) -> int:
    """The tokens a row puts into a forward pass (prompt and completion): what trl.max_token_len_per_mini_batch counts."""
    return len(row.prompt_ids) + len(row.completion_ids)


class RowQueue:
    def __init__(self, settings, step_rows: int, micro_batch_size: int, shard: tuple[int, int],
                 reference: FrozenPolicy | None, sampling: SamplingParams, compares_sampled: bool,
                 collate: Callable[[list[TrainingRow]], dict[str, Any]]):
        """`step_rows`: rows of one optimizer step over all processes; `collate`: rows -> a micro-batch's inputs (for the
        log-prob passes); `compares_sampled`: old log-probs are also kept under the engine's sampling filters."""
        self.settings, self.step_rows, self.micro_batch_size = settings, step_rows, micro_batch_size
        self.rank, self.world = shard
        self.reference, self.sampling, self.compares_sampled, self.collate = reference, sampling, compares_sampled, collate
        self.windows: list[list[TrainingRow]] = []  # each optimizer step's rows (all processes'), still to train on
        self.empty_reason = "skipped_zero_adv_batches"  # the metric of a step with nothing to train on

    def __len__(self) -> int:
        return len(self.windows)

    def pop(self) -> list[TrainingRow]:
        return self.windows.pop(0)

    def fill(self, model, rows: list[TrainingRow], skip: bool, step: int, metrics: BatchMetrics) -> None:
        """Queue a generation batch's rows (`skip`: it has no learning signal: its steps update nothing) at optimizer step
        `step`; into the batch's `metrics` go the rows dropped as stale and the log-prob pass (`time/logprobs`, part of
        `time/rollout_total`)."""
        s = self.settings
        rows, dropped = self.within_staleness(rows, step)
        if dropped:
            metrics.note("async/stale_rows_dropped", dropped)
        # no update on these steps: no learning signal, or every row older than allowed_outdated_steps
        self.empty_reason = "skipped_zero_adv_batches" if skip else "async/stale_batches_skipped"
        sizes = [0] * s.steps_per_generation if skip or not rows else [len(w) for w in self._windows(rows)]
        trained = rows if sizes[0] else []
        started = clock()
        recorded = {id(row) for row in trained if row.replayed and not s.replay_recompute_logps}
        # Old log-probs are cached when the policy moves before these rows are used up (several optimizer steps:
        # num_iterations, steps_per_generation, a generation_batch_size above one step's rows), or when replayed rows
        # keep their recorded ones. Otherwise the loss's own log-probs are the old ones (same weights), for free.
        if s.num_iterations * sum(1 for size in sizes if size) > 1 or recorded:
            # replay_recompute_logps: false keeps the log-probs recorded with the group
            trained = [self._with_recorded(row) if id(row) in recorded else row for row in trained]
            missing = [index for index, row in enumerate(trained) if row.old_logps is None]
            for index, (logps, sampled) in zip(missing, self._logps(model, [trained[i] for i in missing], reference=False)):
                trained[index] = dataclasses.replace(trained[index], old_logps=logps,
                                                     old_sampled_logps=sampled if sampled is not None else
                                                     trained[index].old_sampled_logps)
        if s.beta:
            trained = [dataclasses.replace(row, ref_logps=logps)
                       for row, (logps, _) in zip(trained, self._logps(model, trained, reference=True))]
        windows, start = [], 0
        for size in sizes:
            windows.append(trained[start : start + size])
            start += size
        self.windows = [window for _ in range(s.num_iterations) for window in windows]
        metrics.add_phase("time/logprobs", clock() - started, within="time/rollout_total")

    def within_staleness(self, rows: list[TrainingRow], step: int) -> tuple[list[TrainingRow], int]:
        """The rows sampled at most `allowed_outdated_steps` steps before `step` (replayed ones can be older), and how
        many were dropped."""
        bound = self.settings.allowed_outdated_steps
        if bound is None:
            return rows, 0
        kept = [row for row in rows if step - row.weight_version <= bound]
        return kept, len(rows) - len(kept)

    def _windows(self, rows: list[TrainingRow]) -> list[list[TrainingRow]]:
        """Split a generation batch into optimizer steps of `step_rows` rows."""
        return [rows[start : start + self.step_rows] for start in range(0, len(rows), self.step_rows)]

    def _with_recorded(self, row: TrainingRow) -> TrainingRow:
        """A replayed row with the sampling log-probs recorded with its group as its old ones."""
        return dataclasses.replace(row, old_logps=list(row.sampling_logps),
                                   old_sampled_logps=list(row.sampling_logps) if self.compares_sampled else None)

    def _logps(self, model, rows: list[TrainingRow], reference: bool) -> list[Logps]:
        """The policy's (or with `reference` the reference's) log-probs of every row, in order. Each process computes a
        contiguous share of the rows (a group's rows stay together, so they can share their prompt; the same number of
        forward passes on each, for FSDP's collectives), and all processes get all of them. A pass holds
        micro_batch_size rows, or as many as trl.max_token_len_per_mini_batch allows."""
        temperature = self.settings.temperature
        device = next(model.parameters()).device
        bounds = [len(rows) * rank // self.world for rank in range(self.world + 1)]
        mine = rows[bounds[self.rank] : bounds[self.rank + 1]]
        # packing by tokens may put a later row into an earlier pass: passes of positions, the values put back in order
        packs = chunks(range(len(mine)), self.micro_batch_size, self.settings.max_token_len_per_mini_batch,
                       lambda position: row_length(mine[position]))
        passes = int(max_across(len(packs), device))
        values: list[Logps | None] = [None] * len(mine)
        for place in range(passes):
            # a pass with nothing of its own: computed and dropped
            chunk = [mine[position] for position in packs[place]] if place < len(packs) else rows[:1]
            batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.collate(chunk).items()}
            sampled = None
            with torch.no_grad(), phase_range("logprobs"):
                if reference:
                    with self.reference.view(model) as network:
                        logps, _ = completion_logps(network, batch, temperature, False)
                else:
                    scores = completion_scores(model, batch)
                    logps, _ = scores.token_logps(temperature, False)
                    sampled = sampled_logps(scores, batch, self.sampling, logps)[0] if self.compares_sampled else None
            for index, position in enumerate(packs[place] if place < len(packs) else ()):
                width = len(mine[position].completion_ids)
                values[position] = (logps[index, :width].tolist(),
                                    sampled[index, :width].tolist() if sampled is not None else None)
        return gather_objects(values)  # rank order: rank r's are rows[bounds[r]:bounds[r + 1]], so all rows in order

    def state_dict(self) -> list[list[dict[str, Any]]]:
        return [[row.to_state() for row in window] for window in self.windows]

    def load_state_dict(self, windows: list) -> None:
        # a window is a list of rows
        self.windows = [[TrainingRow.from_state(row) for row in _flat(window)] for window in windows]


def _flat(window: list) -> list:
    return [row for item in window for row in (item if isinstance(item, list) else [item])]
