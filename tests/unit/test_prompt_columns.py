"""field_prompt and field_response on GRPO prompt datasets (Cosmos-RL's prompt_column_name and response_column_name):
the prompt's and the reference answer's columns, read as `prompt` and `answer`."""

from __future__ import annotations

import pytest

from rlft.config.loading import build_config
from rlft.data.formats.rows import RowError
from rlft.data.prompts import resolve_prompt_format
from rlft.errors import ConfigError

BASE = {"base_model": "./model", "rl": "grpo", "micro_batch_size": 8, "trl": {"reward_funcs": ["boxed_math"]}}


def config(**entry):
    return build_config({**BASE, "datasets": [{"path": "math.jsonl", **entry}]})


def test_the_columns_are_read_as_prompt_and_answer():
    cfg = config(field_prompt="question", field_response="solution")
    convert = resolve_prompt_format(cfg.datasets[0], cfg, 0, "datasets[0]", tokenizer=None)
    record = convert({"question": "1+1=", "solution": "2", "level": 1})
    assert record == {"question": "1+1=", "solution": "2", "level": 1, "prompt": "1+1=", "answer": "2"}
    only_prompt = resolve_prompt_format(config(field_prompt="question").datasets[0], cfg, 0, "datasets[0]", None)
    assert only_prompt({"question": "q", "answer": "a"}) == {"question": "q", "answer": "a", "prompt": "q"}


def test_a_missing_column_names_itself():
    cfg = config(field_response="solution")
    convert = resolve_prompt_format(cfg.datasets[0], cfg, 0, "datasets[0]", tokenizer=None)
    with pytest.raises(RowError, match="no column 'solution' \\(field_response; the row has"):
        convert({"prompt": "1+1=", "answer": "2"})


@pytest.mark.parametrize("entry,words", [
    ({"field_prompt": "question", "type": "chat_template"}, "remove the type"),
    ({"system_prompt": "Be brief."}, "system_prompt belongs to SFT's chat_template rows"),
])
def test_what_grpo_rows_do_not_read_is_refused(entry, words):
    with pytest.raises(ConfigError, match=words):
        config(**entry)
    validation = {"enable": True, "datasets": [{"path": "val.jsonl", **entry}]}  # validation prompts are read the same way
    with pytest.raises(ConfigError, match=f"validation.datasets\\[0\\]: .*{words}"):
        build_config({**BASE, "datasets": [{"path": "math.jsonl"}], "validation": validation})
