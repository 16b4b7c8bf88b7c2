"""rlft's layouts of Axolotl's vendor chat templates render text chats exactly as Axolotl's own templates do.

tests/data/chat_template_renders.json holds Axolotl's templates rendered on fixed conversations (system + user +
assistant, user + assistant, three exchanges, generation prompts, unicode, content with spaces and newlines around it,
think blocks in answers, a system message mid-chat, ...), with each family's own BOS/EOS strings and with placeholder
ones, and with `enable_thinking` False/True where the template reads it; tests/assets/make_chat_template_renders.py
wrote it from a clone of Axolotl. Rendering is transformers' (trim_blocks, lstrip_blocks, raise_exception) with
strftime_now fixed to the file's date. Where Axolotl's template raises, rlft's must raise too.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jinja2
import pytest

from rlft.config.template_names import NAMES, NOT_SHIPPED, TEMPLATE_NAMES
from rlft.data.chat_templates import TEMPLATES

DATA = json.loads((Path(__file__).resolve().parents[1] / "data" / "chat_template_renders.json").read_text(encoding="utf-8"))
FIXED_DATE = datetime(2025, 1, 31)  # what strftime_now returned when the JSON was written (see its "about")
CASES = [(name, index) for name, entries in DATA["renders"].items() for index in range(len(entries))]


def render(template: str, messages, add_generation_prompt: bool = False, bos_token="<s>", eos_token="</s>", **kwargs) -> str:
    """`tokenizer.apply_chat_template(messages, tokenize=False)`, with strftime_now fixed."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template(template).render(
        messages=messages, tools=kwargs.pop("tools", None), documents=kwargs.pop("documents", None),
        add_generation_prompt=add_generation_prompt, bos_token=bos_token, eos_token=eos_token,
        strftime_now=FIXED_DATE.strftime, **kwargs)


def test_the_json_covers_the_shipped_vendor_templates():
    assert FIXED_DATE.strftime("%Y-%m-%d") in DATA["about"]
    assert set(DATA["renders"]) <= set(TEMPLATES) and not set(DATA["renders"]) & set(NOT_SHIPPED)
    assert len(DATA["renders"]) == 18


@pytest.mark.parametrize(("name", "index"), CASES, ids=[f"{name}-{index}" for name, index in CASES])
def test_rlft_layout_renders_as_axolotl(name, index):
    case = DATA["renders"][name][index]
    bos, eos = DATA["tokens"][case["tokens"]][name] if case["tokens"] == "typical" else DATA["tokens"]["distinct"]
    messages = DATA["conversations"][case["conversation"]]
    args = (TEMPLATES[name][0], messages, case["add_generation_prompt"], bos, eos)
    if "error" in case:
        with pytest.raises(jinja2.TemplateError):
            render(*args, **case["kwargs"])
    else:
        assert render(*args, **case["kwargs"]) == case["text"]


def test_the_layouts_render_through_transformers_public_path():
    """The path training takes (`render_jinja_template`, as `apply_chat_template` calls it): same text."""
    from transformers.utils.chat_template_utils import render_jinja_template

    messages = DATA["conversations"]["system_user_assistant"]
    for name in DATA["renders"]:
        if name == "mistral_v7_tekken":
            continue  # dated system prompt only without a system message; this chat has one
        bos, eos = DATA["tokens"]["typical"][name]
        expected = next(case["text"] for case in DATA["renders"][name]
                        if case["conversation"] == "system_user_assistant" and case["tokens"] == "typical" and not case["kwargs"])
        rendered, _ = render_jinja_template([messages], chat_template=TEMPLATES[name][0], bos_token=bos, eos_token=eos)
        assert rendered[0] == expected, name


LEFT_OUT = {
    "tools": {"tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}]},
    "documents": {"documents": [{"title": "t", "text": "x"}]},
}


@pytest.mark.parametrize("name", sorted(DATA["renders"]))
def test_what_a_layout_leaves_out_stops_with_the_field_named(name):
    template = TEMPLATES[name][0]
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    for field, kwargs in LEFT_OUT.items():
        with pytest.raises(jinja2.TemplateError, match=f"`{field}`.*tokenizer_default"):
            render(template, chat, **kwargs)
    call = {"id": "call012345", "type": "function", "function": {"name": "f", "arguments": {}}}
    for message, what in (({"role": "assistant", "content": "", "tool_calls": [call]}, "`tool_calls`"),
                          ({"role": "assistant", "content": "4", "reasoning_content": "2+2"}, "`reasoning_content`"),
                          ({"role": "tool", "content": "4", "tool_call_id": "call012345"}, "`tool`"),
                          ({"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}, "not text")):
        with pytest.raises(jinja2.TemplateError, match=f"chat_template: {name} .*{what}"):
            render(template, [*chat, message] if message["role"] != "user" else [message])


def test_template_settings_a_layout_leaves_out_are_named():
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    for name, kwargs, what in (("command_a", {"safety_mode": "strict"}, "safety_mode"),
                               ("exaone4", {"skip_think": False}, "skip_think"),
                               ("jamba", {"knobs": {"is_set": True}}, "knobs"), ("llama4", {"custom_tools": []}, "custom_tools")):
        with pytest.raises(jinja2.TemplateError, match=what):
            render(TEMPLATES[name][0], chat, **kwargs)
    with pytest.raises(jinja2.TemplateError, match="`name`"):
        render(TEMPLATES["jamba"][0], [{"role": "user", "content": "Hi", "name": "bob"}])


def test_the_config_names_every_template_written_here_in_order():
    """`chat_template:` validates against the names in rlft.config (the config reads no template text): the same names
    as the templates written here, in the same order (`rlft validate` lists them so)."""
    assert TEMPLATE_NAMES == tuple(TEMPLATES)
    assert NAMES == ("tokenizer_default", "jinja", *TEMPLATES, *NOT_SHIPPED)


def test_vision_templates_are_refused_in_train_as_vision_templates(config):
    from rlft.config.axolotl_keys import unsupported_settings

    assert set(NOT_SHIPPED) == {"llama3_2_vision", "pixtral", "llava", "qwen2_vl"}
    for name in NOT_SHIPPED:
        refused = dict(unsupported_settings(config(chat_template=name))[0])
        assert "vision template" in refused[f"chat_template: {name}"]
