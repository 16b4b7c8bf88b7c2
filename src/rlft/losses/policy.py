"""Policy-gradient losses of the GRPO family: GRPO, DAPO, Dr. GRPO, BNPO, GSPO, CISPO and the Cosmos-RL options.

Pure functions over per-token log-probabilities (B, T) and a loss mask (B, T): 1 on the completion tokens the loss
sees (completion mask times tool mask), 0 on padding, left or right. Padded positions may hold anything (0, -inf,
NaN): they are replaced before any arithmetic, so padding side and padding values never change a result.

Old, reference and rollout quantities are constants: `old_logps`, `ref_logps`, `advantages`, `is_weights` and
`sequence_keep` are detached here, whatever the caller passes; gradients reach `logps` (and `entropy`, whose bonus is
meant to train).

Accumulation contract: `policy_loss` returns (loss_sum, units). The training loop adds loss_sum over the micro-batches
of one optimizer step and divides by the sum of units; each loss_type picks them so the quotient is that type's
normalisation over the whole accumulated batch (see `policy_loss`). References: TRL 1.8 `GRPOTrainer._compute_loss`
(https://github.com/huggingface/trl), Cosmos-RL `compute_loss` (https://github.com/nvidia-cosmos/cosmos-rl).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "token-mean")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
LOG_RATIO_LIMIT = 20.0  # Cosmos-RL clamps log-ratios to +-20: exp() stays finite and its gradient never NaN


class PolicyLossOutput(NamedTuple):
    """loss_sum: scalar with gradient, to be summed over micro-batches; units: this micro-batch's share of the
    normaliser (the optimizer-step loss is sum(loss_sum) / sum(units)); metrics: floats under TRL's names."""

    loss_sum: torch.Tensor
    units: float
    metrics: dict[str, float]


def k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate, Schulman's k3 (http://joschu.net/blog/kl-approx.html):

    k3 = exp(d) - d - 1,  d = ref_logp - logp.

    Unbiased for KL(pi || pi_ref) under samples of pi, and >= 0 everywhere (e^d >= 1 + d), 0 where the two agree.
    Only the exponent is capped (d at 20, as Cosmos-RL caps log-ratios) so it cannot overflow; the linear term keeps its
    value and gradient, so a token far likelier under the policy than the reference (d << 0) is still pulled back.
    (Clamping d itself at +-20 would zero that gradient.) The reference is detached.
    """
    diff = ref_logps.detach() - logps
    return torch.exp(diff.clamp(max=LOG_RATIO_LIMIT)) - diff - 1


def _masked_mean(values: torch.Tensor, weights: torch.Tensor) -> float:
    total = float(weights.sum())
    return float((values.detach() * weights).sum()) / total if total > 0 else 0.0


def _as_tokens(name: str, tensor: torch.Tensor, shape: torch.Size, allow_rows: bool) -> torch.Tensor:
    """(B, T) as is; (B,) or (B, 1) broadcast over tokens when allow_rows."""
    if tensor.shape == shape:
        return tensor
    if allow_rows and tensor.dim() in (1, 2) and tensor.shape[0] == shape[0] and tensor.numel() == shape[0]:
        return tensor.reshape(shape[0], 1).expand(shape)
    expected = f"(B,) or (B, T) = {tuple(shape)}" if allow_rows else f"(B, T) = {tuple(shape)}"
    raise ValueError(f"policy_loss: {name} has shape {tuple(tensor.shape)}, expected {expected}")


def policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: str | None = "dapo",
    epsilon: float | None = 0.2,
    epsilon_high: float | None = None,
    delta: float | None = None,
    lower_bound_ratio: float | None = None,
    aipo_rho: float | None = None,
    importance_sampling_level: str | None = "token",
    ref_logps: torch.Tensor | None = None,
    beta: float | None = 0.0,
    entropy: torch.Tensor | None = None,
    entropy_coeff: float | None = 0.0,
    positive_nll_coef: float | None = 0.0,
    max_completion_length: int | None = None,
    is_weights: torch.Tensor | None = None,
    sequence_keep: torch.Tensor | None = None,
    bias_correction_kl: bool = False,
    across_ranks: tuple[float, float] | None = None,
) -> PolicyLossOutput:
    """Clipped policy-gradient loss over one micro-batch.

    Shapes: logps, old_logps, mask, ref_logps, entropy (B, T); advantages (B,) (or (B, T) per token); is_weights
    (B,) or (B, T); sequence_keep (B,) or (B, 1). old_logps None means on-policy (old = logps.detach(), ratio 1).
    Below, m = mask, A = advantage of the token's sequence, eps_h = epsilon_high (None -> epsilon), sg = stop-gradient.

    Importance ratio (`importance_sampling_level`):
        token     r_t = exp(logp_t - old_t)                                       PPO / GRPO
        sequence  s_i = exp(sum_t m_t (logp_t - old_t) / sum_t m_t); every token gets the GSPO-token form
                  r_t = sg(s_i) exp(logp_t - sg(logp_t)) (GSPO https://arxiv.org/abs/2507.18071 Section 4.3): value s_i,
                  gradient per token. Under every aggregation below this has the same value and gradient as TRL's
                  broadcast of s_i, and it leaves room for token-level advantages.
        Log-ratios are clamped to +-20 (Cosmos-RL) so exp never overflows.

    Per-token policy term l_t, by loss_type:
        grpo, bnpo, dr_grpo, dapo (PPO clip, https://arxiv.org/abs/1707.06347, with DAPO's clip-higher eps_h):
            l = -min(r~ A, clip(r, 1 - epsilon, 1 + eps_h) A),  r~ = min(r, delta) if delta is set, else r
            `delta` (INTELLECT-2 two-sided clip, https://arxiv.org/abs/2505.07291, as TRL): caps the unclipped ratio,
            which only matters for A < 0 (delta > 1 + eps_h), where the PPO loss r|A| is otherwise unbounded.
            `lower_bound_ratio` = c (dual clip, https://arxiv.org/abs/1912.09729, Cosmos-RL / verl): for A < 0,
            l = min(l, -c A), so a negative-advantage token costs at most c|A|. For A >= 0 it does nothing.
            delta and c bound the same thing, the first the ratio, the second the loss; with both set the smaller
            wins. Cosmos skips the dual clip under GSPO; here it applies at both levels (s_i > c is as harmful).
            `aipo_rho` = rho (AIPO, https://arxiv.org/abs/2505.24034, as Cosmos-RL): l = -min(r, rho) A, a one-sided
            truncation that replaces the PPO clip, delta and the dual clip (zero gradient where r > rho).
        cispo (CISPO, MiniMax-M1 https://arxiv.org/abs/2506.13585 Eq. 4):
            l = -sg(min(r, 1 + eps_h)) A logp_t. Every token keeps a gradient; only its IS weight is capped. The paper
            writes the cap as 1 + eps_high^IS (no lower bound), so eps_h is used the same way as in the PPO clip;
            TRL 1.8 caps at epsilon_high itself (its suggested 5.0 is our 4.0). delta, lower_bound_ratio are ignored
            (as TRL); aipo_rho is refused.

    Then, per token:
        l *= sg(sequence_keep)               off-policy sequence mask (DeepSeek-V3.2 OPSM, `rlft.losses.importance.
                                             off_policy_sequence_mask`), on the policy term only, as TRL
        l *= sg(is_weights)                  external IS correction (vLLM / async staleness, `rlft.losses.importance`),
                                             on the policy term only, as TRL multiplies before adding the KL
        l += beta * k3(logp, ref)            KL to the reference (beta > 0 needs ref_logps), not IS-weighted (TRL).
                                             bias_correction_kl (DeepSeek-V3.2 Section 3.1 unbiased KL estimate, TRL
                                             `use_bias_correction_kl`, Cosmos `unbiased_kl_estimate`): the k3 term is
                                             multiplied by the token ratio exp(logp_t - old_t) (clamped log-ratio as
                                             above), with gradient through logp as TRL. At both levels the *token*
                                             ratio: the correction is of the per-token KL estimate (DeepSeek's formula;
                                             TRL multiplies by its importance weight, the sequence ratio under GSPO).
        l -= entropy_coeff * H_t             entropy bonus (Cosmos-RL `entropy_coeff`)
        l += positive_nll_coef * (-logp_t)   on tokens of sequences with A > 0 (VAPO positive-example LM loss,
                                             https://arxiv.org/abs/2504.05118 Section 4.3, Cosmos `positive_nll_coef`).
                                             VAPO and Cosmos select "reward > 0" and average over the positive tokens
                                             alone; here A > 0 selects (the loss sees no rewards) and the term is
                                             aggregated with the loss_type below, so its weight is relative to all
                                             tokens: one normaliser keeps the accumulation contract exact.

    Aggregation, with the loop computing sum(loss_sum) / sum(units) over an optimizer step's micro-batches:
        grpo     loss_sum = sum_i (sum_t m l / sum_t m),  units = #sequences with >= 1 token
                 -> mean over sequences of the per-sequence token mean (GRPO https://arxiv.org/abs/2402.03300).
                 TRL also counts fully masked sequences (e.g. mask_truncated_completions) in the mean; they carry no
                 tokens, so here they do not dilute it, as in verl's `seq-mean-token-mean`. Cosmos-RL's
                 `seq-mean-token-mean` is this mean too (it scales each mini-batch's mean of sequence means by the
                 mini-batch's share of the sequences); the config maps that name here.
        dapo     loss_sum = sum m l, units = sum m -> token mean over the whole accumulated batch (DAPO
                 https://arxiv.org/abs/2503.14476 Eq. 8; TRL's num_items_in_batch; verl's `token-mean` with its global
                 token count, https://github.com/volcengine/verl `agg_loss`).
        dr_grpo  loss_sum = sum m l, units = B * max_completion_length -> sum / (n_sequences * L) (Dr. GRPO
                 https://arxiv.org/abs/2503.20783; pass Cosmos's unbiased_loss_max_tokens as L when set). The
                 normaliser is deliberately length-free, so units stay B * L even for an empty mask.
        bnpo     loss_sum = sum m l / sum m of this micro-batch, units = 1 -> mean of per-micro-batch token means
                 (TRL bnpo divided by gradient_accumulation_steps).
        cispo    as dapo (the CISPO paper's token mean over the batch; TRL the same).
        token-mean  loss_sum = B * sum m l / sum m, units = B -> Cosmos-RL's `token-mean` (`compute_loss` with
                 balance_dp_token off, its default): each micro-batch's token mean, weighted by the micro-batch's
                 share of the step's sequences (Cosmos scales each mini-batch's loss by len(mini-batch) / len(batch)).
                 The same as dapo when a step is one micro-batch; with several it differs, since a micro-batch of
                 short completions weighs as much per sequence as one of long ones. Every row counts in B, and a
                 micro-batch without loss tokens adds 0 over B rows (Cosmos divides by tokens + 1e-8). Over several
                 processes every process's micro-batches enter one such mean: Cosmos's mean over ranks when each
                 rank holds as many rows.
                 With `across_ranks` = (B_k, T_k), the rows and loss tokens of the micro-batches at this one's place
                 on every data-parallel rank together: loss_sum = B_k * sum m l / T_k, units = B -> over a step of
                 N rows on all ranks, sum_k (B_k / N) * (sum m l of the place's micro-batches on all ranks) / T_k:
                 each place's token mean over all ranks' tokens, weighted by its share of the step's rows (Cosmos-RL's
                 `balance_dp_token`, which divides each rank's token sum by the all-reduced token count).
    An empty mask gives loss_sum 0 (with a graph, no NaN) and units 0, except dr_grpo (B * L, see above) and token-mean
    (B).

    Metrics (floats, this micro-batch): `clip_ratio/low_mean` = share of masked tokens with r < 1 - epsilon and A < 0,
    `clip_ratio/high_mean` = r > 1 + eps_h and A > 0, `clip_ratio/region_mean` = either (TRL's definitions; at sequence
    level per non-empty sequence). AIPO: high = r > rho, low = 0. CISPO: high = `cispo_clip_ratio` = r > 1 + eps_h and
    A > 0. `clip_ratio/dual_mean` when delta or lower_bound_ratio is set: A < 0 and r above the smaller bound. `kl` =
    masked mean of k3 when ref_logps is given (of k3 * r with bias_correction_kl, the estimate the loss uses, as TRL),
    `entropy` = masked mean of H when given. Empty mask -> 0.0.

    None for loss_type, epsilon, importance_sampling_level, beta, entropy_coeff or positive_nll_coef means the default.
    Raises ValueError for an unknown loss_type or level, mismatched shapes, dr_grpo without max_completion_length,
    beta > 0 without ref_logps, entropy_coeff != 0 without entropy, aipo_rho with cispo, epsilon < 0, across_ranks
    with a loss_type other than token-mean.
    """
    # None: the config's unset value, meaning the default
    loss_type = loss_type or "dapo"
    importance_sampling_level = importance_sampling_level or "token"
    epsilon = 0.2 if epsilon is None else epsilon
    beta = beta or 0.0
    entropy_coeff = entropy_coeff or 0.0
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown loss_type {loss_type!r}; valid: {', '.join(LOSS_TYPES)}")
    if importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(
            f"unknown importance_sampling_level {importance_sampling_level!r}; valid: {', '.join(IMPORTANCE_SAMPLING_LEVELS)}"
        )
    if logps.dim() != 2:
        raise ValueError(f"policy_loss: logps must have shape (B, T), got {tuple(logps.shape)}")
    eps_low = float(epsilon)
    eps_high = eps_low if epsilon_high is None else float(epsilon_high)
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"epsilon and epsilon_high must be >= 0, got {epsilon} and {epsilon_high}")
    if loss_type == "dr_grpo" and max_completion_length is None:
        raise ValueError("loss_type 'dr_grpo' divides by B * max_completion_length: pass max_completion_length")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if beta > 0 and ref_logps is None:
        raise ValueError(f"beta = {beta} adds a KL term to the reference: pass ref_logps")
    if entropy_coeff and entropy is None:
        raise ValueError(f"entropy_coeff = {entropy_coeff} needs the per-token entropy: pass entropy")
    if aipo_rho is not None and loss_type == "cispo":
        raise ValueError("aipo_rho replaces the PPO clip; loss_type 'cispo' has its own IS-weight cap (epsilon_high)")
    if across_ranks is not None and loss_type != "token-mean":
        raise ValueError(f"across_ranks balances loss_type 'token-mean' over ranks; {loss_type!r} has no per-rank token mean")

    if logps.dtype in (torch.float16, torch.bfloat16):
        logps = logps.float()  # ratios and exp() in half precision lose the differences that matter
    shape = logps.shape
    n_rows = shape[0]
    valid = _as_tokens("mask", mask, shape, allow_rows=False) != 0
    weights = torch.where(valid, mask.to(logps.dtype), 0.0)
    zero = torch.zeros((), dtype=logps.dtype, device=logps.device)
    logp = torch.where(valid, logps, zero)
    if old_logps is None:
        old = logp.detach()
    else:
        old = torch.where(valid, _as_tokens("old_logps", old_logps, shape, False).detach().to(logp.dtype), zero)
    adv = torch.where(valid, _as_tokens("advantages", advantages.detach().to(logp.dtype), shape, True), zero)

    log_ratio = (logp - old).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    tokens_per_row = weights.sum(dim=-1)
    if importance_sampling_level == "token":
        ratio = torch.exp(log_ratio)
    else:
        seq_log_ratio = (log_ratio * weights).sum(dim=-1) / tokens_per_row.clamp_min(1.0)
        seq_ratio = torch.exp(seq_log_ratio.detach()).unsqueeze(1)
        ratio = seq_ratio * torch.exp(logp - logp.detach())
    ratio_value = ratio.detach()

    caps = [c for c in (delta, lower_bound_ratio) if c is not None]
    if loss_type == "cispo":
        per_token = -torch.clamp(ratio_value, max=1 + eps_high) * adv * logp
        low = torch.zeros_like(valid)
        high = (ratio_value > 1 + eps_high) & (adv > 0)
        caps = []
    elif aipo_rho is not None:
        per_token = -torch.clamp(ratio, max=float(aipo_rho)) * adv
        low = torch.zeros_like(valid)
        high = ratio_value > aipo_rho
        caps = []
    else:
        clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
        unclipped = ratio if delta is None else torch.clamp(ratio, max=float(delta))
        per_token = -torch.minimum(unclipped * adv, clipped * adv)
        if lower_bound_ratio is not None:
            per_token = torch.where(adv < 0, torch.minimum(per_token, -float(lower_bound_ratio) * adv), per_token)
        low = (ratio_value < 1 - eps_low) & (adv < 0)
        high = (ratio_value > 1 + eps_high) & (adv > 0)

    if sequence_keep is not None:
        keep = _as_tokens("sequence_keep", sequence_keep.detach().to(logp.dtype), shape, True)
        per_token = per_token * torch.where(valid, keep, zero)
    if is_weights is not None:
        per_token = per_token * torch.where(valid, _as_tokens("is_weights", is_weights.detach().to(logp.dtype), shape, True), zero)

    metrics: dict[str, float] = {}
    if ref_logps is not None:
        ref = torch.where(valid, _as_tokens("ref_logps", ref_logps, shape, False).detach().to(logp.dtype), zero)
        kl = k3_kl(logp, ref)
        if bias_correction_kl:
            kl = kl * torch.exp(log_ratio)
        if beta > 0:
            per_token = per_token + beta * kl
        metrics["kl"] = _masked_mean(kl, weights)
    if entropy is not None:
        token_entropy = torch.where(valid, _as_tokens("entropy", entropy, shape, False).to(logp.dtype), zero)
        if entropy_coeff:
            per_token = per_token - entropy_coeff * token_entropy
        metrics["entropy"] = _masked_mean(token_entropy, weights)
    if positive_nll_coef:
        per_token = per_token + positive_nll_coef * (-logp) * (adv > 0)

    weighted = per_token * weights
    n_tokens = float(tokens_per_row.sum())
    if loss_type == "grpo":
        loss_sum = (weighted.sum(dim=-1) / tokens_per_row.clamp_min(1.0)).sum()
        units = float((tokens_per_row > 0).sum())
    elif loss_type == "bnpo":
        loss_sum = weighted.sum() / max(n_tokens, 1.0)
        units = 1.0 if n_tokens > 0 else 0.0
    elif loss_type == "dr_grpo":
        assert max_completion_length is not None
        loss_sum = weighted.sum()
        units = float(n_rows * max_completion_length)
    elif loss_type == "token-mean":
        rows, tokens = (n_rows, n_tokens) if across_ranks is None else across_ranks
        loss_sum = weighted.sum() * (rows / max(tokens, 1.0))
        units = float(n_rows)
    else:  # dapo, cispo
        loss_sum = weighted.sum()
        units = n_tokens

    if importance_sampling_level == "token":
        metric_weights = weights
    else:  # one vote per non-empty sequence: the ratio is the sequence's
        metric_weights = torch.zeros_like(weights)
        first = torch.argmax(valid.to(torch.int8), dim=-1)
        metric_weights[torch.arange(n_rows, device=weights.device), first] = (tokens_per_row > 0).to(weights.dtype)
    metrics["clip_ratio/low_mean"] = _masked_mean(low.to(weights.dtype), metric_weights)
    metrics["clip_ratio/high_mean"] = _masked_mean(high.to(weights.dtype), metric_weights)
    metrics["clip_ratio/region_mean"] = _masked_mean((low | high).to(weights.dtype), metric_weights)
    if loss_type == "cispo":
        metrics["cispo_clip_ratio"] = metrics["clip_ratio/high_mean"]
    if caps:
        dual = (adv < 0) & (ratio_value > min(caps))
        metrics["clip_ratio/dual_mean"] = _masked_mean(dual.to(weights.dtype), metric_weights)
    return PolicyLossOutput(loss_sum, units, metrics)
