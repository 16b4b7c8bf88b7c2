"""The Bradley-Terry loss of a reward model trained on preference pairs."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _as_rows(name: str, values: torch.Tensor) -> torch.Tensor:
    """(B,) stays, (B, 1) from a scalar head becomes (B,); anything else is refused (no silent broadcasting)."""
    if values.dim() == 2 and values.size(-1) == 1:
        values = values.squeeze(-1)
    if values.dim() != 1:
        raise ValueError(f"{name} must have shape (B,) or (B, 1), got {tuple(values.shape)}")
    return values


def bradley_terry_loss(
    rewards_chosen: torch.Tensor,
    rewards_rejected: torch.Tensor,
    margin: torch.Tensor | None = None,
    center_rewards_coefficient: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bradley-Terry reward-model loss per pair, and accuracy r_c > r_r (TRL's metric, margin ignored).

    loss_i = -log sigmoid(r_c,i - r_r,i - m_i) + c * (r_c,i + r_r,i)^2
    InstructGPT https://arxiv.org/abs/2203.02155 (margin: Llama 2 https://arxiv.org/abs/2307.09288); the centring term
    of Eisenstein et al. https://arxiv.org/abs/2312.09244 Eq. 2, c = center_rewards_coefficient (TRL: None, 0.01
    recommended; EasyDeL 0.1). TRL adds c * mean((r_c + r_r)^2) to the batch mean; the per-row form has exactly that
    batch mean. Rewards (B, 1) from a scalar head are squeezed to (B,); margin is per row, (B,) or (B, 1). Shapes must
    match: EasyDeL's (B, 1) - (B,) broadcast to (B, B) (https://github.com/erfanzar/EasyDeL) is refused instead of averaged.
    """
    chosen = _as_rows("rewards_chosen", rewards_chosen)
    rejected = _as_rows("rewards_rejected", rewards_rejected)
    if chosen.shape != rejected.shape:
        raise ValueError(f"rewards_chosen {tuple(chosen.shape)} and rewards_rejected {tuple(rejected.shape)} differ in shape")
    difference = chosen - rejected
    if margin is not None:
        margin = _as_rows("margin", margin)
        if margin.shape != chosen.shape:
            raise ValueError(f"margin {tuple(margin.shape)} must have one value per pair, shape {tuple(chosen.shape)}")
        difference = difference - margin.to(difference.dtype)
    losses = -F.logsigmoid(difference)
    if center_rewards_coefficient:
        losses = losses + center_rewards_coefficient * (chosen + rejected) ** 2
    return losses, (chosen > rejected).detach()
