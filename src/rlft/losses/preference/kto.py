"""KTO: the per-row loss against a KL reference point, and the checks of a dataset's label balance."""

from __future__ import annotations

from typing import NamedTuple

import torch

from rlft.losses.preference.rows import check_same_rows

KTO_BALANCE_RANGE = (1.0, 4.0 / 3.0)


class KTOOutput(NamedTuple):
    """losses: (B,) in batch order; rewards of the desirable / undesirable rows (detached); kl: the reference point z0."""

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor
    kl: torch.Tensor


def kto_loss(
    policy_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    desirable: torch.Tensor,
    policy_kl_logps: torch.Tensor,
    ref_kl_logps: torch.Tensor,
    *,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> KTOOutput:
    """KTO (https://arxiv.org/abs/2402.01306, Eq. 7), per row, in batch order.

    r = log pi(y|x) - log pi_ref(y|x) (summed over completion tokens). Reference point
    z0 = max(0, mean(policy_kl_logps - ref_kl_logps)), detached, from mismatched pairs (x_i, y_{i+1}) that the caller
    builds (and gathers across processes, as TRL does, when it wants a global z0); an empty KL batch gives z0 = 0.
    desirable:   lambda_D * (1 - sigmoid(beta * (r - z0)))
    undesirable: lambda_U * (1 - sigmoid(beta * (z0 - r)))
    Rewards beta * r of the desirable / undesirable rows, detached. Reference inputs are detached.
    """
    check_same_rows(policy_logps=policy_logps, ref_logps=ref_logps, desirable=desirable)
    desirable = desirable.bool()
    logratios = policy_logps - ref_logps.detach()
    kl_diff = (policy_kl_logps - ref_kl_logps).detach()
    if kl_diff.numel() == 0:
        kl = torch.zeros((), dtype=logratios.dtype, device=logratios.device)
    else:
        kl = kl_diff.float().mean().clamp(min=0).to(logratios.dtype)
    desirable_losses = desirable_weight * (1 - torch.sigmoid(beta * (logratios - kl)))
    undesirable_losses = undesirable_weight * (1 - torch.sigmoid(beta * (kl - logratios)))
    losses = torch.where(desirable, desirable_losses, undesirable_losses)
    rewards = (beta * logratios).detach()
    return KTOOutput(losses, rewards[desirable], rewards[~desirable], kl)


def check_kto_labels(n_desirable: int, n_undesirable: int) -> None:
    """Refuse a KTO dataset with one label class only: raise ValueError explaining why and what to do."""
    if n_desirable > 0 and n_undesirable > 0:
        return
    missing = "undesirable (label false)" if n_undesirable == 0 else "desirable (label true)"
    raise ValueError(
        f"KTO needs both desirable and undesirable examples, but the dataset has {n_desirable} desirable and "
        f"{n_undesirable} undesirable rows: no {missing} rows. KTO raises the reward of desirable completions above the "
        "reference point and pushes undesirable ones below it; with one class the loss only moves the policy one way "
        "and the KL reference point is its only brake. Add rows of the missing label (check the `label` field of the "
        "dataset format), or use SFT for good examples only."
    )


def kto_imbalance_warning(n_desirable: int, n_undesirable: int, desirable_weight: float, undesirable_weight: float) -> str | None:
    """A warning when lambda_D * n_D / (lambda_U * n_U) leaves [1, 4/3] (KTO paper, Eq. 8 and Section 4.2), else None.

    TRL checks the same bounds (with 1.33) but only when n_D != n_U; this checks always, so equal counts with unequal
    weights are flagged too. Raises ValueError (`check_kto_labels`) when a class is empty.
    """
    check_kto_labels(n_desirable, n_undesirable)
    low, high = KTO_BALANCE_RANGE
    ratio = desirable_weight * n_desirable / (undesirable_weight * n_undesirable)
    if low - 1e-9 <= ratio <= high + 1e-9:
        return None
    balanced_desirable_weight = undesirable_weight * n_undesirable / n_desirable  # gives a ratio of exactly 1
    balanced_undesirable_weight = desirable_weight * n_desirable / n_undesirable
    desirable_range = (low * balanced_desirable_weight, high * balanced_desirable_weight)
    undesirable_range = (balanced_undesirable_weight / high, balanced_undesirable_weight / low)
    return (
        f"KTO class balance: {n_desirable} desirable and {n_undesirable} undesirable rows with "
        f"kto_desirable_weight={desirable_weight:g} and kto_undesirable_weight={undesirable_weight:g} give "
        f"desirable_weight*n_desirable / (undesirable_weight*n_undesirable) = {ratio:.3g}, outside the range [1, 4/3] the "
        f"KTO paper recommends (https://arxiv.org/abs/2402.01306); set kto_desirable_weight in "
        f"[{desirable_range[0]:.3g}, {desirable_range[1]:.3g}] or kto_undesirable_weight in "
        f"[{undesirable_range[0]:.3g}, {undesirable_range[1]:.3g}] (one of the two, not both)."
    )
