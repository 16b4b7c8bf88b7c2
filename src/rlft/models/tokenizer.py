"""Tokenizers and chat templates.

`byte_tokenizer()` builds a lossless byte-level tokenizer in code (256 byte tokens + 4 specials, no
files, no training): the tokenizer of the tiny models used by tests and the offline quickstart.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the templates below are read before anything loads (config checks): transformers is imported on use
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from rlft.errors import ConfigError, ModelError

BYTE_SPECIALS = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# `{% generation %}` marks assistant text, so transformers can return assistant-token masks too. Tools follow the
# Hermes convention of Qwen's ChatML templates: the tool list in a system turn, calls as
# <tool_call>{"name": ..., "arguments": {...}}</tool_call> in the assistant turn (what `rlft vllm-serve` parses back),
# results as <tool_response> in a user turn. Without tools the output is plain ChatML.
CHATML_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\n' }}"
    "{% if messages and messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n\n' }}{% endif %}"
    "{{ '# Tools\n\nTo call a function, answer <tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
    "\n</tool_call>\n\n<tools>' }}{% for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\n</tools><|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] or '' }}"
    "{% for call in message['tool_calls'] or [] %}{{ '\n' if message['content'] or not loop.first else '' }}"
    "{{ '<tool_call>\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' + (call['function']['arguments'] | tojson) + '}\n</tool_call>' }}"
    "{% endfor %}{{ '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

LLAMA3_TEMPLATE = (
    "{{ bos_token if bos_token else '' }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)



def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: ids 0-255 are bytes, 256-259 are `BYTE_SPECIALS`; ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_to_char = bytes_to_unicode()
    core = Tokenizer(models.BPE(vocab={byte_to_char[i]: i for i in range(256)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(BYTE_SPECIALS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        additional_special_tokens=["<|endoftext|>", "<|im_start|>"],
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def apply_chat_template_setting(tokenizer: PreTrainedTokenizerBase, name: str, jinja: str | None) -> None:
    """Set the tokenizer's chat template from the `chat_template` / `chat_template_jinja` keys."""
    from rlft.models.chat_templates import TEMPLATES, add_missing_markers

    if name.startswith("tokenizer_default_fallback_"):  # the tokenizer's own template, else the named one
        if getattr(tokenizer, "chat_template", None):
            return
        name = name.removeprefix("tokenizer_default_fallback_")
        if name not in TEMPLATES:
            raise ConfigError(f"chat_template: the tokenizer has no template of its own and rlft does not ship {name!r}: "
                              f"use one of {', '.join(TEMPLATES)}, or chat_template_jinja")
    if name == "tokenizer_default":
        return
    if name in TEMPLATES:
        tokenizer.chat_template = TEMPLATES[name][0]
        add_missing_markers(tokenizer, name)
        return
    source = jinja if name == "jinja" else name
    if not source:
        raise ConfigError("chat_template: jinja needs chat_template_jinja (the template text or a .jinja file path)")
    candidate = Path(source).expanduser()
    if "{" not in source and candidate.suffix in (".jinja", ".j2"):
        if not candidate.is_file():
            raise ConfigError(f"chat template file not found: {candidate}")
        source = candidate.read_text()
    tokenizer.chat_template = source


def require_chat_template(tokenizer: PreTrainedTokenizerBase, where: str) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise ModelError(
            f"{where} needs a chat template but the tokenizer has none: set `chat_template: chatml` "
            "(or llama3, or jinja with chat_template_jinja)"
        )


def end_ids(model, tokenizer: PreTrainedTokenizerBase, **revision: str) -> tuple[int, ...]:
    """The ids that end an answer: the tokenizer's EOS, then the `eos_token_id` of the model's generation config (one
    or a list: Gemma's <end_of_turn> beside <eos>, Qwen's <|im_end|> beside <|endoftext|>), where vLLM and
    transformers' `generate` stop too. `model`: a loaded model, or its folder or hub name (read from its
    generation_config.json, at `revision` for a hub id; without that file, the tokenizer's EOS alone)."""
    from transformers import GenerationConfig

    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    config = getattr(model, "generation_config", None)
    if config is None and isinstance(model, (str, Path)):
        if Path(model).expanduser().is_dir():  # a folder, also written as ~/...: transformers would take it for a hub id
            model = Path(model).expanduser()
            if (model / "model" / "generation_config.json").is_file():  # an rlft checkpoint's model
                model = model / "model"
        try:
            config = GenerationConfig.from_pretrained(model, **revision)
        except (OSError, ValueError):  # no generation_config.json there
            config = None
    extra = getattr(config, "eos_token_id", None)
    for token in [extra] if isinstance(extra, int) else list(extra or []):
        if token not in ids:
            ids.append(int(token))
    return tuple(ids)


def end_of_turn_token(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The string that closes an assistant turn in this tokenizer's template (for train_on_eos)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    for marker in ("<|im_end|>", "<|eot_id|>", "<|eot|>", "<|end|>", "<end_of_turn>", "<turn|>", "<|END_RESPONSE|>",
                   "<|END_OF_TURN_TOKEN|>", "[|endofturn|]", "<|eom|>", "<｜end▁of▁sentence｜>", "</s>"):
        if marker in template:
            return marker
    return tokenizer.eos_token
