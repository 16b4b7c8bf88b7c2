"""Policy-gradient losses against values computed by hand with `math`, token by token, from the paper formulas."""

from __future__ import annotations

import math

import pytest
import torch

from rlft.losses.policy import LOSS_TYPES, k3_kl, policy_loss

# three completions of 4, 2 and 3 tokens (right-padded to T = 4)
LOGP = [[-1.0, -0.5, -2.0, -0.1], [-0.3, -1.2], [-0.7, -0.2, -1.5]]
LOG_RATIO = [[0.5, -0.4, 0.1, 0.0], [0.2, -0.05], [-0.3, 0.6, 0.15]]
OLD = [[lp - d for lp, d in zip(row, ratios)] for row, ratios in zip(LOGP, LOG_RATIO)]
REF = [[-1.2, -0.4, -2.5, -0.1], [-0.1, -1.0], [-0.9, -0.6, -1.0]]
ENTROPY = [[0.5, 1.0, 0.2, 0.3], [0.8, 0.1], [0.4, 0.6, 0.9]]
ADV = [1.0, -0.5, -2.0]
T = 4
L_MAX = 6


def pad(rows: list[list[float]], value: float = 0.0, left: bool = False) -> torch.Tensor:
    return torch.tensor(
        [([value] * (T - len(r)) + r) if left else (r + [value] * (T - len(r))) for r in rows], dtype=torch.float64
    )


def mask_of(rows: list[list[float]], left: bool = False) -> torch.Tensor:
    return pad([[1.0] * len(r) for r in rows], 0.0, left)


def inputs(rows=range(3), left: bool = False, garbage: bool = False) -> dict[str, torch.Tensor]:
    """Tensors of the chosen rows; garbage=True fills padding with -inf / NaN (it must never leak)."""
    pick = list(rows)
    logp = pad([LOGP[i] for i in pick], -math.inf if garbage else 0.0, left).requires_grad_(True)
    filler = math.nan if garbage else 0.0
    return {
        "logps": logp,
        "old_logps": pad([OLD[i] for i in pick], filler, left),
        "advantages": torch.tensor([ADV[i] for i in pick], dtype=torch.float64),
        "mask": mask_of([LOGP[i] for i in pick], left),
        "ref_logps": pad([REF[i] for i in pick], filler, left),
        "entropy": pad([ENTROPY[i] for i in pick], filler, left),
    }


def clip(x: float, lo: float, hi: float) -> float:
    return max(lo, min(hi, x))


def k3(logp: float, ref: float) -> float:
    d = ref - logp
    return math.exp(d) - d - 1


def token_losses(
    i: int,
    *,
    eps: float = 0.2,
    eps_high: float | None = None,
    delta: float | None = None,
    c: float | None = None,
    rho: float | None = None,
    cispo: bool = False,
    sequence: bool = False,
    beta: float = 0.0,
    ent: float = 0.0,
    nll: float = 0.0,
    is_w: float = 1.0,
) -> list[float]:
    """Per-token loss of sequence i, by hand from the formulas in the docstring of `policy_loss`."""
    eh = eps if eps_high is None else eps_high
    a = ADV[i]
    seq_ratio = math.exp(sum(LOG_RATIO[i]) / len(LOG_RATIO[i]))
    out = []
    for t, logp in enumerate(LOGP[i]):
        r = seq_ratio if sequence else math.exp(LOG_RATIO[i][t])
        if cispo:
            loss = -min(r, 1 + eh) * a * logp
        elif rho is not None:
            loss = -min(r, rho) * a
        else:
            unclipped = r if delta is None else min(r, delta)
            loss = -min(unclipped * a, clip(r, 1 - eps, 1 + eh) * a)
            if c is not None and a < 0:
                loss = min(loss, -c * a)
        loss *= is_w
        loss += beta * k3(logp, REF[i][t]) - ent * ENTROPY[i][t]
        if a > 0:
            loss += nll * -logp
        out.append(loss)
    return out


def aggregate(loss_type: str, per_seq: list[list[float]], rows=range(3)) -> tuple[float, float]:
    """(loss_sum, units) of the accumulation contract, by hand."""
    per_seq = [per_seq[i] for i in rows]
    n_tokens = sum(len(s) for s in per_seq)
    if loss_type == "grpo":
        return sum(sum(s) / len(s) for s in per_seq), float(len(per_seq))
    if loss_type == "bnpo":
        return sum(sum(s) for s in per_seq) / n_tokens, 1.0
    if loss_type == "dr_grpo":
        return sum(sum(s) for s in per_seq), float(len(per_seq) * L_MAX)
    if loss_type == "token-mean":
        return len(per_seq) * sum(sum(s) for s in per_seq) / n_tokens, float(len(per_seq))
    return sum(sum(s) for s in per_seq), float(n_tokens)


def run(rows=range(3), left=False, garbage=False, **kwargs):
    x = inputs(rows, left, garbage)
    if "ref" not in kwargs.pop("drop", ()):
        kwargs.setdefault("ref_logps", x["ref_logps"])
    kwargs.setdefault("max_completion_length", L_MAX)
    return policy_loss(x["logps"], x["old_logps"], x["advantages"], x["mask"], **kwargs), x


# ---- k3 ------------------------------------------------------------------------------------------------------------


def test_k3_by_hand_nonnegative_and_zero_when_equal():
    assert k3_kl(torch.tensor([-1.0]), torch.tensor([-2.0])).item() == pytest.approx(math.exp(-1) + 1 - 1)
    assert k3_kl(torch.tensor([-2.0]), torch.tensor([-1.0])).item() == pytest.approx(math.e - 1 - 1)
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, generator=generator) * 3, torch.randn(64, generator=generator) * 3
    assert (k3_kl(a, b) >= 0).all()
    assert k3_kl(a, a).abs().max().item() == 0.0


# ---- aggregation per loss_type ------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "token-mean"])
def test_ppo_clip_loss_types(loss_type):
    out, _ = run(loss_type=loss_type)
    expected_sum, expected_units = aggregate(loss_type, [token_losses(i) for i in range(3)])
    assert out.loss_sum.item() == pytest.approx(expected_sum, abs=1e-12)
    assert out.units == expected_units


def test_literal_values_dapo():
    # token 0 of row 0: r = e^0.5 > 1.2, A = 1 -> clipped at 1.2: loss -1.2; token 1: r = e^-0.4, A > 0 -> -e^-0.4
    out, _ = run(rows=[0], loss_type="dapo")
    expected = -1.2 - math.exp(-0.4) - math.exp(0.1) - 1.0
    assert out.loss_sum.item() == pytest.approx(expected)
    assert out.units == 4.0


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "cispo"])
def test_micro_batch_split_matches_one_batch(loss_type):
    whole, _ = run(loss_type=loss_type, beta=0.05)
    first, _ = run(rows=[0, 1], loss_type=loss_type, beta=0.05)
    second, _ = run(rows=[2], loss_type=loss_type, beta=0.05)
    split = (first.loss_sum.item() + second.loss_sum.item()) / (first.units + second.units)
    assert split == pytest.approx(whole.loss_sum.item() / whole.units, abs=1e-12)


def test_bnpo_is_mean_of_micro_batch_token_means():
    first, _ = run(rows=[0, 1], loss_type="bnpo")
    second, _ = run(rows=[2], loss_type="bnpo")
    per_seq = [token_losses(i) for i in range(3)]
    expected = (sum(per_seq[0] + per_seq[1]) / 6 + sum(per_seq[2]) / 3) / 2
    assert (first.loss_sum.item() + second.loss_sum.item()) / (first.units + second.units) == pytest.approx(expected)


def test_token_mean_weighs_micro_batch_token_means_by_their_rows():
    """Cosmos-RL's token-mean: a micro-batch's token mean times its share of the step's sequences (1 of 3 with 4 tokens,
    then 2 of 3 with 5 tokens); dapo's one token mean over the 9 tokens differs, and the two agree on a step of one
    micro-batch."""
    per_seq = [token_losses(i) for i in range(3)]
    first, _ = run(rows=[0], loss_type="token-mean")
    second, _ = run(rows=[1, 2], loss_type="token-mean")
    step = (first.loss_sum.item() + second.loss_sum.item()) / (first.units + second.units)
    expected = 1 / 3 * sum(per_seq[0]) / 4 + 2 / 3 * sum(per_seq[1] + per_seq[2]) / 5
    assert step == pytest.approx(expected, abs=1e-12)
    assert (first.units, second.units) == (1.0, 2.0)
    dapo = sum(sum(s) for s in per_seq) / 9
    assert abs(step - dapo) > 0.05
    whole, _ = run(loss_type="token-mean")
    assert whole.loss_sum.item() / whole.units == pytest.approx(dapo, abs=1e-12)


def test_token_mean_counts_a_row_without_loss_tokens():
    """A fully masked row adds no token but is one of the micro-batch's rows; a micro-batch with no loss token at all
    contributes 0 over its rows (Cosmos-RL divides by tokens + 1e-8)."""
    per_seq = [token_losses(i) for i in range(3)]
    x = inputs(rows=[0, 1])
    mask = x["mask"].clone()
    mask[1] = 0
    first = policy_loss(x["logps"], x["old_logps"], x["advantages"], mask, loss_type="token-mean")
    assert first.units == 2.0
    assert first.loss_sum.item() == pytest.approx(2 * sum(per_seq[0]) / 4, abs=1e-12)
    second, _ = run(rows=[2], loss_type="token-mean")
    empty = policy_loss(x["logps"], x["old_logps"], x["advantages"], torch.zeros(2, T), loss_type="token-mean")
    assert (empty.loss_sum.item(), empty.units) == (0.0, 2.0)
    step = (first.loss_sum + second.loss_sum + empty.loss_sum).item() / (first.units + second.units + empty.units)
    assert step == pytest.approx((2 * sum(per_seq[0]) / 4 + sum(per_seq[2]) / 3) / 5, abs=1e-12)


def test_dr_grpo_needs_a_length():
    with pytest.raises(ValueError, match="max_completion_length"):
        run(loss_type="dr_grpo", max_completion_length=None)


def test_on_policy_ratio_is_one():
    x = inputs()
    out = policy_loss(x["logps"], None, x["advantages"], x["mask"], loss_type="dapo")
    assert out.loss_sum.item() == pytest.approx(-(1.0 * 4 - 0.5 * 2 - 2.0 * 3))
    assert out.metrics["clip_ratio/region_mean"] == 0.0


# ---- ratios and clipping ------------------------------------------------------------------------------------------


def test_clip_metrics_token_level():
    out, _ = run(loss_type="dapo")
    # A > 0 and r > 1.2: row 0 token 0. A < 0 and r < 0.8: row 2 token 0 (e^-0.3). Of 9 tokens.
    assert out.metrics["clip_ratio/high_mean"] == pytest.approx(1 / 9)
    assert out.metrics["clip_ratio/low_mean"] == pytest.approx(1 / 9)
    assert out.metrics["clip_ratio/region_mean"] == pytest.approx(2 / 9)
    assert "clip_ratio/dual_mean" not in out.metrics
    wide, _ = run(loss_type="dapo", epsilon=0.2, epsilon_high=0.7)
    assert wide.metrics["clip_ratio/high_mean"] == 0.0
    assert wide.loss_sum.item() == pytest.approx(aggregate("dapo", [token_losses(i, eps_high=0.7) for i in range(3)])[0])


def test_sequence_level_ratio_gspo():
    out, x = run(loss_type="grpo", importance_sampling_level="sequence")
    expected_sum, units = aggregate("grpo", [token_losses(i, sequence=True) for i in range(3)])
    assert out.loss_sum.item() == pytest.approx(expected_sum, abs=1e-12)
    assert units == out.units
    # s = exp(mean log-ratio): row 0 e^0.05, row 1 e^0.075, row 2 e^0.15 -> none clipped at 0.2
    assert out.metrics["clip_ratio/region_mean"] == 0.0
    out.loss_sum.backward()
    # GSPO gradient: d/dlogp_t of -s A per sequence mean = -s A / |y| on every token of the sequence
    for i in range(3):
        s = math.exp(sum(LOG_RATIO[i]) / len(LOG_RATIO[i]))
        n = len(LOGP[i])
        assert x["logps"].grad[i, :n].tolist() == pytest.approx([-s * ADV[i] / n] * n)
        assert x["logps"].grad[i, n:].tolist() == [0.0] * (T - n)


def test_sequence_level_matches_sequence_ratio_autograd():
    """The GSPO-token form gives the gradient of TRL's broadcast exp(mean log-ratio), clipped or not."""
    for loss_type in ("grpo", "dapo"):
        # epsilon 0.04: row 0 (s = e^0.05, A > 0) is clipped, rows 1 and 2 are not
        out, x = run(loss_type=loss_type, importance_sampling_level="sequence", epsilon=0.04, drop=("ref",))
        out.loss_sum.backward()
        logp = x["logps"].detach().clone().requires_grad_(True)
        m = x["mask"]
        seq = torch.exp(((logp - x["old_logps"]) * m).sum(-1) / m.sum(-1)).unsqueeze(1)
        a = x["advantages"].unsqueeze(1)
        per_token = -torch.minimum(seq * a, seq.clamp(0.96, 1.04) * a) * m
        total = (per_token.sum(-1) / m.sum(-1)).sum() if loss_type == "grpo" else per_token.sum()
        total.backward()
        assert out.loss_sum.item() == pytest.approx(total.item())
        assert torch.allclose(x["logps"].grad, logp.grad)
        assert x["logps"].grad[0].tolist() == [0.0] * T and x["logps"].grad[1, 0].item() != 0.0


def test_sequence_level_clip_metrics_one_vote_per_sequence():
    out, _ = run(loss_type="grpo", importance_sampling_level="sequence", epsilon=0.06)
    # s: e^0.05 (A>0, inside 1.06), e^0.075 = 1.078 (A<0: not low), e^0.15 = 1.16 (A<0: not low) -> 0 of 3
    assert out.metrics["clip_ratio/high_mean"] == 0.0
    out, _ = run(loss_type="grpo", importance_sampling_level="sequence", epsilon=0.04)
    # e^0.05 = 1.051 > 1.04 with A > 0: one sequence of three
    assert out.metrics["clip_ratio/high_mean"] == pytest.approx(1 / 3)


def test_delta_caps_negative_advantage_ratio():
    out, _ = run(rows=[2], loss_type="dapo", delta=1.5)
    # row 2 token 1: r = e^0.6 = 1.82, A = -2: plain PPO 3.64, capped at 1.5 * 2 = 3.0
    plain = -min(math.exp(0.6) * -2, 1.2 * -2)
    assert plain == pytest.approx(2 * math.exp(0.6))
    expected = sum(token_losses(2, delta=1.5))
    assert out.loss_sum.item() == pytest.approx(expected)
    assert expected == pytest.approx(sum(token_losses(2)) - plain + 3.0)
    assert out.metrics["clip_ratio/dual_mean"] == pytest.approx(1 / 3)
    # A > 0 (row 0, r = e^0.5 > delta): unchanged, the PPO clip already bounds it
    assert run(rows=[0], loss_type="dapo", delta=1.5)[0].loss_sum.item() == pytest.approx(sum(token_losses(0)))


def test_dual_clip_only_acts_on_negative_advantages():
    c = 1.1
    out, _ = run(loss_type="dapo", lower_bound_ratio=c)
    assert out.loss_sum.item() == pytest.approx(aggregate("dapo", [token_losses(i, c=c) for i in range(3)])[0])
    # positive row 0 (r up to e^0.5 > c): untouched
    assert token_losses(0, c=c) == token_losses(0)
    # row 1 token 0: r = e^0.2, A = -0.5: PPO 0.5 e^0.2 = 0.611 > c |A| = 0.55
    assert token_losses(1, c=c)[0] == pytest.approx(0.55)
    assert token_losses(1)[0] == pytest.approx(0.5 * math.exp(0.2))
    # r above c with A < 0: row 1 token 0 (1.22), row 2 tokens 1 and 2 (1.82, 1.16)
    assert out.metrics["clip_ratio/dual_mean"] == pytest.approx(3 / 9)
    x = inputs()
    out = policy_loss(x["logps"], x["old_logps"], x["advantages"], x["mask"], lower_bound_ratio=c)
    out.loss_sum.backward()
    grad = x["logps"].grad
    assert grad[1, 0].item() == 0.0 and grad[2, 1].item() == 0.0  # capped: constant loss
    assert grad[0, 1].item() != 0.0


def test_aipo_truncation():
    rho = 1.3
    out, x = run(loss_type="dapo", aipo_rho=rho, lower_bound_ratio=3.0, delta=2.0, drop=("ref",))
    assert out.loss_sum.item() == pytest.approx(aggregate("dapo", [token_losses(i, rho=rho) for i in range(3)])[0])
    # literal: row 0 token 0 r = e^0.5 > rho -> -1.3 * 1; row 2 token 1 r = e^0.6 -> -1.3 * -2 = 2.6
    assert token_losses(0, rho=rho)[0] == pytest.approx(-1.3)
    assert token_losses(2, rho=rho)[1] == pytest.approx(2.6)
    assert out.metrics["clip_ratio/high_mean"] == pytest.approx(2 / 9)
    assert out.metrics["clip_ratio/low_mean"] == 0.0
    out.loss_sum.backward()
    assert x["logps"].grad[0, 0].item() == 0.0  # truncated: no gradient
    assert x["logps"].grad[0, 1].item() == pytest.approx(-math.exp(-0.4) * 1.0)


def test_cispo():
    out, x = run(loss_type="cispo", epsilon_high=0.3, drop=("ref",))
    expected_sum, units = aggregate("cispo", [token_losses(i, cispo=True, eps_high=0.3) for i in range(3)])
    assert out.loss_sum.item() == pytest.approx(expected_sum)
    assert out.units == units == 9.0
    out.loss_sum.backward()
    # the IS weight is a constant: d/dlogp_t = -min(r, 1.3) A on every token, clipped ones included
    row0 = [-min(math.exp(d), 1.3) * ADV[0] for d in LOG_RATIO[0]]
    assert x["logps"].grad[0].tolist() == pytest.approx(row0)
    # r > 1.3 and A > 0: row 0 token 0 only
    assert out.metrics["cispo_clip_ratio"] == pytest.approx(1 / 9)
    with pytest.raises(ValueError, match="aipo_rho"):
        run(loss_type="cispo", aipo_rho=2.0)


# ---- KL, entropy, positive NLL, IS weights ------------------------------------------------------------------------


def test_kl_term_and_metric():
    out, x = run(loss_type="dapo", beta=0.1)
    assert out.loss_sum.item() == pytest.approx(aggregate("dapo", [token_losses(i, beta=0.1) for i in range(3)])[0])
    mean_kl = sum(k3(lp, rf) for i in range(3) for lp, rf in zip(LOGP[i], REF[i])) / 9
    assert out.metrics["kl"] == pytest.approx(mean_kl)
    # ref given but beta = 0: the KL is logged, not added
    no_kl, _ = run(loss_type="dapo")
    assert no_kl.metrics["kl"] == pytest.approx(mean_kl)
    assert no_kl.loss_sum.item() == pytest.approx(aggregate("dapo", [token_losses(i) for i in range(3)])[0])
    with pytest.raises(ValueError, match="ref_logps"):
        policy_loss(x["logps"], x["old_logps"], x["advantages"], x["mask"], beta=0.1)


def test_entropy_bonus():
    x = inputs()
    entropy = x["entropy"].clone().requires_grad_(True)
    out = policy_loss(x["logps"], x["old_logps"], x["advantages"], x["mask"], entropy=entropy, entropy_coeff=0.01)
    assert out.loss_sum.item() == pytest.approx(aggregate("dapo", [token_losses(i, ent=0.01) for i in range(3)])[0])
    assert out.metrics["entropy"] == pytest.approx(sum(sum(e) for e in ENTROPY) / 9)
    out.loss_sum.backward()
    assert torch.equal(entropy.grad, -0.01 * x["mask"])  # the bonus trains the entropy
    with pytest.raises(ValueError, match="entropy"):
        policy_loss(x["logps"], x["old_logps"], x["advantages"], x["mask"], entropy_coeff=0.01)


def test_positive_nll():
    out, _ = run(loss_type="grpo", positive_nll_coef=0.5, drop=("ref",))
    assert out.loss_sum.item() == pytest.approx(aggregate("grpo", [token_losses(i, nll=0.5) for i in range(3)])[0])
    # only row 0 has A > 0: the term adds 0.5 * mean NLL of its tokens to the grpo loss_sum
    base, _ = run(loss_type="grpo", drop=("ref",))
    assert out.loss_sum.item() - base.loss_sum.item() == pytest.approx(0.5 * -sum(LOGP[0]) / 4)


@pytest.mark.parametrize("per_token", [False, True])
def test_is_weights_multiply_policy_term_only(per_token):
    x = inputs()
    w = [0.5, 1.0, 2.0]
    is_weights = torch.tensor(w, dtype=torch.float64)
    if per_token:
        is_weights = is_weights.unsqueeze(1).expand(3, T).clone()
    out = policy_loss(
        x["logps"], x["old_logps"], x["advantages"], x["mask"], ref_logps=x["ref_logps"], beta=0.1, is_weights=is_weights
    )
    expected = aggregate("dapo", [token_losses(i, beta=0.1, is_w=w[i]) for i in range(3)])[0]
    assert out.loss_sum.item() == pytest.approx(expected)


# ---- gradients, padding, empty masks, errors ----------------------------------------------------------------------


def test_gradients_reach_logps_only():
    x = inputs()
    old = x["old_logps"].clone().requires_grad_(True)
    ref = x["ref_logps"].clone().requires_grad_(True)
    adv = x["advantages"].clone().requires_grad_(True)
    is_weights = torch.ones(3, dtype=torch.float64, requires_grad=True)
    out = policy_loss(x["logps"], old, adv, x["mask"], ref_logps=ref, beta=0.1, is_weights=is_weights, loss_type="grpo")
    out.loss_sum.backward()
    assert x["logps"].grad is not None and torch.isfinite(x["logps"].grad).all()
    assert old.grad is None and ref.grad is None and adv.grad is None and is_weights.grad is None
    k3_kl(x["logps"], ref).sum().backward()
    assert ref.grad is None


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_left_and_right_padding_agree(loss_type, level):
    def full(x: dict[str, torch.Tensor]):
        return policy_loss(
            x["logps"], x["old_logps"], x["advantages"], x["mask"], ref_logps=x["ref_logps"], entropy=x["entropy"],
            loss_type=loss_type, importance_sampling_level=level, beta=0.1, entropy_coeff=0.01, positive_nll_coef=0.2,
            lower_bound_ratio=1.5, max_completion_length=L_MAX,
        )

    xr, xl = inputs(), inputs(left=True, garbage=True)  # left padding holds -inf / NaN: it must not leak
    right, left = full(xr), full(xl)
    assert left.loss_sum.item() == pytest.approx(right.loss_sum.item(), abs=1e-12)
    assert left.units == right.units
    assert left.metrics == pytest.approx(right.metrics)
    left.loss_sum.backward()
    right.loss_sum.backward()
    for i, row in enumerate(LOGP):
        n = len(row)
        assert xl["logps"].grad[i, T - n :].tolist() == pytest.approx(xr["logps"].grad[i, :n].tolist(), abs=1e-12)
        assert xl["logps"].grad[i, : T - n].tolist() == [0.0] * (T - n)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_empty_mask(loss_type, level):
    x = inputs(garbage=True)
    out = policy_loss(
        x["logps"], x["old_logps"], x["advantages"], torch.zeros(3, T), loss_type=loss_type, importance_sampling_level=level,
        ref_logps=x["ref_logps"], beta=0.1, entropy=x["entropy"], entropy_coeff=0.01, positive_nll_coef=0.1,
        max_completion_length=L_MAX,
    )
    assert out.loss_sum.item() == 0.0
    assert out.units == {"dr_grpo": 3.0 * L_MAX, "token-mean": 3.0}.get(loss_type, 0.0)
    assert all(v == 0.0 for v in out.metrics.values())
    out.loss_sum.backward()
    assert torch.equal(x["logps"].grad, torch.zeros(3, T, dtype=torch.float64))


def test_grpo_counts_only_nonempty_sequences():
    x = inputs()
    mask = x["mask"].clone()
    mask[1] = 0  # e.g. a truncated completion masked out
    out = policy_loss(x["logps"], x["old_logps"], x["advantages"], mask, loss_type="grpo")
    per_seq = [token_losses(i) for i in range(3)]
    assert out.units == 2.0
    assert out.loss_sum.item() == pytest.approx(sum(per_seq[0]) / 4 + sum(per_seq[2]) / 3)


def test_bool_mask_and_half_precision():
    x = inputs()
    expected = aggregate("dapo", [token_losses(i) for i in range(3)])[0]
    out = policy_loss(x["logps"], x["old_logps"], x["advantages"], x["mask"].bool())
    assert out.loss_sum.item() == pytest.approx(expected)
    logps = x["logps"].detach().to(torch.bfloat16).requires_grad_(True)
    half = policy_loss(logps, x["old_logps"].to(torch.bfloat16), x["advantages"], x["mask"].bool())
    assert half.loss_sum.dtype == torch.float32
    assert half.loss_sum.item() == pytest.approx(expected, rel=0.05)
    half.loss_sum.backward()
    assert logps.grad is not None and logps.grad.dtype == torch.bfloat16


def test_bad_arguments():
    x = inputs()
    args = (x["logps"], x["old_logps"], x["advantages"], x["mask"])
    with pytest.raises(ValueError, match="loss_type"):
        policy_loss(*args, loss_type="ppo")
    with pytest.raises(ValueError, match="importance_sampling_level"):
        policy_loss(*args, importance_sampling_level="segment")
    with pytest.raises(ValueError, match="mask"):
        policy_loss(x["logps"], x["old_logps"], x["advantages"], x["mask"][:, :2])
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(x["logps"], x["old_logps"], torch.zeros(2), x["mask"])
    with pytest.raises(ValueError, match="epsilon"):
        policy_loss(*args, epsilon=-0.1)


def test_k3_keeps_its_value_and_gradient_for_a_token_far_likelier_than_the_reference():
    """d = ref - logp = -24: k3 = e^-24 + 24 - 1 ~ 23, with gradient 1 - e^-24 in logp (pulled back). Clamping d at -20
    gave 19 and no gradient; d = +30 stays finite (the exponent is capped)."""
    logp = torch.tensor([-1.0, -1.0], requires_grad=True)
    ref = torch.tensor([-25.0, -15.0])
    kl = k3_kl(logp, ref)
    assert kl[0].item() == pytest.approx(math.exp(-24) + 23, rel=1e-6)
    kl.sum().backward()
    assert logp.grad[0].item() == pytest.approx(1.0, abs=1e-6)
    assert torch.isfinite(k3_kl(torch.tensor([-31.0]), torch.tensor([-1.0]))).all()


def test_importance_weights_at_padded_positions_are_never_read():
    """Padded positions may hold anything (a NaN sampling log-prob from a server gives a NaN weight there): like every
    other per-token input, the weights are replaced there before any arithmetic."""
    logp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0]])
    kwargs = dict(advantages=torch.tensor([1.0]), mask=mask, loss_type="grpo")
    clean = policy_loss(logp, None, is_weights=torch.tensor([[1.0, 1.0]]), **kwargs)
    poisoned = policy_loss(logp, None, is_weights=torch.tensor([[1.0, float("nan")]]), **kwargs)
    assert torch.isfinite(poisoned.loss_sum) and poisoned.loss_sum.item() == clean.loss_sum.item()


def test_entropy_over_logits_a_model_masks_with_minus_inf_is_finite():
    from rlft.models.logprobs import logps_from_logits

    logits = torch.tensor([[[1.0, 2.0, float("-inf")]]], requires_grad=True)
    batch = {"input_ids": torch.tensor([[1]]), "completion_width": 1}
    logps, entropy = logps_from_logits(logits, batch, 1.0, with_entropy=True, grad_entropy=True)
    p = torch.softmax(torch.tensor([1.0, 2.0]), -1)
    assert entropy.item() == pytest.approx(float(-(p * p.log()).sum()), rel=1e-6)
    (logps.sum() + entropy.sum()).backward()
    assert torch.isfinite(logits.grad).all()
