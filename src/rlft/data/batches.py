"""Which examples form each micro-batch of each epoch: a pure function of (seed, epoch).

Because the order is recomputed from the seed, resuming at (epoch, batch index) replays exactly
the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import math
import signal
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import torch

from rlft.data.collate import pack_examples, packed_batch, pad_batch


@dataclass
class MicroBatch:
    """One micro-batch as the training loop runs it: the collated tensors a recipe's loss reads (`inputs`, by the
    collator's names: input_ids (B, T), attention_mask (B, T), labels (B, T), ...), and what the loop counts."""

    inputs: dict[str, Any]
    num_tokens: int  # real (unpadded) tokens of its rows: tokens trained (`tokens`, tokens/s)
    model_tokens: int  # tokens the forward computes, each shared prompt once: what MFU counts
    padding: bool = False  # repeats another micro-batch so that collectives stay in step: weight 0, counted nowhere

    @staticmethod
    def collated(batch: dict[str, Any], padding: bool = False) -> "MicroBatch":
        """A collator's batch: its `num_tokens` and `model_tokens` (when a prompt is computed once for its answers) become
        fields, the rest the inputs."""
        inputs = {k: v for k, v in batch.items() if k not in ("num_tokens", "model_tokens")}
        tokens = int(batch["num_tokens"])
        return MicroBatch(inputs, tokens, int(batch.get("model_tokens", tokens)), padding)

    def to(self, device: torch.device) -> "MicroBatch":
        return MicroBatch(to_device(self.inputs, device), self.num_tokens, self.model_tokens, self.padding)


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The batch with its tensors on `device`."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


class BatchPlan:
    """Micro-batches of `examples` (packed into rows of `pack_capacity` tokens when given)."""

    def __init__(self, examples: list[Any], micro_batch_size: int, seed: int, pad_id: int, pack_capacity: int | None = None,
                 shard: tuple[int, int] = (0, 1), collate: Callable[[list[Any]], dict[str, Any]] | None = None,
                 lengths: list[int] | None = None, width: int = 0, seed_batches: bool = False, multiple: int = 1):
        """`lengths` turns on length grouping: within windows of 64 micro-batches of the shuffled order,
        rows of similar length share a batch (less padding), and the batches are shuffled again.
        `width` pads every batch to at least that many tokens (pad_to_sequence_len: one shape), `multiple` rounds
        each batch's width up to a multiple of it (pad_to_multiple_of).
        `seed_batches` gives each drawn batch a `sample_seed` of its own (`batch_seed`), the same whichever process
        draws it: a recipe that samples inside its loss draws the same samples on 1 or N processes, and after a resume."""
        self.seed_batches = seed_batches
        self.micro_batch_size = micro_batch_size
        self.lengths = lengths
        self.seed = seed
        self.rank, self.world = shard
        if pack_capacity:
            self.items = [[examples[i] for i in pack] for pack in pack_examples(examples, pack_capacity)]
        else:
            self.items = list(examples)
        self.collate = collate or rows_collate(bool(pack_capacity), pad_id, width, multiple)

    def __len__(self) -> int:
        """Micro-batches per epoch on this process."""
        return math.ceil(self.global_batches / self.world)

    @property
    def global_batches(self) -> int:
        """Micro-batches per epoch over all processes: a checkpoint keeps it, so a resume sees a plan that changed."""
        return math.ceil(len(self.items) / self.micro_batch_size)

    def epoch_order(self, epoch: int) -> list[list[int]]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(len(self.items), generator=generator).tolist()
        size = self.micro_batch_size
        if self.lengths is not None:
            window = size * 64
            order = [i for start in range(0, len(order), window)
                     for i in sorted(order[start : start + window], key=lambda j: self.lengths[j], reverse=True)]
        batches = [order[i : i + size] for i in range(0, len(order), size)]
        if self.lengths is not None:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
        mine = batches[self.rank :: self.world] or batches[:1]  # fewer batches than processes: repeat one, weight 0
        while len(mine) < len(self):  # equal counts on every process keep collectives in step (trained with weight 0)
            mine.append(mine[-1])
        return mine

    def is_padding(self, position: int) -> bool:
        """Whether this process's micro-batch `position` of an epoch only repeats one (the last process may have fewer)."""
        batches = math.ceil(len(self.items) / self.micro_batch_size)
        return position >= (batches - self.rank + self.world - 1) // self.world

    def batch_seed(self, epoch: int, position: int) -> int:
        """The seed of this process's micro-batch `position` of `epoch`, from its place in the global order."""
        return ((self.seed * 1_000_003 + epoch) * 1_000_033 + position * self.world + self.rank) % 2**62

    def batch(self, indices: list[int]) -> dict[str, Any]:
        return self.collate([self.items[i] for i in indices])

    def sequential(self) -> list[dict[str, Any]]:
        """All items, for evaluation: in order, or shortest first when `lengths` are known (rows of similar lengths
        share a batch: little padding)."""
        order = list(range(len(self.items)))
        if self.lengths is not None:
            order.sort(key=lambda i: self.lengths[i])
        return [self.batch(order[i : i + self.micro_batch_size]) for i in range(0, len(order), self.micro_batch_size)]


def rows_collate(packed: bool, pad_id: int, width: int = 0, multiple: int = 1) -> Callable[[list[Any]], dict[str, Any]]:
    """The default batch of a plan's items: packs (lists of examples) as packed rows, else examples as padded rows."""
    if packed:
        return lambda packs: packed_batch(packs, pad_id, width, multiple=multiple)
    return lambda rows: pad_batch(rows, pad_id, width, multiple)


class PlanCursor:
    """Where a run stands in a plan: (epoch, batch index). `next()` gives the next micro-batch, moving to the next
    epoch's order when one runs out. Checkpointed as two integers; a resume continues with the same batches."""

    def __init__(self, plan: BatchPlan, epoch: int = 0, batch_in_epoch: int = 0):
        self.plan, self.epoch, self.batch_in_epoch = plan, epoch, batch_in_epoch
        self._order: tuple[int, list[list[int]]] | None = None

    def next_indices(self) -> list[int]:
        while True:
            if self._order is None or self._order[0] != self.epoch:
                self._order = (self.epoch, self.plan.epoch_order(self.epoch))
            order = self._order[1]
            if self.batch_in_epoch < len(order):
                self.batch_in_epoch += 1
                return order[self.batch_in_epoch - 1]
            self.epoch += 1
            self.batch_in_epoch = 0

    def next(self) -> dict[str, Any]:
        return self.collate(self.draw())

    def epoch_rows(self) -> int:
        return len(self.plan.items)

    def draw(self) -> tuple[list[int], dict[str, Any]]:
        """The next micro-batch's example indices and what it carries besides its rows, the cursor moved past it.
        `collate` builds it, and may run on another thread (it reads nothing that `draw` changes)."""
        indices, extras = self.next_indices(), {}
        if self.plan.seed_batches:
            extras["sample_seed"] = self.plan.batch_seed(self.epoch, self.batch_in_epoch - 1)
        if self.plan.is_padding(self.batch_in_epoch - 1):
            extras["padding"] = True  # the loop runs it (collectives stay in step) and counts none of it
        return indices, extras

    def collate(self, drawn: tuple[list[int], dict[str, Any]]) -> dict[str, Any]:
        indices, extras = drawn
        return {**self.plan.batch(indices), **extras}

    def reshard(self, old_world: int, new_world: int, old_batches: int = 0, new_batches: int = 0) -> None:
        """Continue a position written by `old_world` processes with `new_world`: the global micro-batches consumed are
        kept; a remainder that does not divide is skipped, never repeated. Where the plan had `old_batches` micro-
        batches an epoch (over all processes) and has `new_batches` now (another micro_batch_size, sequence_len,
        packing or data), the same share of the epoch, rounded up likewise (0: not known, taken as unchanged)."""
        consumed = self.batch_in_epoch * old_world
        if old_batches and new_batches and old_batches != new_batches:
            consumed = -(-consumed * new_batches // old_batches)
        self.batch_in_epoch = -(-consumed // new_world)

    @property
    def epochs_done(self) -> float:
        return self.epochs_at(self.epoch, self.batch_in_epoch)

    def epochs_at(self, epoch: int, batch_in_epoch: int) -> float:
        return epoch + batch_in_epoch / max(1, len(self.plan))

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.batch_in_epoch = int(state.get("epoch", 0)), int(state.get("batch_in_epoch", 0))


class StepBatches:
    """Each training step's micro-batches from a cursor, the next step's collated on a background thread while this
    step computes, as a DataLoader worker would (a thread, not a process: collating needs nothing but the rows). The
    loop synchronises with the GPU during a step (loss values, the gradient norm), so collating in between had left the
    GPU idle: 5 ms of an 89 ms SFT step at micro batch 32 on an H200 (bench/results/sft_vs_trl-*-mb32.json).

    `ahead=False` (training on a CPU) collates each step when it is asked for, in the caller's thread: there the
    collating thread takes a core and the GIL from the step's own compute threads, and stalls them. DPO at size S
    with each prompt once (whose collation builds the shared layout) took 28.5 ms per step collated ahead against
    13.2 ms collated in the step, on 2 cores (bench/results/preference-S-collate-ahead.json, -in-step.json).

    The cursor moves when a step is drawn, one step ahead of training, so `next` also gives the position just after
    the step it returns: what a checkpoint saved after that step records. Batches are the same as drawn one by one."""

    def __init__(self, cursor: PlanCursor, count: int, ahead: bool = True):
        self.cursor, self.count, self.ahead = cursor, count, ahead
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: tuple[Future, tuple[int, int]] | None = None

    def next(self) -> tuple[list[MicroBatch], tuple[int, int]]:
        """The next step's `count` micro-batches and the (epoch, batch_in_epoch) after them."""
        if not self.ahead:
            collate, position = self._draw()
            return collate(), position
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="rlft-batches", initializer=_main_thread_signals)
        current = self._ahead or self._submit()
        self._ahead = self._submit()
        return current[0].result(), current[1]

    def _draw(self) -> tuple[Callable[[], list[MicroBatch]], tuple[int, int]]:
        """Draw the next step's micro-batches: (what collates them, the cursor's position after them)."""
        drawn = [self.cursor.draw() for _ in range(self.count)]
        return (lambda: [self._collate(d) for d in drawn]), (self.cursor.epoch, self.cursor.batch_in_epoch)

    def _collate(self, drawn: tuple[list[int], dict[str, Any]]) -> MicroBatch:
        indices, extras = drawn
        return MicroBatch.collated(self.cursor.collate((indices, {k: v for k, v in extras.items() if k != "padding"})),
                                   padding=bool(extras.get("padding")))

    def _submit(self) -> tuple[Future, tuple[int, int]]:
        collate, position = self._draw()
        return self._pool.submit(collate), position

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _main_thread_signals() -> None:
    """Ctrl-C and SIGTERM reach the main thread, which handles them (`StopRequest`, `stop_on_sigterm`): delivered to
    this thread, they would not interrupt a wait in the main one."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
