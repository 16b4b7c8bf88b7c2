"""Preference losses: the DPO family (IPO and 14 other loss types), WPO and LD-DPO, KTO, ORPO, CPO/SimPO, Bradley-Terry.

Every function is pure: it takes per-sequence log-probabilities (summed over the completion tokens, shape (B,)), completion
token counts where a loss needs per-token averages, and per-token log-probs with their masks only where a method needs them
(WPO, LD-DPO). Per-row losses come back with shape (B,); the recipe reduces them (mean over the batch, or a sum divided by
the accumulation window). Reference log-probs are treated as constants: they are detached here, whatever the caller passes.

Where TRL (v1.x, see spec/peers.md §3-4) differs from the paper, the paper and its authors are followed and the docstring
says so.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

DPO_LOSS_TYPES = (
    "sigmoid",
    "hinge",
    "ipo",
    "robust",
    "exo_pair",
    "nca_pair",
    "bco_pair",
    "sppo_hard",
    "aot",
    "aot_unpaired",
    "apo_zero",
    "apo_down",
    "discopop",
    "sft",
    "sigmoid_norm",
)
LENGTH_NORMALISED_LOSS_TYPES = frozenset({"ipo", "sigmoid_norm"})
BATCH_SORTED_LOSS_TYPES = frozenset({"aot", "aot_unpaired"})
CPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "simpo")
EXO_PAPER_EPSILON = 1e-3
KTO_BALANCE_RANGE = (1.0, 4.0 / 3.0)


class DPOOutput(NamedTuple):
    """losses: (B,) weighted sum over the loss types (times sample_weights when given); rewards: beta * log-ratio, detached."""

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor


class KTOOutput(NamedTuple):
    """losses: (B,) in batch order; rewards of the desirable / undesirable rows (detached); kl: the reference point z0."""

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor
    kl: torch.Tensor


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


def _check_same_1d(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    first = next(iter(shapes.values()))
    if len(first) != 1 or any(shape != first for shape in shapes.values()):
        raise ValueError(f"expected 1-D tensors of one shape (B,), got {shapes}")


def _per_token(summed: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """summed / length, an empty completion counting as length 1 (as TRL does) so it gives 0, not NaN."""
    return summed / lengths.to(summed.dtype).clamp_min(1.0)


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    *,
    loss_types: list[str],
    beta: float,
    loss_weights: list[float] | None = None,
    label_smoothing: float = 0.0,
    chosen_lengths: torch.Tensor | None = None,
    rejected_lengths: torch.Tensor | None = None,
    chosen_nll: torch.Tensor | None = None,
    bco_running_mean: float | None = None,
    discopop_tau: float = 0.05,
    sample_weights: torch.Tensor | None = None,
) -> DPOOutput:
    """DPO and its loss family, per preference pair; `losses` = sum_k loss_weights[k] * L_k (times sample_weights).

    Notation (all (B,)): Dw = log pi(y_w|x) - log pi_ref(y_w|x), Dl likewise for y_l, d = Dw - Dl, b = beta,
    e = label_smoothing, s(z) = sigmoid(z); |y| = completion token count; Dw' = Dw / |y_w|, Dl' = Dl / |y_l|.

    sigmoid      -(1-e) log s(b d) - e log s(-b d)        DPO https://arxiv.org/abs/2305.18290; with e > 0 the
                 conservative cDPO https://ericmitchell.ai/cdpo.pdf (TRL < 1.0 and Axolotl did this; TRL 1.x ignores e
                 for sigmoid, which silently drops a configured `dpo_label_smoothing`). e = 0 is plain DPO.
    hinge        max(0, 1 - b d)                          SLiC https://arxiv.org/abs/2305.10425
    ipo          (Dw' - Dl' - 1/(2b))^2                   IPO https://arxiv.org/abs/2310.12036 Eq. 17, b = tau; per-token
                 averaged log-ratios, as the IPO authors confirmed to TRL. Needs chosen_lengths and rejected_lengths.
    robust       [-(1-e) log s(b d) + e log s(-b d)] / (1 - 2e), e in [0, 0.5)   rDPO https://arxiv.org/abs/2403.00409
    exo_pair     s(b d) [log s(b d) - log(1-e)] + s(-b d) [log s(-b d) - log e]  EXO https://arxiv.org/abs/2402.00856
                 Eq. 16; needs e > 0 (log 0), the paper uses e = 1e-3.
    nca_pair     -log s(b Dw) - 1/2 log s(-b Dw) - 1/2 log s(-b Dl)             NCA https://arxiv.org/abs/2402.05369
    bco_pair     -log s(b Dw - m) - log s(-(b Dl - m)), m = running mean of the rewards b Dw and b Dl
                 BCO https://arxiv.org/abs/2404.04656. The caller keeps m: update it with `bco_reward_mean_update` on
                 this batch's detached rewards first (as TRL < 1.0 did), then pass it as bco_running_mean. None gives
                 m = 0, the TRL 1.x form (which dropped the shift).
    sppo_hard    (Dw - 1/(2b))^2 + (Dl + 1/(2b))^2        SPPO https://arxiv.org/abs/2405.00675, hard P in {0, 1}
    aot          d' = sort_B(log pi_w - log pi_l) - sort_B(log pi_ref,w - log pi_ref,l);
                 -(1-e) log s(b d') - e log s(-b d')      AOT https://arxiv.org/abs/2406.05882 (paired)
    aot_unpaired as aot with d' = sort_B(Dw) - sort_B(Dl) (EasyDeL calls this `aot_pair`). Sorting mixes rows, so
                 sample_weights are refused with both aot types (TRL refuses WPO with them too).
    apo_zero     (1 - s(b Dw)) + s(b Dl)                  APO https://arxiv.org/abs/2408.06266 Eq. 7
    apo_down     s(b Dw) + (1 - s(b (Dw - Dl)))           APO Eq. 8
    discopop     z = b d, m = s(z / tau): (1 - m)(-log s(z)) + m exp(-z)        DiscoPOP https://arxiv.org/abs/2406.08414
    sft          chosen NLL per token: `chosen_nll` (per-sequence mean NLL) or -policy_chosen / |y_w|. RPO,
                 https://arxiv.org/abs/2404.19733 (TRL's replacement for rpo_alpha). Per-sequence mean, where TRL
                 averages over all chosen tokens of the batch. With LD-DPO log-probs pass chosen_nll explicitly.
    sigmoid_norm -log s(b (Dw' - Dl'))                    length-normalised DPO, Tulu 3 https://arxiv.org/abs/2411.15124
                 (same as TRL). Needs chosen_lengths and rejected_lengths.

    Lengths are clamped at 1 (an empty completion contributes 0, not NaN). Reference inputs are detached. Raises
    ValueError naming the loss type for an unknown type, a length-normalised type without lengths, a loss_weights list
    of the wrong length, label_smoothing outside the range of robust or exo_pair.
    """
    _check_same_1d(
        policy_chosen=policy_chosen, policy_rejected=policy_rejected, ref_chosen=ref_chosen, ref_rejected=ref_rejected
    )
    if not loss_types:
        raise ValueError("dpo_loss: loss_types is empty; give at least one of " + ", ".join(DPO_LOSS_TYPES))
    weights = [1.0] * len(loss_types) if loss_weights is None else list(loss_weights)
    if len(weights) != len(loss_types):
        raise ValueError(
            f"dpo_loss_weights has {len(weights)} entries but dpo_loss_type has {len(loss_types)} ({loss_types}): "
            "give one weight per loss type"
        )
    for loss_type in loss_types:
        if loss_type not in DPO_LOSS_TYPES:
            raise ValueError(f"unknown DPO loss type {loss_type!r}; valid types: {', '.join(DPO_LOSS_TYPES)}")
        if loss_type in LENGTH_NORMALISED_LOSS_TYPES and (chosen_lengths is None or rejected_lengths is None):
            raise ValueError(
                f"DPO loss type {loss_type!r} averages log-ratios per token: pass chosen_lengths and rejected_lengths"
            )
        if loss_type == "sft" and chosen_nll is None and chosen_lengths is None:
            raise ValueError("DPO loss type 'sft' needs chosen_nll or chosen_lengths (NLL per chosen token)")
        if sample_weights is not None and loss_type in BATCH_SORTED_LOSS_TYPES:
            raise ValueError(f"DPO loss type {loss_type!r} sorts the batch, so per-row sample_weights (WPO) do not apply")
    if "robust" in loss_types and not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"DPO loss type 'robust' needs label_smoothing in [0, 0.5) (a flip probability), got {label_smoothing}")
    if "exo_pair" in loss_types and not 0.0 < label_smoothing < 1.0:
        raise ValueError(
            f"DPO loss type 'exo_pair' needs label_smoothing in (0, 1) (log of it is taken), got {label_smoothing}; "
            f"the EXO paper uses {EXO_PAPER_EPSILON}"
        )

    ref_chosen, ref_rejected = ref_chosen.detach(), ref_rejected.detach()
    chosen_logratios = policy_chosen - ref_chosen
    rejected_logratios = policy_rejected - ref_rejected
    logits = beta * (chosen_logratios - rejected_logratios)
    eps = label_smoothing

    def smoothed_sigmoid(z: torch.Tensor) -> torch.Tensor:
        return -(1 - eps) * F.logsigmoid(z) - eps * F.logsigmoid(-z)

    def averaged_logits() -> torch.Tensor:
        assert chosen_lengths is not None and rejected_lengths is not None
        return _per_token(chosen_logratios, chosen_lengths) - _per_token(rejected_logratios, rejected_lengths)

    total = torch.zeros_like(logits)
    for loss_type, weight in zip(loss_types, weights):
        if loss_type == "sigmoid":
            loss = smoothed_sigmoid(logits)
        elif loss_type == "hinge":
            loss = torch.relu(1 - logits)
        elif loss_type == "ipo":
            loss = (averaged_logits() - 1 / (2 * beta)) ** 2
        elif loss_type == "robust":
            loss = (-(1 - eps) * F.logsigmoid(logits) + eps * F.logsigmoid(-logits)) / (1 - 2 * eps)
        elif loss_type == "exo_pair":
            loss = torch.sigmoid(logits) * (F.logsigmoid(logits) - math.log1p(-eps)) + torch.sigmoid(-logits) * (
                F.logsigmoid(-logits) - math.log(eps)
            )
        elif loss_type == "nca_pair":
            chosen_rewards, rejected_rewards = beta * chosen_logratios, beta * rejected_logratios
            loss = -F.logsigmoid(chosen_rewards) - 0.5 * F.logsigmoid(-chosen_rewards) - 0.5 * F.logsigmoid(-rejected_rewards)
        elif loss_type == "bco_pair":
            shift = 0.0 if bco_running_mean is None else float(bco_running_mean)
            loss = -F.logsigmoid(beta * chosen_logratios - shift) - F.logsigmoid(-(beta * rejected_logratios - shift))
        elif loss_type == "sppo_hard":
            loss = (chosen_logratios - 0.5 / beta) ** 2 + (rejected_logratios + 0.5 / beta) ** 2
        elif loss_type == "aot":
            policy_sorted, _ = torch.sort(policy_chosen - policy_rejected, dim=0)
            ref_sorted, _ = torch.sort(ref_chosen - ref_rejected, dim=0)
            loss = smoothed_sigmoid(beta * (policy_sorted - ref_sorted))
        elif loss_type == "aot_unpaired":
            chosen_sorted, _ = torch.sort(chosen_logratios, dim=0)
            rejected_sorted, _ = torch.sort(rejected_logratios, dim=0)
            loss = smoothed_sigmoid(beta * (chosen_sorted - rejected_sorted))
        elif loss_type == "apo_zero":
            loss = (1 - torch.sigmoid(beta * chosen_logratios)) + torch.sigmoid(beta * rejected_logratios)
        elif loss_type == "apo_down":
            loss = torch.sigmoid(beta * chosen_logratios) + (1 - torch.sigmoid(logits))
        elif loss_type == "discopop":
            modulation = torch.sigmoid(logits / discopop_tau)
            # modulation * exp(-logits) as one exponent: exp(-logits) overflows below -88.7 where modulation is 0 (NaN)
            loss = (1 - modulation) * -F.logsigmoid(logits) + torch.exp(F.logsigmoid(logits / discopop_tau) - logits)
        elif loss_type == "sft":
            if chosen_nll is not None:
                loss = chosen_nll
            else:
                assert chosen_lengths is not None
                loss = -_per_token(policy_chosen, chosen_lengths)
        else:  # sigmoid_norm
            loss = -F.logsigmoid(beta * averaged_logits())
        total = total + weight * loss

    if sample_weights is not None:
        total = total * sample_weights
    return DPOOutput(total, (beta * chosen_logratios).detach(), (beta * rejected_logratios).detach())


def bco_reward_mean_update(old_mean: float, count: int, new_rewards: torch.Tensor) -> tuple[float, int]:
    """Running mean of BCO rewards (the shift m of `bco_pair`), https://arxiv.org/abs/2404.04656.

    mean' = mean + (sum(r) - n * mean) / (count + n), count' = count + n, over the n = numel elements of new_rewards
    (pass the chosen and rejected rewards b*Dw, b*Dl of the batch, gathered across processes). Every reward counts
    once, where TRL < 1.0 averaged per-step batch means (the same when batches are equal-sized). An empty tensor
    leaves the state unchanged. Start from (0.0, 0).
    """
    rewards = new_rewards.detach().reshape(-1).double()
    n = rewards.numel()
    if n == 0:
        return float(old_mean), int(count)
    new_count = int(count) + n
    return float(old_mean) + (float(rewards.sum()) - n * float(old_mean)) / new_count, new_count


def _masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # where() rather than a product: padded positions may hold -inf or NaN log-probs
    return torch.where(mask.bool(), values, torch.zeros_like(values)).sum(dim=-1)


def token_log_sum_squared_probs(logits: torch.Tensor) -> torch.Tensor:
    """log sum_v p_v^2 per position, p = softmax(logits over the vocabulary): logsumexp(2 * log_softmax(logits)).

    The WPO "sampled alignment" term. Pass the logits aligned with the token log-probs (logits[:, :-1] for
    `rlft.losses.sft.token_nll`). Shape (..., V) -> (...).
    """
    return torch.logsumexp(2 * torch.log_softmax(logits.float(), dim=-1), dim=-1)


def wpo_weights(
    policy_chosen_token_logps: torch.Tensor,
    chosen_mask: torch.Tensor,
    policy_rejected_token_logps: torch.Tensor,
    rejected_mask: torch.Tensor,
    *,
    chosen_token_log_sum_sq_probs: torch.Tensor | None = None,
    rejected_token_log_sum_sq_probs: torch.Tensor | None = None,
) -> torch.Tensor:
    """WPO pair weights w(x, y_w) * w(x, y_l), detached, shape (B,): https://arxiv.org/abs/2406.11827, Eq. 2 and §3.

    w(x, y) = exp( (1/|y|) sum_t [log pi(y_t | x, y_<t) - a_t] ) over the completion tokens (mask), |y| clamped at 1.
    With the per-token a_t = log sum_v pi(v | x, y_<t)^2 given (`token_log_sum_squared_probs` of the policy logits) this
    is the paper's recommended "sampled alignment" weight, which is what TRL's `use_weighting` computes. Without them
    a_t = 0: the plain length-normalised sequence probability exp(mean_t log p_t), which needs no full-vocabulary
    logits (cheaper; a weight on the same scale for every pair, but not calibrated against the policy's entropy).
    Multiply DPO losses by the result through `dpo_loss(..., sample_weights=...)`.
    """
    with torch.no_grad():
        chosen_aligned, rejected_aligned = policy_chosen_token_logps, policy_rejected_token_logps
        if chosen_token_log_sum_sq_probs is not None:
            chosen_aligned = chosen_aligned - chosen_token_log_sum_sq_probs
        if rejected_token_log_sum_sq_probs is not None:
            rejected_aligned = rejected_aligned - rejected_token_log_sum_sq_probs
        chosen_mean = _masked_sum(chosen_aligned, chosen_mask) / chosen_mask.sum(dim=-1).clamp_min(1)
        rejected_mean = _masked_sum(rejected_aligned, rejected_mask) / rejected_mask.sum(dim=-1).clamp_min(1)
        # capped at 1, as the authors' code and TRL cap it: a token likelier than the distribution's average makes the
        # aligned term positive, and an uncapped weight would scale up the step on the pairs it means to favour
        return (chosen_mean + rejected_mean).exp().clamp(max=1.0)


def chosen_nll(chosen_logps: torch.Tensor, chosen_lengths: torch.Tensor, average: str = "pair") -> torch.Tensor:
    """Per-pair NLL of the chosen answers, scaled so that its mean over the pairs is the wanted average.

    pair  -log p(y_w) / |y_w| per pair: the mean over pairs averages each answer's token mean (CPO, ORPO, RPO papers).
    batch -log p(y_w) / mean |y_w|: the mean over pairs is sum of NLL / sum of tokens, TRL's cross-entropy over every
          chosen token of the micro-batch (long answers weigh more).
    """
    lengths = chosen_lengths.float().clamp_min(1)
    return -chosen_logps / (lengths.mean() if average == "batch" else lengths)


def ld_dpo_logps(
    token_logps_chosen: torch.Tensor,
    mask_chosen: torch.Tensor,
    token_logps_rejected: torch.Tensor,
    mask_rejected: torch.Tensor,
    alpha: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """LD-DPO sequence log-probs (https://arxiv.org/abs/2409.06411), each (B,).

    With l_s = min(|y_w|, |y_l|) and k the rank of a completion token among its row's mask positions (cumsum of the
    mask, so padding may sit anywhere): log pi_LD(y) = sum_{k <= l_s} log p_k + alpha * sum_{k > l_s} log p_k.
    alpha = 1 is plain DPO, alpha = 0 cuts the longer completion to the shorter one's length. Apply it to the reference
    token log-probs too, with the same masks, and pass both to `dpo_loss`. Same as TRL's `ld_alpha`.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"LD-DPO alpha (ld_alpha) must lie in [0, 1], got {alpha}")
    chosen_bool, rejected_bool = mask_chosen.bool(), mask_rejected.bool()
    shared = torch.minimum(chosen_bool.sum(dim=-1), rejected_bool.sum(dim=-1)).unsqueeze(-1)

    def weighted(token_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        rank = mask.long().cumsum(dim=-1)
        head = _masked_sum(token_logps, mask & (rank <= shared))
        tail = _masked_sum(token_logps, mask & (rank > shared))
        return head + alpha * tail

    return weighted(token_logps_chosen, chosen_bool), weighted(token_logps_rejected, rejected_bool)


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
    z0 = max(0, mean(policy_kl_logps - ref_kl_logps)), detached, from mismatched pairs (x_i, y_{i-1}) that the caller
    builds (and gathers across processes, as TRL does, when it wants a global z0); an empty KL batch gives z0 = 0.
    desirable:   lambda_D * (1 - sigmoid(beta * (r - z0)))
    undesirable: lambda_U * (1 - sigmoid(beta * (z0 - r)))
    Rewards beta * r of the desirable / undesirable rows, detached. Reference inputs are detached.
    """
    _check_same_1d(policy_logps=policy_logps, ref_logps=ref_logps, desirable=desirable)
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
    """A warning when lambda_D * n_D / (lambda_U * n_U) leaves [1, 4/3] (KTO paper, Eq. 8 and §4.2), else None.

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
    _check_same_1d(chosen_avg_logps=chosen_avg_logps, rejected_avg_logps=rejected_avg_logps, chosen_nll=chosen_nll)
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
    _check_same_1d(
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
        chosen, rejected = _per_token(policy_chosen, chosen_lengths), _per_token(policy_rejected, rejected_lengths)
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
        nll = chosen_nll if chosen_nll is not None else -_per_token(policy_chosen, chosen_lengths)
        losses = losses + cpo_alpha * nll
    return CPOOutput(losses, (beta * chosen).detach(), (beta * rejected).detach())


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
    match: EasyDeL's (B, 1) - (B,) broadcast to (B, B) (spec/peers.md §3) is refused instead of averaged.
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
