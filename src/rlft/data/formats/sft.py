"""SFT row formats: turn a raw dataset row into a canonical SFT record.

Canonical SFT records are one of:
  {"messages": [{"role", "content"}, ...]}   chat, tokenised with the chat template
  {"prompt": str, "completion": str}        prompt masked, completion (+EOS) trained
  {"text": str}                             every token trained (+EOS)
  {"segments": [(str, bool), ...]}          each text tokenised alone, trained where True (Axolotl's input_output)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from rlft.config import UserDefinedType
from rlft.data.formats.rows import (Record, RowError, RowFormat, bind_tokenizer, call_transform, chat_record,
                                    chat_template_format, fields_of, get_field, message_list, short, text, text_field,
                                    user_transform)
from rlft.errors import DataError

ALPACA_PROMPT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)


def alpaca_format(ds) -> RowFormat:
    def convert(row: dict[str, Any]) -> Record:
        instruction = text_field(row, "instruction")
        extra = text(row.get("input"), "input", optional=True)
        prompt = (ALPACA_PROMPT if extra else ALPACA_PROMPT_NO_INPUT).format(instruction=instruction, input=extra)
        return {"prompt": prompt, "completion": text_field(row, "output")}

    return convert


def completion_format(ds) -> RowFormat:
    def convert(row: dict[str, Any]) -> Record:
        return {"text": text_field(row, ds.field)}

    return convert


def input_output_format(ds) -> RowFormat:
    """Axolotl's template-free `input_output`: {"segments": [{"text": str, "label": bool}, ...]}, each segment's text
    tokenised as it is (no BOS or EOS added: the texts carry their own), its tokens trained where `label` is true."""

    def convert(row: dict[str, Any]) -> Record:
        segments = row.get("segments")
        if not isinstance(segments, list) or not segments:
            raise RowError(f"type: input_output needs a non-empty `segments` list (the row has {fields_of(row)})")
        kept = []
        for index, segment in enumerate(segments):
            words, label = (segment.get("text"), segment.get("label")) if isinstance(segment, dict) else (None, None)
            # 1 and 0 count as true and false, as Axolotl tests the label's truth
            if not isinstance(words, str) or type(label) not in (bool, int) or label not in (0, 1):
                raise RowError(f"segments[{index}] must be {{\"text\": str, \"label\": true|false}}, got {short(segment)}")
            kept.append((words, bool(label)))
        return {"segments": kept}

    return convert


def prompt_completion_format(ds, chunks: bool = False) -> RowFormat:
    """Rows that already hold `prompt` and `completion` strings (or `messages`, or `text`)."""
    chat = chat_template_format(ds, chunks)

    def convert(row: dict[str, Any]) -> Record:
        for keys in (("messages",), ("prompt", "completion"), ("text",)):
            if all(key in row and row[key] is not None for key in keys):
                if keys == ("messages",):
                    return chat(row)
                return {key: text(row[key], key) for key in keys}
        raise RowError(f"no `type:` set and the row has none of messages / prompt+completion / text (it has {fields_of(row)})")

    return convert


def conversation_format(ds, chunks: bool = False) -> RowFormat:
    """SFT's `chat_template`: the conversation at `field_messages`, or the user's turn at `field_prompt` and the
    assistant's at `field_response` (each a text or a message list). With `system_prompt`, a system turn of that text
    leads every conversation that starts without one (neither in its messages nor from its `system` column)."""
    normalise = message_list(ds, chunks)

    def turns(row: dict[str, Any], name: str, role: str) -> list[dict[str, Any]]:
        value = get_field(row, name)
        if isinstance(value, str):
            return [{"role": role, "content": value}]
        if isinstance(value, list):
            return normalise(value, name)
        raise RowError(f"field {name!r} holds {short(value)}: expected the {role}'s text or a list of messages")

    def convert(row: dict[str, Any]) -> Record:
        if ds.field_prompt:
            messages = turns(row, ds.field_prompt, "user") + turns(row, ds.field_response, "assistant")
        else:
            messages = normalise(get_field(row, ds.field_messages), ds.field_messages)
        record = chat_record(ds, row, messages)
        if ds.system_prompt and (not record["messages"] or record["messages"][0]["role"] != "system"):
            record["messages"] = [{"role": "system", "content": ds.system_prompt}, *record["messages"]]
        return record

    return convert


def user_defined_sft_format(spec) -> RowFormat:
    def convert(row: dict[str, Any]) -> Record:
        values = {
            "instruction": text_field(row, spec.field_instruction),
            "input": text(row.get(spec.field_input), spec.field_input, optional=True) if spec.field_input else "",
            "system": (text(row.get(spec.field_system), spec.field_system, optional=True) if spec.field_system else "")
            or spec.system_prompt or "",
        }
        try:
            prompt = (spec.format if values["input"] else spec.no_input_format).format(**values)
            if values["system"]:
                prompt = spec.system_format.format(system=values["system"]) + prompt
        except (KeyError, IndexError, ValueError) as exc:  # a placeholder it does not fill, or a lone brace
            raise RowError(f"the dataset type's format / no_input_format / system_format cannot be filled ({type(exc).__name__}: "
                           f"{exc}): its placeholders are {{instruction}}, {{input}} and {{system}}; write a literal brace "
                           "as {{ or }}") from None
        return {"prompt": prompt, "completion": text_field(row, spec.field_output)}

    return convert


SFT_FORMATS: dict[str, Callable[[Any], RowFormat]] = {
    "chat_template": conversation_format,
    "chat_template.default": conversation_format,
    "alpaca": alpaca_format,
    "completion": completion_format,
    "input_output": input_output_format,
}


def resolve_sft_format(ds, cfg, index: int, where: str, tokenizer) -> RowFormat:
    """The function that turns one raw row of dataset `ds` into a canonical SFT record."""
    chunks = bool(cfg.uses_mistral_common)  # mistral-common encodes typed content chunks itself
    if ds.type is None:
        return prompt_completion_format(ds, chunks)
    if isinstance(ds.type, UserDefinedType):
        return user_defined_sft_format(ds.type)
    if ds.type in ("chat_template", "chat_template.default"):
        return conversation_format(ds, chunks)
    if ds.type in SFT_FORMATS:
        return SFT_FORMATS[ds.type](ds)
    found = user_transform(ds.type, cfg, index, where)
    if found is None:
        known = ", ".join(sorted(SFT_FORMATS))
        raise DataError(
            f"{where}: unknown type {ds.type!r}: SFT formats are {known}; a user transform `module.fn` "
            f"must be importable from {Path.cwd()}"
        )
    transform, _ = found
    transform = bind_tokenizer(transform, tokenizer)
    canonical = prompt_completion_format(ds, chunks)
    return lambda row: canonical(call_transform(transform, ds.type, row))
