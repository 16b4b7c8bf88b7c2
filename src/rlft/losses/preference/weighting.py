"""DPO variants that change how a pair's log-probs count: WPO pair weights, LD-DPO sequence log-probs."""

from __future__ import annotations

import torch

from rlft.losses.preference.rows import masked_sum


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
    """WPO pair weights w(x, y_w) * w(x, y_l), detached, shape (B,): https://arxiv.org/abs/2406.11827, Eq. 2 and Section 3.

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
        chosen_mean = masked_sum(chosen_aligned, chosen_mask) / chosen_mask.sum(dim=-1).clamp_min(1)
        rejected_mean = masked_sum(rejected_aligned, rejected_mask) / rejected_mask.sum(dim=-1).clamp_min(1)
        # capped at 1, as the authors' code caps it (TRL's use_weighting does not): a token likelier than the
        # distribution's average makes the aligned term positive, and an uncapped weight would scale up the step on the
        # pairs it means to favour
        return (chosen_mean + rejected_mean).exp().clamp(max=1.0)


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
        head = masked_sum(token_logps, mask & (rank <= shared))
        tail = masked_sum(token_logps, mask & (rank > shared))
        return head + alpha * tail

    return weighted(token_logps_chosen, chosen_bool), weighted(token_logps_rejected, rejected_bool)
