"""Built-in reward functions named by a bare word in `trl.reward_funcs`: Cosmos-RL's `boxed_math`, `single_choice` and
`format` (its `train.train_policy.reward_function`, https://github.com/nvidia-cosmos/cosmos-rl).

    trl:
      reward_funcs: {boxed_math: 0.9, format: 0.1}

Each is called as every reward function is (rlft.rollout.rewards.calling) and reads the text of the completion (for
message prompts, the assistant message's content). `boxed_math` and `single_choice` take the reference from the
dataset's `answer` column, as `math_verify_reward` does; `format` needs no column. Each returns 1.0 or 0.0 per
completion, and None (unscorable, counted in `rewards/<name>/unscorable`) where a reference is missing (None) or, for
`boxed_math`, holds nothing math-verify can parse. Cosmos-RL scores those rows 0.0; the weighted sum of the rewards is
the same either way, since an unscorable score adds nothing to it.
"""

from __future__ import annotations

import re
from typing import Any

from rlft.rollout.rewards.calling import completion_text
from rlft.rollout.rewards.math_verify import INSTALL_HINT, math_verify_module, verified_score

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# the whole completion: <think>, text without another <think> or </think> tag, </think>, a blank line, <answer>,
# anything, </answer>, at most one newline after it (Cosmos-RL matches `^...</answer>$` without MULTILINE)
THINK_ANSWER = re.compile(r"<think>(?:(?!</?think>).)*</think>\n\n<answer>.*</answer>\n?", re.DOTALL)


def boxed_math(completions: list[Any], answer: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 when math-verify finds the completion's answer mathematically equal to the reference, else 0.0.

    Cosmos-RL's comparison (math-verify's `math_metric`, LaTeX extraction for the reference, expression then LaTeX
    extraction for the completion):
    * the reference is read as LaTeX; one without `\\boxed` is first wrapped as `$\\boxed{reference}$`, as Cosmos-RL's
      Hugging Face GRPO dataset does for `boxed_math`, so a plain "8" or "\\frac{1}{2}" works. None when nothing can
      be parsed from it.
    * the completion's answer is the one math-verify extracts, by rank: "final answer is X. I hope"; `\\boxed{}` (nested
      braces included) or "final answer ... is X"; "answer: X"; "answer ... X"; any LaTeX or number. Of candidates of
      one rank, the one ending last. A boxed answer spans every `\\boxed{}` of the text: "\\boxed{7} then \\boxed{8}"
      reads as the set {7, 8} and matches neither 7 nor 8. A bare number counts only after a space, "=" or the start
      of the text, so "<answer>8</answer>" holds no answer. No answer at all (an unclosed `\\boxed{8`, no number)
      scores 0.0.
    * equality is symbolic, numbers to 6 decimals: "0.5" equals "\\frac{1}{2}".
    Needs math-verify (`pip install 'rlft[math]' -c constraints.txt`); its signal.alarm timeouts need the main thread,
    which rlft's reward calls have (in the training process or in each reward worker).
    """
    math_verify = math_verify_module()
    reference_targets = (math_verify.LatexExtractionConfig(),)
    answer_targets = (math_verify.ExprExtractionConfig(), math_verify.LatexExtractionConfig())
    scores: list[float | None] = []
    for completion, reference in zip(completions, answer):
        if reference is None:
            scores.append(None)
            continue
        reference = str(reference)
        if "\\boxed" not in reference:
            reference = "$\\boxed{" + reference + "}$"
        scores.append(verified_score(completion_text(completion), reference, reference_targets, answer_targets))
    return scores


def single_choice(completions: list[Any], answer: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 when the completion's choice equals the reference's, ignoring case and surrounding whitespace, else 0.0.

    The choice of a text is what its first `<answer>...</answer>` holds, or the whole text when it has none, stripped
    of surrounding whitespace; this is applied to the reference too. So "<think>...</think><answer> b </answer>"
    matches the reference "B", "(B)" does not, and neither does a completion "B because ..." without answer tags.
    None where the reference is None.
    """
    scores: list[float | None] = []
    for completion, reference in zip(completions, answer):
        if reference is None:
            scores.append(None)
            continue
        scores.append(1.0 if _choice(completion_text(completion)) == _choice(str(reference)) else 0.0)
    return scores


# named as users write it in reward_funcs (and as its metrics read); it shadows the builtin format() in this module only
def format(completions: list[Any], **kwargs: Any) -> list[float]:
    """1.0 when the whole completion is `<think>T</think>\\n\\n<answer>A</answer>`, else 0.0.

    Exactly: the text starts with `<think>`; T holds no `<think>` or `</think>` tag; `</think>` is followed by one blank
    line (two newlines) and `<answer>`; A is anything; the text ends with `</answer>`, optionally followed by one
    newline. Leading whitespace, a space for the blank line, text after `</answer>` or a second think block all score
    0.0. A chat template that puts `<think>` into the prompt leaves the completion without it: 0.0. No column needed.
    """
    return [1.0 if THINK_ANSWER.fullmatch(completion_text(completion)) else 0.0 for completion in completions]


def _choice(text: str) -> str:
    tagged = ANSWER_TAG.search(text)
    return (tagged.group(1) if tagged else text).strip().lower()


BUILTIN_REWARDS = {"boxed_math": boxed_math, "single_choice": single_choice, "format": format}

# what a built-in needs installed: (importable module, the install line)
REQUIRES = {"boxed_math": ("math_verify", INSTALL_HINT)}
