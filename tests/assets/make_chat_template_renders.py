"""Write tests/data/chat_template_renders.json: Axolotl's own chat templates rendered on fixed conversations.

tests/unit/test_chat_templates_rendering.py renders rlft's named templates on the same conversations and compares.
Run once, where a clone of Axolotl is at hand (CI reads only the JSON):

  .venv/bin/python tests/assets/make_chat_template_renders.py [--repo PATH_TO_AXOLOTL_CLONE]

Rendering is transformers' (`tokenizer.apply_chat_template`): its sandboxed jinja environment with trim_blocks and
lstrip_blocks, `raise_exception`, `tojson` and `strftime_now` (fixed to FIXED_DATE here, so the output does not
change with the day), `bos_token` / `eos_token` as variables. Each template is rendered with the special tokens of
its model family ("typical") and with placeholder tokens ("distinct"), which shows where a template reads
`bos_token` / `eos_token` and where it writes the text itself. A render that raises is stored as its error.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from datetime import datetime
from pathlib import Path

AXOLOTL_COMMIT = "067b021c8b87a9e5e380b9173c704cf7340e30f5"
TEMPLATE_DIR = "src/axolotl/utils/chat_templates/templates"
OUTPUT = Path(__file__).resolve().parents[1] / "data" / "chat_template_renders.json"
FIXED_DATE = datetime(2025, 1, 31)

# The special tokens of each family's tokenizer (tokenizer_config.json of its checkpoints); None where it has none
TYPICAL_TOKENS = {
    "mistral_v3_tekken": ("<s>", "</s>"),
    "mistral_v7_tekken": ("<s>", "</s>"),
    "llama4": ("<|begin_of_text|>", "<|eot|>"),
    "deepseek_v3": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "jamba": ("<|startoftext|>", "<|endoftext|>"),
    "qwen3": (None, "<|im_end|>"),
    "qwen3_5": (None, "<|im_end|>"),
    "falcon_h1": ("<|begin_of_text|>", "<|end_of_text|>"),
    "nemotron_h": ("<s>", "</s>"),
    "exaone4": ("[BOS]", "[|endofturn|]"),
    "gemma3": ("<bos>", "<eos>"),
    "gemma3n": ("<bos>", "<eos>"),
    "gemma4": ("<bos>", "<eos>"),
    "gemma4_unified": ("<bos>", "<eos>"),
    "command_a": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    "command_a_tool_use": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    "command_a_rag": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    "aya": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
}
DISTINCT_TOKENS = ("[BOS]", "[EOS]")
# templates that read `enable_thinking`: also rendered with it set to False and to True
THINKING = ("qwen3", "qwen3_5", "exaone4", "gemma4", "gemma4_unified")


def message(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


S, U, A = "system", "user", "assistant"
CONVERSATIONS: dict[str, list[dict[str, str]]] = {
    "system_user_assistant": [message(S, "You are terse."), message(U, "Hi there"), message(A, "Hello!")],
    "user_assistant": [message(U, "What is the capital of France?"), message(A, "Paris.")],
    "multi_turn": [message(U, "One?"), message(A, "1"), message(U, "Two?"), message(A, "2"), message(U, "Three?"),
                   message(A, "3")],
    "system_multi_turn": [message(S, "Count."), message(U, "One?"), message(A, "1"), message(U, "Two?"), message(A, "2"),
                          message(U, "Three?"), message(A, "3")],
    "user": [message(U, "Hello?")],
    "system_user": [message(S, "You are terse."), message(U, "Hello?")],
    "system_user_assistant_user": [message(S, "You are terse."), message(U, "One?"), message(A, "1"), message(U, "Two?")],
    "unicode": [message(S, "Réponds en français ✓"), message(U, "Ünïcödé — 日本語 🚀 ½?"), message(A, "Ça va — 你好 ✓ 😀")],
    "whitespace": [message(S, "  Be brief.\n"), message(U, "\n  What is 2+2?  \n\n"), message(A, " \n4\n "),
                   message(U, "  and 3+3? "), message(A, "6  ")],
    "empty_answer": [message(U, "Say nothing."), message(A, "")],
    "thinking_in_answers": [message(U, "One?"), message(A, "<think>\nit is one\n</think>\n\n1"), message(U, "Two?"),
                            message(A, "<think>two</think>2"), message(U, "Three?"),
                            message(A, "<|channel>thought\nthree<channel|>3")],
    "system_in_the_middle": [message(U, "One?"), message(A, "1"), message(S, "Be brief."), message(U, "Two?")],
    "two_assistant_messages": [message(U, "One?"), message(A, "1"), message(A, "and more")],
    "developer_first": [message("developer", "Be brief."), message(U, "One?"), message(A, "1")],
}
ENDS_WITH_USER = [name for name, chat in CONVERSATIONS.items() if chat[-1]["role"] == U]


def render(template: str, messages, add_generation_prompt: bool, bos_token, eos_token, **kwargs) -> str:
    """What `tokenizer.apply_chat_template(messages, tokenize=False, ...)` returns, with strftime_now fixed."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template(template).render(
        messages=messages, tools=None, documents=None, add_generation_prompt=add_generation_prompt, bos_token=bos_token,
        eos_token=eos_token, strftime_now=FIXED_DATE.strftime, **kwargs)


def cases(name: str) -> list[dict]:
    """(conversation, add_generation_prompt, tokens, kwargs) combinations rendered for `name`."""
    out = []
    for conversation in CONVERSATIONS:
        for generation in (False, True) if conversation in ENDS_WITH_USER or conversation == "user_assistant" else (False,):
            out.append({"conversation": conversation, "add_generation_prompt": generation, "tokens": "typical", "kwargs": {}})
    for conversation in ("system_user_assistant", "system_user", "multi_turn"):
        out.append({"conversation": conversation, "add_generation_prompt": True, "tokens": "distinct", "kwargs": {}})
    if name in THINKING:
        for enable in (False, True):
            for conversation in ("system_user_assistant_user", "thinking_in_answers", "user"):
                for generation in (False, True):
                    out.append({"conversation": conversation, "add_generation_prompt": generation, "tokens": "typical",
                                "kwargs": {"enable_thinking": enable}})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default="/work/.mirror/axolotl-ai-cloud+axolotl/repo", help="a clone of Axolotl")
    args = parser.parse_args()
    renders = {}
    for name, typical in TYPICAL_TOKENS.items():
        template = subprocess.run(["git", "-C", args.repo, "show", f"{AXOLOTL_COMMIT}:{TEMPLATE_DIR}/{name}.jinja"],
                                  check=True, capture_output=True, text=True).stdout
        entries = []
        for case in cases(name):
            bos, eos = typical if case["tokens"] == "typical" else DISTINCT_TOKENS
            try:
                case["text"] = render(template, CONVERSATIONS[case["conversation"]], case["add_generation_prompt"], bos, eos,
                                      **case["kwargs"])
            except Exception as error:  # noqa: BLE001 - stored: rlft's template must raise as well
                case["error"] = f"{type(error).__name__}: {error}"
            entries.append(case)
        renders[name] = entries
    data = {
        "about": f"Axolotl's chat templates (axolotl-ai-cloud/axolotl@{AXOLOTL_COMMIT[:7]}) rendered the way transformers "
                 f"does; strftime_now returns {FIXED_DATE:%Y-%m-%d}. Written by tests/assets/make_chat_template_renders.py.",
        "tokens": {"typical": TYPICAL_TOKENS, "distinct": DISTINCT_TOKENS},
        "conversations": CONVERSATIONS,
        "renders": renders,
    }
    OUTPUT.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{sum(map(len, renders.values()))} renders of {len(renders)} templates in {OUTPUT}")


if __name__ == "__main__":
    main()
