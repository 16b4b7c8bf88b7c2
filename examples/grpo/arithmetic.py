"""Reward functions and the dataset transform of the GRPO arithmetic examples.

Axolotl / TRL conventions: a transform is `fn(cfg, **kwargs) -> (transform_fn, map_kwargs)`, and a
reward function is `fn(completions, **columns) -> list[float]` with dataset columns as keywords.
"""


def transform(cfg, *args, **kwargs):
    """Quickstart rows {"prompt": "12+34=", "completion": "46"} -> {"prompt": ..., "answer": "46"}."""

    def transform_fn(example, tokenizer=None):
        return {"prompt": example["prompt"], "answer": example["completion"]}

    return transform_fn, {"remove_columns": ["completion"]}


def exact_match(completions, answer, **kwargs) -> list[float]:
    """1.0 when the completion is exactly the right sum (surrounding whitespace ignored)."""
    return [1.0 if str(c).strip() == str(a).strip() else 0.0 for c, a in zip(completions, answer)]


def is_number(completions, **kwargs) -> list[float]:
    """Format reward: 1.0 when the completion is a number at all (a second, easier objective for GDPO)."""
    return [1.0 if str(c).strip().isdigit() else 0.0 for c in completions]


def close_enough(completions, answer, **kwargs) -> list[float]:
    """Partial credit: 1 - |error| / 10, floored at 0 (dense signal when exact matches are rare)."""
    scores = []
    for c, a in zip(completions, answer):
        text = str(c).strip()
        scores.append(max(0.0, 1.0 - abs(int(text) - int(a)) / 10) if text.isdigit() else 0.0)
    return scores
