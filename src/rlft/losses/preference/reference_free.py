"""Preference losses without a reference model: ORPO and CPO/SimPO."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from rlft.losses.preference.rows import check_same_rows, per_token

CPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "simpo")


class ORPOOutput(NamedTuple):
    """Per-row values under TRL's metric names (so dashboards keep working):

    log_odds_ratio = log sigmoid(log odds(y_w) - log odds(y_l))   (TRL logs its mean as `log_odds_ratio`)
    log_odds_chosen = log odds(y_w) - log odds(y_l)               (TRL logs its mean as `log_odds_chosen`)
    """

    losses: torch.Tensor
    log_odds_ratio: torch.Tensor
    log_odds_chosen: torch.Tensor


class CPOOutput(NamedTuple):
    """losses: (B,); rewards: beta * the (summed or averaged) policy log-prob used by the loss, detached."""

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, stable on both sides of -log 2 (Maechler 2012)."""
    return torch.where(x < -math.log(2), torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def orpo_loss(
    chosen_avg_logps: torch.Tensor,
    rejected_avg_logps: torch.Tensor,
    chosen_nll: torch.Tensor,
    *,
    alpha: float,
) -> ORPOOutput:
    """ORPO (https://arxiv.org/abs/2403.07691, Eq. 6-7): loss = L_NLL(y_w) - alpha * log sigmoid(log odds(y_w) - log odds(y_l)).

    p = exp(mean token log-prob of the completion) (chosen_avg_logps, rejected_avg_logps), log odds(p) =
    log p - log(1 - p) = avg_logp - log1mexp(avg_logp), in float32; average log-probs are clamped at -1e-7 so a
    probability rounding to 1 gives a large finite log-odds instead of inf - inf = NaN. alpha is `orpo_alpha` (lambda
    in the paper, TRL's beta, default 0.1 there).

    chosen_nll is the per-sequence NLL of the chosen completion tokens only (not the prompt), averaged per token: the
    paper's L_SFT = -(1/m) sum_t log P(y_t | x, y_<t) over the response. TRL's decoder-only path instead takes the NLL
    over prompt + response tokens; this follows the paper.
    """
    check_same_rows(chosen_avg_logps=chosen_avg_logps, rejected_avg_logps=rejected_avg_logps, chosen_nll=chosen_nll)
    chosen = chosen_avg_logps.float().clamp(max=-1e-7)
    rejected = rejected_avg_logps.float().clamp(max=-1e-7)
    log_odds = (chosen - _log1mexp(chosen)) - (rejected - _log1mexp(rejected))
    log_sigmoid_odds = F.logsigmoid(log_odds)
    return ORPOOutput(chosen_nll.float() - alpha * log_sigmoid_odds, log_sigmoid_odds, log_odds)


def cpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    chosen_lengths: torch.Tensor,
    rejected_lengths: torch.Tensor,
    *,
    loss_type: str,
    beta: float,
    gamma: float = 0.5,
    label_smoothing: float = 0.0,
    cpo_alpha: float = 1.0,
    chosen_nll: torch.Tensor | None = None,
    length_normalize: bool | None = None,
) -> CPOOutput:
    """CPO (https://arxiv.org/abs/2401.08417) and SimPO (https://arxiv.org/abs/2405.14734): no reference model.

    L = log pi(y) summed over completion tokens, or averaged per token when length_normalize (None: averaged for ipo
    and simpo, summed for sigmoid and hinge, as TRL's CPOTrainer); d = L_w - L_l, e = label_smoothing.
    sigmoid  -(1-e) log sigmoid(beta d) - e log sigmoid(-beta d)        CPO Eq. 3 (e = 0)
    hinge    max(0, 1 - beta d)
    ipo      (d - 1/(2 beta))^2
    simpo    -(1-e) log sigmoid(beta d - gamma) - e log sigmoid(-(beta d - gamma))   SimPO Eq. 6
    plus cpo_alpha * NLL(y_w), the CPO behaviour-cloning term, with NLL = chosen_nll (per-sequence NLL per chosen
    completion token) or -policy_chosen / |y_w|.

    gamma is the SimPO paper's target reward margin, config key `simpo_gamma` (TRL's simpo_gamma is the same gamma:
    it computes beta * (d - gamma / beta)); the SimPO authors' code takes gamma_beta_ratio = gamma / beta instead.
    cpo_alpha defaults to 1.0 as in TRL/Axolotl, which for simpo gives CPO-SimPO; the paper's pure SimPO is
    cpo_alpha = 0 (TRL's `alphapo` sets that). The SimPO paper uses beta of 2-10 and gamma around 0.5-1.5, not
    TRL's CPO default beta = 0.1. Rewards are beta * L (the summed or averaged log-prob), detached.
    """
    check_same_rows(
        policy_chosen=policy_chosen,
        policy_rejected=policy_rejected,
        chosen_lengths=chosen_lengths,
        rejected_lengths=rejected_lengths,
    )
    if loss_type not in CPO_LOSS_TYPES:
        raise ValueError(f"unknown CPO loss type {loss_type!r}; valid types: {', '.join(CPO_LOSS_TYPES)}")
    if length_normalize is None:
        length_normalize = loss_type in ("ipo", "simpo")
    if length_normalize:
        chosen, rejected = per_token(policy_chosen, chosen_lengths), per_token(policy_rejected, rejected_lengths)
    else:
        chosen, rejected = policy_chosen, policy_rejected
    logits = beta * (chosen - rejected)
    eps = label_smoothing
    if loss_type == "sigmoid":
        losses = -(1 - eps) * F.logsigmoid(logits) - eps * F.logsigmoid(-logits)
    elif loss_type == "hinge":
        losses = torch.relu(1 - logits)
    elif loss_type == "ipo":
        losses = (chosen - rejected - 1 / (2 * beta)) ** 2
    else:  # simpo
        margin_logits = logits - gamma
        losses = -(1 - eps) * F.logsigmoid(margin_logits) - eps * F.logsigmoid(-margin_logits)
    if cpo_alpha != 0.0:
        nll = chosen_nll if chosen_nll is not None else -per_token(policy_chosen, chosen_lengths)
        losses = losses + cpo_alpha * nll
    return CPOOutput(losses, (beta * chosen).detach(), (beta * rejected).detach())
