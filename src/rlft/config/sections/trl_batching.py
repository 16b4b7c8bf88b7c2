"""Cosmos-RL's GRPO batching keys (its `train.train_policy` names, meanings and defaults) in the `trl:` section: micro-
batches packed by a token budget, and Cosmos-RL's `token-mean` divided by the tokens of every data-parallel rank. How
each runs, and how Cosmos-RL's `mini_batch` and `batch_size_per_optimize` map onto rlft's keys: docs/grpo.md#batching."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel

from rlft.config.base import field


class BatchingKeys(BaseModel):
    """A base of `TRLConfig`: the keys only (the rules are in rlft.config.rules.batching)."""

    max_token_len_per_mini_batch: Optional[int] = field(
        None,
        "Cosmos-RL's dynamic micro-batches: each process packs its rows of an optimizer step into micro-batches of at "
        "most this many tokens (prompt + completion of each row, first fit in row order) instead of micro_batch_size "
        "rows; a row longer than this trains alone. The step's rows stay micro_batch_size * gradient_accumulation_steps "
        "per process, and the gradient is the same as with fixed micro-batches (except for loss_type token-mean and "
        "bnpo, whose means are per micro-batch). Also sizes the old and reference log-prob passes. Default None (or "
        "0, as in Cosmos-RL): micro_batch_size rows per micro-batch.", ge=0,
    )
    balance_dp_token: bool = field(
        False,
        "Cosmos-RL's GRPO balance_dp_token, for loss_type token-mean: each micro-batch's token mean is taken over the "
        "micro-batches at its place on every data-parallel process together (their summed loss over their summed loss "
        "tokens), so each token of a step weighs the same whichever process holds it. Default false: each process's "
        "own token mean per micro-batch, averaged (Cosmos-RL's default). The other loss types never need it: dapo and "
        "cispo always divide by every process's tokens.",
    )
