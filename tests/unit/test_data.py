"""Data: loading every kind of source, row formats, label masks, bad rows, length handling, eval splits."""

from __future__ import annotations

import json
import sys

import pytest
from datasets import Dataset, DatasetDict

from rlft.data.formats.sft import resolve_sft_format
from rlft.data.loading import load_rows, unpack
from rlft.data.prepare import prepare_sft_data, tokenize_dataset
from rlft.data.tokenize import IGNORE, tokenize_record
from rlft.data.formats.rows import RowError
from rlft.errors import DataError

ROWS = [{"n": i, "text": f"row {i}"} for i in range(10)]
CHAT = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello there"},
    {"role": "user", "content": "what is 2+2?"},
    {"role": "assistant", "content": "four"},
]


def entry(data_config, **dataset):
    """The validated DatasetConfig of a one-dataset config."""
    return data_config(dataset).datasets[0]


def column(rows, name: str) -> list:
    """One field of every loaded row, as its user wrote it."""
    return [unpack(row)[1][name] for row in rows]


def trained_text(example, tok) -> str:
    return tok.decode([token for token, label in zip(example["input_ids"], example["labels"]) if label != IGNORE])


# ---------------------------------------------------------------- loading


def test_load_jsonl_file(write_jsonl, data_config):
    rows = load_rows(entry(data_config, path=str(write_jsonl(ROWS, "a.jsonl"))), 0)
    assert column(rows, "n") == list(range(10))
    assert unpack(rows[3]) == ("line 4", {"n": 3, "text": "row 3"})


def test_load_json_array_file(tmp_path, data_config):
    path = tmp_path / "a.json"
    path.write_text(json.dumps(ROWS))
    assert column(load_rows(entry(data_config, path=str(path)), 0), "n") == list(range(10))


def test_load_csv_file(tmp_path, data_config):
    path = tmp_path / "a.csv"
    path.write_text("n,text\n" + "".join(f"{r['n']},{r['text']}\n" for r in ROWS))
    rows = load_rows(entry(data_config, path=str(path)), 0)
    assert column(rows, "text") == [r["text"] for r in ROWS]


def test_load_parquet_file(tmp_path, data_config):
    path = tmp_path / "a.parquet"
    Dataset.from_list(ROWS).to_parquet(str(path))
    assert column(load_rows(entry(data_config, path=str(path)), 0), "n") == list(range(10))


def test_load_folder_of_jsonl_files(tmp_path, data_config):
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / "part-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS[:4]))
    (folder / "part-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS[4:]))
    assert sorted(column(load_rows(entry(data_config, path=str(folder)), 0), "n")) == list(range(10))


def test_load_saved_dataset(tmp_path, data_config):
    Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    assert column(load_rows(entry(data_config, path=str(tmp_path / "saved")), 0), "n") == list(range(10))


def test_load_saved_dataset_dict_named_split(tmp_path, data_config):
    DatasetDict({"train": Dataset.from_list(ROWS), "test": Dataset.from_list(ROWS[:2])}).save_to_disk(str(tmp_path / "dd"))
    assert column(load_rows(entry(data_config, path=str(tmp_path / "dd"), split="test"), 0), "n") == [0, 1]
    assert len(load_rows(entry(data_config, path=str(tmp_path / "dd")), 0)) == 10


def test_load_saved_dataset_dict_unknown_split(tmp_path, data_config):
    DatasetDict({"train": Dataset.from_list(ROWS)}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError, match=r"saved dataset has splits \['train'\], not 'validation'"):
        load_rows(entry(data_config, path=str(tmp_path / "dd"), split="validation"), 0)


def test_load_data_files_relative_to_cwd(tmp_path, monkeypatch, write_jsonl, data_config):
    write_jsonl(ROWS, "rel.jsonl")
    monkeypatch.chdir(tmp_path)
    assert len(load_rows(entry(data_config, data_files="rel.jsonl"), 0)) == 10


def test_load_ds_type_overrides_extension(tmp_path, data_config):
    path = tmp_path / "rows.data"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert len(load_rows(entry(data_config, path=str(path), ds_type="jsonl"), 0)) == 10


@pytest.mark.parametrize(
    "split, expected",
    [("train[:3]", [0, 1, 2]), ("train[2:5]", [2, 3, 4]), ("train[:50%]", [0, 1, 2, 3, 4]), ("train[-2:]", [8, 9])],
)
def test_split_slices(write_jsonl, data_config, split, expected):
    assert column(load_rows(entry(data_config, path=str(write_jsonl(ROWS)), split=split), 0), "n") == expected


def test_missing_data_file_names_path(tmp_path, monkeypatch, data_config):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as caught:
        load_rows(entry(data_config, data_files="missing.jsonl"), 0)
    assert str(caught.value).startswith("datasets[0] (missing.jsonl): file not found: missing.jsonl")
    assert str(tmp_path) in str(caught.value)


def test_missing_absolute_path_names_path(tmp_path, data_config):
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(DataError, match=f"{missing} does not exist"):
        load_rows(entry(data_config, path=str(missing)), 0)


def test_unknown_extension_without_ds_type(tmp_path, data_config):
    path = tmp_path / "rows.data"
    path.write_text(json.dumps(ROWS[0]) + "\n")
    with pytest.raises(DataError, match=r"cannot infer the file format of \['.data'\]: set ds_type"):
        load_rows(entry(data_config, path=str(path)), 0)


def test_nonexistent_relative_path(tmp_path, monkeypatch, data_config):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=r"datasets\[0\] \(\./x\): \./x does not exist"):
        load_rows(entry(data_config, path="./x"), 0)


def test_hub_id_offline(monkeypatch, data_config):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match=r"'org/some-dataset' is not a local file or folder, and the hub is off"):
        load_rows(entry(data_config, path="org/some-dataset"), 0)


def test_empty_jsonl_file(tmp_path, data_config):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(DataError, match=f"datasets\\[0\\] \\({path}\\)"):
        load_rows(entry(data_config, path=str(path)), 0)


def test_header_only_csv_names_path(tmp_path, data_config):
    path = tmp_path / "header.csv"
    path.write_text("prompt,completion\n")
    with pytest.raises(DataError, match=f"datasets\\[0\\] \\({path}\\): cannot read {path} as csv"):
        load_rows(entry(data_config, path=str(path)), 0)


def test_empty_saved_dataset(tmp_path, data_config):
    path = tmp_path / "empty-saved"
    Dataset.from_dict({"text": []}).save_to_disk(str(path))
    with pytest.raises(DataError, match=f"datasets\\[0\\] \\({path}\\): cannot read saved dataset"):
        load_rows(entry(data_config, path=str(path)), 0)


@pytest.mark.parametrize(
    "split, message",
    [("train[5]", r"split slice \[5\] needs a colon"), ("train[a:b]", r"bad slice bound 'a' in \[a:b\]"), ("train[[", "is not understood")],
)
def test_bad_slice(write_jsonl, data_config, split, message):
    with pytest.raises(DataError, match=message):
        load_rows(entry(data_config, path=str(write_jsonl(ROWS)), split=split), 0)


# ---------------------------------------------------------------- strict rows: the user's values, the user's lines


def _tokenize_file(tmp_path, data_config, tok, content: bytes | str, name: str = "rows.jsonl", **dataset):
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    cfg = data_config({"path": str(path), **dataset})
    return path, cfg


@pytest.mark.parametrize(
    "row, dataset, message",
    [
        ({"instruction": ["a", "b"], "output": "x"}, {"type": "alpaca"}, r"field 'instruction' is a list \(\['a', 'b'\]\), expected text"),
        ({"instruction": "a", "output": {"t": 1}}, {"type": "alpaca"}, r"field 'output' is a mapping"),
        ({"instruction": "a", "input": 3, "output": "x"}, {"type": "alpaca"}, r"field 'input' is a number \(3\)"),
        ({"text": 5}, {"type": "completion"}, r"field 'text' is a number \(5\), expected text"),
        ({"prompt": "p", "completion": True}, {}, r"field 'completion' is a boolean"),
        ({"messages": [{"role": "user", "content": {"a": 1}}]}, {"type": "chat_template"}, r"field 'messages\[0\]\.content' is a mapping"),
        ({"messages": [{"role": ["user"], "content": "a"}]}, {"type": "chat_template"}, r"field 'messages\[0\]\.role' is a list"),
    ],
)
def test_a_field_of_the_wrong_type_names_line_and_field(tmp_path, data_config, tok, row, dataset, message):
    good = {"instruction": "q", "output": "a", "text": "t", "prompt": "p", "completion": "c",
            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    content = json.dumps(good) + "\n\n" + json.dumps(row) + "\n"  # a blank line: line numbers are the file's
    path, cfg = _tokenize_file(tmp_path, data_config, tok, content, **dataset)
    with pytest.raises(DataError, match=rf"^datasets\[0\] \({path}\), line 3: {message}"):
        tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")


def test_a_column_of_mixed_types_is_never_stringified(tmp_path, data_config, tok):
    """datasets would type the column from the whole file (or cast 7 to "7"); the user's values stay as written."""
    rows = [{"text": f"row {i}"} for i in range(5)] + [{"text": 7}]
    path, cfg = _tokenize_file(tmp_path, data_config, tok, "".join(json.dumps(r) + "\n" for r in rows), type="completion")
    with pytest.raises(DataError, match=r"line 6: field 'text' is a number \(7\), expected text"):
        tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")


def test_rows_with_different_nested_shapes_load(tmp_path, data_config, tok):
    """A column that is a string in one row and a message list in another is a whole-file arrow error in datasets."""
    rows = [{"prompt": "p1", "completion": "c1"}, {"messages": CHAT}, {"prompt": "p2", "completion": "c2", "meta": {"a": [1]}}]
    path, cfg = _tokenize_file(tmp_path, data_config, tok, "".join(json.dumps(r) + "\n" for r in rows))
    examples, report = tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")
    assert report.kept == 3 and trained_text(examples[0], tok) == "c1<|im_end|>"


def test_non_utf8_bytes_name_the_line(tmp_path, data_config, tok):
    content = b'{"text": "fine"}\n{"text": "caf\xe9"}\n'
    path, cfg = _tokenize_file(tmp_path, data_config, tok, content, type="completion")
    with pytest.raises(DataError, match=rf"\): {path.name} line 2 is not UTF-8 \(byte 0xe9 at column 14\): save the file as UTF-8"):
        tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")


@pytest.mark.parametrize(
    "line, message",
    [('["a", "b"]', r"line 2 is list \[\"a\", \"b\"\], not an object with the row's fields"),
     ('"just text"', r"line 2 is str"),
     ('{"text": "unterminated', r"line 2 is not valid JSON: Unterminated string"),
     ("{'text': 'single quotes'}", r"line 2 is not valid JSON: Expecting property name")],
)
def test_a_jsonl_line_that_is_not_an_object_names_its_line(tmp_path, data_config, tok, line, message):
    path, cfg = _tokenize_file(tmp_path, data_config, tok, '{"text": "fine"}\n' + line + "\n", type="completion")
    with pytest.raises(DataError, match=rf"^datasets\[0\] \({path}\): {path.name} {message}"):
        load_rows(cfg.datasets[0], 0)


def test_json_array_elements_are_named(tmp_path, data_config, tok):
    path, cfg = _tokenize_file(tmp_path, data_config, tok, json.dumps([{"text": "a"}, {"text": ["b"]}]), name="rows.json",
                               type="completion")
    with pytest.raises(DataError, match=r"element 1: field 'text' is a list"):
        tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")
    path.write_text('[{"text": "a"}, 3]')
    with pytest.raises(DataError, match=r"element 1 is int 3, not an object"):
        load_rows(cfg.datasets[0], 0)


def test_a_json_file_holding_json_lines_is_read_as_lines(tmp_path, data_config, tok):
    path, cfg = _tokenize_file(tmp_path, data_config, tok, '{"text": "a"}\n{"text": "b"}\n', name="rows.json", type="completion")
    assert [unpack(row) for row in load_rows(cfg.datasets[0], 0)] == [("line 1", {"text": "a"}), ("line 2", {"text": "b"})]


def test_the_line_is_named_after_a_split_slice(tmp_path, data_config, tok):
    rows = [{"text": f"r{i}"} for i in range(6)] + [{"text": None}]
    path, cfg = _tokenize_file(tmp_path, data_config, tok, "".join(json.dumps(r) + "\n" for r in rows), type="completion",
                               split="train[4:]")
    with pytest.raises(DataError, match=r"line 7: missing field 'text'"):
        tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")


def test_rows_of_other_sources_are_numbered_from_one(tmp_path, data_config, tok):
    Dataset.from_list([{"text": "a"}, {"text": ""}, {"text": None}]).save_to_disk(str(tmp_path / "saved"))
    cfg = data_config({"path": str(tmp_path / "saved"), "type": "completion"})
    with pytest.raises(DataError, match=r"row 3: missing field 'text'"):
        tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")


# ---------------------------------------------------------------- formats


def convert(cfg, tok, index=0):
    return resolve_sft_format(cfg.datasets[index], cfg, index, f"datasets[{index}]", tok)


def test_chat_template_property_mappings_and_roles(data_config, tok):
    cfg = data_config(
        {
            "path": "x.jsonl",
            "type": "chat_template",
            "field_messages": "conversations",
            "message_property_mappings": {"role": "from", "content": "value"},
            "roles": {"assistant": ["gpt"], "user": ["human"]},
        }
    )
    row = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
    assert convert(cfg, tok)(row) == {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}


def test_chat_template_dotted_field_messages(data_config, tok):
    cfg = data_config({"path": "x.jsonl", "type": "chat_template", "field_messages": "responses_create_params.input"})
    row = {"responses_create_params": {"input": [{"role": "user", "content": "q"}], "tools": []}}
    assert convert(cfg, tok)(row) == {"messages": [{"role": "user", "content": "q"}]}


def test_chat_template_drop_system_message(data_config, tok):
    cfg = data_config({"path": "x.jsonl", "type": "chat_template", "drop_system_message": True})
    row = {"messages": [{"role": "system", "content": "be brief"}, *CHAT[:2]]}
    assert convert(cfg, tok)(row) == {"messages": CHAT[:2]}


def test_chat_template_keeps_system_message_by_default(data_config, tok):
    cfg = data_config({"path": "x.jsonl", "type": "chat_template"})
    row = {"messages": [{"role": "system", "content": "be brief"}, *CHAT[:2]]}
    assert convert(cfg, tok)(row)["messages"][0] == {"role": "system", "content": "be brief"}


def test_alpaca_format_tokenised(write_jsonl, data_config, tok):
    path = write_jsonl([{"instruction": "Add 2 and 3", "input": "", "output": "5"}])
    cfg = data_config({"path": str(path), "type": "alpaca"})
    [example], report = tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")
    full = tok.decode(example["input_ids"])
    assert "### Instruction:\nAdd 2 and 3\n\n### Response:\n5<|im_end|>" in full
    assert "### Input:" not in full
    assert trained_text(example, tok) == "5<|im_end|>"
    assert report.kept == 1


def test_alpaca_with_input(data_config, tok):
    cfg = data_config({"path": "x.jsonl", "type": "alpaca"})
    record = convert(cfg, tok)({"instruction": "Sum", "input": "2 3", "output": "5"})
    assert record["prompt"].endswith("### Instruction:\nSum\n\n### Input:\n2 3\n\n### Response:\n")
    assert record["completion"] == "5"


def test_completion_format_custom_field(write_jsonl, data_config, tok):
    path = write_jsonl([{"body": "abc", "text": "ignored"}])
    cfg = data_config({"path": str(path), "type": "completion", "field": "body"})
    [example], _ = tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")
    assert tok.decode(example["input_ids"]) == "abc<|im_end|>"
    assert example["labels"] == example["input_ids"]


def test_completion_format_default_field_text(data_config, tok):
    cfg = data_config({"path": "x.jsonl", "type": "completion"})
    assert convert(cfg, tok)({"text": "hello"}) == {"text": "hello"}


def test_no_type_prompt_completion_columns(data_config, tok):
    cfg = data_config({"path": "x.jsonl"})
    assert convert(cfg, tok)({"prompt": "P", "completion": "C", "extra": 1}) == {"prompt": "P", "completion": "C"}


def test_no_type_row_without_known_columns(data_config, tok):
    cfg = data_config({"path": "x.jsonl"})
    with pytest.raises(Exception, match="no `type:` set and the row has none of"):
        convert(cfg, tok)({"question": "q"})


def test_user_defined_mapping_type(data_config, tok):
    spec = {"field_instruction": "q", "field_output": "a", "no_input_format": "Q: {instruction}\nA: ", "format": "Q: {instruction} ({input})\nA: "}
    cfg = data_config({"path": "x.jsonl", "type": spec})
    assert convert(cfg, tok)({"q": "2+2", "a": "4"}) == {"prompt": "Q: 2+2\nA: ", "completion": "4"}
    assert convert(cfg, tok)({"q": "2+2", "input": "base 10", "a": "4"}) == {"prompt": "Q: 2+2 (base 10)\nA: ", "completion": "4"}


def test_user_defined_mapping_system_prompt(data_config, tok):
    spec = {"field_instruction": "q", "field_output": "a", "system_prompt": "SYS", "system_format": "[{system}] "}
    cfg = data_config({"path": "x.jsonl", "type": spec})
    assert convert(cfg, tok)({"q": "hi", "a": "yo"}) == {"prompt": "[SYS] hi ", "completion": "yo"}


@pytest.mark.parametrize("fmt", ["Q: {question}\nA: ", "Q: {instruction} {\nA: ", "{0}"])
def test_a_user_defined_format_that_cannot_be_filled_says_why(data_config, tok, fmt):
    spec = {"field_instruction": "q", "field_output": "a", "no_input_format": fmt}
    with pytest.raises(RowError, match=r"cannot be filled .*placeholders are \{instruction\}, \{input\} and \{system\}"):
        convert(data_config({"path": "x.jsonl", "type": spec}), tok)({"q": "hi", "a": "yo"})


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Write `name.py` into a cwd of its own; sys.path and sys.modules are restored afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    written = []

    def write(name: str, source: str) -> None:
        (tmp_path / f"{name}.py").write_text(source)
        written.append(name)

    yield write
    for name in written:
        sys.modules.pop(name, None)


def test_user_transform_module_fn(user_module, write_jsonl, data_config, tok):
    user_module(
        "rlft_unit_xform_a",
        "def fn(cfg, dataset_idx=0, **kw):\n"
        "    def transform(row):\n"
        "        return {'prompt': 'Q' + row['q'], 'completion': row['a'] + str(dataset_idx)}\n"
        "    return transform, {}\n",
    )
    path = write_jsonl([{"q": "1", "a": "x"}])
    cfg = data_config({"path": str(path), "type": "rlft_unit_xform_a.fn"})
    [example], _ = tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")
    assert tok.decode(example["input_ids"]) == "Q1x0<|im_end|>"
    assert trained_text(example, tok) == "x0<|im_end|>"


def test_user_transform_receives_tokenizer(user_module, data_config, tok):
    user_module(
        "rlft_unit_xform_b",
        "def fn(cfg, dataset_idx=0, **kw):\n"
        "    def transform(row, tokenizer):\n"
        "        return {'prompt': row['q'], 'completion': tokenizer.eos_token + str(len(tokenizer))}\n"
        "    return transform\n",
    )
    cfg = data_config({"path": "x.jsonl", "type": "rlft_unit_xform_b.fn"})
    assert convert(cfg, tok)({"q": "Q"}) == {"prompt": "Q", "completion": "<|im_end|>260"}


def test_user_transform_missing_function(user_module, data_config, tok):
    user_module("rlft_unit_xform_c", "def other(cfg, dataset_idx=0):\n    return lambda row: row\n")
    cfg = data_config({"path": "x.jsonl", "type": "rlft_unit_xform_c.fn"})
    with pytest.raises(DataError, match="module rlft_unit_xform_c .* has no function 'fn'"):
        convert(cfg, tok)


def test_unknown_type_lists_formats(tmp_path, monkeypatch, data_config, tok):
    monkeypatch.chdir(tmp_path)
    cfg = data_config({"path": "x.jsonl", "type": "nosuchmodule_rlft.fn"})
    with pytest.raises(DataError, match=r"datasets\[0\]: unknown type 'nosuchmodule_rlft.fn': SFT formats are alpaca, chat_template"):
        convert(cfg, tok)


# ---------------------------------------------------------------- label masks


def test_chat_trains_assistant_turns_and_their_end_of_turn(tok):
    example = tokenize_record({"messages": CHAT}, tok, False, ["assistant"], "turn")
    assert trained_text(example, tok) == "hello there<|im_end|>four<|im_end|>"


def test_chat_train_on_eos_none(tok):
    example = tokenize_record({"messages": CHAT}, tok, False, ["assistant"], "none")
    assert trained_text(example, tok) == "hello therefour"


def test_chat_train_on_eos_last(tok):
    example = tokenize_record({"messages": CHAT}, tok, False, ["assistant"], "last")
    assert trained_text(example, tok) == "hello therefour<|im_end|>"


def test_chat_train_on_eos_all(tok):
    example = tokenize_record({"messages": CHAT}, tok, False, ["assistant"], "all")
    assert trained_text(example, tok) == "<|im_end|>hello there<|im_end|><|im_end|>four<|im_end|>"


def test_chat_roles_to_train_user(tok):
    example = tokenize_record({"messages": CHAT}, tok, False, ["user"], "turn")
    assert trained_text(example, tok) == "hi<|im_end|>what is 2+2?<|im_end|>"


def test_chat_train_on_inputs_trains_every_token(tok):
    example = tokenize_record({"messages": CHAT}, tok, True, ["assistant"], "turn")
    assert example["labels"] == example["input_ids"]
    assert tok.decode(example["input_ids"]) == tok.apply_chat_template(CHAT, tokenize=False)


def trained_positions(example) -> list[int]:
    return [i for i, label in enumerate(example["labels"]) if label != IGNORE]


def test_chat_repeated_content_masks_the_right_turn(tok):
    messages = [{"role": "user", "content": "ok"}, {"role": "assistant", "content": "ok"}]
    example = tokenize_record({"messages": messages}, tok, False, ["assistant"], "turn")
    n = len(example["input_ids"])  # ... o k <|im_end|> \n: the assistant's "ok", not the user's
    assert trained_positions(example) == [n - 4, n - 3, n - 2]


@pytest.mark.parametrize("answer", ["a", "t", "start"])
def test_chat_answer_that_occurs_in_the_turn_header_is_trained(tok, answer):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": answer}]
    example = tokenize_record({"messages": messages}, tok, False, ["assistant"], "turn")
    assert trained_text(example, tok) == answer + "<|im_end|>"


def test_chat_answer_equal_to_role_name_trains_the_content(tok):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "assistant"}]
    example = tokenize_record({"messages": messages}, tok, False, ["assistant"], "turn")
    n = len(example["input_ids"])  # ... assistant \n assistant <|im_end|> \n
    assert trained_positions(example) == list(range(n - 11, n - 1))


def test_prompt_completion_masks_prompt(tok):
    example = tokenize_record({"prompt": "Q: 1+1\nA: ", "completion": "2"}, tok, False, ["assistant"], "turn")
    prompt_len = len("Q: 1+1\nA: ")
    assert example["labels"][:prompt_len] == [IGNORE] * prompt_len
    assert trained_text(example, tok) == "2<|im_end|>"
    assert example["input_ids"][-1] == tok.eos_token_id


def test_prompt_completion_train_on_inputs(tok):
    example = tokenize_record({"prompt": "Q", "completion": "A"}, tok, True, ["assistant"], "turn")
    assert example["labels"] == example["input_ids"]


# ---------------------------------------------------------------- bad rows and lengths


def test_bad_row_names_dataset_row_and_field(write_jsonl, data_config, tok):
    rows = [{"instruction": "a", "output": "b"}, {"instruction": "c", "output": "d"}, {"instruction": "e"}]
    path = write_jsonl(rows)
    cfg = data_config({"path": str(path), "type": "alpaca"})
    with pytest.raises(DataError) as caught:
        tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")
    message = str(caught.value)
    assert message.startswith(f"datasets[0] ({path}), line 3: missing field 'output'")


def test_bad_chat_message_names_turn_and_key(write_jsonl, data_config, tok):
    path = write_jsonl([{"messages": [{"role": "user", "content": "a"}]}, {"messages": [{"role": "user", "text": "b"}]}])
    cfg = data_config({"path": str(path), "type": "chat_template"})
    with pytest.raises(DataError, match=r"line 2: messages\[0\] lacks key 'content'"):
        tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")


LENGTH_ROWS = [{"text": "a" * 4}, {"text": "b" * 20}, {"text": "c" * 7}, {"text": "d" * 30}]  # 5, 21, 8, 31 tokens with EOS


def test_excess_length_drop(write_jsonl, data_config, tok):
    cfg = data_config({"path": str(write_jsonl(LENGTH_ROWS)), "type": "completion"}, sequence_len=10)
    examples, report = tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")
    assert (report.rows, report.kept, report.dropped_too_long, report.truncated) == (4, 2, 2, 0)
    assert [len(e["input_ids"]) for e in examples] == [5, 8]


def test_excess_length_truncate(write_jsonl, data_config, tok):
    cfg = data_config({"path": str(write_jsonl(LENGTH_ROWS)), "type": "completion"}, sequence_len=10, excess_length_strategy="truncate")
    examples, report = tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")
    assert (report.kept, report.dropped_too_long, report.truncated) == (4, 0, 2)
    assert [len(e["input_ids"]) for e in examples] == [5, 10, 8, 10]
    assert tok.decode(examples[1]["input_ids"]) == "b" * 10


def test_excess_length_raise_names_row(write_jsonl, data_config, tok):
    path = write_jsonl(LENGTH_ROWS)
    cfg = data_config({"path": str(path), "type": "completion"}, sequence_len=10, excess_length_strategy="raise")
    with pytest.raises(DataError) as caught:
        tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")
    assert str(caught.value).startswith(f"datasets[0] ({path}), line 2: row has 21 tokens, more than sequence_len=10")


def test_rows_without_trained_tokens_are_counted(write_jsonl, data_config, tok):
    rows = [{"messages": [{"role": "user", "content": "only a question"}]}, {"messages": CHAT}]
    cfg = data_config({"path": str(write_jsonl(rows)), "type": "chat_template"})
    examples, report = tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")
    assert (report.kept, report.dropped_no_target) == (1, 1)
    assert len(examples) == 1


def test_everything_dropped_raises_mentioning_sequence_len(write_jsonl, data_config, tok):
    cfg = data_config({"path": str(write_jsonl(LENGTH_ROWS)), "type": "completion"}, sequence_len=4)
    with pytest.raises(DataError) as caught:
        prepare_sft_data(cfg, tok)
    message = str(caught.value)
    assert message.startswith("no training rows left after filtering")
    assert "4 too long" in message
    assert "sequence_len" in message


# ---------------------------------------------------------------- eval splits


TEN_ROWS = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(10)]


@pytest.mark.parametrize("val_set_size, train_rows, eval_rows", [(0.3, 7, 3), (0.2, 8, 2), (4, 6, 4), (0, 10, 0)])
def test_val_set_size_splits_exactly(write_jsonl, data_config, tok, val_set_size, train_rows, eval_rows):
    cfg = data_config({"path": str(write_jsonl(TEN_ROWS))}, val_set_size=val_set_size)
    data = prepare_sft_data(cfg, tok)
    assert (len(data.train), len(data.eval)) == (train_rows, eval_rows)


def test_val_set_size_holds_out_the_last_rows(write_jsonl, data_config, tok):
    """As Axolotl's `train_test_split(shuffle=False)` after its merge: with the merged rows kept in order, the eval
    rows are the last ones."""
    cfg = data_config({"path": str(write_jsonl(TEN_ROWS))}, val_set_size=0.3, shuffle_merged_datasets=False)
    data = prepare_sft_data(cfg, tok)
    assert [tok.decode(e["input_ids"]) for e in data.eval] == [f"p{i}c{i}<|im_end|>" for i in (7, 8, 9)]
    assert [tok.decode(e["input_ids"]) for e in data.train] == [f"p{i}c{i}<|im_end|>" for i in range(7)]


def test_val_set_size_too_large(write_jsonl, data_config, tok):
    cfg = data_config({"path": str(write_jsonl(TEN_ROWS))}, val_set_size=10)
    with pytest.raises(DataError, match="val_set_size=10.0 leaves no training rows out of 10"):
        prepare_sft_data(cfg, tok)


def test_test_datasets_used_for_eval(write_jsonl, data_config, tok):
    train = write_jsonl(TEN_ROWS, "train.jsonl")
    held_out = write_jsonl([{"prompt": "held", "completion": "out"}] * 3, "eval.jsonl")
    cfg = data_config({"path": str(train)}, test_datasets=[{"path": str(held_out)}])  # with val_set_size: refused
    data = prepare_sft_data(cfg, tok)
    assert (len(data.train), len(data.eval)) == (10, 3)
    assert all(tok.decode(e["input_ids"]) == "heldout<|im_end|>" for e in data.eval)
    assert [r.name for r in data.reports] == [f"datasets[0] ({train})", f"test_datasets[0] ({held_out})"]


def test_merged_datasets_shuffle_is_seeded(write_jsonl, data_config, tok):
    path = write_jsonl(TEN_ROWS)
    first = prepare_sft_data(data_config({"path": str(path)}, seed=1), tok).train
    again = prepare_sft_data(data_config({"path": str(path)}, seed=1), tok).train
    assert first == again
    assert sorted(tok.decode(e["input_ids"]) for e in first) == sorted(f"p{i}c{i}<|im_end|>" for i in range(10))


def test_dataset_num_proc_gives_the_same_examples_and_errors(tmp_path, data_config, tok):
    from rlft.data.prepare import tokenize_dataset

    rows = "".join(f'{{"prompt": "{i}+1=", "completion": "{i + 1}"}}\n' for i in range(40))
    path = tmp_path / "rows.jsonl"
    path.write_text(rows)
    results = []
    for procs in (None, 2):
        cfg = data_config({"path": str(path)}, dataset_num_proc=procs)
        results.append(tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")[0])
    assert results[0] == results[1] and len(results[0]) == 40
    path.write_text(rows + '{"prompt": "x"}\n')
    cfg = data_config({"path": str(path)}, dataset_num_proc=2)
    with pytest.raises(DataError, match=r"line 41: .*\(it has \['prompt'\]\)"):
        tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")


def test_json_rows_get_every_key_of_the_file_as_with_datasets(tmp_path, data_config, tok):
    """Transforms written for Axolotl read `row["input"]` on rows that lack it: null, as the datasets library gives."""
    path, cfg = _tokenize_file(tmp_path, data_config, tok, '{"a": "x"}\n{"b": [1]}\n')
    assert [unpack(row) for row in load_rows(cfg.datasets[0], 0)] == [("line 1", {"a": "x", "b": None}),
                                                                      ("line 2", {"a": None, "b": [1]})]


def test_a_user_transform_that_raises_names_the_line(user_module, tmp_path, data_config, tok):
    user_module("strict_tf", "def shape(cfg, dataset_idx=0):\n"
                             "    return lambda row: {'prompt': row['q'].upper(), 'completion': row['a']}\n")
    path, cfg = _tokenize_file(tmp_path, data_config, tok, '{"q": "x", "a": "y"}\n{"q": 3, "a": "z"}\n', type="strict_tf.shape")
    with pytest.raises(DataError, match=r"line 2: transform strict_tf.shape raised AttributeError: 'int' object has no attribute 'upper'"):
        tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")


@pytest.mark.parametrize("prompt, message", [
    ([{"role": "user"}], r"line 2: prompt\[0\] is not a message \(a mapping with role and content\)"),
    ([{"role": "user", "content": ["a"]}], r"line 2: field 'prompt\[0\]\.content' is a list"),
    ({"role": "user", "content": "q"}, r"line 2: field 'prompt' is a mapping"),
])
def test_grpo_prompts_of_the_wrong_shape_name_the_line(tmp_path, data_config, tok, prompt, message):
    from rlft.data.prepare import prompt_steps

    content = json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n" + json.dumps({"prompt": prompt, "answer": "2"}) + "\n"
    path, _ = _tokenize_file(tmp_path, data_config, tok, content)
    cfg = data_config({"path": str(path)}, rl="grpo", micro_batch_size=2, trl={"num_generations": 2, "reward_funcs": ["r.f"]})
    with pytest.raises(DataError, match=message):
        tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets", prompt_steps(cfg))


@pytest.mark.parametrize("prompt, message", [
    ("2+3?", r"line 2: field `prompt`: the prompt is a string \(rendered as one user message\), and continue_final_message"),
    ([{"role": "user", "content": "2+3?"}], r"line 2: field `prompt`: the prompt's last message is 'user', not 'assistant'"),
])
def test_continue_final_message_refuses_prompts_that_do_not_end_with_an_assistant_turn(tmp_path, data_config, tok, prompt,
                                                                                       message):
    """The first row ends with the assistant's started answer, which the model may continue; the second would have the
    model go on writing the user's words."""
    from rlft.data.prepare import prompt_steps

    started = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "It is"}]
    content = json.dumps({"prompt": started}) + "\n" + json.dumps({"prompt": prompt}) + "\n"
    path, _ = _tokenize_file(tmp_path, data_config, tok, content)
    cfg = data_config({"path": str(path)}, rl="grpo", micro_batch_size=2, trl={"num_generations": 2, "reward_funcs": ["r.f"]})
    steps = prompt_steps(cfg, {"continue_final_message": True, "add_generation_prompt": False}, chat=True)
    with pytest.raises(DataError, match=message):
        tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets", steps)
    path.write_text(json.dumps({"prompt": started}) + "\n")
    [example], _ = tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets", steps)
    assert tok.decode(example["prompt_ids"]).endswith("<|im_start|>assistant\nIt is")


def test_a_chat_template_that_rejects_a_row_names_the_line(tmp_path, data_config, tok):
    strict = "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system role') }}{% endif %}{{ m.content }}{% endfor %}"
    original = tok.chat_template
    tok.chat_template = strict
    try:
        rows = [{"messages": CHAT}, {"messages": [{"role": "system", "content": "s"}, *CHAT]}]
        path, cfg = _tokenize_file(tmp_path, data_config, tok, "".join(json.dumps(r) + "\n" for r in rows), type="chat_template")
        with pytest.raises(DataError, match=r"line 2: the chat template rejected the messages: no system role"):
            tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")
    finally:
        tok.chat_template = original


def test_dataset_exact_deduplication_keeps_the_first_of_identical_examples(tmp_path, data_config):
    """Axolotl's dataset_exact_deduplication: identical prepared examples once per split, and no eval example that is
    also a training example; without the key nothing is dropped."""
    from rlft.data.prepare import prepare_sft_data
    from rlft.data.tokenizer import byte_tokenizer

    rows = [{"prompt": "1+1=", "completion": "2"}, {"prompt": "2+2=", "completion": "4"},
            {"prompt": "1+1=", "completion": "2"}, {"prompt": "3+3=", "completion": "6"}]
    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    held.write_text("".join(json.dumps(r) + "\n" for r in [rows[1], {"prompt": "5+5=", "completion": "10"}] * 2))
    tok = byte_tokenizer()
    for dedup, sizes in ((True, (3, 1)), (False, (4, 4))):
        cfg = data_config({"path": str(train)}, test_datasets=[{"path": str(held)}], dataset_exact_deduplication=dedup,
                          shuffle_merged_datasets=False)
        data = prepare_sft_data(cfg, tok)
        assert (len(data.train), len(data.eval)) == sizes
    assert len({json.dumps(e, sort_keys=True) for e in data.train}) == 3
    dedup_cfg = data_config({"path": str(train)}, test_datasets=[{"path": str(held)}], dataset_exact_deduplication=True)
    report = prepare_sft_data(dedup_cfg, tok).reports[0]
    assert "1 duplicates of earlier training rows" in report.dropped_text()
    assert "3 eval rows repeating an earlier eval row or a training row" in report.dropped_text()


def _trained(template: str, messages: list[dict], train_on_eos: str = "turn") -> str:
    from rlft.data.tokenizer import apply_chat_template_setting, byte_tokenizer

    tokenizer = byte_tokenizer()
    apply_chat_template_setting(tokenizer, template, None)
    example = tokenize_record({"messages": messages}, tokenizer, False, ["assistant"], train_on_eos)
    return "".join(tokenizer.decode([i]) if label != IGNORE else "~" for i, label in zip(example["input_ids"], example["labels"]))


def test_chat_content_with_leading_or_trailing_whitespace_is_found_and_ends_with_its_marker():
    """Templates that render content as written (ChatML): a system prompt led by spaces, an answer led by blank lines
    (both stopped preparation: "cannot be located"), an answer ending in a newline (its <|im_end|> went untrained, so
    the model never learnt to stop after code); llama3 trims and is unchanged."""
    chat = [{"role": "system", "content": "  You are helpful."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "\n\nParis."}]
    assert _trained("chatml", chat).strip("~") == "\n\nParis.<|im_end|>"
    newline = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Paris.\n"}]
    assert _trained("chatml", newline).strip("~") == "Paris.\n<|im_end|>"
    assert _trained("llama3", [{"role": "user", "content": "  Hi"}, {"role": "assistant", "content": " Paris.\n"}]).strip("~") \
        == "Paris.<|eot_id|>"


def test_chat_reasoning_blocks_in_content_train_as_the_template_renders_them():
    """Qwen3's template re-renders a <think> block of the last answer and drops it from earlier ones: the last answer
    trains with its block, an earlier one without it (both stopped preparation)."""
    think = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>\nr\n</think>\n\nParis."}]
    assert _trained("qwen3", think).strip("~") == "<think>\nr\n</think>\n\nParis.<|im_end|>"
    turns = think + [{"role": "user", "content": "More"}, {"role": "assistant", "content": "<think>\ns\n</think>\n\nRome."}]
    assert [part for part in _trained("qwen3", turns).split("~") if part] == \
        ["Paris.<|im_end|>", "<think>\ns\n</think>\n\nRome.<|im_end|>"]


def test_a_template_that_drops_an_untrained_message_is_fine_and_a_trained_one_it_rewrites_is_an_error():
    from rlft.data.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    tokenizer.chat_template = ("{% for m in messages %}{% if m['role'] != 'system' %}<{{ m['role'] }}>"
                               "{{ m['content'] | upper }}</s>{% endif %}{% endfor %}")
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "HELLO"}]
    example = tokenize_record({"messages": chat}, tokenizer, False, ["assistant"], "turn", ["</s>"])
    assert "".join(tokenizer.decode([i]) for i, label in zip(example["input_ids"], example["labels"]) if label != IGNORE) \
        == "HELLO</s>"
    with pytest.raises(RowError, match=r"message 2 \(assistant\) cannot be located.*roles_to_train"):
        tokenize_record({"messages": chat[:2] + [{"role": "assistant", "content": "hello"}]}, tokenizer, False,
                        ["assistant"], "turn", ["</s>"])


def test_text_that_already_ends_with_eos_gets_no_second_one(tok):
    eos = tok.eos_token
    assert tokenize_record({"text": "abc" + eos}, tok, False, ["assistant"], "turn")["input_ids"].count(tok.eos_token_id) == 1
    pair = tokenize_record({"prompt": "1+1=", "completion": "2" + eos}, tok, False, ["assistant"], "turn")
    assert pair["labels"][-2:] != [tok.eos_token_id] * 2 and pair["labels"][-1] == tok.eos_token_id


def test_tool_calls_and_reasoning_fields_are_refused_not_dropped(data_config, tok):
    """Dropping them trained a tool-calling turn as an empty answer; the row's place and the field are named."""
    cfg = data_config({"path": "x.jsonl", "type": "chat_template"})
    for field, value in (("tool_calls", [{"type": "function", "function": {"name": "f", "arguments": {}}}]),
                         ("reasoning_content", "because")):
        row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, field: value}]}
        with pytest.raises(RowError, match=rf"messages\[1\]\.{field}: SFT rows keep each message's role and content only"):
            convert(cfg, tok)(row)
    convert(cfg, tok)({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x", "tool_calls": None}]})


def test_grpo_prompts_are_limited_only_where_the_config_sets_sequence_len(data_config):
    """Axolotl keeps every GRPO prompt whatever its length (its seed configs ask for 512-token completions with the
    default sequence_len of 512): with sequence_len unset, rlft keeps them too; set, a prompt may use sequence_len -
    max_completion_length tokens; skip_prepare_dataset keeps every prompt."""
    from rlft.config.settings.training import prompt_budget

    base = {"rl": "grpo", "micro_batch_size": 2, "trl": {"num_generations": 2, "reward_funcs": ["r.f"], "max_completion_length": 512}}
    assert prompt_budget(data_config({"path": "x.jsonl"}, **base)) is None
    assert prompt_budget(data_config({"path": "x.jsonl"}, **base, sequence_len=640)) == 128
    assert prompt_budget(data_config({"path": "x.jsonl"}, **base, sequence_len=512, skip_prepare_dataset=True)) is None


# ---------------------------------------------------------------- input_output (Axolotl's template-free format)

SEGMENTS = [{"text": "Q: 2+2?\n", "label": False}, {"text": "A: 4", "label": True}, {"text": "\n", "label": False},
            {"text": " done</s>", "label": True}]


@pytest.mark.parametrize("train_on_inputs", [False, True])
def test_input_output_trains_the_labelled_segments_as_written(write_jsonl, data_config, gpt2_tokenizer, train_on_inputs):
    """Each segment's text is tokenised alone, without BOS or EOS (the texts carry their own), and its tokens are
    trained where `label` is true, or everywhere with train_on_inputs (as Axolotl's RawInputOutputStrategy)."""
    cfg = data_config({"path": str(write_jsonl([{"segments": SEGMENTS}])), "type": "input_output"},
                      train_on_inputs=train_on_inputs, sequence_len=64)
    (example,) = prepare_sft_data(cfg, gpt2_tokenizer).train
    parts = [gpt2_tokenizer(s["text"], add_special_tokens=False)["input_ids"] for s in SEGMENTS]
    assert example["input_ids"] == [i for part in parts for i in part]
    expected = [i if s["label"] or train_on_inputs else IGNORE for s, part in zip(SEGMENTS, parts) for i in part]
    assert example["labels"] == expected
    assert gpt2_tokenizer.decode([i for i in example["labels"] if i != IGNORE]) == (
        "Q: 2+2?\nA: 4\n done</s>" if train_on_inputs else "A: 4 done</s>")


@pytest.mark.parametrize("row, message", [
    ({"text": "no segments"}, r"needs a non-empty `segments` list \(the row has \['text'\]\)"),
    ({"segments": []}, r"needs a non-empty `segments` list"),
    ({"segments": [{"text": "a"}]}, r"segments\[0\] must be \{\"text\": str, \"label\": true\|false\}, got \{'text': 'a'\}"),
    ({"segments": [{"text": "a", "label": True}, {"text": 3, "label": False}]}, r"segments\[1\] must be"),
    ({"segments": [{"text": "a", "label": "yes"}]}, r"segments\[0\] must be"),
    ({"segments": [{"text": "a", "label": 2}]}, r"segments\[0\] must be"),
    ({"segments": ["a"]}, r"segments\[0\] must be"),
    ({"segments": "a"}, r"needs a non-empty `segments` list"),
])
def test_a_malformed_input_output_row_names_its_line(write_jsonl, data_config, tok, row, message):
    cfg = data_config({"path": str(write_jsonl([{"segments": SEGMENTS}, row])), "type": "input_output"})
    with pytest.raises(DataError, match=r"line 2: (type: input_output )?" + message):
        tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")


def test_input_output_labels_of_one_and_zero_count_as_true_and_false(write_jsonl, data_config, tok):
    """Axolotl tests the label's truth, so rows written with 1 and 0 train there: they train the same here."""
    numbers = [{"text": s["text"], "label": int(s["label"])} for s in SEGMENTS]
    rows = [{"segments": SEGMENTS}, {"segments": numbers}]
    cfg = data_config({"path": str(write_jsonl(rows)), "type": "input_output"})
    examples, _ = tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")
    assert len(examples) == 2 and examples[0]["labels"] == examples[1]["labels"]


def test_an_input_output_row_with_no_trained_segment_is_dropped_and_counted(write_jsonl, data_config, tok):
    rows = [{"segments": SEGMENTS}, {"segments": [{"text": "only input", "label": False}]}]
    cfg = data_config({"path": str(write_jsonl(rows)), "type": "input_output"})
    examples, report = tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")
    assert len(examples) == 1 and report.dropped.get("no_target") == 1


def test_a_file_path_with_data_files_is_refused_not_half_read(write_jsonl, data_config):
    """data_files are read inside a folder `path`; beside a file path they would be ignored."""
    path = write_jsonl(ROWS)
    with pytest.raises(DataError, match=r"data_files are read inside a folder `path`, and .*rows.jsonl is a file"):
        load_rows(entry(data_config, path=str(path), data_files=["other.jsonl"]), 0)
    assert len(load_rows(entry(data_config, path=str(path), data_files=[str(path)]), 0)) == len(ROWS)  # the file itself


def test_a_tokenizer_without_a_chat_template_is_a_message_naming_the_row(tmp_path, data_config, tok):
    original = tok.chat_template
    tok.chat_template = None
    try:
        path, cfg = _tokenize_file(tmp_path, data_config, tok, json.dumps({"messages": CHAT}) + "\n", type="chat_template")
        with pytest.raises(DataError, match=r"line 1: the tokenizer has no chat template to render these messages: set "
                                            r"`chat_template: chatml`"):
            tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")
    finally:
        tok.chat_template = original


def test_a_prompt_column_that_is_not_plain_json_is_named(tmp_path, data_config, tok):
    """GRPO prompts carry every other column to the reward functions; a parquet timestamp is no JSON value."""
    import datetime

    import pandas as pd

    from rlft.data.prepare import prompt_steps

    path = tmp_path / "prompts.parquet"
    pd.DataFrame({"prompt": ["1+1=", "2+2="], "when": [datetime.datetime(2026, 1, 1)] * 2}).to_parquet(path)
    cfg = data_config({"path": str(path)}, rl="grpo", micro_batch_size=2, trl={"num_generations": 2, "reward_funcs": ["r.f"]})
    with pytest.raises(DataError, match=r"row 1: column when holds a value that is not plain JSON .*: drop it with a "
                                        r"transform's remove_columns"):
        tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets", prompt_steps(cfg))


def test_remove_columns_given_as_one_name_removes_that_column_only(workdir, tmp_path, data_config, tok):
    """datasets.map takes remove_columns as one name; a string must not be read as a set of substrings."""
    from rlft.data.prepare import prompt_steps

    workdir("shape", """
        def fn(cfg, dataset_idx=0):
            return (lambda row: {"prompt": row["question"]}), {"remove_columns": "question"}
    """)
    rows = [{"question": "1+1=", "q": 1, "ion": 2}]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = data_config({"path": str(path), "type": "shape.fn"}, rl="grpo", micro_batch_size=2,
                      trl={"num_generations": 2, "reward_funcs": ["r.f"]})
    [example], _ = tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets", prompt_steps(cfg))
    assert "question" not in example["columns"] and example["columns"]["q"] == 1 and example["columns"]["ion"] == 2


TOOL_TEMPLATE = ("{% if tools %}<tools>{% for t in tools %}{{ t.function.name }}({{ t.function.parameters | tojson }}){% endfor %}"
                 "</tools>{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


def test_chat_rows_take_the_system_and_tools_columns_as_axolotl_does(data_config, tok):
    """Axolotl's chat_template strategy puts a `system` column (field_system) before the messages unless they start
    with a system turn, and passes a `tools` column (field_tools) to the chat template; until 2026-11-28 rlft dropped
    both without a word. The system turn and the tools are shown, never trained."""
    cfg = data_config({"path": "x.jsonl", "type": "chat_template"})
    row = {"system": "Be brief.", "tools": json.dumps([{**WEATHER, "function": {**WEATHER["function"], "parameters": '{"type": "object"}'}}]),
           "messages": CHAT[:2]}
    record = convert(cfg, tok)(row)
    assert record == {"messages": [{"role": "system", "content": "Be brief."}, *CHAT[:2]], "tools": [WEATHER]}
    own = convert(cfg, tok)({"system": "ignored", "messages": [{"role": "system", "content": "own"}, *CHAT[:2]]})
    assert own == {"messages": [{"role": "system", "content": "own"}, *CHAT[:2]]}
    dropped = data_config({"path": "x.jsonl", "type": "chat_template", "drop_system_message": True})
    assert convert(dropped, tok)({"system": "Be brief.", "messages": CHAT[:2]}) == {"messages": CHAT[:2]}

    original = tok.chat_template
    tok.chat_template = TOOL_TEMPLATE
    try:
        example = tokenize_record(record, tok, False, ["assistant"], "turn")
    finally:
        tok.chat_template = original
    assert tok.decode(example["input_ids"]).startswith('<tools>weather({"type": "object"})</tools><|im_start|>system\nBe brief.')
    assert trained_text(example, tok) == "hello there<|im_end|>"
    for bad, message in (("[1, 2]", r"field 'tools' must be a list of tool schemas"), ("{not json", r"field 'tools' is text but not JSON")):
        with pytest.raises(RowError, match=message):
            convert(cfg, tok)({"tools": bad, "messages": CHAT[:2]})


def test_grpo_chat_prompts_show_the_rows_tools_and_keep_the_column(tmp_path, data_config, tok):
    from rlft.data.prepare import prompt_steps

    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "rain?"}], "tools": [WEATHER], "answer": "no"}) + "\n")
    cfg = data_config({"path": str(path), "type": "chat_template"}, rl="grpo", micro_batch_size=2,
                      trl={"num_generations": 2, "reward_funcs": ["r.f"]})
    original = tok.chat_template
    tok.chat_template = TOOL_TEMPLATE
    try:
        [example], _ = tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets", prompt_steps(cfg))
    finally:
        tok.chat_template = original
    assert tok.decode(example["prompt_ids"]).startswith("<tools>weather(")
    assert example["columns"] == {"tools": [WEATHER], "answer": "no"}  # the column as the row had it, for the rewards


def test_chat_train_on_eos_last_is_the_last_trained_turns_marker(tok):
    """Axolotl's `last` is the end-of-turn marker of the last trained turn (it skips untrained turns); a chat that
    ends with a user turn keeps the assistant's marker trained, not the user's."""
    example = tokenize_record({"messages": CHAT[:3]}, tok, False, ["assistant"], "last")
    assert trained_text(example, tok) == "hello there<|im_end|>"
    positions = trained_positions(example)
    assert positions == list(range(positions[0], positions[0] + len(positions)))  # the marker right after the answer


def test_a_row_of_only_system_messages_under_drop_system_message_is_dropped_as_untrained(tmp_path, data_config, tok):
    """Nothing is left to render: the row trains nothing (counted as such), and no message blames a missing template."""
    rows = [{"messages": CHAT}, {"messages": [{"role": "system", "content": "only this"}]}]
    path, cfg = _tokenize_file(tmp_path, data_config, tok, "".join(json.dumps(r) + "\n" for r in rows), type="chat_template",
                               drop_system_message=True)
    examples, report = tokenize_dataset(cfg.datasets[0], 0, cfg, tok, "datasets")
    assert len(examples) == 1 and report.dropped.get("no_target") == 1
