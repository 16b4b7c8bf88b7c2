"""DPO and its loss family per preference pair, and the running reward mean of BCO."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from rlft.losses.preference.rows import check_same_rows, per_token

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
EXO_PAPER_EPSILON = 1e-3


class DPOOutput(NamedTuple):
    """losses: (B,) weighted sum over the loss types (times sample_weights when given); rewards: beta * log-ratio, detached."""

    losses: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor


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
    check_same_rows(
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
        return per_token(chosen_logratios, chosen_lengths) - per_token(rejected_logratios, rejected_lengths)

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
                loss = -per_token(policy_chosen, chosen_lengths)
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
