"""Preference / KTO row formats: the exact strings Axolotl's formats build, for every `type:`."""

from __future__ import annotations

import pytest

from rlft.config import build_config
from rlft.data.formats.rows import RowError
from rlft.data.formats.preference.fields import is_degenerate_pair, parse_label
from rlft.data.formats.preference.resolve import KTO_FORMATS, PREFERENCE_FORMATS, resolve_preference_format
from rlft.errors import DataError
from rlft.data.chat_templates import LLAMA3_TEMPLATE
from rlft.data.tokenizer import byte_tokenizer

WHERE = "datasets[0] (pairs.jsonl)"

# ChatML (C2), prompt "q", system "sys"
CHATML_PROMPT = "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
CHATML_PROMPT_SYS = "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
# Llama 3 (C3)
LLAMA3_PROMPT = "<|start_header_id|>user<|end_header_id|>\n\nq<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
LLAMA3_PROMPT_SYS = (
    "<|start_header_id|>system<|end_header_id|>\n\nsys<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nq<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
)


@pytest.fixture
def chatml_tok():
    return byte_tokenizer()


@pytest.fixture
def llama3_tok():
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = LLAMA3_TEMPLATE
    return tokenizer


def resolve(type_=None, method="dpo", tokenizer=None, **dataset):
    """The row function of a one-dataset config whose dataset has `type: type_`."""
    entry = {"path": "pairs.jsonl", **dataset}
    if type_ is not None:
        entry["type"] = type_
    data = {"base_model": "tiny-model", "micro_batch_size": 2, "datasets": [entry]}
    if method == "reward_model":
        data["reward_model"] = True
    else:
        data["rl"] = method
    cfg = build_config(data)
    tokenizer = tokenizer if tokenizer is not None else byte_tokenizer()
    return resolve_preference_format(cfg.datasets[0], cfg, 0, WHERE, tokenizer, method)


def row_error(convert, row) -> str:
    with pytest.raises(RowError) as caught:
        convert(row)
    return str(caught.value)


def msgs(*pairs):
    return [{"role": role, "content": content} for role, content in pairs]


def conv(answer, user="q"):
    """A [user, assistant] conversation."""
    return msgs(("user", user), ("assistant", answer))


def pair(prompt, chosen, rejected):
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


# ------------------------------------------------------------------ chatml.* / llama3.* (C2, C3)

CHATML = ("chatml", CHATML_PROMPT, CHATML_PROMPT_SYS, "<|im_end|>")
LLAMA3 = ("llama3", LLAMA3_PROMPT, LLAMA3_PROMPT_SYS, "<|eot_id|>")


@pytest.mark.parametrize("family", [CHATML, LLAMA3], ids=["chatml", "llama3"])
@pytest.mark.parametrize("name, row", [
    ("default", {"prompt": "q", "chosen": "good", "rejected": "bad"}),
    ("default", {"input": "q", "chosen": "good", "rejected": "bad"}),
    ("default", {"question": "q", "chosen_response": "good", "rejected_response": "bad"}),
    ("default", {"instruction": "q", "chosen_response": "good", "rejected_response": "bad"}),
    ("argilla", {"instruction": "q", "chosen_response": "good", "rejected_response": "bad"}),
    ("icr", {"input": "q", "chosen": "good", "rejected": "bad"}),
    ("intel", {"question": "q", "chosen": "good", "rejected": "bad"}),
    ("prompt_pairs", {"prompt": "q", "chosen": "good", "rejected": "bad"}),
    ("ultra", {"prompt": "q", "chosen": conv("good"),
               "rejected": conv("bad")}),
])
@pytest.mark.parametrize("system", [False, True], ids=["no_system", "system"])
def test_delimited_pair_formats(family, name, row, system):
    prefix, prompt, prompt_sys, end = family
    if system:
        row = {**row, "system": "sys"}
    assert resolve(f"{prefix}.{name}")(row) == {
        "prompt": prompt_sys if system else prompt, "chosen": "good" + end, "rejected": "bad" + end,
    }


def test_chatml_literal_strings():
    row = {"system": "sys", "question": "q", "chosen": "good", "rejected": "bad"}
    assert resolve("chatml.intel")(row) == {
        "prompt": "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n",
        "chosen": "good<|im_end|>",
        "rejected": "bad<|im_end|>",
    }
    assert resolve("llama3.intel")(row) == {
        "prompt": "<|start_header_id|>system<|end_header_id|>\n\nsys<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
                  "q<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        "chosen": "good<|eot_id|>",
        "rejected": "bad<|eot_id|>",
    }


def test_one_segment_type_means_default():
    row = {"instruction": "q", "chosen_response": "good", "rejected_response": "bad", "system": ""}
    assert resolve("chatml")(row) == {"prompt": CHATML_PROMPT, "chosen": "good<|im_end|>", "rejected": "bad<|im_end|>"}
    assert resolve("llama3")(row) == {"prompt": LLAMA3_PROMPT, "chosen": "good<|eot_id|>", "rejected": "bad<|eot_id|>"}


def test_chatml_default_prompt_key_order():
    row = {"question": "not me", "prompt": "q", "input": "nor me", "chosen": "good", "chosen_response": "x", "rejected": "bad"}
    assert resolve("chatml.default")(row)["prompt"] == CHATML_PROMPT
    assert resolve("chatml.default")(row)["chosen"] == "good<|im_end|>"


@pytest.mark.parametrize("prefix, prompt, end", [
    ("chatml", CHATML_PROMPT, "<|im_end|>"),
    ("llama3", LLAMA3_PROMPT, "<|eot_id|>"),
])
def test_argilla_chat_ignores_system(prefix, prompt, end):
    row = {
        "system": "sys",
        "chosen": conv("good"),
        "rejected": conv("bad"),
    }
    assert resolve(f"{prefix}.argilla_chat")(row) == {"prompt": prompt, "chosen": "good" + end, "rejected": "bad" + end}


def test_ipo_simpo_orpo_use_the_dpo_formats():
    row = {"question": "q", "chosen": "good", "rejected": "bad"}
    expected = {"prompt": CHATML_PROMPT, "chosen": "good<|im_end|>", "rejected": "bad<|im_end|>"}
    for method in ("ipo", "simpo", "orpo", "reward_model"):
        assert resolve("chatml.intel", method)(row) == expected


def test_delimited_pair_errors_name_the_field():
    intel = resolve("chatml.intel")
    assert "'question'" in row_error(intel, {"chosen": "good", "rejected": "bad"})
    assert "'chosen'" in row_error(intel, {"question": "q", "chosen": "  \n", "rejected": "bad"})
    assert "'rejected'" in row_error(intel, {"question": "q", "chosen": "good", "rejected": ""})
    assert "'rejected'" in row_error(intel, {"question": "q", "chosen": "good", "rejected": None})
    assert "'chosen'" in row_error(intel, {"question": "q", "chosen": 5, "rejected": "bad"})
    assert "'system'" in row_error(intel, {"question": "q", "chosen": "good", "rejected": "bad", "system": ["x"]})
    default = resolve("chatml")
    message = row_error(default, {"chosen": "good", "rejected": "bad"})
    assert "'prompt'" in message and "'instruction'" in message
    assert "'chosen' / 'chosen_response'" in row_error(default, {"prompt": "q", "rejected": "bad"})
    ultra = resolve("llama3.ultra")
    assert "'chosen'" in row_error(ultra, {"prompt": "q", "chosen": msgs(("user", "q")), "rejected": conv("b")})
    assert "'rejected[1].content'" in row_error(
        ultra, {"prompt": "q", "chosen": conv("a"), "rejected": conv(" ")})
    assert "'chosen'" in row_error(ultra, {"prompt": "q", "chosen": "good", "rejected": "bad"})
    assert "'chosen[1].content'" in row_error(
        resolve("chatml.argilla_chat"),
        {"chosen": [{"role": "user", "content": "q"}, {"role": "assistant"}], "rejected": conv("b")},
    )


# -------------------------------------------------------------------------- zephyr.nectar (C4)


def test_zephyr_nectar_chosen_is_the_lowest_rank_number():
    answers = [{"answer": "third", "rank": 3}, {"answer": "best", "rank": 1}, {"answer": "second", "rank": 2}]
    row = {"prompt": "q", "answers": answers}
    assert resolve("zephyr.nectar")(row) == {
        "prompt": "<|system|>\n</s>\n<|user|>\nq</s>\n<|assistant|>\n",
        "chosen": "best",
        "rejected": "second",
    }


def test_zephyr_nectar_errors():
    nectar = resolve("zephyr.nectar")
    assert "'answers'" in row_error(nectar, {"prompt": "q", "answers": [{"answer": "only", "rank": 1}]})
    assert "'answers[1].rank'" in row_error(nectar, {"prompt": "q", "answers": [{"answer": "a", "rank": 1}, {"answer": "b"}]})
    blank = [{"answer": "b", "rank": 2}, {"answer": " ", "rank": 1}]
    assert "'answers[1].answer'" in row_error(nectar, {"prompt": "q", "answers": blank})
    assert "'prompt'" in row_error(nectar, {"answers": [{"answer": "a", "rank": 1}, {"answer": "b", "rank": 2}]})


# ------------------------------------------------------------------- chat_template.default (C5)

CHAT_ROW = {
    "messages": msgs(("system", "sys"), ("user", "q")),
    "chosen": {"role": "assistant", "content": "good"},
    "rejected": {"role": "assistant", "content": "bad"},
}


def test_chat_template_default_chatml(chatml_tok):
    convert = resolve("chat_template.default", tokenizer=chatml_tok)
    assert convert(CHAT_ROW) == {
        "prompt": "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n",
        "chosen": "good<|im_end|>",
        "rejected": "bad<|im_end|>",
    }
    no_system = {**CHAT_ROW, "messages": msgs(("user", "q"))}
    assert convert(no_system) == {"prompt": CHATML_PROMPT, "chosen": "good<|im_end|>", "rejected": "bad<|im_end|>"}
    assert resolve("chat_template", tokenizer=chatml_tok)(no_system) == convert(no_system)


def test_chat_template_default_llama3(llama3_tok):
    convert = resolve("chat_template.default", tokenizer=llama3_tok)
    assert convert(CHAT_ROW) == {
        "prompt": "<|start_header_id|>system<|end_header_id|>\n\nsys<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
                  "q<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        "chosen": "good<|eot_id|>",
        "rejected": "bad<|eot_id|>",
    }
    assert convert({**CHAT_ROW, "messages": msgs(("user", "q"))}) == {
        "prompt": "<|start_header_id|>user<|end_header_id|>\n\nq<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        "chosen": "good<|eot_id|>",
        "rejected": "bad<|eot_id|>",
    }


def test_chat_template_answers_as_string_message_or_list(chatml_tok, llama3_tok):
    row = {
        "messages": "q",  # a plain string is one user message
        "chosen": "a",  # short answers must not be found inside the assistant header
        "rejected": conv("user"),  # a list: its last message
    }
    assert resolve("chat_template", tokenizer=chatml_tok)(row) == {
        "prompt": CHATML_PROMPT, "chosen": "a<|im_end|>", "rejected": "user<|im_end|>",
    }
    assert resolve("chat_template", tokenizer=llama3_tok)(row) == {
        "prompt": LLAMA3_PROMPT, "chosen": "a<|eot_id|>", "rejected": "user<|eot_id|>",
    }


def test_chat_template_field_names_and_mappings(chatml_tok):
    row = {
        "conv": {"turns": [{"from": "narrator", "value": "sys"}, {"from": "asker", "value": "q"}]},
        "better": {"from": "answerer", "value": "good"},
        "worse": [{"from": "answerer", "value": "bad"}],
    }
    convert = resolve(
        "chat_template", tokenizer=chatml_tok,
        field_messages="conv.turns", field_chosen="better", field_rejected="worse",
        message_property_mappings={"role": "from", "content": "value"},
        roles={"system": ["narrator"], "user": ["asker"], "assistant": ["answerer"]},
    )
    assert convert(row) == {"prompt": CHATML_PROMPT_SYS, "chosen": "good<|im_end|>", "rejected": "bad<|im_end|>"}
    legacy = resolve(
        "chat_template", tokenizer=chatml_tok, field_messages="conv.turns", field_chosen="better", field_rejected="worse",
        message_field_role="from", message_field_content="value",
        roles={"system": ["narrator"], "user": ["asker"], "assistant": ["answerer"]},
    )
    assert legacy(row) == convert(row)


def test_chat_template_reads_every_field_with_one_message_reader(chatml_tok, monkeypatch):
    """The prompt's and both answers' messages go through one reader of the dataset's role names and keys, built once."""
    import rlft.data.formats.preference.chat as chat
    from rlft.data.formats.rows import message_list

    built = []
    monkeypatch.setattr(chat, "message_list", lambda *a: built.append(a) or message_list(*a))
    convert = resolve("chat_template", tokenizer=chatml_tok, roles={"user": ["asker"], "assistant": ["answerer"]})
    row = {"messages": [{"role": "asker", "content": "q"}], "chosen": [{"role": "answerer", "content": "good"}],
           "rejected": {"role": "answerer", "content": "bad"}}
    assert convert(row) == {"prompt": CHATML_PROMPT, "chosen": "good<|im_end|>", "rejected": "bad<|im_end|>"}
    assert convert(row) == convert(row) and len(built) == 1


def test_chat_template_errors_name_the_field(chatml_tok):
    convert = resolve("chat_template", tokenizer=chatml_tok)
    assert "'messages'" in row_error(convert, {"chosen": "good", "rejected": "bad"})
    assert "'chosen'" in row_error(convert, {"messages": "q", "rejected": "bad"})
    assert "'chosen'" in row_error(convert, {"messages": "q", "chosen": {"role": "assistant", "content": " "}, "rejected": "bad"})
    assert "'rejected'" in row_error(convert, {"messages": "q", "chosen": "good", "rejected": 3})
    assert "messages[0]" in row_error(convert, {"messages": [{"content": "q"}], "chosen": "good", "rejected": "bad"})
    no_content = {"messages": "q", "chosen": {"role": "assistant"}, "rejected": "bad"}
    assert "chosen lacks key 'content'" in row_error(convert, no_content)


def test_chat_template_answer_not_in_render_is_an_error():
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] | upper }}\n{% endfor %}"
    convert = resolve("chat_template", tokenizer=tokenizer)
    assert "'chosen'" in row_error(convert, {"messages": "q", "chosen": "good", "rejected": "bad"})


def test_chat_template_needs_a_template():
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(DataError, match=r"datasets\[0\].*chat_template: chatml"):
        resolve("chat_template.default", tokenizer=tokenizer)


# ------------------------------------------------------------- chat_template.argilla_chat (C5)

ARGILLA_CHAT_ROW = {
    "chosen": msgs(("system", "sys"), ("user", "q"), ("assistant", "good")),
    "rejected": msgs(("system", "sys"), ("user", "q"), ("assistant", "bad")),
}


def test_chat_template_argilla_chat(chatml_tok, llama3_tok):
    assert resolve("chat_template.argilla_chat", tokenizer=chatml_tok)(ARGILLA_CHAT_ROW) == {
        "prompt": "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n",
        "chosen": "good<|im_end|>",
        "rejected": "bad<|im_end|>",
    }
    assert resolve("chat_template.argilla_chat", tokenizer=llama3_tok)(ARGILLA_CHAT_ROW) == {
        "prompt": LLAMA3_PROMPT_SYS, "chosen": "good<|eot_id|>", "rejected": "bad<|eot_id|>",
    }
    no_system = {key: value[1:] for key, value in ARGILLA_CHAT_ROW.items()}
    assert resolve("chat_template.argilla_chat", tokenizer=chatml_tok)(no_system) == {
        "prompt": CHATML_PROMPT, "chosen": "good<|im_end|>", "rejected": "bad<|im_end|>",
    }
    assert resolve("chat_template.argilla_chat", tokenizer=llama3_tok)(no_system) == {
        "prompt": LLAMA3_PROMPT, "chosen": "good<|eot_id|>", "rejected": "bad<|eot_id|>",
    }


def test_chat_template_argilla_chat_errors(chatml_tok):
    convert = resolve("chat_template.argilla_chat", tokenizer=chatml_tok)
    assert "'rejected'" in row_error(convert, {"chosen": ARGILLA_CHAT_ROW["chosen"], "rejected": []})
    assert "'chosen'" in row_error(convert, {"chosen": conv(""), "rejected": ARGILLA_CHAT_ROW["rejected"]})
    assert "'chosen'" in row_error(convert, {"chosen": "good", "rejected": ARGILLA_CHAT_ROW["rejected"]})


# ---------------------------------------------------------------- ORPO chat_template.argilla (C8)


def test_orpo_chat_template_argilla_chatml(chatml_tok):
    convert = resolve("chat_template.argilla", "orpo", tokenizer=chatml_tok)
    row = {"chosen": conv("good"), "rejected": conv("bad")}
    # a character slice of the whole render: the template's newline after <|im_end|> stays
    assert convert(row) == {"prompt": CHATML_PROMPT, "chosen": "good<|im_end|>\n", "rejected": "bad<|im_end|>\n"}
    assert convert({**row, "system": "sys"}) == {
        "prompt": "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n",
        "chosen": "good<|im_end|>\n",
        "rejected": "bad<|im_end|>\n",
    }


def test_orpo_chat_template_argilla_llama3(llama3_tok):
    convert = resolve("chat_template.argilla", "orpo", tokenizer=llama3_tok)
    row = {"chosen": conv("good"), "rejected": conv("bad")}
    assert convert(row) == {"prompt": LLAMA3_PROMPT, "chosen": "good<|eot_id|>", "rejected": "bad<|eot_id|>"}
    assert convert({**row, "system": "sys"}) == pair(LLAMA3_PROMPT_SYS, "good<|eot_id|>", "bad<|eot_id|>")


def test_orpo_multi_turn_and_prompt_column(chatml_tok):
    convert = resolve("chat_template.argilla", "orpo", tokenizer=chatml_tok)
    row = {
        "chosen": msgs(("user", "u1"), ("assistant", "a1"), ("user", "u2"), ("assistant", "good")),
        "rejected": msgs(("user", "u1"), ("assistant", "a1"), ("user", "u2"), ("assistant", "bad")),
    }
    assert convert(row) == {
        "prompt": "<|im_start|>user\nu1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n"
                  "<|im_start|>user\nu2<|im_end|>\n<|im_start|>assistant\n",
        "chosen": "good<|im_end|>\n",
        "rejected": "bad<|im_end|>\n",
    }
    # Axolotl repeats a `prompt` column as the user message of every turn
    assert convert({**row, "prompt": "p"})["prompt"] == (
        "<|im_start|>user\np<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n"
        "<|im_start|>user\np<|im_end|>\n<|im_start|>assistant\n"
    )


def test_orpo_errors(chatml_tok):
    convert = resolve("chat_template.argilla", "orpo", tokenizer=chatml_tok)
    odd = {"chosen": msgs(("user", "q"), ("assistant", "a"), ("user", "again")), "rejected": conv("b")}
    message = row_error(convert, odd)
    assert "'chosen'" in message and "invalid number of turns" in message
    assert "'rejected'" in row_error(convert, {"chosen": conv("a"), "rejected": conv(" ")})
    assert "'chosen'" in row_error(convert, {"rejected": conv("b")})
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}|{% endfor %}{% if add_generation_prompt %}GEN{% endif %}"
    sliced = resolve("chat_template.argilla", "orpo", tokenizer=tokenizer)
    message = row_error(sliced, {"chosen": conv("a"), "rejected": conv("b")})
    assert "'chosen'" in message and "not a prefix" in message


def test_orpo_only_format_is_refused_for_dpo():
    with pytest.raises(DataError) as caught:
        resolve("chat_template.argilla", "dpo")
    assert "datasets[0]" in str(caught.value) and "chatml.intel" in str(caught.value)


# ---------------------------------------------------------------------- reward models (C5 + BT)


def test_reward_model_chat_template_rows_and_margin(chatml_tok):
    convert = resolve("chat_template", "reward_model", tokenizer=chatml_tok)
    assert convert({**CHAT_ROW, "margin": 2}) == {
        "prompt": CHATML_PROMPT_SYS, "chosen": "good<|im_end|>", "rejected": "bad<|im_end|>", "margin": 2.0,
    }
    assert "margin" not in convert(CHAT_ROW)
    assert "'margin'" in row_error(convert, {**CHAT_ROW, "margin": "lots"})
    assert resolve("chat_template.argilla_chat", "reward_model", tokenizer=chatml_tok)(ARGILLA_CHAT_ROW) == {
        "prompt": CHATML_PROMPT_SYS, "chosen": "good<|im_end|>", "rejected": "bad<|im_end|>",
    }


def test_reward_model_bradley_terry_rows(chatml_tok, llama3_tok):
    row = {"chosen": conv("good"), "rejected": conv("bad"), "margin": 0.5}
    assert resolve("chat_template", "reward_model", tokenizer=chatml_tok)(row) == {
        "prompt": CHATML_PROMPT, "chosen": "good<|im_end|>", "rejected": "bad<|im_end|>", "margin": 0.5,
    }
    assert resolve("chat_template.default", "reward_model", tokenizer=llama3_tok)(row) == {
        "prompt": LLAMA3_PROMPT, "chosen": "good<|eot_id|>", "rejected": "bad<|eot_id|>", "margin": 0.5,
    }
    # conversations that differ from their first message: no shared prompt, the whole renders
    different = {"chosen": conv("good"), "rejected": msgs(("user", "r"), ("assistant", "bad"))}
    assert resolve("chat_template", "reward_model", tokenizer=chatml_tok)(different) == {
        "prompt": "",
        "chosen": "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\ngood<|im_end|>",
        "rejected": "<|im_start|>user\nr<|im_end|>\n<|im_start|>assistant\nbad<|im_end|>",
    }


def test_reward_model_bradley_terry_keeps_bos_in_the_prompt():
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = LLAMA3_TEMPLATE
    tokenizer.bos_token = "<|endoftext|>"
    different = {"chosen": conv("good"), "rejected": msgs(("user", "r"), ("assistant", "bad"))}
    assert resolve("chat_template", "reward_model", tokenizer=tokenizer)(different) == {
        "prompt": "<|endoftext|>",
        "chosen": "<|start_header_id|>user<|end_header_id|>\n\nq<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\ngood<|eot_id|>",
        "rejected": "<|start_header_id|>user<|end_header_id|>\n\nr<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\nbad<|eot_id|>",
    }


def test_reward_model_bradley_terry_errors(chatml_tok):
    convert = resolve("chat_template", "reward_model", tokenizer=chatml_tok)
    assert "'rejected'" in row_error(convert, {"chosen": conv("good"), "rejected": conv("")})
    assert "'rejected'" in row_error(convert, {"chosen": conv("good"), "rejected": []})


# ----------------------------------------------------------------- user_defined (C6, C7), passthrough


def test_user_defined_pair():
    spec = {
        "field_prompt": "question", "field_system": "sys", "field_chosen": "yes", "field_rejected": "no",
        "prompt_format": "[{system}] {prompt} =>", "chosen_format": " {chosen}.", "rejected_format": " {rejected}!",
    }
    convert = resolve(spec)
    assert convert({"question": "q", "sys": "s", "yes": "good", "no": "bad"}) == pair("[s] q =>", " good.", " bad!")
    assert convert({"question": "q", "yes": "good", "no": "bad"}) == pair("[] q =>", " good.", " bad!")
    defaults = resolve({"prompt_format": "", "chosen_format": ""})
    assert defaults({"prompt": "q", "chosen": "good", "rejected": "bad"}) == {"prompt": "q", "chosen": "good", "rejected": "bad"}
    assert resolve({"system_prompt": "S", "prompt_format": "{system}|{prompt}"})(
        {"prompt": "q", "chosen": "good", "rejected": "bad"})["prompt"] == "S|q"
    assert "'yes'" in row_error(convert, {"question": "q", "yes": " ", "no": "bad"})
    assert "'question'" in row_error(convert, {"yes": "good", "no": "bad"})


def test_user_defined_bad_placeholder_is_a_config_problem():
    with pytest.raises(DataError, match=r"datasets\[0\].*chosen_format.*\{chosen\}"):
        resolve({"chosen_format": "{answer}"})


@pytest.mark.parametrize("type_", [None, "passthrough.default", "passthrough"])
def test_rows_that_already_hold_the_pair(type_):
    convert = resolve(type_)
    assert convert({"prompt": "q", "chosen": "good", "rejected": "bad", "extra": 1}) == pair("q", "good", "bad")
    assert "'prompt'" in row_error(convert, {"chosen": "good", "rejected": "bad"})
    assert "'rejected'" in row_error(convert, {"prompt": "q", "chosen": "good", "rejected": "\t"})
    assert "'chosen'" in row_error(convert, {"prompt": "q", "rejected": "bad"})
    assert "'chosen'" in row_error(convert, {"prompt": "q", "chosen": 1.5, "rejected": "bad"})


def test_no_type_chat_rows_are_rendered(chatml_tok, llama3_tok):
    conversational = pair(msgs(("user", "q")), msgs(("assistant", "good")), msgs(("assistant", "bad")))
    assert resolve(None, tokenizer=chatml_tok)(conversational) == pair(CHATML_PROMPT, "good<|im_end|>", "bad<|im_end|>")
    assert resolve(None, tokenizer=llama3_tok)(conversational) == pair(LLAMA3_PROMPT, "good<|eot_id|>", "bad<|eot_id|>")
    assert resolve(None, tokenizer=chatml_tok)({**CHAT_ROW}) == pair(CHATML_PROMPT_SYS, "good<|im_end|>", "bad<|im_end|>")
    assert resolve(None, tokenizer=llama3_tok)(ARGILLA_CHAT_ROW) == pair(LLAMA3_PROMPT_SYS, "good<|eot_id|>", "bad<|eot_id|>")
    different = {"chosen": conv("good"), "rejected": msgs(("user", "r"), ("assistant", "bad"))}
    assert resolve(None, "reward_model", tokenizer=chatml_tok)(different)["prompt"] == ""
    assert resolve(None, "reward_model")({"chosen": "all good", "rejected": "all bad"}) == pair("", "all good", "all bad")


def test_no_type_ready_made_strings_beside_a_messages_column_and_a_blank_prompt_beside_conversations(chatml_tok):
    """A string prompt and string answers are used as they are, whatever other columns the row has (a `messages` column
    made the prompt a user message and templated it twice); a blank `prompt` column beside whole conversations leaves
    the conversations' own user turns as the prompt (an empty user turn replaced the question)."""
    ready = {"prompt": CHATML_PROMPT, "chosen": "good<|im_end|>", "rejected": "bad<|im_end|>", "messages": msgs(("user", "q"))}
    assert resolve(None, tokenizer=chatml_tok)(ready) == pair(CHATML_PROMPT, "good<|im_end|>", "bad<|im_end|>")
    blank = {"prompt": " ", "chosen": conv("good"), "rejected": conv("bad")}
    assert resolve(None, tokenizer=chatml_tok)(blank) == pair(CHATML_PROMPT, "good<|im_end|>", "bad<|im_end|>")


# --------------------------------------------------------------------------------- KTO (C7)

KTO_CHATML_SYS = "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("family", [CHATML, LLAMA3], ids=["chatml", "llama3"])
@pytest.mark.parametrize("name, row", [
    ("argilla", {"instruction": "q", "completion": "good"}),
    ("intel", {"question": "q", "completion": "good"}),
    ("prompt_pairs", {"prompt": "q", "completion": "good"}),
    ("ultra", {"prompt": "q", "completion": "good"}),
])
@pytest.mark.parametrize("system", [False, True], ids=["no_system", "system"])
def test_kto_delimited_formats(family, name, row, system):
    prefix, prompt, prompt_sys, end = family
    row = {**row, "label": True, **({"system": "sys"} if system else {})}
    expected = {"prompt": prompt_sys if system else prompt, "completion": "good" + end, "label": True}
    assert resolve(f"{prefix}.{name}", "kto")(row) == expected


def test_kto_literal_strings():
    row = {"system": "sys", "question": "q", "completion": "good", "label": False}
    assert resolve("chatml.intel", "kto")(row) == {
        "prompt": "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n",
        "completion": "good<|im_end|>",
        "label": False,
    }
    assert resolve("llama3.intel", "kto")(row) == {
        "prompt": "<|start_header_id|>system<|end_header_id|>\n\nsys<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
                  "q<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        "completion": "good<|eot_id|>",
        "label": False,
    }


@pytest.mark.parametrize("prefix, prompt, end", [
    ("chatml", CHATML_PROMPT, "<|im_end|>"),
    ("llama3", LLAMA3_PROMPT, "<|eot_id|>"),
])
def test_kto_argilla_chat(prefix, prompt, end):
    row = {"completion": conv("good"), "label": "false", "system": "ignored"}
    assert resolve(f"{prefix}.argilla_chat", "kto")(row) == {"prompt": prompt, "completion": "good" + end, "label": False}


def test_kto_user_defined():
    spec = {"field_prompt": "q", "field_completion": "a", "field_label": "ok",
            "prompt_format": "{system}{prompt}:", "completion_format": " {completion}"}
    convert = resolve(spec, "kto")
    assert convert({"q": "q", "a": "good", "ok": 1, "system": "S "}) == {"prompt": "S q:", "completion": " good", "label": True}
    assert convert({"q": "q", "a": "good", "ok": 0}) == {"prompt": "q:", "completion": " good", "label": False}
    assert "'ok'" in row_error(convert, {"q": "q", "a": "good", "ok": "maybe"})
    assert "'a'" in row_error(convert, {"q": "q", "a": "", "ok": True})
    with pytest.raises(DataError, match="completion_format"):
        resolve({"completion_format": "{chosen}"}, "kto")


def test_kto_rows_without_type(chatml_tok):
    convert = resolve(None, "kto", tokenizer=chatml_tok)
    assert convert({"prompt": "q", "completion": "good", "label": True}) == {"prompt": "q", "completion": "good", "label": True}
    assert convert({"prompt": msgs(("user", "q")), "completion": msgs(("assistant", "good")), "label": "TRUE"}) == {
        "prompt": CHATML_PROMPT, "completion": "good<|im_end|>", "label": True,
    }
    assert "'label'" in row_error(convert, {"prompt": "q", "completion": "good"})
    assert "'completion'" in row_error(convert, {"prompt": "q", "completion": " ", "label": True})
    assert "'completion'" in row_error(convert, {"prompt": "q", "completion": 3, "label": True})


@pytest.mark.parametrize("value, expected", [
    (True, True), (False, False), (1, True), (0, False), ("true", True), ("False", False), (" TRUE ", True), ("0", False),
])
def test_kto_label_parsing(value, expected):
    assert parse_label(value) is expected


@pytest.mark.parametrize("value", [2, -1, "yes", "", None, 0.5, [True]])
def test_kto_label_rejects_other_values(value):
    with pytest.raises(RowError, match="'label'"):
        parse_label(value)
    assert "'label'" in row_error(resolve("chatml.intel", "kto"), {"question": "q", "completion": "good", "label": value})


def test_kto_errors_name_the_field():
    intel = resolve("llama3.intel", "kto")
    assert "'question'" in row_error(intel, {"completion": "good", "label": True})
    assert "'completion'" in row_error(intel, {"question": "q", "label": True})
    assert "'completion[1].content'" in row_error(
        resolve("chatml.argilla_chat", "kto"), {"completion": conv("  "), "label": True})


def test_kto_has_no_pair_formats():
    with pytest.raises(DataError) as caught:
        resolve("chatml.icr", "kto")
    message = str(caught.value)
    assert "chatml.argilla_chat" in message and "llama3.ultra" in message and "user_defined.default" in message


# ----------------------------------------------------------------------- resolution, user code


def test_unknown_type_lists_the_method_formats():
    with pytest.raises(DataError) as caught:
        resolve("chatml.nope")
    message = str(caught.value)
    assert message.startswith(WHERE) and "chatml.intel" in message and "zephyr.nectar" in message
    with pytest.raises(DataError, match="chat_template.argilla"):
        resolve("nope_module_xyz", "orpo")


def test_user_transform(tmp_path, monkeypatch):
    (tmp_path / "pref_transforms_a.py").write_text(
        "def to_pair(cfg, dataset_idx=0, **kwargs):\n"
        "    def transform(row, tokenizer=None):\n"
        "        assert tokenizer is not None\n"
        "        if row['q'] == 'boom':\n"
        "            raise KeyError('boom')\n"
        "        return {'prompt': row['q'] + '?', 'chosen': row['a'].upper()}\n"
        "    return transform, {'remove_columns': ['q']}\n"
        "def to_chat(cfg, **kwargs):\n"
        "    return lambda row: {'messages': row['q'], 'chosen': 'good', 'rejected': 'bad'}\n"
        "def to_kto(cfg, **kwargs):\n"
        "    return lambda row: {'prompt': row['q'], 'completion': row['a'], 'label': row['ok']}\n"
    )
    monkeypatch.chdir(tmp_path)
    convert = resolve("pref_transforms_a.to_pair")
    # the transform's output is merged into the row: `rejected` stays from the row
    assert convert({"q": "q", "a": "good", "rejected": "bad"}) == {"prompt": "q?", "chosen": "GOOD", "rejected": "bad"}
    assert "KeyError" in row_error(convert, {"q": "boom", "a": "good", "rejected": "bad"})
    assert "'rejected'" in row_error(convert, {"q": "q", "a": "good"})
    assert resolve("pref_transforms_a.to_chat")({"q": "q"}) == pair(CHATML_PROMPT, "good<|im_end|>", "bad<|im_end|>")
    kto = resolve("pref_transforms_a.to_kto", "kto")
    assert kto({"q": "q", "a": "good", "ok": 0}) == {"prompt": "q", "completion": "good", "label": False}


def test_tables_for_docs():
    assert {"chatml.default", "chatml.argilla", "chatml.argilla_chat", "chatml.icr", "chatml.intel", "chatml.prompt_pairs",
            "chatml.ultra", "llama3.default", "llama3.argilla", "llama3.argilla_chat", "llama3.icr", "llama3.intel",
            "llama3.prompt_pairs", "llama3.ultra", "zephyr.nectar", "chat_template.default", "chat_template.argilla_chat",
            "user_defined.default", "passthrough.default"} == set(PREFERENCE_FORMATS)
    assert {"chatml.argilla", "chatml.argilla_chat", "chatml.intel", "chatml.prompt_pairs", "chatml.ultra",
            "llama3.argilla", "llama3.argilla_chat", "llama3.intel", "llama3.prompt_pairs", "llama3.ultra",
            "user_defined.default"} == set(KTO_FORMATS)


def test_degenerate_pairs_are_detected_not_rejected():
    record = resolve("chatml.intel")({"question": "q", "chosen": "same", "rejected": "same"})
    assert is_degenerate_pair(record)
    assert not is_degenerate_pair({"prompt": "q", "chosen": "a", "rejected": "b"})
