"""Tokenizers and chat templates.

`byte_tokenizer()` builds a lossless byte-level tokenizer in code (256 byte tokens + 4 specials, no
files, no training): the tokenizer of the tiny models used by tests and the offline quickstart.
"""

from __future__ import annotations

from pathlib import Path
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import GenerationConfig, PreTrainedTokenizerBase, PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

from rlft.data.chat_templates import CHATML_TEMPLATE, TEMPLATES, add_missing_markers
from rlft.errors import ConfigError

BYTE_SPECIALS = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: ids 0-255 are bytes, 256-259 are `BYTE_SPECIALS`; ChatML template."""
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


def end_ids(model, tokenizer: PreTrainedTokenizerBase, **revision: str) -> tuple[int, ...]:
    """The ids that end an answer: the tokenizer's EOS, then the `eos_token_id` of the model's generation config (one
    or a list: Gemma's <end_of_turn> beside <eos>, Qwen's <|im_end|> beside <|endoftext|>), where vLLM and
    transformers' `generate` stop too. `model`: a loaded model, or its folder or hub name (read from its
    generation_config.json, at `revision` for a hub id; without that file, the tokenizer's EOS alone)."""
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
