"""Prompt datasets for online RL: rows -> {prompt_ids, prompt, columns}.

A row needs a `prompt` (a string or a message list) after its transform; every other column is
kept and reaches the reward functions as a keyword argument (TRL's convention). `type:` may be a
user transform `module.fn` (Axolotl/TRL style, returning `transform_fn` or `(transform_fn,
map_kwargs)`), or `chat_template` (the messages at `field_messages` are the prompt). With no type,
`field_prompt` and `field_response` name the prompt's and the reference answer's columns (Cosmos-RL's
prompt_column_name and response_column_name), read as `prompt` and `answer`.
"""

from __future__ import annotations

from typing import Any, Callable, TypedDict

from rlft.data.formats.rows import (RowError, bind_tokenizer, call_transform, chat_template_format, fields_of, render_chat, text,
                                    user_transform)
from rlft.errors import DataError


CHAT_TOOLS = "_chat_tools"  # a prompt record's parsed tools for the chat template (the tools column itself stays a column)


def _columns(prompt: str | None, answer: str | None) -> Callable[[dict], dict]:
    """Rows as they are, with `field_prompt`'s column read as `prompt` and `field_response`'s as `answer` (the column the
    built-in rewards read); the named columns stay too (reward functions get every column)."""
    renames = [(column, name) for column, name in ((prompt, "prompt"), (answer, "answer")) if column]

    def convert(row: dict) -> dict:
        record = dict(row)
        for column, name in renames:
            if column not in row:
                raise RowError(f"no column {column!r} (field_{'prompt' if name == 'prompt' else 'response'}; the row has "
                               f"{fields_of(row)})")
            record[name] = row[column]
        return record

    return convert


def resolve_prompt_format(ds, cfg, index: int, where: str, tokenizer) -> Callable[[dict], dict]:
    if ds.type is None:
        convert: Callable[[dict], dict] = _columns(ds.field_prompt, ds.field_response)
    elif ds.type in ("chat_template", "chat_template.default"):
        messages = chat_template_format(ds)
        field = ds.field_messages.split(".")[0]

        def convert(row: dict) -> dict:  # the other columns go on to the reward functions as they are
            chat = messages(row)
            return {**{k: v for k, v in row.items() if k != field}, "prompt": chat["messages"],
                    **({CHAT_TOOLS: chat["tools"]} if "tools" in chat else {})}
    elif isinstance(ds.type, str):
        found = user_transform(ds.type, cfg, index, where)
        if found is None:
            raise DataError(f"{where}: type {ds.type!r}: no module {ds.type.rpartition('.')[0]!r} to import from the working "
                            "directory; GRPO datasets take a user transform `module.fn`, `chat_template`, or no type")
        transform, map_kwargs = found
        transform = bind_tokenizer(transform, tokenizer)
        removed = map_kwargs.get("remove_columns") or []

        def convert(row: dict) -> dict:
            kept = {} if removed == "__all__" else {k: v for k, v in row.items() if k not in removed}
            return {**kept, **call_transform(transform, ds.type, row)}
    else:
        raise DataError(f"{where}: a user-defined `type:` mapping is for preference data; GRPO needs a `prompt` column")

    def to_record(row: dict) -> dict:
        record = convert(row)
        if record.get("prompt") in (None, "", []):
            raise RowError(f"no `prompt` after the transform (row has {fields_of(record)}): GRPO rows need a prompt string or message list")
        prompt = record["prompt"]
        if isinstance(prompt, list):
            for turn, message in enumerate(prompt):
                if not isinstance(message, dict) or "role" not in message or "content" not in message:
                    raise RowError(f"prompt[{turn}] is not a message (a mapping with role and content): {message!r:.60}")
                text(message["role"], f"prompt[{turn}].role")
                text(message["content"], f"prompt[{turn}].content", optional=True)
        else:
            text(prompt, "prompt")
        return record

    return to_record


def prompt_text(prompt: str | list, tokenizer, chat_template_kwargs: dict | None) -> tuple[str, bool]:
    """The text the model is given and whether the tokenizer adds its special tokens to it.

    A message list is rendered with the chat template, which holds any BOS itself; a string gets the
    tokenizer's special tokens unless it already starts with BOS (a prompt rendered beforehand).
    """
    if isinstance(prompt, list):
        kwargs = dict(chat_template_kwargs or {})
        opening = kwargs.pop("add_generation_prompt", True)  # multi-turn rollouts may set it (and continue_final_message)
        return render_chat(tokenizer, prompt, add_generation_prompt=opening, **kwargs), False
    return prompt, not (tokenizer.bos_token is not None and prompt.startswith(tokenizer.bos_token))


def template_kwargs(record: dict[str, Any], chat_template_kwargs: dict | None) -> dict | None:
    """The chat template's keyword arguments for a prompt: the config's, and the row's tools (a chat_template dataset's
    tools column, parsed) after any the config gives (a multi-turn run's Python tools), which the template shows the
    model."""
    tools = record.get(CHAT_TOOLS)
    if not tools:
        return chat_template_kwargs
    return {**(chat_template_kwargs or {}), "tools": [*((chat_template_kwargs or {}).get("tools") or []), *tools]}


class PromptRow(TypedDict, total=False):
    """One prompt of an online-RL or structured-EBFT dataset, as the rollout side reads it."""

    prompt_ids: list[int]  # the prompt's token ids, chat template applied (what the engine continues)
    prompt: Any  # the prompt as the dataset gave it: a string, or a list of chat messages
    columns: dict[str, Any]  # the row's other columns, passed to the reward functions by name (e.g. `answer`)
    ground_truth_ids: list[int]  # structured EBFT: the reference completion's ids, end token included


def tokenize_prompt(record: dict[str, Any], tokenizer, chat_template_kwargs: dict | None, chat: bool = False) -> PromptRow:
    """`chat`: a string prompt is rendered as one user message (multi-turn rollouts, whose later turns the chat template
    renders too); the row keeps the prompt as given."""
    prompt = record["prompt"]
    shown = [{"role": "user", "content": prompt}] if chat and isinstance(prompt, str) else prompt
    if (chat_template_kwargs or {}).get("continue_final_message") and isinstance(shown, list):
        _refuse_continuing_a_non_assistant_turn(shown, isinstance(prompt, str))
    text, special = prompt_text(shown, tokenizer, template_kwargs(record, chat_template_kwargs))
    ids = tokenizer(text, add_special_tokens=special)["input_ids"]
    columns = {k: v for k, v in record.items() if k not in ("prompt", "completion", "completion_ids", CHAT_TOOLS)}
    return {"prompt_ids": ids, "prompt": prompt, "columns": columns}


def _refuse_continuing_a_non_assistant_turn(messages: list, from_string: bool) -> None:
    """continue_final_message renders the last message open for the model to go on writing, which is right only for an
    assistant message the dataset started; any other last turn would have the model write the user's (or a tool's)
    words."""
    last = messages[-1].get("role") if messages and isinstance(messages[-1], dict) else None
    if last == "assistant":
        return
    shown = "the prompt is a string (rendered as one user message)" if from_string else \
        f"the prompt's last message is {last!r}, not 'assistant'"
    raise RowError(f"field `prompt`: {shown}, and continue_final_message is true, so the model would continue that turn "
                   "instead of answering it. End each prompt with the assistant message the model should continue, or "
                   "set trl.multi_turn_config.continue_final_message: false (or drop continue_final_message from "
                   "trl.chat_template_kwargs)")


def fit_prompt(example: dict[str, Any], budget: int, strategy: str) -> tuple[dict | None, str]:
    """Prompts longer than `budget` (sequence_len - max_completion_length) are dropped, cut from the left, or refused."""
    if len(example["prompt_ids"]) <= budget:
        return example, "ok"
    if strategy == "raise":
        raise RowError(f"prompt has {len(example['prompt_ids'])} tokens; with max_completion_length the budget is {budget} "
                       "(raise sequence_len, shorten max_completion_length, or set excess_length_strategy: drop)")
    if strategy == "drop":
        return None, "too_long"
    return {**example, "prompt_ids": example["prompt_ids"][-budget:]}, "truncated"
