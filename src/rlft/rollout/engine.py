"""Rollout engines: the protocol the producer samples through.

Every engine reports each token's log-prob from the exact distribution it was drawn from (after
repetition penalty, temperature, min-p, top-k and top-p), so importance-sampling
corrections compare like with like (`rlft.models.logprobs.process_logits`, which the trainer evaluates too).
`LocalEngine` (rollout/local.py) is the in-process one.
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
    samples afterwards carries. `health()` says whether it can serve, with its version. An engine may also offer
    `relabel(version)`: the weights it holds stand for `version` too (a step that changed nothing), without a load.
    """

    @property
    def version(self) -> int: ...

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, num_samples: int = 1,
                 seed: int | None = None) -> Rollout: ...

    def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None: ...

    def health(self) -> dict[str, Any]: ...
