"""`rlft preprocess --debug`: a few tokenised rows, each token shown with whether it carries the loss."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from rlft.data.tokenize import IGNORE


def token_segments(example: dict[str, Any]) -> list[tuple[str, list[int], list[bool]]]:
    """(title, ids, trained per id) for each sequence the example puts in a batch."""
    if "labels" in example:  # SFT
        return [("", example["input_ids"], [label != IGNORE for label in example["labels"]])]
    prompt = example.get("prompt_ids", [])
    answers = [key for key in ("chosen_ids", "rejected_ids", "completion_ids", "ground_truth_ids") if key in example]
    if not answers:  # online RL prompts: the model writes the answer
        return [("prompt", prompt, [False] * len(prompt))]
    return [(key.removesuffix("_ids"), prompt + example[key], [False] * len(prompt) + [True] * len(example[key])) for key in answers]


def show_tokens(tokenizer, ids: list[int], trained: list[bool]) -> Text:
    """Each token as repr(text)(id): bold green when trained, dim when not."""
    text = Text()
    for token, is_trained in zip(ids, trained):
        piece = tokenizer.convert_ids_to_tokens(token)
        text.append(f"{piece!r}({token}) ", style="bold green" if is_trained else "dim")
    return text


def describe_examples(examples: list[dict[str, Any]], tokenizer, count: int) -> list[Text]:
    lines = []
    for index, example in enumerate(examples[:count]):
        for title, ids, trained in token_segments(example):
            heading = f"row {index}" + (f" {title}" if title else "") + f": {len(ids)} tokens, {sum(trained)} trained"
            lines += [Text(heading, style="bold"), show_tokens(tokenizer, ids, trained)]
    return lines
