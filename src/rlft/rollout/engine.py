"""Rollout engines: the protocol the producer samples through, and the sampling distribution.

Every engine reports each token's log-prob from the exact distribution it was drawn from (after
repetition penalty, temperature, top-k, top-p and min-p, `process_logits`), so importance-sampling
corrections compare like with like. `LocalEngine` (rollout/local.py) is the in-process one.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

import torch

from rlft.rollout.types import Rollout, SamplingParams


class RolloutEngine(Protocol):
    """What the producer samples from. An engine holds its own weights: it never reads the module being trained.

    `seed` makes a batch's sampling reproducible (the same seed and weights give the same tokens);
    `version` names the weights it samples with; `load_weights` replaces them (all named tensors of the
    policy, or only those that train, such as a LoRA adapter's) and sets the version that every row it
    samples afterwards carries. `health()` says whether it can serve, with its version.
    """

    @property
    def version(self) -> int: ...

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, num_samples: int = 1,
                 seed: int | None = None) -> Rollout: ...

    def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None: ...

    def health(self) -> dict[str, Any]: ...


def process_logits(logits: torch.Tensor, seen: torch.Tensor | None, params: SamplingParams) -> torch.Tensor:
    """Scores of the sampling distribution (HF order: repetition penalty, temperature, top-k, top-p, min-p).

    `seen` (N, V) bool marks tokens already in each sequence (for the repetition penalty). Filtered
    tokens get -inf; log_softmax of the result is the distribution sampled from.
    """
    scores = logits.float()
    if params.repetition_penalty != 1.0 and seen is not None:
        penalised = torch.where(scores > 0, scores / params.repetition_penalty, scores * params.repetition_penalty)
        scores = torch.where(seen, penalised, scores)
    if params.temperature > 0 and params.temperature != 1.0:  # skip no-op work: decoding is overhead-bound
        scores = scores / params.temperature
    if 0 < params.top_k < scores.size(-1):  # 0 or -1 = off
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        ordered, order = torch.sort(scores, descending=True, dim=-1)
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop_sorted = cumulative - ordered.softmax(-1) >= params.top_p  # keep the smallest set reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    if params.min_p > 0:
        probs = scores.softmax(-1)
        scores = scores.masked_fill(probs < params.min_p * probs.max(-1, keepdim=True).values, float("-inf"))
    return scores
