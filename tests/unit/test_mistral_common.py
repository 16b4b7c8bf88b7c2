"""`tokenizer_use_mistral_common: true`: Mistral's own tokenizer files, encoded by mistral-common (no chat template).

The tokenizers are mistral-common's real files from its wheel (fetched by `make test`): the v7 SentencePiece instruct
model and the v3 tekken file. The trained tokens are written out by hand from mistral-common's documented formats.
"""

from __future__ import annotations

import pytest

from rlft.data.formats.rows import RowError, chat_template_format
from rlft.data.tokenize import IGNORE, tokenize_record
from rlft.data.mistral_common import ENCODERS, chat_ids, fingerprint, has_mistral_files

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And Spain?"},
        {"role": "assistant", "content": "Madrid."}]


class Ds:  # a chat_template dataset entry's settings, as its defaults
    field_messages, message_property_mappings, message_field_role, message_field_content = "messages", None, None, None
    roles, drop_system_message, field_tools = None, False, "tools"


def trained(tokenizer, example) -> list[str]:
    return tokenizer.convert_ids_to_tokens([t for t, label in zip(example["input_ids"], example["labels"]) if label != IGNORE])


def record(tokenizer, messages=CHAT, roles=("assistant",), eos="turn", inputs=False):
    return tokenize_record({"messages": messages}, tokenizer, inputs, list(roles), eos)


def test_v7_trains_each_assistant_turn_and_its_eos(mistral_common_v7):
    example = record(mistral_common_v7)
    assert mistral_common_v7.convert_ids_to_tokens(example["input_ids"]) == [
        "<s>", "[SYSTEM_PROMPT]", "▁Be", "▁brief", ".", "[/SYSTEM_PROMPT]", "[INST]", "▁Capital", "▁of", "▁France", "?",
        "[/INST]", "▁Paris", ".", "</s>", "[INST]", "▁And", "▁Spain", "?", "[/INST]", "▁Madrid", ".", "</s>"]
    assert trained(mistral_common_v7, example) == ["▁Paris", ".", "</s>", "▁Madrid", ".", "</s>"]
    # the ids are mistral-common's own encoding of the conversation
    assert example["input_ids"] == list(mistral_common_v7.apply_chat_template(CHAT, tokenize=True, return_dict=False))


def test_tekken_v3_puts_the_system_prompt_in_the_last_user_turn(mistral_common_tekken):
    example = record(mistral_common_tekken)
    tokens = mistral_common_tekken.convert_ids_to_tokens(example["input_ids"])
    assert tokens == ["<s>", "[INST]", "Capital", " of", " France", "?", "[/INST]", "Paris", ".", "</s>", "[INST]", "Be",
                      " brief", ".\n\n", "And", " Spain", "?", "[/INST]", "Madrid", ".", "</s>"]
    assert trained(mistral_common_tekken, example) == ["Paris", ".", "</s>", "Madrid", ".", "</s>"]


@pytest.mark.parametrize("eos, expected", [
    ("none", ["▁Paris", ".", "▁Madrid", "."]),
    ("last", ["▁Paris", ".", "▁Madrid", ".", "</s>"]),
    ("all", ["▁Paris", ".", "</s>", "▁Madrid", ".", "</s>"]),
])
def test_train_on_eos(mistral_common_v7, eos, expected):
    assert trained(mistral_common_v7, record(mistral_common_v7, eos=eos)) == expected


def test_user_turns_and_all_inputs(mistral_common_v7):
    users = record(mistral_common_v7, roles=("user",), eos="none")
    assert trained(mistral_common_v7, users) == ["[INST]", "▁Capital", "▁of", "▁France", "?", "[/INST]", "[INST]", "▁And",
                                                 "▁Spain", "?", "[/INST]"]
    everything = record(mistral_common_v7, inputs=True)
    assert everything["labels"] == everything["input_ids"]


def test_text_rows_get_bos_and_eos(mistral_common_v7):
    example = tokenize_record({"text": "Paris is a city."}, mistral_common_v7, False, ["assistant"], "turn")
    tokens = mistral_common_v7.convert_ids_to_tokens(example["input_ids"])
    assert tokens[0] == "<s>" and tokens[-1] == "</s>" and example["labels"] == example["input_ids"]


def test_rows_mistral_common_refuses_name_the_reason(mistral_common_v7):
    with pytest.raises(RowError, match="Expected last role Assistant"):
        record(mistral_common_v7, messages=CHAT[:2])
    thinking = [{"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "two"}, {"type": "text", "text": "4"}]}]
    with pytest.raises(RowError, match="cannot encode the messages: Unexpected content chunk types"):  # v7 has no [THINK]
        record(mistral_common_v7, messages=thinking)
    assert record(mistral_common_v7, messages=[]) == {"input_ids": [], "labels": []}  # all dropped: no target
    with pytest.raises(RowError, match="prompt/completion"):
        tokenize_record({"prompt": "2+2=", "completion": "4"}, mistral_common_v7, False, ["assistant"], "turn")
    # a failed encoding leaves the tokenizer as it was: no counting wrappers stay on its instance
    assert not set(ENCODERS) & set(vars(mistral_common_v7.tokenizer.instruct_tokenizer))
    assert record(mistral_common_v7)["input_ids"][:2] == [1, 16]


def test_content_chunks_with_mistral_common_only(mistral_common_v7, mistral_tokenizer):
    chunked = [{"role": "user", "content": [{"type": "text", "text": "Capital of France?"}]},
               {"role": "assistant", "content": [{"type": "text", "text": "Paris."}]}]
    converted = chat_template_format(Ds(), chunks=True)({"messages": chunked})
    plain = [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."}]
    assert record(mistral_common_v7, converted["messages"]) == record(mistral_common_v7, plain)
    with pytest.raises(RowError, match=r"messages\[1\]\.content\[0\] must be a text or thinking chunk"):
        chat_template_format(Ds(), chunks=True)({"messages": [chunked[0], {"role": "assistant", "content": ["Paris."]}]})
    image = {"type": "image", "url": "https://example.com/cat.png"}  # never fetched: refused as the row is read
    with pytest.raises(RowError, match=r"messages\[0\]\.content\[0\] must be a text or thinking chunk"):
        chat_template_format(Ds(), chunks=True)({"messages": [{"role": "user", "content": [image]}, chunked[1]]})
    with pytest.raises(RowError, match="is a list"):  # a Jinja template's rows stay text
        chat_template_format(Ds())({"messages": chunked})


def test_spans_follow_what_mistral_common_encodes(mistral_common_tekken, mistral_common_v7):
    ids, spans = chat_ids(mistral_common_tekken, CHAT)
    assert [role for role, _, _ in spans] == ["user", "assistant", "user", "assistant"]  # v3: no system message of its own
    tokens = mistral_common_tekken.convert_ids_to_tokens(ids)
    assert tokens[spans[2][1]:spans[2][2]] == ["[INST]", "Be", " brief", ".\n\n", "And", " Spain", "?", "[/INST]"]
    # two user messages in a row are joined into one turn by mistral-common's normalizer: one span
    doubled = [{"role": "user", "content": "Capital"}, {"role": "user", "content": "of France?"},
               {"role": "assistant", "content": "Paris."}]
    ids, spans = chat_ids(mistral_common_v7, doubled)
    assert [role for role, _, _ in spans] == ["user", "assistant"]
    assert trained(mistral_common_v7, record(mistral_common_v7, doubled)) == ["▁Paris", ".", "</s>"]


def test_a_system_turn_v3_does_not_encode_cannot_be_trained(mistral_common_tekken, mistral_common_v7):
    with pytest.raises(RowError, match="roles_to_train has system, and this mistral-common tokenizer encodes no such message"):
        record(mistral_common_tekken, roles=("assistant", "system"))
    assert trained(mistral_common_v7, record(mistral_common_v7, roles=("system",), eos="none")) == [
        "[SYSTEM_PROMPT]", "▁Be", "▁brief", ".", "[/SYSTEM_PROMPT]"]  # v7: its own block, control tokens included


def test_fingerprint_and_files(mistral_common_v7, mistral_common_tekken, tmp_path):
    from rlft.data.mistral_common import load_mistral_tokenizer

    assert fingerprint(mistral_common_v7) != fingerprint(mistral_common_tekken)
    again = load_mistral_tokenizer(str(mistral_common_v7._tokenizer_path.parent))
    assert fingerprint(again) == fingerprint(mistral_common_v7)
    assert fingerprint(load_mistral_tokenizer(str(mistral_common_v7._tokenizer_path.parent), mode="test")) != fingerprint(again)
    mistral_common_v7.save_pretrained(tmp_path)
    assert has_mistral_files(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{}")  # a transformers tokenizer beside it wins
    assert not has_mistral_files(tmp_path)


def test_config_rules(config, config_problems):
    problems = lambda **settings: "\n".join(what for _, what in config_problems(**settings))  # noqa: E731
    assert config(tokenizer_use_mistral_common=True).uses_mistral_common
    assert "is built for SFT; dpo" in problems(tokenizer_use_mistral_common=True, rl="dpo",
                                               datasets=[{"path": "p.jsonl", "type": "chatml.intel"}])
    assert "with chat_template, special_tokens" in problems(tokenizer_use_mistral_common=True, chat_template="chatml",
                                                            special_tokens={"pad_token": "<pad>"})
    assert "remove eot_tokens" in problems(tokenizer_use_mistral_common=True, eot_tokens=["<end_of_turn>"])
    assert "dataset type alpaca" in problems(tokenizer_use_mistral_common=True, datasets=[{"path": "a.jsonl", "type": "alpaca"}])
    # Axolotl's inference: unset, and a Magistral model named
    assert config(base_model="mistralai/Magistral-Small-2506").uses_mistral_common
    assert not config(base_model="mistralai/Magistral-Small-2506", tokenizer_use_mistral_common=False).uses_mistral_common
    assert not config().uses_mistral_common
    assert "on for a Magistral model" in problems(base_model="mistralai/Magistral-Small-2506", chat_template="chatml")


SPECIAL = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
           "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]",
           "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]"]


def v13_tekken(folder, names: list[str]):
    """The tekken file above declared as v13 with `names` as its first special tokens, the layout of Magistral's
    tokenizers, whose files are not on the package registry: for the chunk path only."""
    import json

    from rlft.data.mistral_common import load_mistral_tokenizer
    from tests.conftest import _tokenizer_file

    data = json.loads(_tokenizer_file("mistral-common-tekken/tekken.json").read_text())
    data["config"]["version"] = "v13"
    data["special_tokens"] = [{"rank": rank, "token_str": names[rank] if rank < len(names) else f"<SPECIAL_{rank}>",
                               "is_control": True} for rank in range(data["config"]["default_num_special_tokens"])]
    (folder / "tekken.json").write_text(json.dumps(data))
    return load_mistral_tokenizer(str(folder))


@pytest.fixture(scope="module")
def thinking_tekken(tmp_path_factory):
    return v13_tekken(tmp_path_factory.mktemp("v13"), SPECIAL)


def test_thinking_chunks_are_trained_with_their_answer(thinking_tekken):
    """Axolotl's Magistral thinking rows: content as chunks, a `thinking` chunk before the answer's text."""
    row = {"messages": [{"role": "system", "content": [{"type": "text", "text": "Think first."}]},
                        {"role": "user", "content": [{"type": "text", "text": "2+2?"}]},
                        {"role": "assistant", "content": [{"type": "thinking", "thinking": "two and two"},
                                                          {"type": "text", "text": "4"}]}]}
    example = tokenize_record(chat_template_format(Ds(), chunks=True)(row), thinking_tekken, False, ["assistant"], "turn")
    assert thinking_tekken.convert_ids_to_tokens(example["input_ids"]) == [
        "<s>", "[SYSTEM_PROMPT]", "Think", " first", ".", "[/SYSTEM_PROMPT]", "[INST]", "2", "+", "2", "?", "[/INST]",
        "[THINK]", "two", " and", " two", "[/THINK]", "4", "</s>"]
    assert trained(thinking_tekken, example) == ["[THINK]", "two", " and", " two", "[/THINK]", "4", "</s>"]


def test_loading_errors_say_what_is_missing(tiny_model_dir, monkeypatch):
    from rlft.errors import ModelError
    from rlft.data import mistral_common

    with pytest.raises(ModelError, match=r"No tokenizer file found \(it needs tekken.json or a tokenizer.model.v\* file; set "
                                         "tokenizer_use_mistral_common: false"):
        mistral_common.load_mistral_tokenizer(str(tiny_model_dir))  # a transformers tokenizer only
    monkeypatch.setattr(mistral_common.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelError, match=r"needs the mistral-common package: pip install -c constraints.txt 'rlft\[mistral\]'"):
        mistral_common.load_mistral_tokenizer(str(tiny_model_dir))


def test_a_thinking_chunk_without_think_tokens_is_the_rows_error(tmp_path):
    tokenizer = v13_tekken(tmp_path, SPECIAL[:-2])  # a v13 file without [THINK] and [/THINK]: mistral-common asserts
    row = [{"role": "user", "content": "2+2?"},
           {"role": "assistant", "content": [{"type": "thinking", "thinking": "two"}, {"type": "text", "text": "4"}]}]
    with pytest.raises(RowError, match="cannot encode the messages: think tokens are not available"):
        record(tokenizer, messages=row)


def test_a_mistral_common_that_encodes_differently_is_named(mistral_common_v7, monkeypatch):
    """The per-message counts must add up to the whole encoding after the start token; a version where they do not is
    refused by name, never trained with shifted masks."""
    from rlft.errors import ModelError
    from rlft.data import mistral_common

    # as if a version encoded system messages through an encoder rlft does not count
    monkeypatch.setattr(mistral_common, "ENCODERS", {k: v for k, v in ENCODERS.items() if v != "system"})
    with pytest.raises(ModelError, match="rlft cannot tell which ids each message has with this version"):
        chat_ids(mistral_common_v7, CHAT)
    assert chat_ids(mistral_common_v7, CHAT[1:])[0][:2] == [1, 3]  # without a system message the counts add up
