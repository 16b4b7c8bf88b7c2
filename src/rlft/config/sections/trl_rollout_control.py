"""Cosmos-RL's GRPO rollout-control keys (its `train.train_policy` names, meanings and, where sensible, defaults), in the
`trl:` section: on-policy sampling, the throttle's trickle of early prompts, the draw limit of dynamic sampling, the
shared-prefix filter and the optimizer reset with the reference. How each runs: docs/rollout-server.md
(#asynchronous-grpo) and docs/grpo.md."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel

from rlft.config.base import field


class RolloutControlKeys(BaseModel):
    """A base of `TRLConfig`: the keys only (the rules are in rlft.config.rules.online)."""

    on_policy: bool = field(
        False,
        "Cosmos-RL's fully synchronised rollouts: every generation batch is sampled by the weights that start training "
        "on it (allowed_outdated_steps resolves to 0, so with async_prefetch the engine waits for those weights instead "
        "of sampling ahead); needs vllm_sync_interval 1. Default false.",
    )
    outdated_rollout_fetch_batch_size: int = field(
        0,
        "While allowed_outdated_steps holds the producer back (async_prefetch), it still samples this many prompts of the "
        "held generation batch with the weights it has (Cosmos-RL's outdated rollouts: rows older than the bound when "
        "trained are dropped, async/stale_rows_dropped); the batch's other prompts wait for fresher weights. 0 = the "
        "producer waits. Default 0 (Cosmos-RL's is 1, which a translated Cosmos-RL file carries).", ge=0,
    )
    max_retry_for_on_policy: Optional[int] = field(
        None,
        "Dynamic sampling's draw limit (Cosmos-RL): at most this many times a generation batch's prompts are drawn to "
        "fill it with groups whose filter_reward_metric varies, and the run stops with an error when they do not fill "
        "it; 0 or -1 = draw until it is filled (the run stops after a whole epoch of prompts without). None = "
        "dynamic_sampling_max_retries applies instead (extra draws, then the step trains on what it has). Default None.",
        ge=-1,
    )
    min_filter_prefix_tokens: Optional[int] = field(
        None,
        "Cosmos-RL's shared-prefix filter: completions of a group that share a prefix of at least this many tokens (the "
        "longest prefix some of them share) and whose rewards differ are not trained on that prefix (its tokens leave "
        "the loss mask; a completion that is the prefix itself keeps its tokens). None or 0 = off. Default None.", ge=0,
    )
    reset_optimizer_with_reference: bool = field(
        True,
        "When reference_reset_interval copies the policy into the reference, the optimizer's state starts again as a new "
        "optimizer's (Adam's moments and step count zero; the learning-rate schedule goes on), as Cosmos-RL does. "
        "sync_ref_model's soft update is not a reset. Default true.",
    )
