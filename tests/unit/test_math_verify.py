"""math_verify_reward: symbolic equivalence with the reference, unscorable when the reference cannot be parsed."""

import pytest

pytest.importorskip("math_verify")

from rlft.rollout.rewards.math_verify import math_verify_reward  # noqa: E402


def test_equivalent_answers_score_one_and_others_zero():
    completions = ["8", "The answer is 8.", "7", "no idea", "0.5", [{"role": "assistant", "content": "$\\frac{1}{2}$"}]]
    answers = ["8", "8", "8", "8", "\\frac{1}{2}", "0.5"]
    assert math_verify_reward(completions, answers) == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]


def test_a_reference_that_cannot_be_parsed_is_unscorable_not_zero():
    assert math_verify_reward(["x^2"], ["x^2"]) == [None]  # LaTeX needs $...$: the reference holds no answer
