"""Supervised fine-tuning loss: next-token cross-entropy on target tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100


def token_nll(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token negative log-likelihood of the next token and its mask.

    nll[b, t] = -log softmax(logits[b, t])[labels[b, t + 1]] for t < T-1; mask is labels[:, 1:] != -100.
    Returns (nll, mask), both (B, T-1); nll is 0 where mask is False.
    """
    targets = labels[:, 1:]
    mask = targets != IGNORE
    predicted = logits[:, :-1].float()
    nll = F.cross_entropy(predicted.reshape(-1, predicted.size(-1)), targets.clamp_min(0).reshape(-1), reduction="none")
    nll = nll.view_as(targets) * mask
    return nll, mask


def sft_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Sum of target-token NLL and the number of target tokens.

    The loop divides the sum by the target-token count of the whole accumulation window, so the loss
    is a true per-token mean however the tokens fall into micro-batches (gradient accumulation gives
    the same gradient as one big batch). An empty mask gives a zero sum and a count of 0.
    """
    nll, mask = token_nll(logits, labels)
    return nll.sum(), int(mask.sum())
