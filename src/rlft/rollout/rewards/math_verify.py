"""`math_verify_reward`: mathematical equivalence of a completion's answer and the reference, by math-verify.

    trl:
      reward_funcs: [rlft.rollout.rewards.math_verify.math_verify_reward]
      reward_num_workers: 2      # optional: math-verify times its parsing out with signal.alarm

math-verify (`pip install 'rlft[math]' -c constraints.txt`) extracts the final answer of a completion (plain
numbers and expressions, or LaTeX between $...$ / \\boxed{}) and compares it with the dataset's `answer` column
symbolically: "0.5" matches "\\frac{1}{2}". Its parsing timeout uses signal.alarm, which works only on a main
thread: rlft calls reward functions on the main thread, or on the main thread of each reward worker process.

Returns 1.0 (equivalent), 0.0 (not, or no answer found in the completion), or None when the reference itself
cannot be parsed (the row is unscorable and counted, not scored 0).
"""

from __future__ import annotations

from typing import Any


def math_verify_reward(completions: list[Any], answer: list[Any], **kwargs: Any) -> list[float | None]:
    try:
        from math_verify import parse, verify  # an optional package (the math extra)
    except ImportError:
        raise ImportError("math_verify_reward needs the math-verify package: pip install 'rlft[math]' -c constraints.txt") from None
    rewards: list[float | None] = []
    for completion, reference in zip(completions, answer):
        text = completion if isinstance(completion, str) else "".join(
            str(message.get("content", "")) for message in completion if isinstance(message, dict))
        gold = parse(str(reference))
        if not gold:
            rewards.append(None)
            continue
        predicted = parse(text)
        rewards.append(1.0 if predicted and verify(gold, predicted) else 0.0)
    return rewards
