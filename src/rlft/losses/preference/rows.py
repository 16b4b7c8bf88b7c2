"""Shape checks and per-row reductions shared by the preference losses."""

from __future__ import annotations

import torch


def check_same_rows(**tensors: torch.Tensor) -> None:
    """Raise ValueError unless every tensor is 1-D with the same (B,) shape; the message names each shape."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    first = next(iter(shapes.values()))
    if len(first) != 1 or any(shape != first for shape in shapes.values()):
        raise ValueError(f"expected 1-D tensors of one shape (B,), got {shapes}")


def per_token(summed: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """summed / length, an empty completion counting as length 1 (as TRL does) so it gives 0, not NaN."""
    return summed / lengths.to(summed.dtype).clamp_min(1.0)


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # where() rather than a product: padded positions may hold -inf or NaN log-probs
    return torch.where(mask.bool(), values, torch.zeros_like(values)).sum(dim=-1)


def chosen_nll(chosen_logps: torch.Tensor, chosen_lengths: torch.Tensor, average: str = "pair") -> torch.Tensor:
    """Per-pair NLL of the chosen answers, scaled so that its mean over the pairs is the wanted average.

    pair  -log p(y_w) / |y_w| per pair: the mean over pairs averages each answer's token mean (CPO, ORPO, RPO papers).
    batch -log p(y_w) / mean |y_w|: the mean over pairs is sum of NLL / sum of tokens, TRL's cross-entropy over every
          chosen token of the micro-batch (long answers weigh more).
    """
    lengths = chosen_lengths.float().clamp_min(1)
    return -chosen_logps / (lengths.mean() if average == "batch" else lengths)
