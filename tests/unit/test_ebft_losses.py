"""EBFT whitening, feature-matching rewards, advantages and the strided loss against values computed by hand with `math`."""

from __future__ import annotations

import math
from itertools import combinations

import pytest
import torch

from rlft.losses import ebft
from rlft.losses.ebft import (
    cfm_loss,
    ebft_advantages,
    feature_matching_rewards,
    strided_ebft_loss,
    whiten,
    whiten_groups,
)


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def flat(values) -> list[float]:
    return [x for item in values for x in flat(item)] if isinstance(values, list) else [values]


def close(actual: torch.Tensor, expected, tol: float = 1e-9) -> None:
    assert tuple(actual.shape) == tuple(torch.tensor(expected).shape)
    assert flat(actual.tolist()) == pytest.approx(flat(expected), abs=tol)


def dot(x: list[float], y: list[float]) -> float:
    return sum(a * b for a, b in zip(x, y))


def unit(x: list[float]) -> list[float]:
    norm = math.sqrt(dot(x, x))
    return [a / norm for a in x]


def hand_rewards(phis: list[list[float]], g: list[float], alpha: float, beta: float):
    """Unwhitened rewards by the formula: joint L2 normalisation, 2 cos, 2/(n-1) sum of dot products."""
    units, gu, n = [unit(p) for p in phis], unit(g), len(phis)
    align = [2 * dot(u, gu) for u in units]
    div = [2 / (n - 1) * sum(dot(units[j], units[k]) for k in range(n) if k != j) if n > 1 else 0.0 for j in range(n)]
    return [alpha * a - beta * d for a, d in zip(align, div)], align, div


# ----------------------------------------------------------------------------------------------------------- rewards


PHIS = [[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]]
GT = [1.0, 1.0]


def test_unwhitened_rewards_n3_d2_by_hand():
    out = feature_matching_rewards(t([PHIS]), t([GT]), alignment_coef=1.0, diversity_coef=1.0)
    root2 = math.sqrt(2)
    close(out.alignment[0], [2 * 1.4 / root2, 2 / root2, 2 / root2])
    close(out.diversity[0], [1.4, 0.6, 0.8])  # units (.6,.8), (1,0), (0,1): dots .6, .8, 0
    close(out.rewards[0], [2 * 1.4 / root2 - 1.4, 2 / root2 - 0.6, 2 / root2 - 0.8])
    assert out.whitened.tolist() == [True]


def test_unwhitened_rewards_coefficients():
    rewards, align, div = hand_rewards(PHIS, GT, alpha=0.7, beta=0.5)
    out = feature_matching_rewards(t([PHIS]), t([GT]), alignment_coef=0.7, diversity_coef=0.5)
    close(out.rewards[0], rewards)
    close(out.alignment[0], align)
    close(out.diversity[0], div)


def test_cfm_value_by_hand():
    out = feature_matching_rewards(t([PHIS]), t([GT]))
    units, gu = [unit(p) for p in PHIS], unit(GT)
    mean = [sum(u[i] for u in units) / 3 for i in range(2)]
    expected = sum((m - g) ** 2 for m, g in zip(mean, gu))
    close(out.cfm, [expected])
    close(cfm_loss(t([[[1.0, 2.0], [3.0, 0.0]]]), t([[0.0, 0.0]])), [2.0**2 + 1.0**2])


def test_pairwise_is_the_dot_product_matrix():
    out = feature_matching_rewards(t([PHIS]), t([GT]))
    units = [unit(p) for p in PHIS]
    close(out.pairwise[0], [[dot(a, b) for b in units] for a in units])


def test_unwhitened_normalises_the_whole_concatenation_not_each_layer():
    # two "layers" of very different scale; identical samples: joint normalisation gives diversity 2 (dot 1), where
    # per-layer normalisation (Axolotl's strided trainer) would give 2 * n_layers = 4
    phi = [1.0, 0.0, 100.0, 0.0]
    g = [0.0, 1.0, 100.0, 0.0]
    out = feature_matching_rewards(t([[phi, phi, phi]]), t([g]))
    close(out.diversity[0], [2.0, 2.0, 2.0])
    cos = dot(phi, g) / math.sqrt(dot(phi, phi) * dot(g, g))
    close(out.alignment[0], [2 * cos] * 3)


def test_whitened_n3_d3_full_rank_by_hand():
    # Phi square and invertible: Phi~ = V U^T is orthogonal (diversity 0), and with g = sum_j c_j phi_j,
    # phi~_j . g~ = phi_j (Phi^T Phi)^-1 g^T = c_j and ||g~|| = ||c||, so alignment_j = 2 c_j / ||c||.
    phis = [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 1.0, 1.0]]
    c = [1.0, 2.0, -1.0]
    g = [sum(c[j] * phis[j][i] for j in range(3)) for i in range(3)]  # (3, 1, -1)
    assert g == [3.0, 1.0, -1.0]
    out = feature_matching_rewards(t([phis]), t([g]), use_whitening=True)
    norm_c = math.sqrt(dot(c, c))
    close(out.alignment[0], [2 * cj / norm_c for cj in c])
    close(out.diversity[0], [0.0, 0.0, 0.0])
    close(out.pairwise[0], [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    # cfm = ||mean||^2 - 2 mean . g~ + ||g~||^2 = 3/9 - 2/3 sum_j c_j + ||c||^2
    close(out.cfm, [1 / 3 - 2 / 3 * sum(c) + dot(c, c)])
    close(out.rewards[0], [2 * cj / norm_c for cj in c])


def test_whitened_n3_d2_rank_two_by_hand():
    # n > D: Phi~ Phi~^T = projection onto the column space of Phi (3x2): P = A (A^T A)^-1 A^T
    phis = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    g = [1.0, 0.0]
    gram = [[2.0, 1.0], [1.0, 2.0]]  # Phi^T Phi
    det = gram[0][0] * gram[1][1] - gram[0][1] * gram[1][0]
    inverse = [[gram[1][1] / det, -gram[0][1] / det], [-gram[1][0] / det, gram[0][0] / det]]

    def form(x, y):  # x (Phi^T Phi)^-1 y^T
        return sum(x[a] * inverse[a][b] * y[b] for a in range(2) for b in range(2))

    projection = [[form(p, q) for q in phis] for p in phis]
    assert projection[0] == pytest.approx([2 / 3, -1 / 3, 1 / 3])
    out = feature_matching_rewards(t([phis]), t([g]), use_whitening=True, diversity_coef=0.5)
    close(out.pairwise[0], projection)
    div = [2 / 2 * sum(projection[j][k] for k in range(3) if k != j) for j in range(3)]
    close(out.diversity[0], div)
    assert div == pytest.approx([0.0, 0.0, 2 / 3])
    align = [2 * form(p, g) / (math.sqrt(projection[j][j]) * math.sqrt(form(g, g))) for j, p in enumerate(phis)]
    close(out.alignment[0], align)
    assert align == pytest.approx([2.0, -1.0, 1.0])
    close(out.rewards[0], [a - 0.5 * d for a, d in zip(align, div)])


def test_n1_has_no_diversity_and_whitening_refuses():
    out = feature_matching_rewards(t([[[3.0, 4.0]]]), t([[1.0, 0.0]]), diversity_coef=5.0)
    close(out.diversity, [[0.0]])
    close(out.alignment, [[2 * 0.6]])
    close(out.rewards, [[2 * 0.6]])
    with pytest.raises(ValueError, match="whitening needs at least 2 samples per group"):
        feature_matching_rewards(t([[[3.0, 4.0]]]), t([[1.0, 0.0]]), use_whitening=True)
    with pytest.raises(ValueError, match="whitening needs at least 2 samples per group"):
        whiten(t([[3.0, 4.0]]), t([1.0, 0.0]))
    with pytest.raises(ValueError, match="whitening needs at least 2 samples per group"):
        whiten_groups(t([[[3.0, 4.0]]]), t([[1.0, 0.0]]))


def test_duplicated_samples_whitening_is_finite_and_penalises_the_pair():
    # rank 2 from 3 samples: the range of Phi is {(a, a, b)}, so P = [[1/2, 1/2, 0], [1/2, 1/2, 0], [0, 0, 1]]
    x, y = [1.0, 2.0, 0.0], [1.0, 0.0, 1.0]
    out = feature_matching_rewards(t([[x, x, y]]), t([[0.0, 1.0, 1.0]]), use_whitening=True)
    for value in (out.rewards, out.alignment, out.diversity, out.cfm, out.pairwise):
        assert torch.isfinite(value).all()
    close(out.pairwise[0], [[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    close(out.diversity[0], [0.5, 0.5, 0.0])  # 2/(n-1) * 1/2 for each duplicate, 0 for the distinct sample
    assert out.alignment[0, 0] == pytest.approx(float(out.alignment[0, 1]))
    assert out.whitened.tolist() == [True]


def test_duplicate_pair_at_n4_has_diversity_one_third():
    # the sqrt(n) scale note: a duplicate pair at n = 4 gives 2/3 * 1/2 = 1/3 (appendix eq. 48 would give 4/3)
    x, y, z = [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 1.0, 1.0]
    out = feature_matching_rewards(t([[x, x, y, z]]), t([[1.0, 1.0, 1.0]]), use_whitening=True)
    close(out.diversity[0], [1 / 3, 1 / 3, 0.0, 0.0])


def test_collinear_group_rank_one_by_hand():
    # phi_j = c_j u: phi~_j = (c_j / ||c||) u^, pairwise c_j c_j' / ||c||^2, alignment 2 sign(c_j) sign(g . u)
    u, c = [1.0, 2.0], [1.0, 2.0, -1.0]
    phis = [[cj * ui for ui in u] for cj in c]
    out = feature_matching_rewards(t([phis]), t([[1.0, 0.0]]), use_whitening=True)
    norm2 = dot(c, c)
    close(out.pairwise[0], [[a * b / norm2 for b in c] for a in c])
    close(out.diversity[0], [sum(c[j] * c[k] for k in range(3) if k != j) / norm2 for j in range(3)])
    close(out.alignment[0], [2.0, 2.0, -2.0])
    assert torch.isfinite(out.cfm).all()


def test_whiten_single_matches_groups_and_keeps_dtype():
    phis = torch.tensor([[1.0, 0.0, 2.0], [0.5, 1.0, 0.0]])
    g = torch.tensor([1.0, 1.0, 1.0])
    samples_w, gt_w, ok = whiten(phis, g)
    group_w, group_gt, group_ok = whiten_groups(phis.unsqueeze(0), g.unsqueeze(0))
    assert ok is True and group_ok.tolist() == [True]
    assert samples_w.dtype == torch.float32
    assert torch.allclose(samples_w, group_w[0]) and torch.allclose(gt_w, group_gt[0])
    # rows orthonormal at full rank, no renormalisation of g~
    assert torch.allclose(samples_w @ samples_w.T, torch.eye(2), atol=1e-5)


def test_whiten_all_zero_samples_give_zeros():
    samples_w, gt_w, ok = whiten(t([[0.0, 0.0], [0.0, 0.0]]), t([1.0, 2.0]))
    close(samples_w, [[0.0, 0.0], [0.0, 0.0]])
    close(gt_w, [0.0, 0.0])
    assert ok is True


def test_whiten_retries_with_noise_then_falls_back(monkeypatch):
    real_svd = torch.linalg.svd
    calls = []

    def fail_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise torch.linalg.LinAlgError("forced")
        return real_svd(*args, **kwargs)

    monkeypatch.setattr(torch.linalg, "svd", fail_once)
    phis, g = t([[1.0, 0.0], [0.0, 2.0]]), t([1.0, 1.0])
    samples_w, _, ok = whiten(phis, g)
    assert ok is True and len(calls) == 2
    assert torch.allclose(samples_w @ samples_w.T, torch.eye(2, dtype=torch.float64), atol=1e-5)

    def always_fail(*args, **kwargs):
        raise torch.linalg.LinAlgError("forced")

    monkeypatch.setattr(torch.linalg, "svd", always_fail)
    samples_w, gt_w, ok = whiten(phis, g)
    assert ok is False
    assert torch.equal(samples_w, phis) and torch.equal(gt_w, g)
    out = feature_matching_rewards(phis.unsqueeze(0), g.unsqueeze(0), use_whitening=True)
    assert out.whitened.tolist() == [False]
    assert torch.isfinite(out.rewards).all()


def test_whiten_groups_falls_back_per_group_only(monkeypatch):
    real_svd = torch.linalg.svd

    def fail_batched(matrix, *args, **kwargs):
        if matrix.shape[0] > 1 or bool((matrix > 6.0).any()):  # the noisy retry too
            raise torch.linalg.LinAlgError("forced")
        return real_svd(matrix, *args, **kwargs)

    monkeypatch.setattr(torch.linalg, "svd", fail_batched)
    samples = t([[[1.0, 0.0], [0.0, 1.0]], [[7.0, 0.0], [0.0, 1.0]]])
    gt = t([[1.0, 1.0], [1.0, 1.0]])
    samples_w, gt_w, ok = whiten_groups(samples, gt)
    assert ok.tolist() == [True, False]
    close(samples_w[0], [[1.0, 0.0], [0.0, 1.0]])
    assert torch.equal(samples_w[1], samples[1]) and torch.equal(gt_w[1], gt[1])


def test_layer_count_whitens_each_layer_slice_on_its_own():
    torch.manual_seed(0)
    samples = torch.randn(2, 3, 8, dtype=torch.float64)
    gt = torch.randn(2, 8, dtype=torch.float64)
    out = feature_matching_rewards(samples, gt, use_whitening=True, layer_count=2)
    first_w, first_gt, _ = whiten_groups(samples[..., :4], gt[..., :4])
    second_w, second_gt, _ = whiten_groups(samples[..., 4:], gt[..., 4:])
    phi = torch.cat([first_w, second_w], dim=-1)
    g = torch.cat([first_gt, second_gt], dim=-1)
    assert torch.allclose(out.pairwise, phi @ phi.transpose(-1, -2))
    assert torch.allclose(out.alignment, 2 * torch.nn.functional.cosine_similarity(phi, g.unsqueeze(1), dim=-1))
    with pytest.raises(ValueError, match="equal layer slices"):
        feature_matching_rewards(samples, gt, use_whitening=True, layer_count=3)


def test_reward_shapes_are_checked():
    with pytest.raises(ValueError, match=r"\(G, n, D\)"):
        feature_matching_rewards(t([[1.0, 2.0]]), t([[1.0, 2.0]]))


# -------------------------------------------------------------------------------------------------------- advantages


def test_reinforce_is_the_reward():
    close(ebft_advantages(t([[1.0, 2.0, 4.0]]), estimator="reinforce"), [[1.0, 2.0, 4.0]])


def test_grpo_and_group_norm_alias_by_hand():
    r = [1.0, 2.0, 4.0]
    mu = sum(r) / 3
    sd = math.sqrt(sum((x - mu) ** 2 for x in r) / 2)
    expected = [(x - mu) / (sd + 1e-8) for x in r]
    close(ebft_advantages(t([r]), estimator="grpo"), [expected])
    close(ebft_advantages(t([r]), estimator="group_norm"), [expected])
    assert ebft_advantages(t([[0.7, 0.7, 0.7]]), estimator="grpo").tolist() == [[0.0, 0.0, 0.0]]
    assert ebft_advantages(t([[0.7]]), estimator="grpo").tolist() == [[0.0]]


# a group of four: alignment a (x2 already) and a symmetric similarity matrix s
ALIGN = [1.2, 0.4, -0.2, 0.9]
SIMS = [
    [1.0, 0.3, -0.1, 0.5],
    [0.3, 1.0, 0.2, 0.0],
    [-0.1, 0.2, 1.0, 0.4],
    [0.5, 0.0, 0.4, 1.0],
]


def hand_diversity(sims: list[list[float]]) -> list[float]:
    n = len(sims)
    return [2 / (n - 1) * sum(sims[j][k] for k in range(n) if k != j) for j in range(n)]


def hand_rloo_baseline(align, sims, alpha, beta) -> list[float]:
    """b_j = alpha (sum a - a_j)/(n-1) - beta * 2 * mean over pairs {i, i'} not containing j of s_ii'."""
    n = len(align)
    out = []
    for j in range(n):
        pairs = [sims[i][k] for i, k in combinations(range(n), 2) if j not in (i, k)]
        diversity_baseline = 2 * sum(pairs) / len(pairs) if pairs else 0.0
        out.append(alpha * (sum(align) - align[j]) / (n - 1) - beta * diversity_baseline)
    return out


def test_rloo_is_ref_true_leave_one_out_by_hand():
    alpha, beta = 1.0, 0.5
    div = hand_diversity(SIMS)
    rewards = [alpha * a - beta * d for a, d in zip(ALIGN, div)]
    baseline = hand_rloo_baseline(ALIGN, SIMS, alpha, beta)
    advantages = ebft_advantages(
        t([rewards]), estimator="rloo", alignment=t([ALIGN]), pairwise=t([SIMS]), alignment_coef=alpha, diversity_coef=beta
    )
    close(advantages, [[r - b for r, b in zip(rewards, baseline)]])
    # REF writes the diversity part as (sum d - 2 d_j)/(n-2): the same number
    ref = [alpha * (sum(ALIGN) - a) / 3 - beta * (sum(div) - 2 * d) / 2 for a, d in zip(ALIGN, div)]
    assert ref == pytest.approx(baseline)


def test_rloo_baseline_is_independent_of_the_sample_itself():
    # change every similarity involving sample 0 and its alignment: its baseline must not move (REF); Axolotl's
    # (sum r - r_0)/(n-1) moves, because r_1..r_3 contain s_01, s_02, s_03
    alpha, beta = 1.0, 1.0

    def baselines(align, sims):
        div = hand_diversity(sims)
        rewards = [alpha * a - beta * d for a, d in zip(align, div)]
        adv = ebft_advantages(t([rewards]), estimator="rloo", alignment=t([align]), pairwise=t([sims]))
        ours = [r - a for r, a in zip(rewards, adv[0].tolist())]
        axolotl = [(sum(rewards) - r) / 3 for r in rewards]
        return ours, axolotl

    changed = [row[:] for row in SIMS]
    for k, value in zip((1, 2, 3), (0.9, 0.8, -0.7)):
        changed[0][k] = changed[k][0] = value
    changed_align = [-1.5] + ALIGN[1:]
    ours_before, axolotl_before = baselines(ALIGN, SIMS)
    ours_after, axolotl_after = baselines(changed_align, changed)
    assert ours_after[0] == pytest.approx(ours_before[0], abs=1e-12)
    assert axolotl_after[0] != pytest.approx(axolotl_before[0], abs=1e-3)


def test_rloo_n2_has_no_diversity_baseline():
    align, s12 = [0.8, 0.2], 0.3
    div = [2 * s12, 2 * s12]
    rewards = [a - 0.5 * d for a, d in zip(align, div)]
    advantages = ebft_advantages(
        t([rewards]), estimator="rloo", alignment=t([align]), pairwise=t([[[1.0, s12], [s12, 1.0]]]), diversity_coef=0.5
    )
    close(advantages, [[rewards[0] - align[1], rewards[1] - align[0]]])


def test_rloo_n1_is_reinforce():
    close(ebft_advantages(t([[0.6]]), estimator="rloo", alignment=t([[0.6]])), [[0.6]])


def test_rloo_batched_over_leading_dims_and_needs_its_terms():
    rewards = t([[[0.1, 0.2, 0.3]], [[0.3, 0.2, 0.1]]])  # (2, 1, 3)
    align = rewards * 2
    pair = torch.eye(3, dtype=torch.float64).expand(2, 1, 3, 3)
    out = ebft_advantages(rewards, estimator="rloo", alignment=align, pairwise=pair)
    assert out.shape == (2, 1, 3)
    close(out[0, 0], [0.1 - 0.5, 0.2 - 0.4, 0.3 - 0.3])
    with pytest.raises(ValueError, match="alignment"):
        ebft_advantages(rewards, estimator="rloo")
    with pytest.raises(ValueError, match="pairwise"):
        ebft_advantages(rewards, estimator="rloo", alignment=align)
    no_diversity = ebft_advantages(rewards, estimator="rloo", alignment=align, diversity_coef=0.0)
    close(no_diversity[1, 0], [0.3 - 0.3, 0.2 - 0.4, 0.1 - 0.5])
    with pytest.raises(ValueError, match="advantage_estimator"):
        ebft_advantages(rewards, estimator="ppo")


def test_rewards_feed_rloo_end_to_end():
    torch.manual_seed(1)
    out = feature_matching_rewards(torch.randn(2, 4, 5, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64))
    adv = ebft_advantages(out.rewards, estimator="rloo", alignment=out.alignment, pairwise=out.pairwise)
    for group in range(2):
        expected = hand_rloo_baseline(out.alignment[group].tolist(), out.pairwise[group].tolist(), 1.0, 1.0)
        close(out.rewards[group] - adv[group], expected)


# ---------------------------------------------------------------------------------------------------- strided loss


def test_strided_loss_by_hand():
    # B = 2 rows, K = 2 blocks, Gt = 2 tokens
    logps = [[[-1.0, -2.0], [-0.5, -0.25]], [[-3.0, -1.0], [-2.0, -4.0]]]
    mask = [[[1, 1], [1, 0]], [[0, 0], [1, 1]]]
    adv = [[2.0, -1.0], [5.0, 0.5]]
    row0 = (1.0 * 2 + 2.0 * 2 + 0.5 * -1.0) / 3
    row1 = (2.0 * 0.5 + 4.0 * 0.5) / 2
    rl = (row0 + row1) / 2
    nll = [[0.5, 1.0, 1.5], [2.0, 0.0, 1.0]]
    doc_mask = [[1, 1, 0], [1, 1, 1]]
    ce = ((0.5 + 1.0) / 2 + (2.0 + 0.0 + 1.0) / 3) / 2
    loss, metrics = strided_ebft_loss(t(logps), t(mask), t(adv), t(nll), t(doc_mask), rl_coef=0.8, ce_coef=0.1)
    assert float(loss) == pytest.approx(0.8 * rl + 0.1 * ce)
    assert metrics == pytest.approx({"ebft/rl_loss": rl, "ebft/ce_loss": ce})
    loss, metrics = strided_ebft_loss(t(logps), t(mask), t(adv), None, None)
    assert float(loss) == pytest.approx(rl)
    assert metrics["ebft/ce_loss"] == 0.0
    loss, _ = strided_ebft_loss(t(logps), t(mask), t(adv), t(nll), t(doc_mask), ce_coef=0.0)
    assert float(loss) == pytest.approx(rl)


def _grad(logps: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    leaf = logps.clone().requires_grad_(True)
    loss, _ = strided_ebft_loss(leaf, mask, adv, None, None)
    loss.backward()
    return leaf.grad


def test_block_advantage_reaches_only_its_own_blocks_tokens():
    torch.manual_seed(0)
    batch, blocks, steps = 2, 3, 4
    logps = -torch.rand(batch, blocks, steps, dtype=torch.float64)
    mask = torch.ones(batch, blocks, steps, dtype=torch.float64)
    mask[1, 2, 3] = 0
    adv = torch.randn(batch, blocks, dtype=torch.float64)
    base = _grad(logps, mask, adv)
    for b in range(batch):
        for k in range(blocks):
            bumped = adv.clone()
            bumped[b, k] += 1.0
            changed = (_grad(logps, mask, bumped) - base).abs() > 1e-12
            expected = torch.zeros_like(changed)
            expected[b, k] = mask[b, k].bool()
            assert torch.equal(changed, expected), (b, k)
    # d loss / d logp[b,k,t] = -A[b,k] m[b,k,t] / tokens_b / rows
    tokens = mask.sum(dim=(1, 2))
    assert torch.allclose(base, -adv.unsqueeze(-1) * mask / tokens.view(-1, 1, 1) / batch)


def test_masked_tokens_and_empty_rows_take_no_part():
    logps = t([[[-1.0, -9.0]], [[-5.0, -6.0]]])
    mask = t([[[1, 0]], [[0, 0]]])
    adv = t([[2.0], [3.0]])
    loss, _ = strided_ebft_loss(logps, mask, adv, None, None)
    assert float(loss) == pytest.approx(2.0)  # row 1 has no tokens: the mean is over row 0 only
    moved = logps.clone()
    moved[0, 0, 1] = -100.0
    moved[1] = -50.0
    assert float(strided_ebft_loss(moved, mask, adv, None, None)[0]) == pytest.approx(2.0)
    leaf = logps.clone().requires_grad_(True)
    loss, metrics = strided_ebft_loss(leaf, torch.zeros_like(mask), adv, None, None)
    loss.backward()
    assert loss.item() == 0.0 and metrics["ebft/rl_loss"] == 0.0
    assert torch.equal(leaf.grad, torch.zeros_like(logps))


def test_advantages_are_constants_and_shapes_are_checked():
    adv = t([[1.0]]).requires_grad_(True)
    leaf = t([[[-1.0]]]).requires_grad_(True)
    loss, _ = strided_ebft_loss(leaf, t([[[1.0]]]), adv, None, None)
    loss.backward()
    assert adv.grad is None
    with pytest.raises(ValueError, match="advantages"):
        strided_ebft_loss(t([[[-1.0, -1.0]]]), t([[[1.0, 1.0]]]), t([[1.0, 1.0]]), None, None)
    with pytest.raises(ValueError, match="doc_nll"):
        strided_ebft_loss(t([[[-1.0]]]), t([[[1.0]]]), t([[1.0]]), None, None, ce_coef=0.1)


def test_module_is_pure():
    # losses import nothing of rlft (DESIGN principle 2)
    source = open(ebft.__file__).read()
    assert "import rlft" not in source and "from rlft" not in source


def test_a_whitening_fallback_is_said_once_and_depth_comes_from_the_text_config():
    """A group scored on raw features because its whitening failed is counted (ebft/whitening_fallbacks) and warned
    about once; the feature layers come from the text config's depth, where a multimodal model (Gemma 3) keeps it."""
    from types import SimpleNamespace

    from transformers import AutoConfig

    from rlft.models.features import hidden_layer_count
    from rlft.train.recipes.ebft import EBFTHealth

    health = EBFTHealth()
    assert health.check({"ebft/whitening_fallbacks": 0.0}) == []
    [message] = health.check({"ebft/whitening_fallbacks": 2.0})
    assert "whitening failed for 2 group(s)" in message and "use_whitening: false" in message
    assert health.check({"ebft/whitening_fallbacks": 3.0}) == []
    gemma3 = SimpleNamespace(config=AutoConfig.for_model("gemma3", text_config={"num_hidden_layers": 6}))
    assert not hasattr(gemma3.config, "num_hidden_layers") and hidden_layer_count(gemma3) == 6


def test_strided_health_is_judged_once_per_optimizer_step_not_per_micro_batch():
    """The warning says "for 10 steps": with 4 micro-batches a step, 10 steps of collapsing samples warn once, and 9
    do not (40 and 36 micro-batches)."""
    from types import SimpleNamespace

    from rlft.train.recipes.ebft import EBFTHealth, EBFTStridedRecipe

    for steps, warned in ((9, False), (10, True)):
        recipe = SimpleNamespace(health=EBFTHealth(), pending=[], step_health=[])
        for _ in range(steps):
            recipe.step_health = [{"ebft/diversity": 1.5, "ebft/alignment": 0.5}] * 4
            assert EBFTStridedRecipe.step_metrics(recipe) == {}
        assert bool([m for m in recipe.pending if "ebft/diversity > 1 for 10 steps" in m]) is warned
    recipe = SimpleNamespace(health=EBFTHealth(), pending=[], step_health=[{"ebft/diversity": 0.5}, {"ebft/diversity": 2.5}])
    EBFTStridedRecipe.step_metrics(recipe)
    assert recipe.health.counts["collapse"] == 1  # the step's mean, 1.5, is above 1
