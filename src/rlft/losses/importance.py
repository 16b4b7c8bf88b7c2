"""Importance-sampling correction and off-policy control for rollouts the trainer did not sample itself.

When rollouts come from another engine (vLLM, the rollout server) or from older weights (async prefetch), three
distributions are in play for every sampled token t of sequence i:

    samp_t  log-prob the *engine* reported when it sampled the token (behaviour policy mu)
    old_t   log-prob of the *trainer* at scoring time, no gradient (proximal / "old" policy of the PPO ratio)
    logp_t  log-prob of the policy being trained, with gradient

The PPO ratio exp(logp - old) of `rlft.losses.policy` handles the policy moving during an optimizer step; the
functions here handle the gap between the trainer at scoring time and the engine (kernel / precision differences and
staleness): weights exp(old - samp) that multiply the policy term, and a per-sequence keep mask. All are pure
functions over (B, T) tensors and a loss mask (B, T) (1 on the tokens the loss sees, 0 on padding, left or right).
Padded positions may hold anything (0, -inf, NaN): they are replaced before any arithmetic, so padding never changes a
result. Outputs carry no gradient: they are constants of the loss.

Log-ratios are clamped to +-20 before exp (as `rlft.losses.policy` and Cosmos-RL), so weights are always finite.
Metrics use TRL's names (`sampling/...`) so dashboards keep working.
"""

from __future__ import annotations

import torch

from rlft.losses.policy import LOG_RATIO_LIMIT

IS_LEVELS = ("token", "sequence")
IS_MODES = ("truncate", "mask")


def _prepare(name: str, tensor: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    if tensor.shape != valid.shape:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected (B, T) = {tuple(valid.shape)}")
    values = tensor.detach()
    if not values.is_floating_point() or values.dtype in (torch.float16, torch.bfloat16):
        values = values.float()  # exp of small differences in half precision loses what matters
    return torch.where(valid, values, torch.zeros((), dtype=values.dtype, device=values.device))


def _valid(mask: torch.Tensor) -> torch.Tensor:
    if mask.dim() != 2:
        raise ValueError(f"mask must have shape (B, T), got {tuple(mask.shape)}")
    return mask.detach() != 0


def _logp_difference_metrics(diff: torch.Tensor, valid: torch.Tensor) -> dict[str, float]:
    gap = diff.abs()[valid]
    return {
        "sampling/sampling_logp_difference/mean": float(gap.mean()) if gap.numel() else 0.0,
        "sampling/sampling_logp_difference/max": float(gap.max()) if gap.numel() else 0.0,
    }


def _ratio_metrics(values: torch.Tensor) -> dict[str, float]:
    present = values.numel() > 0
    return {
        "sampling/importance_sampling_ratio/min": float(values.min()) if present else 0.0,
        "sampling/importance_sampling_ratio/mean": float(values.mean()) if present else 0.0,
        "sampling/importance_sampling_ratio/max": float(values.max()) if present else 0.0,
    }


def importance_weights(
    old_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    cap: float = 3.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights rho correcting for the engine's sampling distribution (TRL / Axolotl
    `vllm_importance_sampling_correction`, modes `{token,sequence}_{truncate,mask}`, cap C).

    With m the loss mask and d_t = (old_t - samp_t) m_t:
        level token     rho_t = exp(d_t)                  shape (B, T)
        level sequence  rho_i = exp(sum_t d_t)            shape (B, 1); a *sum* over the sequence's tokens (the
                                                          probability ratio of the whole sequence), as Axolotl and TRL,
                                                          not the length-normalised mean of GSPO
        mode truncate   rho <- min(rho, C)                truncated IS (TIS, Yao et al. 2025, "Your Efficient RL
                                                          Framework Secretly Brings You Off-Policy RL Training",
                                                          https://fengyao.notion.site/off-policy-rl); upper bound only,
                                                          as the paper and TRL's default clip_min=None. Axolotl's async
                                                          trainer also floors at 1/C; rlft does not (a floor would
                                                          up-weight tokens the engine over-sampled).
        mode mask       rho <- 0 where rho > C or rho < 1/C, else rho   (masked IS, TRL's `*_mask`: a true mask).
                                                          Axolotl's async trainer lifts the zeros back to 1/C
                                                          (its `fast_async` trainer), so its mask modes do not mask;
                                                          rlft follows TRL and the masked-IS literature.
    Each log-ratio (d_t, or the sequence sum) is clamped to +-20 before exp. Positions outside the mask get weight 1
    (the loss ignores them); an empty row has sum 0, so rho = 1 at sequence level.

    Metrics (floats): `sampling/sampling_logp_difference/mean` and `/max` = |old - samp| over masked tokens;
    `sampling/importance_sampling_ratio/min|mean|max` = the ratio *before* truncation or masking, over masked tokens
    (token level) or over non-empty sequences (sequence level), so the max shows how far off-policy the batch really
    is; `sampling/is_masked_fraction` (mask modes) = share of those tokens / sequences set to 0. Empty -> 0.0.

    Raises ValueError for an unknown level or mode, mismatched shapes, C <= 0 (or NaN), and C < 1 in mask mode (the
    kept interval [1/C, C] would be empty: every weight 0).
    """
    if level not in IS_LEVELS:
        raise ValueError(f"unknown importance-sampling level {level!r}; valid: {', '.join(IS_LEVELS)}")
    if mode not in IS_MODES:
        raise ValueError(f"unknown importance-sampling mode {mode!r}; valid: {', '.join(IS_MODES)}")
    cap = float(cap)
    if not cap > 0:
        raise ValueError(f"IS cap <= 0 (got {cap}): the cap C bounds a ratio of probabilities and must be > 0")
    if mode == "mask" and cap < 1:
        raise ValueError(f"IS cap {cap} < 1 in mask mode: the kept interval [1/C, C] is empty, every weight would be 0")
    valid = _valid(mask)
    old = _prepare("old_logps", old_logps, valid)
    samp = _prepare("sampling_logps", sampling_logps, valid).to(old.dtype)
    diff = old - samp  # 0 outside the mask
    metrics = _logp_difference_metrics(diff, valid)

    if level == "token":
        ratio = torch.exp(diff.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
        counted = valid
    else:
        ratio = torch.exp(diff.sum(dim=-1, keepdim=True).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
        counted = valid.any(dim=-1, keepdim=True)
    metrics.update(_ratio_metrics(ratio[counted]))

    if mode == "truncate":
        weights = ratio.clamp(max=cap)
    else:
        outside = (ratio > cap) | (ratio < 1.0 / cap)
        weights = torch.where(outside, torch.zeros_like(ratio), ratio)
        cut = outside[counted]
        metrics["sampling/is_masked_fraction"] = float(cut.float().mean()) if cut.numel() else 0.0
    weights = torch.where(counted, weights, torch.ones_like(weights))
    return weights, metrics


def decoupled_weights(
    old_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    cap: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Behaviour weights of decoupled PPO (AReaL, Fu et al. 2025, https://arxiv.org/abs/2505.24298 Section 5; Cosmos-RL
    `use_decoupled_loss` + `behav_imp_weight_cap`).

    The PPO ratio is taken against the proximal policy (old, the trainer at scoring time) and the whole term is
    reweighted by the proximal/behaviour ratio:

        w_t = exp(old_t - samp_t)                         shape (B, T), log-ratio clamped to +-20
        w_t <- 0 where w_t > C                            when cap C is set: masking, not truncation (AReaL, Cosmos)

    No lower bound (cap None: no cap at all). Positions outside the mask get weight 1.
    Metrics: `sampling/sampling_logp_difference/mean|max`, `sampling/importance_sampling_ratio/min|mean|max` (w before
    the cap, over masked tokens) and, with a cap, `sampling/behav_imp_weight_masked_fraction` (share of masked tokens
    set to 0). Raises ValueError for cap <= 0 and mismatched shapes.
    """
    if cap is not None and not float(cap) > 0:
        raise ValueError(f"behav_imp_weight_cap must be > 0, got {cap}")
    valid = _valid(mask)
    old = _prepare("old_logps", old_logps, valid)
    samp = _prepare("sampling_logps", sampling_logps, valid).to(old.dtype)
    diff = old - samp
    metrics = _logp_difference_metrics(diff, valid)
    weights = torch.exp(diff.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    metrics.update(_ratio_metrics(weights[valid]))
    if cap is not None:
        over = (weights > float(cap)) & valid
        weights = torch.where(over, torch.zeros_like(weights), weights)
        metrics["sampling/behav_imp_weight_masked_fraction"] = float(over[valid].float().mean()) if valid.any() else 0.0
    return weights, metrics


def off_policy_sequence_mask(
    logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    threshold: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Off-policy sequence masking (OPSM, DeepSeek-V3.2 tech report Section 3.1, https://arxiv.org/abs/2512.02556; TRL /
    Axolotl `off_policy_mask_threshold`, Cosmos-RL `off_policy_masking_delta`).

    A sequence with a negative advantage that the current policy already finds much less likely than the sampler did is
    dropped from the policy term: learning to push it down further is mostly noise. Per sequence i, with sg the
    stop-gradient:

        kl_i   = sum_t m_t (samp_t - sg(logp_t)) / max(1, sum_t m_t)      (mean log-ratio, a KL estimate)
        keep_i = (A_i >= 0) or (kl_i <= threshold)                       (kl_i == threshold is kept)

    Returns keep as a float (B, 1) tensor of 0/1 (multiply the per-token policy term with it) and
    `sampling/off_policy_masked_fraction` = share of sequences dropped (over all B rows; an empty row has kl 0 and is
    dropped only for a negative threshold). `sampling_logps` falls back to the old log-probs when the engine reported
    none: the caller decides. `advantages` has shape (B,) or (B, 1).
    """
    valid = _valid(mask)
    current = _prepare("logps", logps, valid)
    samp = _prepare("sampling_logps", sampling_logps, valid).to(current.dtype)
    rows = valid.shape[0]
    if advantages.numel() != rows or advantages.dim() not in (1, 2):
        raise ValueError(f"advantages has shape {tuple(advantages.shape)}, expected (B,) or (B, 1) with B = {rows}")
    adv = advantages.detach().reshape(rows, 1).to(current.dtype)
    tokens = valid.sum(dim=-1, keepdim=True).clamp_min(1).to(current.dtype)
    kl = (samp - current).sum(dim=-1, keepdim=True) / tokens
    keep = ((adv >= 0) | (kl <= float(threshold))).to(current.dtype)
    metrics = {"sampling/off_policy_masked_fraction": float(1.0 - keep.mean()) if rows else 0.0}
    return keep, metrics
