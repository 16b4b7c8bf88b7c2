"""An online-RL optimizer step's rows as this process's micro-batches: `micro_batch_size` rows each, or packed by a token
budget (`trl.max_token_len_per_mini_batch`, Cosmos-RL's dynamic micro-batches); and for Cosmos-RL's `balance_dp_token`
the rows and loss tokens of the micro-batches at each place on all processes together.

Every process holds the whole step's rows (rank 0 samples and broadcasts them), so each one computes every process's
split itself: the processes agree on how many forward passes to run, and on the totals, without a collective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, Sequence, TypeVar

from rlft.data.collate import first_fit

Row = TypeVar("Row")


def by_tokens(rows: Sequence[Row], budget: int, length: Callable[[Row], int]) -> list[list[Row]]:
    """`rows` packed into micro-batches of at most `budget` tokens (`length(row)` each) by first fit, rows in their
    order within each micro-batch and micro-batches in the order of their first row. A row longer than `budget`
    cannot be split: it is a micro-batch of its own."""
    return [[rows[index] for index in pack] for pack in first_fit([length(row) for row in rows], budget)]


def chunks(rows: Sequence[Row], size: int, budget: int | None, length: Callable[[Row], int]) -> list[list[Row]]:
    """`rows` as micro-batches: with a `budget`, packed `by_tokens`; else `size` rows each."""
    if budget is not None:
        return by_tokens(rows, budget, length)
    return [list(rows[start : start + size]) for start in range(0, len(rows), size)]


@dataclass(frozen=True)
class StepSplit(Generic[Row]):
    mine: list[list[Row]]  # this process's micro-batches, in order
    padding: int  # padding micro-batches (weight 0) it runs after them, so that every process runs as many
    totals: list[tuple[int, int]]  # per place k: rows and loss tokens of the k-th micro-batches of all processes


def split_step(window: Sequence[Row], rank: int, world: int, size: int, accumulation: int, budget: int | None,
               length: Callable[[Row], int], loss_tokens: Callable[[Row], int] | None = None) -> StepSplit[Row]:
    """Process r trains its contiguous share of the step's `window` (rows r x `size` x `accumulation` onwards, as many
    as one process would have trained alone), cut into micro-batches of `size` rows, or with a `budget` packed
    `by_tokens`; a process with fewer micro-batches than the most runs padding ones. `totals` (only with
    `loss_tokens`) adds up, for each place k, the rows and the loss tokens of every process's k-th micro-batch (a
    process without one adds nothing)."""
    share = size * accumulation
    splits = [chunks(window[process * share : (process + 1) * share], size, budget, length) for process in range(world)]
    most = max((len(split) for split in splits), default=0)
    totals = []
    if loss_tokens is not None:
        for place in range(most):
            batches = [split[place] for split in splits if place < len(split)]
            totals.append((sum(len(batch) for batch in batches), sum(loss_tokens(row) for batch in batches for row in batch)))
    return StepSplit(splits[rank], most - len(splits[rank]), totals)
