"""Advantages and reward shaping for group-sampled online RL: GRPO, RLOO, Dr. GRPO, GDPO, DAPO filters and overlong penalty.

Every function is pure: rewards in, tensors out, no models or devices. Rows are completions; a *group* is `group_size`
consecutive rows sampled from one prompt (row i belongs to group i // group_size). Rewards are (N, K): one column per
reward function, NaN where a function could not score a row (TRL maps a `None` reward to NaN). A row is *unscorable*
when all its K entries are NaN; it gets advantage 0 and takes no part in any mean or std.

Standard deviations are Bessel-corrected (divide by n - 1) and NaN-skipping, as TRL's `nanstd`; a set with fewer than
two scorable values has std NaN. A std counts as zero when |std| <= 1e-8 (`torch.isclose(std, 0)`, as TRL) or is NaN.

Where TRL 1.8 (https://github.com/huggingface/trl), Cosmos-RL (https://github.com/nvidia-cosmos/cosmos-rl) and the
papers differ, the docstrings say which is followed and why.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

SCALES = ("group", "batch", "none")
AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
ESTIMATORS = ("grpo", "rloo")
DEFAULT_EPS = 1e-4
ZERO_STD_ATOL = 1e-8

Scale = Literal["group", "batch", "none"]


class AdvantageOutput(NamedTuple):
    """advantages: (N,), 0 for unscorable rows; total_rewards: (N,) weighted NaN-skipping sum sum_k w_k R_ik, NaN for
    unscorable rows (log it as `reward`); group_std: (N,) std of the total reward over the row's group (NaN for a group
    with fewer than two scorable rows); frac_zero_std: fraction of rows whose group carries no learning signal
    (`frac_reward_zero_std`)."""

    advantages: torch.Tensor
    total_rewards: torch.Tensor
    group_std: torch.Tensor
    frac_zero_std: float


def normalise_scale(value: str | bool | None) -> Scale:
    """`scale_rewards` as one of group | batch | none. YAML booleans map as in TRL / Axolotl: true -> group,
    false -> none; None (unset) -> group, the TRL default. Dr. GRPO / `unbiased_advantage: true` is "none"."""
    if value is None or value is True:
        return "group"
    if value is False:
        return "none"
    if isinstance(value, str) and value in SCALES:
        return value  # type: ignore[return-value]
    raise ValueError(f"scale_rewards must be one of {', '.join(SCALES)} or true/false, got {value!r}")


def nanstd(values: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """Bessel-corrected std over `dim`, skipping NaN; NaN where fewer than two values are not NaN."""
    present = ~torch.isnan(values)
    count = present.sum(dim=dim, keepdim=True)
    mean = torch.nanmean(values, dim=dim, keepdim=True)
    squares = torch.where(present, (values - mean) ** 2, torch.zeros_like(values)).sum(dim=dim, keepdim=True)
    std = torch.sqrt(squares / (count - 1).clamp_min(1))
    std = torch.where(count >= 2, std, torch.full_like(std, float("nan")))
    return std if keepdim else std.squeeze(dim)


def _is_zero_std(std: torch.Tensor) -> torch.Tensor:
    return torch.isnan(std) | (std.abs() <= ZERO_STD_ATOL)


def _check_groups(n_rows: int, group_size: int) -> None:
    if group_size < 1:
        raise ValueError(f"group_size (num_generations) must be >= 1, got {group_size}")
    if n_rows % group_size:
        raise ValueError(
            f"{n_rows} rewards do not split into groups of {group_size} consecutive completions: the batch size must be "
            "a multiple of num_generations"
        )


def group_advantages(
    rewards: torch.Tensor,
    weights: torch.Tensor | None,
    group_size: int,
    *,
    scale: str | bool | None = "group",
    aggregation: str | None = "sum_then_normalize",
    estimator: str | None = "grpo",
    eps: float = DEFAULT_EPS,
) -> AdvantageOutput:
    """Group-relative advantages from per-function rewards R (N, K) and weights w (K,) (None = all 1).

    r_i = sum_k w_k R_ik (NaN entries skipped; NaN if the whole row is NaN). g(i) = the group of row i.

    sum_then_normalize (default; GRPO https://arxiv.org/abs/2402.03300, TRL `multi_objective_aggregation`):
        grpo:  A_i = r_i - mean_{j in g(i)} r_j
        rloo:  A_i = r_i - mean_{j in g(i), j != i} r_j          RLOO https://arxiv.org/abs/2402.14740
               (= G/(G-1) (r_i - mean_g r) with G scorable rows; a row alone in its group has no baseline -> 0)
        then, by `scale` (`scale_rewards`):
        group: A_i /= (std_{g(i)} r + eps)       (TRL default; YAML true)
        batch: A_i /= (std_all r + eps)          (mean still per group; "batch" scales, it does not re-centre)
        none:  no division                        (YAML false). Dr. GRPO https://arxiv.org/abs/2503.20783 is
               scale "none" (Cosmos `unbiased_advantage`) together with loss_type "dr_grpo" in `policy_loss`.
        With rloo the scale applies exactly as with grpo. The RLOO paper and TRL's RLOOTrainer do not divide by a std,
        so RLOO as published is estimator "rloo" with scale "none"; the recipe should default scale_rewards to "none"
        for rloo when the user left it unset (an explicit "group" is honoured: it rescales RLOO by 1/std, which is
        GRPO's advantage times G/(G-1)).

    normalize_then_sum (GDPO https://arxiv.org/abs/2601.05242; `rl: gdpo`):
        Z_ik = (R_ik - mean_{g(i)} R_.k) / (std_{g(i)} R_.k + eps)      per reward function, per group
        s_i  = sum_k w_k Z_ik (NaN skipped; NaN for unscorable rows)
        A_i  = (s_i - mean_all s) / (std_all s + eps)                    final batch z-score
        `scale` is ignored (as TRL). A function scored for only one row of a group has Z = NaN there and adds
        nothing. The rloo estimator is refused here: a leave-one-out baseline would only rescale each Z.

    Afterwards NaN advantages (unscorable rows, groups without a baseline or a std) become 0.

    Edge cases: all-equal rewards in a group give exactly 0 (forced: a mean can differ from equal members by rounding,
    and `skip_zero_advantage_batches` tests for exact zeros); likewise a GDPO function that ties within a group adds
    exactly 0, and a batch whose GDPO sums all tie gets 0 everywhere. A group of size 1 has std NaN and no
    leave-one-out baseline: its advantage is 0 under every scale and estimator (a tied group of one), and it counts in
    frac_zero_std. TRL gives the same 0 by setting the std to 0 for G = 1.

    frac_zero_std: the fraction of rows in groups without a learning signal. sum_then_normalize: the group's std of r
    is zero (or NaN). normalize_then_sum: every function's group std is zero (or NaN), since GDPO still has a signal
    when totals tie but functions differ. TRL instead reports isclose(scaling std, 0), which under "batch" and GDPO is
    the batch std (0 or 1 for the whole batch); the per-group form is what the "no learning signal" health check needs.

    None for scale, aggregation or estimator means the default (the config's unset value). Raises ValueError for N not
    divisible by group_size, a weights length other than K, an unknown option, or rloo with normalize_then_sum.
    """
    scale_mode = normalise_scale(scale)
    aggregation = aggregation or "sum_then_normalize"  # None: the config's unset value
    estimator = estimator or "grpo"
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"multi_objective_aggregation must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}")
    if estimator not in ESTIMATORS:
        raise ValueError(f"advantage_estimator must be one of {', '.join(ESTIMATORS)}, got {estimator!r}")
    if estimator == "rloo" and aggregation == "normalize_then_sum":
        raise ValueError(
            "advantage_estimator 'rloo' does not combine with multi_objective_aggregation 'normalize_then_sum' (GDPO): "
            "GDPO z-scores each reward within its group, so a leave-one-out baseline would only rescale it"
        )
    values = rewards.detach()
    if values.dim() == 1:
        values = values.unsqueeze(1)
    if values.dim() != 2:
        raise ValueError(f"rewards must have shape (N, K) (or (N,) for one function), got {tuple(rewards.shape)}")
    if not values.is_floating_point():
        values = values.float()
    n_rows, n_funcs = values.shape
    _check_groups(n_rows, group_size)
    if weights is None:
        func_weights = torch.ones(n_funcs, dtype=values.dtype, device=values.device)
    else:
        func_weights = weights.detach().to(values.dtype).reshape(-1)
        if func_weights.numel() != n_funcs:
            raise ValueError(f"reward_weights has {func_weights.numel()} entries for {n_funcs} reward functions")

    nan = torch.full((n_rows,), float("nan"), dtype=values.dtype, device=values.device)
    unscorable = torch.isnan(values).all(dim=1)
    total = torch.where(unscorable, nan, torch.nansum(values * func_weights, dim=1))
    grouped = total.view(-1, group_size)
    group_std = nanstd(grouped, dim=1, keepdim=True).expand_as(grouped).reshape(-1)

    if aggregation == "sum_then_normalize":
        if estimator == "grpo":
            baseline = torch.nanmean(grouped, dim=1, keepdim=True).expand_as(grouped)
        else:
            count = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)
            others = (torch.nansum(grouped, dim=1, keepdim=True) - grouped) / (count - 1).clamp_min(1)
            baseline = torch.where(count >= 2, others, torch.full_like(others, float("nan")))
        advantages = total - baseline.reshape(-1)
        if scale_mode == "group":
            advantages = advantages / (group_std + eps)
        elif scale_mode == "batch":
            advantages = advantages / (nanstd(total, dim=0) + eps)
        no_signal = _is_zero_std(group_std)
        # a tied group's mean can differ from its members by rounding (3 * 0.7 / 3 != 0.7): force the exact 0
        advantages = torch.where(no_signal, torch.zeros_like(advantages), advantages)
    else:
        per_func = values.view(-1, group_size, n_funcs)
        func_std = nanstd(per_func, dim=1, keepdim=True)
        z_scores = (per_func - torch.nanmean(per_func, dim=1, keepdim=True)) / (func_std + eps)
        z_scores = torch.where(_is_zero_std(func_std), torch.zeros_like(z_scores), z_scores)  # exact 0 for ties
        summed = torch.nansum(z_scores.reshape(n_rows, n_funcs) * func_weights, dim=1)
        summed = torch.where(unscorable, nan, summed)
        summed_std = nanstd(summed, dim=0)
        advantages = (summed - torch.nanmean(summed)) / (summed_std + eps)
        if _is_zero_std(summed_std):
            advantages = torch.zeros_like(advantages)
        no_signal = _is_zero_std(func_std).all(dim=2).expand(-1, group_size).reshape(-1)

    advantages = torch.where(torch.isnan(advantages), torch.zeros_like(advantages), advantages)
    frac_zero_std = float(no_signal.float().mean()) if n_rows else 0.0
    return AdvantageOutput(advantages, total, group_std, frac_zero_std)


def zero_variance_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(N // group_size,) bool: True where a group's rewards are all equal, NaN entries ignored (a group with fewer
    than two scorable rows counts as equal). "Equal" is std <= 1e-8, the same test as `frac_zero_std`.

    For DAPO dynamic sampling (https://arxiv.org/abs/2503.14476, Cosmos `filter_reward_metric`: drop such groups and
    draw more prompts; pass the sum of the filter reward functions) and `skip_zero_advantage_batches`."""
    values = rewards.detach().reshape(-1)
    if not values.is_floating_point():
        values = values.float()
    _check_groups(values.numel(), group_size)
    return _is_zero_std(nanstd(values.view(-1, group_size), dim=1))


def overlong_penalty(lengths: torch.Tensor, max_completion_length: int, buffer_length: int, factor: float) -> torch.Tensor:
    """DAPO soft overlong punishment (https://arxiv.org/abs/2503.14476 Eq. 13), added to the reward; (N,) -> (N,).

    With L_max = max_completion_length, L_buf = buffer_length, |y| = completion length in tokens:
        0                                     |y| <= L_max - L_buf
        -factor * (|y| - (L_max - L_buf)) / L_buf     L_max - L_buf < |y| <= L_max   (linear from 0 to -factor)
        -factor                               |y| > L_max
    (DAPO and Cosmos: factor 1.) Raises ValueError unless 0 < buffer_length <= max_completion_length: a buffer longer
    than the limit (Cosmos's defaults) would penalise every completion.
    """
    if max_completion_length <= 0:
        raise ValueError(f"max_completion_length must be > 0 for the overlong penalty, got {max_completion_length}")
    if buffer_length <= 0 or buffer_length > max_completion_length:
        raise ValueError(
            f"overlong_buffer_length must be in 1..max_completion_length ({max_completion_length}), got {buffer_length}: "
            "a buffer longer than the limit penalises every completion"
        )
    lengths = lengths.detach()
    dtype = lengths.dtype if lengths.is_floating_point() else torch.float32
    start = max_completion_length - buffer_length
    ramp = ((lengths.to(dtype) - start) / buffer_length).clamp(0.0, 1.0)
    return -float(factor) * ramp
