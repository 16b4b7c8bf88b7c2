"""Advantages, GDPO, RLOO, DAPO filters and the overlong penalty against values computed by hand with `math`."""

from __future__ import annotations

import math

import pytest
import torch

from rlft.losses.advantages import (
    group_advantages,
    normalise_scale,
    overlong_penalty,
    zero_variance_groups,
)

EPS = 1e-4
NAN = float("nan")


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def std(xs: list[float]) -> float:
    """Bessel-corrected, by hand."""
    mu = mean(xs)
    return math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1))


def column(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).unsqueeze(1)


def close(actual: torch.Tensor, expected: list[float], tol: float = 1e-9) -> None:
    assert actual.tolist() == pytest.approx(expected, abs=tol)


REWARDS = [1.0, 2.0, 4.0, 0.0, 0.0, 1.0]  # two groups of three


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, "group"), (False, "none"), (None, "group"), ("group", "group"), ("batch", "batch"), ("none", "none")],
)
def test_normalise_scale(value, expected):
    assert normalise_scale(value) == expected


@pytest.mark.parametrize("value", ["Group", "std", 1.0, "true"])
def test_normalise_scale_rejects(value):
    with pytest.raises(ValueError, match="scale_rewards"):
        normalise_scale(value)


def test_grpo_group_scaling():
    out = group_advantages(column(REWARDS), None, 3)
    expected = []
    for group in (REWARDS[:3], REWARDS[3:]):
        expected += [(r - mean(group)) / (std(group) + EPS) for r in group]
    close(out.advantages, expected)
    close(out.total_rewards, REWARDS)
    close(out.group_std, [std(REWARDS[:3])] * 3 + [std(REWARDS[3:])] * 3)
    assert out.frac_zero_std == 0.0
    assert not out.advantages.requires_grad


def test_grpo_batch_and_none_scaling():
    batch_std = std(REWARDS)
    expected_none = [r - mean(REWARDS[:3]) for r in REWARDS[:3]] + [r - mean(REWARDS[3:]) for r in REWARDS[3:]]
    close(group_advantages(column(REWARDS), None, 3, scale="none").advantages, expected_none)
    close(group_advantages(column(REWARDS), None, 3, scale=False).advantages, expected_none)
    close(group_advantages(column(REWARDS), None, 3, scale="batch").advantages, [a / (batch_std + EPS) for a in expected_none])
    default = group_advantages(column(REWARDS), None, 3).advantages.tolist()
    close(group_advantages(column(REWARDS), None, 3, scale=True).advantages, default)


def test_weights_and_nan_skipping_sum():
    # row 2 has one unscored function (skipped in the sum), row 3 is unscorable (NaN total, advantage 0, out of the stats)
    rewards = torch.tensor([[1.0, 0.5], [0.0, 1.0], [2.0, NAN], [NAN, NAN]], dtype=torch.float64)
    out = group_advantages(rewards, torch.tensor([1.0, 2.0]), 4)
    totals = [1.0 + 2 * 0.5, 0.0 + 2 * 1.0, 2.0]
    assert out.total_rewards[:3].tolist() == pytest.approx(totals)
    assert math.isnan(out.total_rewards[3].item())
    # all three scorable totals are 2.0: no signal at all
    close(out.advantages, [0.0, 0.0, 0.0, 0.0])
    assert out.frac_zero_std == 1.0

    rewards[0, 0] = 3.0
    out = group_advantages(rewards, torch.tensor([1.0, 2.0]), 4)
    totals = [4.0, 2.0, 2.0]
    expected = [(t - mean(totals)) / (std(totals) + EPS) for t in totals] + [0.0]
    close(out.advantages, expected)
    close(out.group_std, [std(totals)] * 4)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_all_equal_rewards_give_zero_advantages(scale, estimator):
    out = group_advantages(column([0.7] * 6), None, 3, scale=scale, estimator=estimator)
    assert out.advantages.tolist() == [0.0] * 6
    assert out.frac_zero_std == 1.0
    close(out.group_std, [0.0] * 6, tol=1e-12)


def test_all_equal_rewards_gdpo():
    rewards = torch.tensor([[1.0, 0.0]] * 4, dtype=torch.float64)
    out = group_advantages(rewards, None, 2, aggregation="normalize_then_sum")
    assert out.advantages.tolist() == [0.0] * 4
    assert out.frac_zero_std == 1.0


def test_frac_zero_std_counts_rows():
    out = group_advantages(column([1.0, 1.0, 0.0, 1.0]), None, 2)
    assert out.frac_zero_std == 0.5
    close(out.advantages, [0.0, 0.0, -0.5 / (std([0.0, 1.0]) + EPS), 0.5 / (std([0.0, 1.0]) + EPS)])


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_of_one(scale):
    out = group_advantages(column([0.0, 1.0, 3.0]), None, 1, scale=scale)
    assert out.advantages.tolist() == [0.0, 0.0, 0.0]
    assert out.frac_zero_std == 1.0
    assert all(math.isnan(s) for s in out.group_std.tolist())
    rloo = group_advantages(column([0.0, 1.0, 3.0]), None, 1, scale=scale, estimator="rloo")
    assert rloo.advantages.tolist() == [0.0, 0.0, 0.0]


def test_group_with_one_scorable_row():
    out = group_advantages(column([2.0, NAN, 0.0, 1.0]), None, 2)
    close(out.advantages, [0.0, 0.0, -0.5 / (std([0.0, 1.0]) + EPS), 0.5 / (std([0.0, 1.0]) + EPS)])
    assert out.frac_zero_std == 0.5


def test_rloo_leave_one_out():
    out = group_advantages(column(REWARDS), None, 3, scale="none", estimator="rloo")
    expected = []
    for group in (REWARDS[:3], REWARDS[3:]):
        expected += [r - mean(group[:i] + group[i + 1 :]) for i, r in enumerate(group)]
    close(out.advantages, expected)
    # = G/(G-1) times the GRPO advantage without scaling
    grpo = group_advantages(column(REWARDS), None, 3, scale="none").advantages
    close(out.advantages, (grpo * 1.5).tolist())


def test_rloo_scaled_like_grpo():
    group_scaled = group_advantages(column(REWARDS), None, 3, scale="group", estimator="rloo")
    expected = []
    for group in (REWARDS[:3], REWARDS[3:]):
        expected += [(r - mean(group[:i] + group[i + 1 :])) / (std(group) + EPS) for i, r in enumerate(group)]
    close(group_scaled.advantages, expected)
    batch_scaled = group_advantages(column(REWARDS), None, 3, scale="batch", estimator="rloo")
    unscaled = group_advantages(column(REWARDS), None, 3, scale="none", estimator="rloo").advantages
    close(batch_scaled.advantages, (unscaled / (std(REWARDS) + EPS)).tolist())


def test_rloo_skips_unscorable_rows():
    out = group_advantages(column([1.0, NAN, 3.0, 0.0]), None, 4, scale="none", estimator="rloo")
    close(out.advantages, [1.0 - 1.5, 0.0, 3.0 - 0.5, 0.0 - 2.0])


def gdpo_by_hand(rows: list[list[float]], weights: list[float], group_size: int) -> list[float]:
    n_funcs = len(rows[0])
    summed = [0.0] * len(rows)
    for start in range(0, len(rows), group_size):
        block = range(start, start + group_size)
        for k in range(n_funcs):
            values = [rows[i][k] for i in block]
            for i in block:
                summed[i] += weights[k] * (rows[i][k] - mean(values)) / (std(values) + EPS)
    return [(s - mean(summed)) / (std(summed) + EPS) for s in summed]


def test_gdpo_by_hand():
    rows = [[1.0, 0.0], [0.0, 3.0], [1.0, 2.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]]
    out = group_advantages(torch.tensor(rows), torch.tensor([1.0, 2.0]), 3, aggregation="normalize_then_sum")
    close(out.advantages, gdpo_by_hand(rows, [1.0, 2.0], 3), tol=1e-5)
    close(out.total_rewards, [1.0, 6.0, 5.0, 2.0, 3.0, 0.0], tol=1e-6)
    # scale_rewards is ignored by GDPO
    for scale in ("batch", "none"):
        again = group_advantages(torch.tensor(rows), torch.tensor([1.0, 2.0]), 3, aggregation="normalize_then_sum", scale=scale)
        assert again.advantages.tolist() == out.advantages.tolist()


def test_gdpo_separates_ties_that_grpo_collapses():
    # the seed's format + correctness rewards with reward_weights [1, 2]: both rows total 2.0
    rows = [[2.0, 0.0], [0.0, 1.0]]
    grpo = group_advantages(torch.tensor(rows), torch.tensor([1.0, 2.0]), 2)
    gdpo = group_advantages(torch.tensor(rows), torch.tensor([1.0, 2.0]), 2, aggregation="normalize_then_sum")
    assert grpo.advantages.tolist() == [0.0, 0.0]
    assert grpo.frac_zero_std == 1.0
    z = (1.0 / (std([2.0, 0.0]) + EPS)) * 1.0  # format, weight 1: (2 - mean 1) / std
    c = (0.5 / (std([0.0, 1.0]) + EPS)) * 2.0  # correctness, weight 2: (1 - 0.5) / std
    summed = [z - c, -z + c]
    expected = [(s - mean(summed)) / (std(summed) + EPS) for s in summed]
    close(gdpo.advantages, expected, tol=1e-6)
    assert gdpo.advantages[0] < 0 < gdpo.advantages[1]
    assert gdpo.frac_zero_std == 0.0

    # three functions, equal weights, equal totals, different per function
    rows3 = [[1.0, 0.0, 0.0], [0.0, 0.5, 0.5]]
    assert group_advantages(torch.tensor(rows3), None, 2).advantages.tolist() == [0.0, 0.0]
    gdpo3 = group_advantages(torch.tensor(rows3), None, 2, aggregation="normalize_then_sum")
    close(gdpo3.advantages, gdpo_by_hand(rows3, [1.0, 1.0, 1.0], 2), tol=1e-6)
    assert gdpo3.advantages[0] < 0 < gdpo3.advantages[1]


def test_gdpo_seed_rows_with_equal_weights_stay_tied():
    # [format, correct] = [0, 3] and [1, 2]: with two functions and equal weights the z-scores cancel exactly
    # (correct = total - format), so GDPO cannot separate them either; the weights or a third function do.
    out = group_advantages(torch.tensor([[0.0, 3.0], [1.0, 2.0]]), None, 2, aggregation="normalize_then_sum")
    close(out.advantages, [0.0, 0.0], tol=1e-6)


def test_gdpo_unscorable_row():
    rows = [[1.0, 0.0], [0.0, 1.0], [NAN, NAN], [1.0, 1.0]]
    out = group_advantages(torch.tensor(rows, dtype=torch.float64), None, 2, aggregation="normalize_then_sum")
    # group 2 has one scorable row: its z-scores are NaN and add nothing (sum 0); the unscorable row is left out
    s0 = (0.5 / (std([1.0, 0.0]) + EPS)) - (0.5 / (std([0.0, 1.0]) + EPS))
    summed = [s0, -s0, 0.0]
    expected = [(s - mean(summed)) / (std(summed) + EPS) for s in summed]
    close(out.advantages, [expected[0], expected[1], 0.0, expected[2]])
    assert math.isnan(out.total_rewards[2].item())


def test_bad_inputs():
    with pytest.raises(ValueError, match="multiple of num_generations"):
        group_advantages(column([1.0, 2.0, 3.0]), None, 2)
    with pytest.raises(ValueError, match="reward_weights"):
        group_advantages(torch.zeros(4, 2), torch.ones(3), 2)
    with pytest.raises(ValueError, match="normalize_then_sum"):
        group_advantages(torch.zeros(4, 2), None, 2, aggregation="normalize_then_sum", estimator="rloo")
    with pytest.raises(ValueError, match="multi_objective_aggregation"):
        group_advantages(torch.zeros(4, 2), None, 2, aggregation="sum")
    with pytest.raises(ValueError, match="advantage_estimator"):
        group_advantages(torch.zeros(4, 2), None, 2, estimator="ppo")
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.zeros(4, 2), None, 0)


def test_zero_variance_groups():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, NAN, 2.0, 2.0, NAN, NAN, 3.0, NAN, 1.0, 2.0])
    assert zero_variance_groups(rewards, 3).tolist() == [True, False, True, True, False]
    assert zero_variance_groups(torch.tensor([1, 1, 0, 1]), 2).tolist() == [True, False]
    with pytest.raises(ValueError):
        zero_variance_groups(torch.zeros(5), 2)


def test_overlong_penalty_boundaries():
    # max 10, buffer 4: free up to 6, then linear to -factor at 10, -factor beyond
    lengths = torch.tensor([0, 6, 7, 8, 9, 10, 11, 100])
    factor = 2.0
    expected = [0.0, 0.0, -0.5, -1.0, -1.5, -2.0, -2.0, -2.0]
    close(overlong_penalty(lengths, 10, 4, factor), expected)
    # DAPO's form: ((L_max - L_buf) - |y|) / L_buf inside the buffer
    assert overlong_penalty(torch.tensor([9.0]), 10, 4, 1.0).item() == pytest.approx(((10 - 4) - 9) / 4)
    # buffer == max: the ramp starts at 0
    close(overlong_penalty(torch.tensor([0, 5, 10]), 10, 10, 1.0), [0.0, -0.5, -1.0])


def test_overlong_penalty_rejects_bad_buffers():
    for buffer in (0, -1, 11):
        with pytest.raises(ValueError, match="overlong_buffer_length"):
            overlong_penalty(torch.tensor([5]), 10, buffer, 1.0)
    with pytest.raises(ValueError, match="max_completion_length"):
        overlong_penalty(torch.tensor([5]), 0, 1, 1.0)


def test_the_overlong_penalty_leaves_an_unscorable_row_unscorable():
    """A row no reward function could score (all NaN: a failed reward, a failed environment episode) is left out of
    its group's statistics with advantage 0. DAPO's overlong column is never NaN, so it used to make such a row a
    scored one (total = its penalty) that the group trained as a wrong answer. Group [nan, 1, 0, 1], penalty 0:
    mean of the scorable rows 2/3, std 0.57735 -> advantages 0, 0.57735, -1.1547, 0.57735."""
    from types import SimpleNamespace

    from rlft.rollout.scoring import add_overlong_penalty, make_scores

    scores = make_scores(torch.tensor([[NAN], [1.0], [0.0], [1.0]]), ["accuracy"], [1.0])
    with_penalty = add_overlong_penalty(scores, SimpleNamespace(completion_ids=[[1, 2]] * 4), 10, 4, 1.0)
    assert with_penalty.names == ["accuracy", "overlong"] and math.isnan(with_penalty.total[0])
    out = group_advantages(with_penalty.values, with_penalty.weights, 4)
    mu, sd = 2 / 3, std([1.0, 0.0, 1.0])
    close(out.advantages, [0.0, (1 - mu) / (sd + EPS), (0 - mu) / (sd + EPS), (1 - mu) / (sd + EPS)], tol=1e-6)  # float32
