"""SFT's chat_template rows with Cosmos-RL's data keys: a conversation column, a dataset-level system prompt, prompt and
response columns as one exchange; the config rules on those keys; balance_dp_token."""

from __future__ import annotations

import json

import pytest

from rlft.data.formats.sft import resolve_sft_format
from rlft.data.prepare import tokenize_dataset
from rlft.data.tokenize import IGNORE, tokenize_record
from rlft.errors import DataError, NotImplementedYet
from rlft.train.unbuilt import refuse_unbuilt

EXCHANGE = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
SYSTEM = {"role": "system", "content": "Answer with a number."}


def chat_entry(**keys):
    return {"path": "x.jsonl", "type": "chat_template", **keys}


def convert(cfg, tok):
    return resolve_sft_format(cfg.datasets[0], cfg, 0, "datasets[0]", tok)


def test_the_system_prompt_leads_a_conversation_without_one(data_config, tok):
    cfg = data_config(chat_entry(field_messages="conversation", system_prompt=SYSTEM["content"]))
    record = convert(cfg, tok)({"conversation": EXCHANGE})
    assert record == {"messages": [SYSTEM, *EXCHANGE]}
    example = tokenize_record(record, tok, False, ["assistant"], "turn")
    rendered = tok.decode(example["input_ids"])
    assert rendered.startswith("<|im_start|>system\nAnswer with a number.<|im_end|>\n<|im_start|>user\n2+2?"), rendered
    trained = tok.decode([t for t, label in zip(example["input_ids"], example["labels"]) if label != IGNORE])
    assert trained == "4<|im_end|>"  # the system turn is context, never a target


def test_a_rows_own_system_turn_or_system_column_wins_over_the_system_prompt(data_config, tok):
    cfg = data_config(chat_entry(system_prompt="dataset's"))
    own = {"role": "system", "content": "row's"}
    assert convert(cfg, tok)({"messages": [own, *EXCHANGE]}) == {"messages": [own, *EXCHANGE]}
    assert convert(cfg, tok)({"messages": EXCHANGE, "system": "column's"})["messages"][0] == {"role": "system", "content": "column's"}
    assert convert(cfg, tok)({"messages": EXCHANGE, "system": None})["messages"][0] == {"role": "system", "content": "dataset's"}


def test_with_drop_system_message_the_system_prompt_replaces_the_rows_own(data_config, tok):
    cfg = data_config(chat_entry(system_prompt="dataset's", drop_system_message=True))
    row = {"messages": [{"role": "system", "content": "row's"}, *EXCHANGE], "system": "column's"}
    assert convert(cfg, tok)(row) == {"messages": [{"role": "system", "content": "dataset's"}, *EXCHANGE]}


def test_without_a_system_prompt_nothing_is_added(data_config, tok):
    cfg = data_config(chat_entry(system_prompt=""))  # Cosmos-RL's default: no system prompt
    assert convert(cfg, tok)({"messages": EXCHANGE}) == {"messages": EXCHANGE}


def test_prompt_and_response_columns_are_one_exchange(data_config, tok):
    cfg = data_config(chat_entry(field_prompt="question", field_response="answer", system_prompt=SYSTEM["content"]))
    assert convert(cfg, tok)({"question": "2+2?", "answer": "4", "other": 1}) == {"messages": [SYSTEM, *EXCHANGE]}


def test_prompt_and_response_columns_may_hold_message_lists_read_as_field_messages_is(data_config, tok):
    cfg = data_config(chat_entry(field_prompt="context", field_response="reply", message_property_mappings={"role": "from", "content": "value"}))
    row = {"context": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "hi"}],
           "reply": [{"from": "gpt", "value": "yo"}]}
    assert convert(cfg, tok)(row) == {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                                                   {"role": "assistant", "content": "yo"}]}


@pytest.mark.parametrize("keys, row, message", [
    ({"field_messages": "conversation"}, {"conversations": EXCHANGE}, r"missing field 'conversation' \(row has \['conversations'\]\)"),
    ({"field_prompt": "question", "field_response": "answer"}, {"prompt": "2+2?", "answer": "4"},
     r"missing field 'question' \(row has \['answer', 'prompt'\]\)"),
    ({"field_prompt": "question", "field_response": "answer"}, {"question": "2+2?", "answer": 4},
     r"field 'answer' holds 4: expected the assistant's text or a list of messages"),
    ({"field_prompt": "question", "field_response": "answer"}, {"question": [{"role": "user"}], "answer": "4"},
     r"question\[0\] lacks key 'content'"),
])
def test_a_bad_column_stops_the_run_naming_the_dataset_row_and_field(tmp_path, data_config, tok, keys, row, message):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    cfg = data_config({"path": str(path), "type": "chat_template", **keys})
    with pytest.raises(DataError, match=rf"^datasets\[0\] \({path}\), line 1: {message}"):
        tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")


@pytest.mark.parametrize("keys, top, message", [
    ({"field_prompt": "q"}, {}, "datasets[0]: field_prompt and field_response go together"),
    ({"field_response": "a"}, {}, "datasets[0]: field_prompt and field_response go together"),
    ({"field_prompt": "q", "field_response": "a", "field_messages": "chat"}, {},
     "datasets[0]: field_messages and field_prompt / field_response both say where the conversation is"),
    ({"system_prompt": "s", "type": "alpaca"}, {},
     "datasets[0]: system_prompt is read by type: chat_template, and this entry has type: alpaca: set type: chat_template"),
    ({"system_prompt": "s", "type": None}, {}, "this entry has type: none"),
    ({"system_prompt": "s", "type": {"field_instruction": "q"}}, {},
     "type: a user-defined mapping (a mapping takes its own system_prompt inside `type:`)"),
    ({"system_prompt": "s"}, {"rl": "dpo"}, "datasets[0]: system_prompt belongs to SFT's chat_template rows, and dpo reads"),
])
def test_the_conversation_keys_are_checked_with_the_config(config_problems, keys, top, message):
    problems = config_problems(datasets=[chat_entry(**keys)], **top)
    assert any(message in what for _, what in problems), problems


def test_test_datasets_are_checked_too(config_problems):
    problems = config_problems(test_datasets=[chat_entry(field_response="a")])
    assert any(what.startswith("test_datasets[0]: field_prompt and field_response go together") for _, what in problems)


def test_balance_dp_token_true_is_how_rlft_trains_and_false_is_refused(config):
    refuse_unbuilt(config(balance_dp_token=True))  # nothing to refuse
    with pytest.raises(NotImplementedYet, match=r"balance_dp_token \(not built: balance_dp_token: false, each rank's own"):
        refuse_unbuilt(config(balance_dp_token=False))


def test_rows_without_a_type_read_their_messages_with_one_reader_built_once(data_config, tok, monkeypatch):
    """The message reader (role names, key mappings) is built once per dataset, not again for every row."""
    import rlft.data.formats.sft as sft
    from rlft.data.formats.rows import chat_template_format

    built = []
    monkeypatch.setattr(sft, "chat_template_format", lambda *a: built.append(a) or chat_template_format(*a))
    cfg = data_config({"path": "rows.jsonl", "roles": {"assistant": ["bot"]}})
    read = convert(cfg, tok)
    records = [read({"messages": [{"role": "user", "content": f"{i}+{i}?"}, {"role": "bot", "content": str(2 * i)}]})
               for i in range(3)]
    assert len(built) == 1 and records[2]["messages"][1] == {"role": "assistant", "content": "4"}
