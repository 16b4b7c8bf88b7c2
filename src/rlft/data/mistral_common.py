"""Mistral's own tokenizer (`tokenizer_use_mistral_common: true`): the `mistral-common` package through transformers'
`MistralCommonBackend`, as Axolotl loads it for Magistral, Ministral, Devstral and Voxtral.

Such a tokenizer has no Jinja chat template: mistral-common turns a conversation into token ids itself, so a chat row
is never rendered to text and tokenised again (the control tokens `[INST]`, `[SYSTEM_PROMPT]`, `[THINK]` exist only as
ids). Which tokens are trained is read from that encoding: mistral-common encodes the messages one by one and joins
their ids after the start token, so each message's ids are counted as they are made (`chat_ids`), and a trained
role's ids carry the loss.
"""

from __future__ import annotations

import hashlib
import importlib.util
from importlib.metadata import version
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rlft.errors import ModelError

# the tokenizer files mistral-common reads (a tekken file, or a SentencePiece model with its instruct version)
FILE_PATTERNS = ("tekken.json", "*.model.v*")
ENCODERS = {"encode_user_message": "user", "encode_assistant_message": "assistant", "encode_tool_message": "tool",
            "encode_system_message": "system"}


def is_mistral_common(tokenizer: Any) -> bool:
    return type(tokenizer).__name__ == "MistralCommonBackend" or any(
        cls.__name__ == "MistralCommonBackend" for cls in type(tokenizer).__mro__)


def has_mistral_files(folder: str | Path) -> bool:
    """A folder with a mistral-common tokenizer file and no transformers tokenizer (an rlft run's output, or Mistral's
    own release format)."""
    folder = Path(folder)
    return (folder.is_dir() and not (folder / "tokenizer.json").exists() and not (folder / "tokenizer_config.json").exists()
            and any(next(folder.glob(pattern), None) for pattern in FILE_PATTERNS))


def load_mistral_tokenizer(source: str, mode: str = "finetuning", **revision: str):
    """transformers' `MistralCommonBackend` for `source` (a folder or hub id). `finetuning` mode: a conversation ends
    with an assistant turn and each assistant turn with EOS; `test` mode: prompts for generation."""
    if importlib.util.find_spec("mistral_common") is None:
        raise ModelError("tokenizer_use_mistral_common needs the mistral-common package: "
                         "pip install -c constraints.txt 'rlft[mistral]'")
    from transformers.tokenization_mistral_common import MistralCommonBackend  # needs mistral-common, an optional package

    try:
        return MistralCommonBackend.from_pretrained(source, mode=mode, **revision)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load a mistral-common tokenizer from {source}: {str(exc).splitlines()[0].rstrip('.')} (it needs "
                         "tekken.json or a tokenizer.model.v* file; set tokenizer_use_mistral_common: false for a "
                         "transformers tokenizer)") from None


def chat_ids(tokenizer, messages: list[dict[str, Any]]) -> tuple[list[int], list[tuple[str, int, int]]]:
    """mistral-common's ids of a conversation and the (role, start, end) span of each message it encoded, in order.

    The spans come from mistral-common's own per-message encoders, counted while `apply_chat_template` runs; a
    conversation it refuses (roles out of order, a last turn that is not the assistant's in finetuning mode, a chunk
    this tokenizer version cannot encode) raises ValueError with its reason.
    """
    from mistral_common.exceptions import MistralCommonException  # an optional package (rlft[mistral])

    instruct = tokenizer.tokenizer.instruct_tokenizer
    counted: list[tuple[str, int]] = []

    def counting(name: str, role: str):
        method = getattr(instruct, name)

        def encode(*args, **kwargs):
            out = method(*args, **kwargs)
            tokens = out[0] if isinstance(out, tuple) else out
            counted.append((role, len(tokens or [])))
            return out

        return encode

    for name, role in ENCODERS.items():
        if hasattr(instruct, name):
            setattr(instruct, name, counting(name, role))  # on this instance only, removed below
    try:
        ids = list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False))
    except (MistralCommonException, ValidationError, AssertionError, ValueError, TypeError, KeyError, IndexError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__  # e.g. a thinking chunk without [THINK]
        raise ValueError(f"mistral-common cannot encode the messages: {reason}") from None
    finally:
        for name in ENCODERS:
            instruct.__dict__.pop(name, None)
    start = len(ids) - sum(length for _, length in counted)
    if start != len(instruct.start()):
        raise ModelError(f"mistral-common {_version()} encoded {len(ids)} ids, and its message encoders gave "
                         f"{len(ids) - start} of them after a start of {len(instruct.start())}: rlft cannot tell which "
                         "ids each message has with this version: pip install -c constraints.txt 'rlft[mistral]' "
                         "(rlft is tested with mistral-common 1.13)")
    spans = []
    for role, length in counted:
        spans.append((role, start, start + length))
        start += length
    return ids, spans


def _version() -> str:
    return version("mistral-common")


def fingerprint(tokenizer) -> str:
    """What identifies the tokenizer for the prepared-data cache: its file's bytes, its version and mode."""
    path = Path(tokenizer._tokenizer_path)
    return f"mistral-common {_version()} {tokenizer.mode.value} {hashlib.sha256(path.read_bytes()).hexdigest()}"
