"""Importance-sampling correction and off-policy control against values computed by hand with `math` from the formulas
(docstrings of `rlft.losses.importance`), plus their wiring into `policy_loss` (sequence keep mask, unbiased KL)."""

from __future__ import annotations

import math

import pytest
import torch

from rlft.losses.importance import decoupled_weights, importance_weights, off_policy_sequence_mask
from rlft.losses.policy import policy_loss

T = 4
CAP = 3.0
# trainer (old) log-probs at scoring time and d = old - samp per token; rows of 3, 2, 4 and 1 tokens
OLD = [[-1.0, -0.5, -2.0], [-0.3, -1.2], [-0.7, -0.2, -1.5, -0.9], [-0.4]]
DIFF = [[0.5, -1.5, 1.3], [0.2, -0.05], [0.4, 0.5, 0.3, 0.2], [-1.2]]
SAMP = [[o - d for o, d in zip(row, ds)] for row, ds in zip(OLD, DIFF)]
MODES = [(level, mode) for level in ("token", "sequence") for mode in ("truncate", "mask")]


def pad(rows: list[list[float]], value: float = 0.0, left: bool = False) -> torch.Tensor:
    return torch.tensor(
        [([value] * (T - len(r)) + r) if left else (r + [value] * (T - len(r))) for r in rows], dtype=torch.float64
    )


def mask_of(rows: list[list[float]], left: bool = False) -> torch.Tensor:
    return pad([[1.0] * len(r) for r in rows], 0.0, left)


def valid_values(weights: torch.Tensor, rows: list[list[float]], left: bool = False) -> list[float]:
    """Weights at the masked positions, row after row (token level), or the one weight per row (sequence level)."""
    if weights.shape[1] == 1:
        return [float(weights[i, 0]) for i in range(len(rows))]
    return [float(v) for i, r in enumerate(rows) for v in (weights[i, T - len(r):] if left else weights[i, : len(r)])]


def by_hand(level: str, mode: str, cap: float = CAP, skip_row: int | None = None) -> list[float]:
    diffs = [row for i, row in enumerate(DIFF) if i != skip_row]
    raw = [math.exp(d) for row in diffs for d in row] if level == "token" else [math.exp(sum(row)) for row in diffs]
    if mode == "truncate":
        return [min(r, cap) for r in raw]
    return [0.0 if (r > cap or r < 1 / cap) else r for r in raw]


# ---------------------------------------------------------------- importance_weights


@pytest.mark.parametrize("level,mode", MODES)
def test_weights_match_hand_computation(level, mode):
    weights, _ = importance_weights(pad(OLD), pad(SAMP), mask_of(OLD), level=level, mode=mode, cap=CAP)
    assert weights.shape == ((4, T) if level == "token" else (4, 1))
    assert valid_values(weights, OLD) == pytest.approx(by_hand(level, mode))


def test_hand_values_cover_every_case():
    """The fixture really exercises the cases: tokens above C and below 1/C, sequences above C and below 1/C."""
    token = [math.exp(d) for row in DIFF for d in row]
    sequence = [math.exp(sum(row)) for row in DIFF]
    for ratios in (token, sequence):
        assert any(r > CAP for r in ratios) and any(r < 1 / CAP for r in ratios) and any(1 / CAP < r < CAP for r in ratios)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_mask_modes_give_zero_not_one_over_cap(level):
    weights, metrics = importance_weights(pad(OLD), pad(SAMP), mask_of(OLD), level=level, mode="mask", cap=CAP)
    values = valid_values(weights, OLD)
    assert 0.0 in values
    assert all(v == 0.0 or 1 / CAP <= v <= CAP for v in values)
    assert not any(v == pytest.approx(1 / CAP) for v in values)  # Axolotl's async trainer would lift zeros to 1/C
    if level == "token":  # e^-1.5, e^1.3 (row 0) and e^-1.2 (row 3) of 10 tokens
        assert metrics["sampling/is_masked_fraction"] == pytest.approx(3 / 10)
    else:  # e^1.4 (row 2) and e^-1.2 (row 3) of 4 sequences
        assert metrics["sampling/is_masked_fraction"] == pytest.approx(2 / 4)


def test_truncate_has_no_floor():
    weights, _ = importance_weights(pad(OLD), pad(SAMP), mask_of(OLD), level="token", mode="truncate", cap=CAP)
    assert float(weights[0, 1]) == pytest.approx(math.exp(-1.5))  # below 1/C, kept as is (TIS is upper-only)
    assert float(weights[0, 2]) == CAP


@pytest.mark.parametrize("level,mode", MODES)
def test_zero_staleness_gives_exactly_one(level, mode):
    old = pad(OLD)
    weights, metrics = importance_weights(old, old.clone(), mask_of(OLD), level=level, mode=mode, cap=CAP)
    assert torch.equal(weights, torch.ones_like(weights))
    assert metrics["sampling/sampling_logp_difference/max"] == 0.0
    assert metrics["sampling/importance_sampling_ratio/min"] == metrics["sampling/importance_sampling_ratio/max"] == 1.0
    assert metrics.get("sampling/is_masked_fraction", 0.0) == 0.0


@pytest.mark.parametrize("level,mode", MODES)
@pytest.mark.parametrize("left", [False, True])
def test_padding_values_and_side_change_nothing(level, mode, left):
    clean, clean_metrics = importance_weights(pad(OLD), pad(SAMP), mask_of(OLD), level=level, mode=mode, cap=CAP)
    for old_fill, samp_fill in ((math.nan, -math.inf), (-math.inf, math.nan), (math.inf, -math.inf)):
        weights, metrics = importance_weights(
            pad(OLD, old_fill, left), pad(SAMP, samp_fill, left), mask_of(OLD, left), level=level, mode=mode, cap=CAP
        )
        assert torch.isfinite(weights).all()
        assert valid_values(weights, OLD, left) == pytest.approx(valid_values(clean, OLD))
        assert metrics == pytest.approx(clean_metrics)


def test_sequence_level_uses_the_sum_not_the_mean():
    old = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    samp = old - 0.3
    weights, _ = importance_weights(old, samp, torch.ones_like(old), level="sequence", mode="truncate", cap=10.0)
    assert float(weights[0, 0]) == pytest.approx(math.exp(0.6))


@pytest.mark.parametrize("cap", [0.0, -1.0, math.nan])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_cap_not_positive_is_refused(cap, mode):
    with pytest.raises(ValueError, match="IS cap <= 0"):
        importance_weights(pad(OLD), pad(SAMP), mask_of(OLD), mode=mode, cap=cap)


def test_cap_below_one_refused_in_mask_mode():
    with pytest.raises(ValueError, match=r"\[1/C, C\] is empty"):
        importance_weights(pad(OLD), pad(SAMP), mask_of(OLD), mode="mask", cap=0.5)


def test_unknown_level_or_mode_refused():
    with pytest.raises(ValueError, match="unknown importance-sampling level"):
        importance_weights(pad(OLD), pad(SAMP), mask_of(OLD), level="tokens")
    with pytest.raises(ValueError, match="unknown importance-sampling mode"):
        importance_weights(pad(OLD), pad(SAMP), mask_of(OLD), mode="clip")


def test_token_metrics_are_before_truncation():
    _, metrics = importance_weights(pad(OLD), pad(SAMP), mask_of(OLD), level="token", mode="truncate", cap=CAP)
    gaps = [abs(d) for row in DIFF for d in row]
    ratios = [math.exp(d) for row in DIFF for d in row]
    assert metrics["sampling/sampling_logp_difference/mean"] == pytest.approx(sum(gaps) / len(gaps))
    assert metrics["sampling/sampling_logp_difference/max"] == pytest.approx(max(gaps))
    assert metrics["sampling/importance_sampling_ratio/min"] == pytest.approx(min(ratios))
    assert metrics["sampling/importance_sampling_ratio/mean"] == pytest.approx(sum(ratios) / len(ratios))
    assert metrics["sampling/importance_sampling_ratio/max"] == pytest.approx(math.exp(1.3))  # above the cap
    assert "sampling/is_masked_fraction" not in metrics


def test_sequence_metrics_are_per_sequence():
    _, metrics = importance_weights(pad(OLD), pad(SAMP), mask_of(OLD), level="sequence", mode="mask", cap=CAP)
    ratios = [math.exp(sum(row)) for row in DIFF]
    assert metrics["sampling/importance_sampling_ratio/mean"] == pytest.approx(sum(ratios) / len(ratios))
    assert metrics["sampling/importance_sampling_ratio/max"] == pytest.approx(math.exp(1.4))


def test_log_ratio_clamped_before_exp():
    old = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
    samp = torch.tensor([[-50.0, -80.0]], dtype=torch.float64)
    weights, metrics = importance_weights(old, samp, torch.ones_like(old), level="token", mode="truncate", cap=CAP)
    assert weights.tolist() == [[CAP, CAP]]
    assert metrics["sampling/importance_sampling_ratio/max"] == pytest.approx(math.exp(20.0))
    weights, _ = importance_weights(old, samp, torch.ones_like(old), level="sequence", mode="truncate", cap=1e12)
    assert float(weights[0, 0]) == pytest.approx(math.exp(20.0))  # the sum 130 is clamped, not each term


@pytest.mark.parametrize("level,mode", MODES)
def test_empty_mask_rows(level, mode):
    mask = mask_of(OLD)
    mask[1] = 0.0
    weights, metrics = importance_weights(pad(OLD), pad(SAMP), mask, level=level, mode=mode, cap=CAP)
    assert torch.equal(weights[1], torch.ones_like(weights[1]))  # the loss ignores the row anyway
    rows = [OLD[0], OLD[2], OLD[3]]
    assert valid_values(weights[[0, 2, 3]], rows) == pytest.approx(by_hand(level, mode, skip_row=1))
    weights, metrics = importance_weights(pad(OLD), pad(SAMP), torch.zeros(4, T), level=level, mode=mode, cap=CAP)
    assert torch.equal(weights, torch.ones_like(weights))
    assert all(value == 0.0 for value in metrics.values())


def test_half_precision_inputs_are_computed_in_float32():
    weights, _ = importance_weights(pad(OLD).bfloat16(), pad(SAMP).bfloat16(), mask_of(OLD), level="token", cap=CAP)
    assert weights.dtype == torch.float32


# ---------------------------------------------------------------- decoupled_weights


def test_decoupled_weights_mask_above_cap_and_keep_small_ones():
    weights, metrics = decoupled_weights(pad(OLD, math.nan), pad(SAMP, -math.inf), mask_of(OLD), cap=1.5)
    expected = [0.0 if math.exp(d) > 1.5 else math.exp(d) for row in DIFF for d in row]
    assert valid_values(weights, OLD) == pytest.approx(expected)
    assert float(weights[0, 1]) == pytest.approx(math.exp(-1.5))  # no lower bound
    # above 1.5: e^0.5 (1.65), e^1.3 of row 0; e^0.5 of row 2
    assert metrics["sampling/behav_imp_weight_masked_fraction"] == pytest.approx(3 / 10)
    assert torch.isfinite(weights).all()


def test_decoupled_weights_without_cap_are_the_plain_ratio():
    weights, metrics = decoupled_weights(pad(OLD), pad(SAMP), mask_of(OLD), cap=None)
    assert valid_values(weights, OLD) == pytest.approx([math.exp(d) for row in DIFF for d in row])
    assert "sampling/behav_imp_weight_masked_fraction" not in metrics
    old = pad(OLD)
    weights, _ = decoupled_weights(old, old.clone(), mask_of(OLD), cap=2.0)
    assert torch.equal(weights, torch.ones_like(weights))


@pytest.mark.parametrize("cap", [0.0, -2.0])
def test_decoupled_cap_not_positive_is_refused(cap):
    with pytest.raises(ValueError, match="behav_imp_weight_cap must be > 0"):
        decoupled_weights(pad(OLD), pad(SAMP), mask_of(OLD), cap=cap)


def test_decoupled_empty_mask():
    weights, metrics = decoupled_weights(pad(OLD), pad(SAMP), torch.zeros(4, T), cap=2.0)
    assert torch.equal(weights, torch.ones_like(weights))
    assert all(value == 0.0 for value in metrics.values())


# ---------------------------------------------------------------- off_policy_sequence_mask

# current log-probs and samp - logp per token; mean gaps 0.75, 0.5 (exactly the threshold), 0.25, 1.0, 0.9
LOGP = [[-1.0, -2.0], [-0.5, -0.5, -1.0, -1.0], [-0.3, -0.3], [-1.0], [-0.2, -0.2]]
GAP = [[1.0, 0.5], [0.25, 0.75, 0.5, 0.5], [0.5, 0.0], [1.0], [0.9, 0.9]]
THRESHOLD = 0.5


def opsm_inputs(advantages: list[float], left: bool = False, garbage: bool = False):
    samp = [[lp + g for lp, g in zip(row, gaps)] for row, gaps in zip(LOGP, GAP)]
    logps = pad(LOGP, -math.inf if garbage else 0.0, left).requires_grad_(True)
    advantages = torch.tensor(advantages, dtype=torch.float64)
    return logps, pad(samp, math.nan if garbage else 0.0, left), advantages, mask_of(LOGP, left)


def test_opsm_keep_logic():
    # A: negative over threshold -> drop; negative == threshold -> keep; negative under -> keep;
    # positive over -> keep; zero over -> keep
    logps, samp, adv, mask = opsm_inputs([-1.0, -1.0, -1.0, 2.0, 0.0])
    keep, metrics = off_policy_sequence_mask(logps, samp, adv, mask, THRESHOLD)
    assert keep.shape == (5, 1)
    assert keep.squeeze(1).tolist() == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert metrics == {"sampling/off_policy_masked_fraction": pytest.approx(1 / 5)}
    assert not keep.requires_grad


def test_opsm_negative_advantages_all_over_threshold():
    logps, samp, adv, mask = opsm_inputs([-1.0, -1.0, -1.0, -1.0, -1.0])
    keep, metrics = off_policy_sequence_mask(logps, samp, adv.unsqueeze(1), mask, THRESHOLD)
    # mean gaps 0.75, 0.5, 0.25, 1.0, 0.9 against 0.5
    assert keep.squeeze(1).tolist() == [0.0, 1.0, 1.0, 0.0, 0.0]
    assert metrics["sampling/off_policy_masked_fraction"] == pytest.approx(3 / 5)


@pytest.mark.parametrize("left", [False, True])
def test_opsm_padding_changes_nothing(left):
    advantages = [-1.0, -1.0, -1.0, -1.0, 1.0]
    clean, _ = off_policy_sequence_mask(*opsm_inputs(advantages)[:4], THRESHOLD)
    keep, _ = off_policy_sequence_mask(*opsm_inputs(advantages, left=left, garbage=True)[:4], THRESHOLD)
    assert torch.equal(keep, clean)


def test_opsm_empty_row_is_kept():
    logps, samp, adv, mask = opsm_inputs([-1.0] * 5, garbage=True)
    mask[0] = 0.0
    keep, _ = off_policy_sequence_mask(logps, samp, adv, mask, THRESHOLD)
    assert float(keep[0, 0]) == 1.0  # kl = 0 / max(1, 0)


def test_opsm_advantages_shape_checked():
    logps, samp, _, mask = opsm_inputs([0.0] * 5)
    with pytest.raises(ValueError, match=r"expected \(B,\) or \(B, 1\)"):
        off_policy_sequence_mask(logps, samp, torch.zeros(5, T), mask, THRESHOLD)


# ---------------------------------------------------------------- wiring into policy_loss


def loss_inputs(garbage: bool = False):
    """Two sequences of 3 and 2 tokens (right-padded to T = 4)."""
    logp = [[-1.0, -0.5, -2.0], [-0.3, -1.2]]
    old = [[-1.1, -0.4, -2.3], [-0.2, -1.0]]
    ref = [[-1.2, -0.4, -2.5], [-0.1, -1.0]]
    fill = math.nan if garbage else 0.0
    return {
        "logps": pad(logp, -math.inf if garbage else 0.0)[:2].requires_grad_(True),
        "old_logps": pad(old, fill)[:2],
        "ref_logps": pad(ref, fill)[:2],
        "mask": mask_of(logp)[:2],
    }, logp, old, ref


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_bias_corrected_kl_value_and_gradient_by_hand(level):
    beta = 0.1
    x, logp, old, ref = loss_inputs(garbage=True)
    out = policy_loss(
        x["logps"], x["old_logps"], torch.zeros(2, dtype=torch.float64), x["mask"], ref_logps=x["ref_logps"], beta=beta,
        loss_type="dapo", importance_sampling_level=level, bias_correction_kl=True,
    )
    out.loss_sum.backward()
    value, grads, corrected = 0.0, [], []
    for row_logp, row_old, row_ref in zip(logp, old, ref):
        row_grads = []
        for lp, o, rf in zip(row_logp, row_old, row_ref):
            r = math.exp(lp - o)  # the token ratio at both levels
            k3 = math.exp(rf - lp) - (rf - lp) - 1
            value += beta * k3 * r
            corrected.append(k3 * r)
            # d/dlogp [k3 r] = r (1 - e^(ref - logp)) + k3 r
            row_grads.append(beta * (r * (1 - math.exp(rf - lp)) + k3 * r))
        grads.append(row_grads + [0.0] * (T - len(row_grads)))
    assert float(out.loss_sum.detach()) == pytest.approx(value)  # A = 0: the policy term is 0
    assert out.units == 5
    assert x["logps"].grad.tolist() == [pytest.approx(row) for row in grads]
    assert out.metrics["kl"] == pytest.approx(sum(corrected) / len(corrected))


def test_bias_correction_off_is_plain_k3_and_on_policy_correction_is_neutral():
    beta = 0.1
    x, logp, _, ref = loss_inputs()
    plain = policy_loss(x["logps"], None, torch.zeros(2, dtype=torch.float64), x["mask"], ref_logps=x["ref_logps"], beta=beta)
    corrected = policy_loss(
        x["logps"], None, torch.zeros(2, dtype=torch.float64), x["mask"], ref_logps=x["ref_logps"], beta=beta,
        bias_correction_kl=True,
    )
    k3 = sum(math.exp(rf - lp) - (rf - lp) - 1 for rl, rr in zip(logp, ref) for lp, rf in zip(rl, rr))
    assert float(plain.loss_sum.detach()) == pytest.approx(beta * k3)
    assert float(corrected.loss_sum.detach()) == pytest.approx(beta * k3)  # old = logp: r = 1 in value


def test_sequence_keep_removes_the_policy_term_only():
    beta = 0.1
    x, *_ = loss_inputs()
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    common = dict(ref_logps=x["ref_logps"], beta=beta, loss_type="dapo")
    full = policy_loss(x["logps"], x["old_logps"], adv, x["mask"], **common)
    kept = policy_loss(x["logps"], x["old_logps"], adv, x["mask"], sequence_keep=torch.tensor([[1.0], [0.0]]), **common)
    row1_policy = policy_loss(x["logps"][1:], x["old_logps"][1:], adv[1:], x["mask"][1:], loss_type="dapo")
    assert float((full.loss_sum - kept.loss_sum).detach()) == pytest.approx(float(row1_policy.loss_sum.detach()))
    assert kept.units == full.units  # the normaliser (accumulation contract) is unchanged
    assert kept.metrics["kl"] == full.metrics["kl"]  # the KL of the dropped sequence still counts
    ones = policy_loss(x["logps"], x["old_logps"], adv, x["mask"], sequence_keep=torch.ones(2), **common)
    assert float(ones.loss_sum.detach()) == pytest.approx(float(full.loss_sum.detach()))


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_importance_weights_feed_policy_loss(level):
    x, *_ = loss_inputs()
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    old = x["old_logps"]
    weights, _ = importance_weights(old, old.clone(), x["mask"], level=level, mode="mask", cap=CAP)
    base = policy_loss(x["logps"], old, adv, x["mask"])
    weighted = policy_loss(x["logps"], old, adv, x["mask"], is_weights=weights)
    assert float(weighted.loss_sum.detach()) == float(base.loss_sum.detach())  # zero staleness: weights exactly 1
