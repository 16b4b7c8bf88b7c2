"""reasoning-gym tasks for GRPO: offline data generation, the dataset transform, and reasoning-gym's own scorer as reward.

Generate a task file (rows {"question", "answer", "metadata"}, all from reasoning_gym, no network):

    python -m examples.reasoning_gym.tasks --task basic_arithmetic --size 500 --seed 0 \
        --output examples/reasoning_gym/data/basic_arithmetic.jsonl --config '{"min_terms": 2, "max_terms": 2}'

Then point a config at it with `type: examples.reasoning_gym.tasks.transform` (or `.chat_transform`) and
`trl.reward_funcs: [examples.reasoning_gym.tasks.score]`.
"""

from __future__ import annotations

import argparse
import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

import reasoning_gym
from reasoning_gym.utils import SYSTEM_PROMPTS, extract_answer

ROW_KEYS = ("question", "answer", "metadata")


def _jsonable(value: Any) -> Any:
    """Tuples and sets become lists, mapping keys strings; anything else JSON cannot hold becomes its str()."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    return str(value)


def generate(task: str, size: int, seed: int, config: dict[str, Any] | None = None, non_negative: bool = False,
             exclude: set[str] = frozenset()) -> Iterator[dict[str, Any]]:
    """`size` rows of `task`; `non_negative` skips answers starting with "-", `exclude` skips these questions."""
    budget = size * 20 if (non_negative or exclude) else size
    dataset = reasoning_gym.create_dataset(task, size=budget, seed=seed, **(config or {}))
    made = 0
    for entry in dataset:
        if made == size:
            break
        if (non_negative and str(entry["answer"]).lstrip().startswith("-")) or entry["question"] in exclude:
            continue
        made += 1
        yield {key: _jsonable(entry[key]) for key in ROW_KEYS}
    if made < size:
        raise ValueError(f"{task}: only {made} of {size} rows pass the filters among {budget} generated; relax them")


def _prompt_text(row: dict[str, Any]) -> str:
    """Arithmetic rows as the quickstart model knows them ("12+34="), others as their question."""
    expression = (row.get("metadata") or {}).get("expression")
    return expression.replace(" ", "") + "=" if isinstance(expression, str) and expression else row["question"]


def transform(cfg, *args, **kwargs) -> tuple[Callable[[dict], dict], dict]:
    """{"question", "answer", "metadata"} -> {"prompt": plain text, "entry": the row for the scorer}."""

    def transform_fn(example: dict, tokenizer=None) -> dict:
        entry = {key: example[key] for key in ROW_KEYS}
        return {"prompt": _prompt_text(entry), "entry": entry}

    return transform_fn, {"remove_columns": list(ROW_KEYS)}


def chat_transform(cfg, *args, **kwargs) -> tuple[Callable[[dict], dict], dict]:
    """For chat models: reasoning-gym's default system prompt (asks for <answer> tags) and the question as the user turn."""

    def transform_fn(example: dict, tokenizer=None) -> dict:
        entry = {key: example[key] for key in ROW_KEYS}
        prompt = [{"role": "system", "content": SYSTEM_PROMPTS["default"]}, {"role": "user", "content": entry["question"]}]
        return {"prompt": prompt, "entry": entry}

    return transform_fn, {"remove_columns": list(ROW_KEYS)}


@lru_cache(maxsize=None)
def _scorer(task: str) -> Callable[..., float]:
    return reasoning_gym.get_score_answer_fn(task)


def _text(completion: Any) -> str:
    """A completion string, or the content of the last message of a chat-form completion."""
    if isinstance(completion, list):
        return str(completion[-1].get("content") or "") if completion else ""
    return str(completion)


def answer_of(completion: Any) -> str:
    """The last <answer>...</answer> span, else the whole completion, stripped."""
    text = _text(completion)
    found = extract_answer(text, tag_name="answer")
    return found if found is not None else text.strip()


def score(completions: list, entry: list, **kwargs) -> list[float]:
    """reasoning-gym's scorer for each row's source dataset; a scorer that raises gives 0.0 for that completion."""
    scores = []
    for completion, row in zip(completions, entry):
        row = json.loads(row) if isinstance(row, str) else row
        score_answer = _scorer(row["metadata"]["source_dataset"])  # an unknown task is a data error, not a wrong answer
        try:
            scores.append(float(score_answer(answer=answer_of(completion), entry=row)))
        except Exception:  # noqa: BLE001 - one bad answer must not sink the batch
            scores.append(0.0)
    return scores


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write reasoning-gym tasks to a JSONL file, offline.")
    parser.add_argument("--task", required=True, help="a reasoning_gym dataset name, e.g. basic_arithmetic")
    parser.add_argument("--size", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--config", type=json.loads, default={}, help="the task's config as JSON")
    parser.add_argument("--non-negative", action="store_true", help="skip rows whose answer is negative")
    parser.add_argument("--exclude", type=Path, action="append", default=[], help="skip questions of this JSONL file")
    args = parser.parse_args(argv)
    excluded = {json.loads(line)["question"] for path in args.exclude for line in path.read_text().splitlines() if line.strip()}
    rows = list(generate(args.task, args.size, args.seed, args.config, args.non_negative, excluded))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} {args.task} rows to {args.output}")


if __name__ == "__main__":
    main()
