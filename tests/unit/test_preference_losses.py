"""Preference losses against values computed by hand with `math` from the paper formulas, row by row."""

from __future__ import annotations

import math

import pytest
import torch

from rlft.losses.preference.dpo import DPO_LOSS_TYPES, bco_reward_mean_update, dpo_loss
from rlft.losses.preference.kto import check_kto_labels, kto_imbalance_warning, kto_loss
from rlft.losses.preference.reference_free import cpo_loss, orpo_loss
from rlft.losses.preference.reward_model import bradley_terry_loss
from rlft.losses.preference.weighting import ld_dpo_logps, token_log_sum_squared_probs, wpo_weights


def sig(z: float) -> float:
    return 1 / (1 + math.exp(-z))


def logsig(z: float) -> float:
    return -math.log1p(math.exp(-z))


# three pairs: policy chosen / rejected, reference chosen / rejected (summed log-probs), completion lengths
PC = [-5.0, -12.0, -3.0]
PR = [-7.0, -10.0, -3.5]
RC = [-6.0, -11.0, -3.2]
RR = [-6.5, -10.5, -3.1]
LC = [4, 6, 2]
LR = [5, 3, 2]


def tensors(requires_grad: bool = False) -> dict[str, torch.Tensor]:
    return {
        name: torch.tensor(values, dtype=torch.float64, requires_grad=requires_grad)
        for name, values in (("policy_chosen", PC), ("policy_rejected", PR), ("ref_chosen", RC), ("ref_rejected", RR))
    }


LENGTHS = {"chosen_lengths": torch.tensor(LC), "rejected_lengths": torch.tensor(LR)}


def expected_row(loss_type: str, i: int, beta: float, eps: float = 0.0, tau: float = 0.05, bco_mean: float = 0.0) -> float:
    """The paper formula for row i, by hand (aot types are handled separately: they sort the batch)."""
    dw, dl = PC[i] - RC[i], PR[i] - RR[i]
    z = beta * (dw - dl)
    if loss_type == "sigmoid":
        return -(1 - eps) * logsig(z) - eps * logsig(-z)
    if loss_type == "hinge":
        return max(0.0, 1 - z)
    if loss_type == "ipo":
        return (dw / LC[i] - dl / LR[i] - 1 / (2 * beta)) ** 2
    if loss_type == "robust":
        return (-(1 - eps) * logsig(z) + eps * logsig(-z)) / (1 - 2 * eps)
    if loss_type == "exo_pair":
        return sig(z) * (logsig(z) - math.log(1 - eps)) + sig(-z) * (logsig(-z) - math.log(eps))
    if loss_type == "nca_pair":
        return -logsig(beta * dw) - 0.5 * logsig(-beta * dw) - 0.5 * logsig(-beta * dl)
    if loss_type == "bco_pair":
        return -logsig(beta * dw - bco_mean) - logsig(-(beta * dl - bco_mean))
    if loss_type == "sppo_hard":
        return (dw - 1 / (2 * beta)) ** 2 + (dl + 1 / (2 * beta)) ** 2
    if loss_type == "apo_zero":
        return (1 - sig(beta * dw)) + sig(beta * dl)
    if loss_type == "apo_down":
        return sig(beta * dw) + (1 - sig(beta * (dw - dl)))
    if loss_type == "discopop":
        m = sig(z / tau)
        return (1 - m) * -logsig(z) + m * math.exp(-z)
    if loss_type == "sft":
        return -PC[i] / LC[i]
    if loss_type == "sigmoid_norm":
        return -logsig(beta * (dw / LC[i] - dl / LR[i]))
    raise AssertionError(loss_type)


ROW_TYPES = [t for t in DPO_LOSS_TYPES if t not in ("aot", "aot_unpaired")]


@pytest.mark.parametrize("beta", [0.1, 0.5])
@pytest.mark.parametrize("loss_type", ROW_TYPES)
def test_dpo_each_loss_type_matches_hand_values(loss_type, beta):
    eps = 1e-3 if loss_type == "exo_pair" else 0.0
    out = dpo_loss(**tensors(), loss_types=[loss_type], beta=beta, label_smoothing=eps, **LENGTHS)
    assert out.losses.shape == (3,)
    assert out.losses.tolist() == pytest.approx([expected_row(loss_type, i, beta, eps) for i in range(3)], rel=1e-9)


def test_dpo_beta_changes_the_loss():
    low = dpo_loss(**tensors(), loss_types=["sigmoid"], beta=0.1).losses
    high = dpo_loss(**tensors(), loss_types=["sigmoid"], beta=0.5).losses
    assert not torch.allclose(low, high)


def test_sigmoid_of_equal_logps_is_log_2():
    same = torch.tensor([-4.0, -9.0], dtype=torch.float64)
    out = dpo_loss(same, same, same - 1, same - 1, loss_types=["sigmoid"], beta=0.3)
    assert out.losses.tolist() == pytest.approx([math.log(2)] * 2)


def test_rewards_are_beta_times_logratio_and_detached():
    out = dpo_loss(**tensors(requires_grad=True), loss_types=["sigmoid"], beta=0.2)
    assert out.chosen_rewards.tolist() == pytest.approx([0.2 * (PC[i] - RC[i]) for i in range(3)])
    assert out.rejected_rewards.tolist() == pytest.approx([0.2 * (PR[i] - RR[i]) for i in range(3)])
    assert not out.chosen_rewards.requires_grad and not out.rejected_rewards.requires_grad


def test_conservative_sigmoid_uses_label_smoothing():
    out = dpo_loss(**tensors(), loss_types=["sigmoid"], beta=0.1, label_smoothing=0.1)
    assert out.losses.tolist() == pytest.approx([expected_row("sigmoid", i, 0.1, 0.1) for i in range(3)])


def test_robust_divides_by_one_minus_two_epsilon():
    eps, beta = 0.2, 0.1
    out = dpo_loss(**tensors(), loss_types=["robust"], beta=beta, label_smoothing=eps)
    for i in range(3):
        z = beta * ((PC[i] - RC[i]) - (PR[i] - RR[i]))
        assert out.losses[i].item() == pytest.approx((-0.8 * logsig(z) + 0.2 * logsig(-z)) / 0.6)
    clean = dpo_loss(**tensors(), loss_types=["robust"], beta=beta).losses
    assert torch.allclose(clean, dpo_loss(**tensors(), loss_types=["sigmoid"], beta=beta).losses)


def test_loss_weights_combine_two_types():
    out = dpo_loss(**tensors(), loss_types=["sigmoid", "bco_pair"], loss_weights=[0.8, 0.2], beta=0.1)
    hand = [0.8 * expected_row("sigmoid", i, 0.1) + 0.2 * expected_row("bco_pair", i, 0.1) for i in range(3)]
    assert out.losses.tolist() == pytest.approx(hand)


def test_mpo_combination_with_sft():
    out = dpo_loss(**tensors(), loss_types=["sigmoid", "bco_pair", "sft"], loss_weights=[0.8, 0.2, 1.0], beta=0.1, **LENGTHS)
    hand = [0.8 * expected_row("sigmoid", i, 0.1) + 0.2 * expected_row("bco_pair", i, 0.1) - PC[i] / LC[i] for i in range(3)]
    assert out.losses.tolist() == pytest.approx(hand)


def test_sft_takes_given_chosen_nll():
    nll = torch.tensor([0.5, 1.5, 2.5], dtype=torch.float64)
    out = dpo_loss(**tensors(), loss_types=["sft"], beta=0.1, chosen_nll=nll)
    assert out.losses.tolist() == pytest.approx([0.5, 1.5, 2.5])


def test_sample_weights_multiply_each_row():
    weights = torch.tensor([0.5, 2.0, 0.0], dtype=torch.float64)
    out = dpo_loss(**tensors(), loss_types=["sigmoid", "hinge"], beta=0.1, sample_weights=weights)
    hand = [(expected_row("sigmoid", i, 0.1) + expected_row("hinge", i, 0.1)) * [0.5, 2.0, 0.0][i] for i in range(3)]
    assert out.losses.tolist() == pytest.approx(hand)


def test_ipo_is_length_normalised():
    beta = 0.1
    base = dpo_loss(**tensors(), loss_types=["ipo"], beta=beta, **LENGTHS).losses
    longer = dpo_loss(
        **tensors(), loss_types=["ipo"], beta=beta, chosen_lengths=torch.tensor([8, 6, 2]), rejected_lengths=torch.tensor(LR)
    ).losses
    assert longer[0] != pytest.approx(base[0].item()) and longer[1:].tolist() == pytest.approx(base[1:].tolist())
    # equal lengths L: the averaged log-ratio difference is d / L
    equal = dpo_loss(
        **tensors(), loss_types=["ipo"], beta=beta, chosen_lengths=torch.full((3,), 4), rejected_lengths=torch.full((3,), 4)
    ).losses
    for i in range(3):
        d = (PC[i] - RC[i]) - (PR[i] - RR[i])
        assert equal[i].item() == pytest.approx((d / 4 - 5.0) ** 2)


def test_aot_sorts_policy_and_reference_margins_separately():
    beta, eps = 0.5, 0.1
    out = dpo_loss(**tensors(), loss_types=["aot"], beta=beta, label_smoothing=eps)
    policy = sorted(PC[i] - PR[i] for i in range(3))  # [-2, 0.5, 2]
    ref = sorted(RC[i] - RR[i] for i in range(3))  # [-0.5, -0.1, 0.5]
    assert policy == [-2.0, 0.5, 2.0] and ref == pytest.approx([-0.5, -0.1, 0.5])
    hand = [-(1 - eps) * logsig(beta * (p - r)) - eps * logsig(-beta * (p - r)) for p, r in zip(policy, ref)]
    assert out.losses.tolist() == pytest.approx(hand)


def test_aot_unpaired_sorts_chosen_and_rejected_logratios_separately():
    beta = 0.5
    out = dpo_loss(**tensors(), loss_types=["aot_unpaired"], beta=beta)
    chosen = sorted(PC[i] - RC[i] for i in range(3))  # [-1, 0.2, 1]
    rejected = sorted(PR[i] - RR[i] for i in range(3))  # [-0.5, -0.4, 0.5]
    assert chosen == pytest.approx([-1.0, 0.2, 1.0]) and rejected == pytest.approx([-0.5, -0.4, 0.5])
    hand = [-logsig(beta * (c - r)) for c, r in zip(chosen, rejected)]
    assert out.losses.tolist() == pytest.approx(hand)


def test_bco_running_mean_update_and_shift():
    mean, count = bco_reward_mean_update(0.0, 0, torch.tensor([1.0, 3.0]))
    assert (mean, count) == (pytest.approx(2.0), 2)
    mean, count = bco_reward_mean_update(mean, count, torch.tensor([[4.0], [6.0], [11.0]]))
    assert (mean, count) == (pytest.approx(5.0), 5)  # (1 + 3 + 4 + 6 + 11) / 5
    assert bco_reward_mean_update(mean, count, torch.tensor([])) == (pytest.approx(5.0), 5)
    out = dpo_loss(**tensors(), loss_types=["bco_pair"], beta=0.1, bco_running_mean=0.07)
    assert out.losses.tolist() == pytest.approx([expected_row("bco_pair", i, 0.1, bco_mean=0.07) for i in range(3)])


def test_discopop_tau():
    out = dpo_loss(**tensors(), loss_types=["discopop"], beta=0.5, discopop_tau=0.5)
    assert out.losses.tolist() == pytest.approx([expected_row("discopop", i, 0.5, tau=0.5) for i in range(3)])


def test_gradients_reach_policy_not_reference():
    inputs = tensors(requires_grad=True)
    dpo_loss(**inputs, loss_types=list(DPO_LOSS_TYPES), beta=0.1, label_smoothing=0.01, **LENGTHS).losses.sum().backward()
    assert inputs["policy_chosen"].grad is not None and inputs["policy_rejected"].grad is not None
    assert torch.isfinite(inputs["policy_chosen"].grad).all()
    assert inputs["ref_chosen"].grad is None and inputs["ref_rejected"].grad is None


def test_empty_batch_gives_empty_losses():
    empty = torch.zeros(0)
    all_types = list(DPO_LOSS_TYPES)
    lengths = {"chosen_lengths": empty, "rejected_lengths": empty}
    out = dpo_loss(empty, empty, empty, empty, loss_types=all_types, beta=0.1, label_smoothing=0.01, **lengths)
    assert out.losses.shape == (0,) and out.chosen_rewards.shape == (0,)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss_types": ["sigmod"]}, "sigmod"),
        ({"loss_types": ["ipo"]}, "ipo"),
        ({"loss_types": ["sigmoid_norm"], "chosen_lengths": torch.ones(3)}, "sigmoid_norm"),
        ({"loss_types": ["sigmoid", "hinge"], "loss_weights": [1.0]}, "dpo_loss_weights"),
        ({"loss_types": ["exo_pair"]}, "exo_pair"),
        ({"loss_types": ["robust"], "label_smoothing": 0.5}, "robust"),
        ({"loss_types": ["aot"], "sample_weights": torch.ones(3)}, "aot"),
        ({"loss_types": []}, "empty"),
    ],
)
def test_dpo_refuses_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        dpo_loss(**tensors(), beta=0.1, **kwargs)


def test_dpo_refuses_column_vectors():
    with pytest.raises(ValueError, match="1-D"):
        dpo_loss(*(t.unsqueeze(-1) for t in tensors().values()), loss_types=["sigmoid"], beta=0.1)


# --- WPO and LD-DPO --------------------------------------------------------------------------------------------------


def test_wpo_weights_plain_and_aligned():
    chosen = torch.tensor([[-0.5, -1.0, float("-inf")], [-0.2, -0.4, -0.6]])
    chosen_mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    rejected = torch.tensor([[float("nan"), -2.0, -1.0], [-3.0, 0.0, 0.0]])
    rejected_mask = torch.tensor([[0, 1, 1], [1, 0, 0]])
    weights = wpo_weights(chosen, chosen_mask, rejected, rejected_mask)
    assert weights.tolist() == pytest.approx([math.exp(-0.75) * math.exp(-1.5), math.exp(-0.4) * math.exp(-3.0)], rel=1e-6)
    chosen_sq = torch.full((2, 3), -0.1)
    rejected_sq = torch.full((2, 3), -0.3)
    aligned = wpo_weights(
        chosen,
        chosen_mask,
        rejected,
        rejected_mask,
        chosen_token_log_sum_sq_probs=chosen_sq,
        rejected_token_log_sum_sq_probs=rejected_sq,
    )
    assert aligned.tolist() == pytest.approx([math.exp(-0.65) * math.exp(-1.2), math.exp(-0.3) * math.exp(-2.7)], rel=1e-6)


def test_wpo_weights_are_detached_and_empty_mask_weighs_one():
    logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    weights = wpo_weights(logps, torch.tensor([[0, 0]]), logps, torch.tensor([[1, 1]]))
    assert not weights.requires_grad
    assert weights.item() == pytest.approx(math.exp(-1.5))


def test_token_log_sum_squared_probs():
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    total = sum(math.exp(v) for v in (0.0, 1.0, 2.0))
    hand = math.log(sum((math.exp(v) / total) ** 2 for v in (0.0, 1.0, 2.0)))
    assert token_log_sum_squared_probs(logits).item() == pytest.approx(hand, rel=1e-6)


def test_ld_dpo_weights_the_tail_of_the_longer_completion():
    # row 0: chosen 4 tokens (right-padded), rejected 2 (left-padded); row 1: chosen 1 token in the middle, rejected 3
    chosen = torch.tensor([[-1.0, -2.0, -3.0, -4.0, 0.0], [-9.0, -1.5, -9.0, -9.0, -9.0]])
    chosen_mask = torch.tensor([[1, 1, 1, 1, 0], [0, 1, 0, 0, 0]])
    rejected = torch.tensor([[-7.0, -0.5, -0.25], [-1.0, -2.0, -4.0]])
    rejected_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    out_chosen, out_rejected = ld_dpo_logps(chosen, chosen_mask, rejected, rejected_mask, 0.5)
    assert out_chosen.tolist() == pytest.approx([-1 - 2 + 0.5 * (-3 - 4), -1.5])
    assert out_rejected.tolist() == pytest.approx([-0.75, -1 + 0.5 * (-2 - 4)])
    full_chosen, full_rejected = ld_dpo_logps(chosen, chosen_mask, rejected, rejected_mask, 1.0)
    assert full_chosen.tolist() == pytest.approx([-10.0, -1.5]) and full_rejected.tolist() == pytest.approx([-0.75, -7.0])
    cut_chosen, _ = ld_dpo_logps(chosen, chosen_mask, rejected, rejected_mask, 0.0)
    assert cut_chosen.tolist() == pytest.approx([-3.0, -1.5])
    with pytest.raises(ValueError, match="alpha"):
        ld_dpo_logps(chosen, chosen_mask, rejected, rejected_mask, 1.5)


# --- KTO -------------------------------------------------------------------------------------------------------------

KTO_POLICY = [-4.0, -6.0, -5.0]
KTO_REF = [-5.0, -5.5, -5.0]


def kto_inputs(labels, kl_policy, kl_ref, requires_grad=False):
    return dict(
        policy_logps=torch.tensor(KTO_POLICY, dtype=torch.float64, requires_grad=requires_grad),
        ref_logps=torch.tensor(KTO_REF, dtype=torch.float64, requires_grad=requires_grad),
        desirable=torch.tensor(labels),
        policy_kl_logps=torch.tensor(kl_policy, dtype=torch.float64, requires_grad=requires_grad),
        ref_kl_logps=torch.tensor(kl_ref, dtype=torch.float64, requires_grad=requires_grad),
    )


def test_kto_mixed_labels_match_hand_values():
    beta, wd, wu = 0.5, 1.0, 1.5
    inputs = kto_inputs([True, False, True], [-3.0, -4.0, -5.0], [-3.5, -4.5, -4.6])
    out = kto_loss(**inputs, beta=beta, desirable_weight=wd, undesirable_weight=wu)
    z0 = max(0.0, ((-3.0 + 3.5) + (-4.0 + 4.5) + (-5.0 + 4.6)) / 3)  # 0.2
    r = [KTO_POLICY[i] - KTO_REF[i] for i in range(3)]  # [1, -0.5, 0]
    hand = [wd * (1 - sig(beta * (r[0] - z0))), wu * (1 - sig(beta * (z0 - r[1]))), wd * (1 - sig(beta * (r[2] - z0)))]
    assert out.kl.item() == pytest.approx(0.2)
    assert out.losses.tolist() == pytest.approx(hand)
    assert out.chosen_rewards.tolist() == pytest.approx([beta * r[0], beta * r[2]])
    assert out.rejected_rewards.tolist() == pytest.approx([beta * r[1]])


def test_kto_all_desirable_and_kl_clamped_at_zero():
    beta = 0.1
    out = kto_loss(**kto_inputs([True, True, True], [-6.0, -6.0], [-5.0, -4.0]), beta=beta)
    assert out.kl.item() == 0.0  # mean KL -1.5 clamps to 0
    assert out.losses.tolist() == pytest.approx([1 - sig(beta * (KTO_POLICY[i] - KTO_REF[i])) for i in range(3)])
    assert out.rejected_rewards.shape == (0,) and out.chosen_rewards.shape == (3,)


def test_kto_gradient_flows_to_policy_only():
    inputs = kto_inputs([True, False, True], [-3.0, -4.0, -5.0], [-3.5, -4.5, -4.6], requires_grad=True)
    out = kto_loss(**inputs, beta=0.1)
    assert not out.kl.requires_grad
    out.losses.sum().backward()
    assert inputs["policy_logps"].grad is not None
    for name in ("ref_logps", "policy_kl_logps", "ref_kl_logps"):
        assert inputs[name].grad is None, name


def test_kto_empty_batch():
    empty = torch.zeros(0)
    out = kto_loss(empty, empty, torch.zeros(0, dtype=torch.bool), empty, empty, beta=0.1)
    assert out.losses.shape == (0,) and out.kl.item() == 0.0


def test_kto_imbalance_warning():
    assert kto_imbalance_warning(100, 100, 1.0, 1.0) is None
    assert kto_imbalance_warning(4, 3, 1.0, 1.0) is None  # exactly 4/3
    message = kto_imbalance_warning(100, 400, 1.0, 1.0)  # ratio 0.25
    assert message is not None and "100 desirable" in message and "400 undesirable" in message and "0.25" in message
    assert "kto_desirable_weight in [4, 5.33]" in message  # 1 * 400/100 .. 4/3 * 400/100
    assert "kto_undesirable_weight in [0.188, 0.25]" in message
    assert kto_imbalance_warning(100, 400, 4.5, 1.0) is None
    assert kto_imbalance_warning(50, 50, 2.0, 1.0) is not None  # equal counts, unequal weights


def test_kto_refuses_one_label_class():
    check_kto_labels(1, 1)
    with pytest.raises(ValueError, match="0 undesirable"):
        check_kto_labels(10, 0)
    with pytest.raises(ValueError, match="desirable and undesirable"):
        kto_imbalance_warning(0, 5, 1.0, 1.0)


# --- ORPO ------------------------------------------------------------------------------------------------------------


def log_odds(avg_logp: float) -> float:
    p = math.exp(avg_logp)
    return math.log(p) - math.log(1 - p)


def test_orpo_matches_hand_values():
    chosen, rejected, nll = [-0.3, -1.2, -2.0], [-0.9, -0.8, -2.0], [0.3, 1.2, 2.0]
    out = orpo_loss(torch.tensor(chosen), torch.tensor(rejected), torch.tensor(nll), alpha=0.1)
    for i in range(3):
        ratio = log_odds(chosen[i]) - log_odds(rejected[i])
        assert out.log_odds_chosen[i].item() == pytest.approx(ratio, rel=1e-5)
        assert out.log_odds_ratio[i].item() == pytest.approx(logsig(ratio), rel=1e-5)
        assert out.losses[i].item() == pytest.approx(nll[i] - 0.1 * logsig(ratio), rel=1e-5)
    assert out.log_odds_ratio[2].item() == pytest.approx(-math.log(2))  # equal probabilities


def test_orpo_is_stable_for_probabilities_near_one():
    chosen = torch.tensor([-1e-4, -1e-8, 0.0], requires_grad=True)
    rejected = torch.tensor([-2.0, -1e-9, 0.0])
    out = orpo_loss(chosen, rejected, torch.zeros(3), alpha=1.0)
    assert torch.isfinite(out.losses).all() and torch.isfinite(out.log_odds_chosen).all()
    assert out.log_odds_chosen[0].item() == pytest.approx(log_odds(-1e-4) - log_odds(-2.0), rel=1e-4)
    out.losses.sum().backward()
    assert torch.isfinite(chosen.grad).all()


# --- CPO / SimPO -----------------------------------------------------------------------------------------------------

CPO_C, CPO_R, CPO_LC, CPO_LR = [-6.0, -4.0], [-9.0, -3.0], [3, 2], [6, 1]


def cpo(loss_type, **kwargs):
    chosen, rejected = torch.tensor(CPO_C, dtype=torch.float64), torch.tensor(CPO_R, dtype=torch.float64)
    return cpo_loss(chosen, rejected, torch.tensor(CPO_LC), torch.tensor(CPO_LR), loss_type=loss_type, **kwargs)


def test_cpo_sigmoid_and_hinge_use_summed_logps_plus_nll():
    beta = 0.5
    sigmoid = cpo("sigmoid", beta=beta, cpo_alpha=0.0)
    hinge = cpo("hinge", beta=beta, cpo_alpha=0.0)
    for i in range(2):
        d = CPO_C[i] - CPO_R[i]
        assert sigmoid.losses[i].item() == pytest.approx(-logsig(beta * d))
        assert hinge.losses[i].item() == pytest.approx(max(0.0, 1 - beta * d))
    with_nll = cpo("sigmoid", beta=beta, cpo_alpha=1.0)
    assert with_nll.losses.tolist() == pytest.approx([sigmoid.losses[i].item() - CPO_C[i] / CPO_LC[i] for i in range(2)])
    given = cpo("sigmoid", beta=beta, cpo_alpha=2.0, chosen_nll=torch.tensor([0.1, 0.2], dtype=torch.float64))
    assert given.losses.tolist() == pytest.approx([sigmoid.losses[0].item() + 0.2, sigmoid.losses[1].item() + 0.4])
    assert sigmoid.chosen_rewards.tolist() == pytest.approx([beta * c for c in CPO_C])


def test_cpo_label_smoothing():
    out = cpo("sigmoid", beta=0.5, cpo_alpha=0.0, label_smoothing=0.1)
    d = CPO_C[0] - CPO_R[0]
    assert out.losses[0].item() == pytest.approx(-0.9 * logsig(0.5 * d) - 0.1 * logsig(-0.5 * d))


def test_cpo_ipo_uses_averaged_logps():
    beta = 0.5
    out = cpo("ipo", beta=beta, cpo_alpha=0.0)
    for i in range(2):
        d = CPO_C[i] / CPO_LC[i] - CPO_R[i] / CPO_LR[i]
        assert out.losses[i].item() == pytest.approx((d - 1 / (2 * beta)) ** 2)
    summed = cpo("ipo", beta=beta, cpo_alpha=0.0, length_normalize=False)
    assert summed.losses[0].item() == pytest.approx((3.0 - 1.0) ** 2)


def test_simpo_gamma_is_the_target_margin():
    beta, gamma = 2.0, 0.8
    out = cpo("simpo", beta=beta, gamma=gamma, cpo_alpha=0.0)
    for i in range(2):
        avg_c, avg_r = CPO_C[i] / CPO_LC[i], CPO_R[i] / CPO_LR[i]
        assert out.losses[i].item() == pytest.approx(-logsig(beta * avg_c - beta * avg_r - gamma))
        assert out.chosen_rewards[i].item() == pytest.approx(beta * avg_c)
    no_margin = cpo("simpo", beta=beta, gamma=0.0, cpo_alpha=0.0)
    assert (out.losses > no_margin.losses).all()
    cpo_simpo = cpo("simpo", beta=beta, gamma=gamma)  # cpo_alpha defaults to 1.0 (TRL / Axolotl)
    assert cpo_simpo.losses.tolist() == pytest.approx([out.losses[i].item() - CPO_C[i] / CPO_LC[i] for i in range(2)])


def test_cpo_gradient_and_unknown_type():
    chosen = torch.tensor(CPO_C, requires_grad=True)
    out = cpo_loss(chosen, torch.tensor(CPO_R), torch.tensor(CPO_LC), torch.tensor(CPO_LR), loss_type="simpo", beta=2.0)
    out.losses.sum().backward()
    assert chosen.grad is not None and torch.isfinite(chosen.grad).all()
    with pytest.raises(ValueError, match="kto"):
        cpo("kto", beta=0.1)


# --- Bradley-Terry ---------------------------------------------------------------------------------------------------


def test_bradley_terry_column_rewards_with_row_margin_stay_per_row():
    chosen = torch.tensor([[1.0], [0.5], [-1.0]])
    rejected = torch.tensor([[0.0], [0.5], [0.5]])
    margin = torch.tensor([0.5, 0.0, 1.0])
    losses, accuracy = bradley_terry_loss(chosen, rejected, margin)
    assert losses.shape == (3,) and accuracy.shape == (3,) and accuracy.dtype == torch.bool
    assert losses.tolist() == pytest.approx([-logsig(0.5), math.log(2), -logsig(-2.5)], rel=1e-6)
    assert accuracy.tolist() == [True, False, False]


def test_bradley_terry_center_coefficient_adds_exactly_its_term():
    chosen, rejected = torch.tensor([2.0, -1.0]), torch.tensor([1.0, 0.5])
    plain, _ = bradley_terry_loss(chosen, rejected)
    centred, _ = bradley_terry_loss(chosen, rejected, center_rewards_coefficient=0.01)
    assert plain.tolist() == pytest.approx([-logsig(1.0), -logsig(-1.5)], rel=1e-6)
    assert (centred.mean() - plain.mean()).item() == pytest.approx(0.01 * (3.0**2 + 0.5**2) / 2, rel=1e-5)


def test_bradley_terry_refuses_mismatched_shapes_and_handles_empty():
    with pytest.raises(ValueError, match="margin"):
        bradley_terry_loss(torch.zeros(3, 1), torch.zeros(3, 1), torch.zeros(2))
    with pytest.raises(ValueError, match="rewards_chosen"):
        bradley_terry_loss(torch.zeros(3, 2), torch.zeros(3, 2))
    losses, accuracy = bradley_terry_loss(torch.zeros(0, 1), torch.zeros(0, 1), torch.zeros(0), 0.01)
    assert losses.shape == (0,) and accuracy.shape == (0,)


def test_bradley_terry_gradient():
    chosen = torch.tensor([[0.3], [0.1]], requires_grad=True)
    losses, _ = bradley_terry_loss(chosen, torch.tensor([[0.0], [0.2]]))
    losses.mean().backward()
    assert chosen.grad is not None and (chosen.grad < 0).all()


def test_config_and_losses_list_the_same_dpo_loss_types():
    """config/ and losses/ import nothing of each other (DESIGN: layers), so the list is written twice: keep it equal."""
    from typing import get_args

    from rlft.config.sections.preference import DPOLossType
    from rlft.losses.preference.dpo import DPO_LOSS_TYPES

    assert set(get_args(DPOLossType)) == set(DPO_LOSS_TYPES)


def test_chosen_nll_per_pair_or_over_the_batch_tokens():
    from rlft.losses.preference.rows import chosen_nll

    logps, lengths = torch.tensor([-4.0, -6.0]), torch.tensor([2, 6])
    # the papers: each answer's token mean (2.0, 1.0), then the mean over pairs 1.5
    assert chosen_nll(logps, lengths, "pair").tolist() == [2.0, 1.0]
    # TRL: all chosen tokens of the batch at once, 10 / 8 = 1.25 as the mean over pairs
    batch = chosen_nll(logps, lengths, "batch")
    assert batch.tolist() == [1.0, 1.5] and float(batch.mean()) == 1.25
    assert chosen_nll(torch.tensor([0.0]), torch.tensor([0]), "pair").tolist() == [0.0]  # an empty answer: no division by 0


def test_orpo_sequence_span_is_trls_cross_entropy_over_prompt_and_answer(tmp_path):
    """`orpo_nll_span: sequence` + `chosen_nll_average: batch` is TRL's decoder-only ORPO NLL: labels = input_ids where
    attention_mask is 1, cross-entropy mean over every chosen token after the first (prompt included)."""
    import torch.nn.functional as F
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlft.data.preference import pair_batch
    from rlft.losses.preference.rows import chosen_nll
    from rlft.models.tiny import write_tiny_model
    from rlft.train.recipes.preference import sequence_logps

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(write_tiny_model(tmp_path / "m")))
    examples = [{"prompt_ids": [5, 6, 7], "chosen_ids": [8, 9], "rejected_ids": [10]},
                {"prompt_ids": [11], "chosen_ids": [12, 13, 14, 15], "rejected_ids": [16, 17]}]
    batch = pair_batch(examples, pad_id=0)
    out = sequence_logps(model, batch, whole_rows=2)
    ours = chosen_nll(out.sequence_logps, out.sequence_lengths, "batch").mean()

    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:2]
    labels = torch.where(batch["attention_mask"][:2].bool(), batch["input_ids"][:2], -100)
    trl = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100)
    assert out.sequence_lengths.tolist() == [4, 4]  # 3 + 2 tokens and 1 + 4 tokens, the first one never a target
    assert torch.allclose(ours, trl, atol=1e-6)
    answer_only = chosen_nll(out.logps[:2], out.lengths[:2], "batch").mean()
    assert not torch.allclose(answer_only, trl)  # the default span (the paper's) differs


def test_discopop_stays_finite_where_its_exponent_overflows():
    """(1 - m) * -log sigma(z) + m * exp(-z) with m = sigma(z / tau): below z = -88.7 exp(-z) overflows float32 while m
    underflows to 0 (0 * inf = NaN, and the NaN reached every row's gradient). By hand: z = -1000 -> -log sigma(z) =
    1000 and m * exp(-z) = exp(log sigma(-20000) + 1000) = 0; z = -100 -> 100 + sigma(-2000) * e^100 = 100."""
    z = torch.tensor([-1000.0, -100.0, 0.0], requires_grad=True)
    zero = torch.zeros(3)
    out = dpo_loss(z / 0.1, zero, zero, zero, loss_types=["discopop"], beta=0.1, discopop_tau=0.05)
    assert out.losses.tolist() == pytest.approx([1000.0, 100.0, 0.5 * math.log(2) + 0.5])
    out.losses.sum().backward()
    assert torch.isfinite(z.grad).all()


def test_wpo_weights_are_capped_at_one():
    """WPO's authors and TRL cap the weight at 1: with the aligned term a token likelier than the distribution's
    average (p = 0.5 among 100 tokens of 0.005: log p - log sum p^2 = log 0.5 - log 0.2525) would weigh 1.98 per answer."""
    logp = torch.tensor([[math.log(0.5)]])
    mask = torch.tensor([[1]])
    sum_sq = torch.tensor([[math.log(0.5 ** 2 + 100 * 0.005 ** 2)]])
    uncapped = math.exp(2 * (math.log(0.5) - math.log(0.2525)))
    assert uncapped == pytest.approx(3.92, abs=0.01)
    assert wpo_weights(logp, mask, logp, mask, chosen_token_log_sum_sq_probs=sum_sq,
                       rejected_token_log_sum_sq_probs=sum_sq).item() == 1.0


def test_pair_metrics_by_hand():
    """TRL's names, each the mean over the pairs: chosen rows first, then rejected rows in `out`."""
    from types import SimpleNamespace

    from rlft.train.recipes.preference import pair_metrics

    chosen, rejected = torch.tensor([0.5, -0.25, 1.0]), torch.tensor([0.25, 0.0, -1.0])
    out = SimpleNamespace(logps=torch.tensor([-1.0, -2.0, -3.0, -4.0, -5.0, -6.0], requires_grad=True),
                          mean_logits=torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5]))
    got = pair_metrics(chosen, rejected, out, 3)
    want = {"rewards/chosen": 1.25 / 3, "rewards/rejected": -0.75 / 3, "rewards/accuracies": 2 / 3,
            "rewards/margins": 2.0 / 3, "logps/chosen": -2.0, "logps/rejected": -5.0, "logits/chosen": 1.5,
            "logits/rejected": -1.5}
    assert list(got) == list(want)
    assert got == pytest.approx(want, rel=1e-6)
    assert all(type(value) is float for value in got.values())
