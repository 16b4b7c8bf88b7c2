"""`math_verify_reward`: mathematical equivalence of a completion's answer and the reference, by math-verify.

    trl:
      reward_funcs: [rlft.rollout.rewards.math_verify.math_verify_reward]
      reward_num_workers: 2      # optional: math-verify times its parsing out with signal.alarm

math-verify (`pip install 'rlft[math]' -c constraints.txt`) extracts the final answer of a completion (plain
numbers and expressions, or LaTeX between $...$ / \\boxed{}) and compares it with the dataset's `answer` column
symbolically: "0.5" matches "\\frac{1}{2}". Its parsing timeout uses signal.alarm, which works only on a main
thread: rlft calls reward functions on the main thread, or on the main thread of each reward worker process.

Returns 1.0 (equivalent), 0.0 (not, or no answer found in the completion), or None when the reference itself
cannot be parsed (the row is unscorable and counted, not scored 0). `verified_score` is the same comparison for one
row with chosen extraction targets; the built-in `boxed_math` (rlft.rollout.rewards.builtin) uses it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlft.rollout.rewards.calling import completion_text

INSTALL_HINT = "pip install 'rlft[math]' -c constraints.txt"


def math_verify_module():
    """The math_verify package (an optional dependency: the math extra); ImportError with the install line."""
    try:
        import math_verify  # an optional package (the math extra)
    except ImportError:
        raise ImportError(f"this reward function needs the math-verify package: {INSTALL_HINT}") from None
    return math_verify


def verified_score(completion: str, reference: str, gold_targets: Sequence[Any] | None = None,
                   answer_targets: Sequence[Any] | None = None) -> float | None:
    """1.0 when math-verify finds the completion's answer equivalent to the reference, 0.0 when not (or when it
    extracts no answer), None when the reference yields nothing to compare with. The targets are math-verify's
    extraction configs for the reference and the completion (None: its default, LaTeX then plain expressions)."""
    math_verify = math_verify_module()
    gold = math_verify.parse(reference) if gold_targets is None else math_verify.parse(reference, list(gold_targets))
    if not gold:
        return None
    predicted = math_verify.parse(completion) if answer_targets is None else math_verify.parse(completion, list(answer_targets))
    return 1.0 if predicted and math_verify.verify(gold, predicted) else 0.0


def math_verify_reward(completions: list[Any], answer: list[Any], **kwargs: Any) -> list[float | None]:
    math_verify_module()
    return [verified_score(completion_text(completion), str(reference)) for completion, reference in zip(completions, answer)]
