"""Preference formats rendered with a chat template: `chat_template.*`, Bradley-Terry reward-model rows, and ORPO's
`chat_template.argilla`."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from rlft.config.methods import method_spec
from rlft.data.formats.preference.fields import Record, RowFormat, checked_text, required_text, system_text
from rlft.data.formats.rows import RowError, get_field, message_list, render_chat
from rlft.data.tokenizer import apply_chat_template_setting
from rlft.errors import DataError

DUMMY_USER = "[[dummy_message]]"


def dataset_chat_template(ds) -> str | None:
    """The dataset-level `chat_template` (+ `chat_template_jinja`) override, if the entry has one."""
    name = getattr(ds, "chat_template", None)
    if not name or name == "tokenizer_default":
        return None
    holder = SimpleNamespace(chat_template=None)
    apply_chat_template_setting(holder, name, getattr(ds, "chat_template_jinja", None))
    return holder.chat_template


class ChatRenderer:
    """Messages of a row, normalised like `chat_template` SFT rows, rendered with the chat template."""

    def __init__(self, ds, tokenizer, template: str | None = None):
        if template is None and not getattr(tokenizer, "chat_template", None):
            raise DataError(
                "this format renders with a chat template but the tokenizer has none: set "
                "`chat_template: chatml` (or llama3, or jinja with chat_template_jinja)"
            )
        self.tokenizer, self.template = tokenizer, template
        self._normalise = message_list(ds)

    def messages(self, value: Any, name: str) -> list[dict[str, str]]:
        """A message list (a plain string is one user message), with roles and keys mapped."""
        if isinstance(value, str):
            return [{"role": "user", "content": value}]
        if not isinstance(value, list):
            raise RowError(f"field {name!r} must be a list of messages, got {type(value).__name__}")
        return self._normalise(value, name)

    def answer(self, value: Any, name: str) -> dict[str, str]:
        """An answer: a string (assistant message), one message, or a list (its last message)."""
        if isinstance(value, str):
            message = {"role": "assistant", "content": value}
        elif isinstance(value, dict):
            try:
                message = self.messages([value], name)[0]
            except RowError as exc:
                raise RowError(str(exc).replace(f"{name}[0]", name)) from None
        elif isinstance(value, list):
            listed = self.messages(value, name)
            if not listed:
                raise RowError(f"field {name!r} has no message left")
            message = listed[-1]
        else:
            raise RowError(f"field {name!r} must be a string, a message or a list of messages, got {type(value).__name__}")
        checked_text(message["content"], name)
        return message

    def render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        kwargs: dict[str, Any] = {"add_generation_prompt": generation_prompt}
        if self.template is not None:
            kwargs["chat_template"] = self.template
        return render_chat(self.tokenizer, messages, **kwargs)

    def answer_text(self, message: dict[str, str], name: str) -> str:
        """Axolotl's dummy-user trick: render [dummy user, answer], keep from the answer on, rstrip.

        The answer is searched for after the dummy turn and its assistant header (the render of the
        dummy with the generation prompt, when that is a prefix), so short answers such as "a" are
        not found inside the header's own text.
        """
        dummy = [{"role": "user", "content": DUMMY_USER}]
        text = self.render(dummy + [message], generation_prompt=False)
        head = self.render(dummy, generation_prompt=True)
        after = len(head) if text.startswith(head) else text.find(DUMMY_USER) + len(DUMMY_USER)
        content = message["content"]
        start = text.find(content, after)
        if start < 0:
            start = text.find(content.strip(), after)
        if start < 0:
            raise RowError(f"field {name!r}: its content does not appear in the chat template's render of it")
        return text[start:].rstrip()


def chat_template_default(ds, tokenizer, method) -> RowFormat:
    """`field_messages` is the prompt conversation; `field_chosen`/`field_rejected` the two answers.

    prompt = template(messages, add_generation_prompt=True); each answer = the dummy-user render from
    the answer's content on, right-stripped. For reward models, a row without `field_messages`
    whose answers are whole conversations is a Bradley-Terry row (see `bradley_terry_record`).
    """
    chat = ChatRenderer(ds, tokenizer, dataset_chat_template(ds))

    def convert(row: dict[str, Any]) -> Record:
        if method_spec(method).bradley_terry and _is_bradley_terry(row, ds):
            return bradley_terry_record(chat, row, ds.field_chosen, ds.field_rejected)
        return conversation_record(chat, row, ds.field_messages, ds.field_chosen, ds.field_rejected)

    return convert


def conversation_record(chat: ChatRenderer, row: dict[str, Any], messages_key: str, chosen_key: str,
                         rejected_key: str) -> Record:
    messages = chat.messages(get_field(row, messages_key), messages_key)
    return {
        "prompt": chat.render(messages, generation_prompt=True),
        "chosen": chat.answer_text(chat.answer(get_field(row, chosen_key), chosen_key), chosen_key),
        "rejected": chat.answer_text(chat.answer(get_field(row, rejected_key), rejected_key), rejected_key),
    }


def chat_template_argilla_chat(ds, tokenizer, method) -> RowFormat:
    """Answers are whole conversations: prompt = template(chosen[:-1]) with the generation prompt;
    chosen = chosen[-1], rejected = rejected[-1], each by the dummy-user trick."""
    chat = ChatRenderer(ds, tokenizer, dataset_chat_template(ds))

    def convert(row: dict[str, Any]) -> Record:
        return argilla_chat_record(chat, row, ds.field_chosen, ds.field_rejected)

    return convert


def argilla_chat_record(chat: ChatRenderer, row: dict[str, Any], chosen_key: str, rejected_key: str) -> Record:
    chosen, rejected = _conversation(chat, row, chosen_key), _conversation(chat, row, rejected_key)
    if len(chosen) < 2:
        raise RowError(f"field {chosen_key!r} needs the prompt messages and the answer (at least 2 messages), has {len(chosen)}")
    return {
        "prompt": chat.render(chosen[:-1], generation_prompt=True),
        "chosen": chat.answer_text(chosen[-1], chosen_key),
        "rejected": chat.answer_text(rejected[-1], rejected_key),
    }


def _conversation(chat: ChatRenderer, row: dict[str, Any], key: str) -> list[dict[str, str]]:
    """A whole conversation (a message list) whose last message, the answer, is not empty."""
    value = get_field(row, key)
    if not isinstance(value, list):
        raise RowError(f"field {key!r} must be a list of messages (the conversation), got {type(value).__name__}")
    messages = chat.messages(value, key)
    if not messages:
        raise RowError(f"field {key!r} is an empty conversation")
    checked_text(messages[-1]["content"], key)
    return messages


def _is_bradley_terry(row: dict[str, Any], ds) -> bool:
    """No prompt conversation, and both answers are message lists (whole conversations)."""
    try:
        get_field(row, ds.field_messages)
        return False
    except RowError:
        pass
    return all(isinstance(row.get(key), list) for key in (ds.field_chosen, ds.field_rejected))


def bradley_terry_record(chat: ChatRenderer, row: dict[str, Any], chosen_key: str, rejected_key: str) -> Record:
    """Two whole conversations scored by a reward model: prompt = their shared rendered start.

    The prompt is the render of the leading messages both share (at most all but the last of the
    shorter one), with the generation prompt when both continue with an assistant turn, if that
    render is a string prefix of both whole renders; else "" (or the BOS text both start with).
    chosen / rejected = the rest of each whole render, right-stripped.
    """
    chosen, rejected = _conversation(chat, row, chosen_key), _conversation(chat, row, rejected_key)
    whole_chosen = chat.render(chosen, generation_prompt=False)
    whole_rejected = chat.render(rejected, generation_prompt=False)
    shared = 0
    while shared < min(len(chosen), len(rejected)) - 1 and chosen[shared] == rejected[shared]:
        shared += 1
    prompt = ""
    if shared:
        replies = chosen[shared]["role"] == "assistant" and rejected[shared]["role"] == "assistant"
        prompt = chat.render(chosen[:shared], generation_prompt=replies)
        if not (whole_chosen.startswith(prompt) and whole_rejected.startswith(prompt)):
            prompt = ""
    bos = getattr(chat.tokenizer, "bos_token", None)
    if not prompt and bos and whole_chosen.startswith(bos) and whole_rejected.startswith(bos):
        prompt = bos
    return {
        "prompt": prompt,
        "chosen": whole_chosen[len(prompt):].rstrip(),
        "rejected": whole_rejected[len(prompt):].rstrip(),
    }


def orpo_chat_template_argilla(ds, tokenizer, method) -> RowFormat:
    """ORPO `chat_template.argilla`: answers are whole alternating user/assistant conversations.

    Prompt messages: the optional system, then each turn's user message (the row's `prompt` if it has
    one, repeated for every turn as Axolotl does, else chosen[2i]) and, except in the last turn,
    chosen's assistant reply. prompt = template(prompt messages, generation prompt); each answer =
    template(prompt messages + its last message) with the prompt's characters cut off the front.
    The template is the top-level `chat_template` only (the tokenizer's), as in Axolotl.
    """
    chat = ChatRenderer(ds, tokenizer)
    chosen_key, rejected_key = ds.field_chosen, ds.field_rejected

    def convert(row: dict[str, Any]) -> Record:
        chosen = chat.messages(get_field(row, chosen_key), chosen_key)
        rejected = chat.messages(get_field(row, rejected_key), rejected_key)
        if not chosen or len(chosen) % 2:
            raise RowError(
                f"field {chosen_key!r} has {len(chosen)} messages: invalid number of turns, ORPO needs "
                "alternating user/assistant turns (an even number)"
            )
        if not rejected:
            raise RowError(f"field {rejected_key!r} is an empty conversation")
        prompt_messages = []
        system = system_text(row)
        if system:
            prompt_messages.append({"role": "system", "content": system})
        user_prompt = required_text(row, "prompt", allow_empty=True) if row.get("prompt") is not None else None
        turns = len(chosen) // 2
        for turn in range(turns):
            user = user_prompt if user_prompt is not None else chosen[2 * turn]["content"]
            prompt_messages.append({"role": "user", "content": user})
            if turn < turns - 1:
                prompt_messages.append({"role": "assistant", "content": chosen[2 * turn + 1]["content"]})
        prompt = chat.render(prompt_messages, generation_prompt=True)
        record = {"prompt": prompt}
        for side, messages, key in (("chosen", chosen, chosen_key), ("rejected", rejected, rejected_key)):
            content = checked_text(messages[-1]["content"], key)
            whole = chat.render(prompt_messages + [{"role": "assistant", "content": content}], generation_prompt=False)
            if not whole.startswith(prompt):
                raise RowError(
                    f"field {key!r}: the chat template's render of the prompt is not a prefix of its render "
                    "with the answer, so the answer cannot be cut out (use chat_template.default instead)"
                )
            record[side] = whole[len(prompt):]
        return record

    return convert
