"""Row formats of preference data: a raw row -> a canonical record of rendered strings.

Canonical records (the recipe tokenises them: the prompt with the tokenizer's special tokens unless it
already starts with BOS; the answers without, plus EOS when they do not already end with it):

  pairs (dpo, ipo, simpo, orpo, reward_model)  {"prompt": str, "chosen": str, "rejected": str}
                                               (+ "margin": float for reward models, when the row has one)
  KTO                                          {"prompt": str, "completion": str, "label": bool}

The strings are exactly Axolotl's (spec `axolotl-rl.md` §C2-C8), so users' configs and data give
the same text. `type:` resolves like Axolotl (§C1): `X` means `X.default`; the built-in names of the
method first; else a user `module.fn` importable from the working directory; a mapping means
`user_defined.default`; no type means the row already holds the canonical fields.

Deliberate differences from the reference implementation:

* `zephyr.nectar`: chosen = the answer with the best rank (the LOWEST rank number, rank 1 = best in
  Nectar), rejected = the second best. Axolotl takes the two largest rank numbers, which is inverted.
* `chat_template.*` answers (the "dummy user" trick of §C5): the answer is searched for after the
  dummy message and its assistant header, not from the start of the render (an answer such as "a"
  or "user" would otherwise match a role header), also as its stripped text (templates that `trim` content), and a miss raises
  RowError instead of degenerating to the last character.
* `chatml.argilla` / `llama3.argilla` (documented, gone from Axolotl) are aliases of `*.default`.
* KTO `user_defined`: a `{system}` placeholder with no system in the row renders as "" (or
  `system_prompt`) instead of Axolotl's KeyError; DPO `user_defined` also falls back to `system_prompt`.
* Format strings of `user_defined` are checked once, when the format is resolved, not on every row.
* Reward models, Bradley-Terry rows (`chosen`/`rejected` are whole conversations, no
  `field_messages` column): prompt = the render of the leading messages both conversations share
  (with the generation prompt when both continue with an assistant turn) when that render is a prefix
  of both whole renders; otherwise "" (or the BOS text both renders start with, so BOS is not doubled).
  chosen/rejected = the rest of each render, right-stripped like the DPO `chat_template` answers.
  The model scores prompt + answer as one text, so where the cut falls changes nothing but padding.

Every row problem raises RowError naming the field; the caller adds the dataset and the row index.
A pair whose chosen equals its rejected is not an error here: see `is_degenerate_pair`.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

from rlft.data.formats import (RowError, bind_tokenizer, call_transform, chat_template_format, fields_of, get_field, render_chat,
                               text, user_transform)
from rlft.errors import DataError, RlftError

Record = dict[str, Any]
RowFormat = Callable[[dict[str, Any]], Record]
# A factory builds the row function of one dataset entry: (ds, tokenizer, method) -> row function.
FormatFactory = Callable[[Any, Any, str], RowFormat]

PAIR_METHODS = ("dpo", "ipo", "simpo", "orpo", "reward_model")
METHODS = PAIR_METHODS + ("kto",)
DUMMY_USER = "[[dummy_message]]"


# ------------------------------------------------------------------------------- reading fields


def _text(row: dict[str, Any], name: str, *, allow_empty: bool = False) -> str:
    """A string field; empty (after strip) is an error unless allowed."""
    return _check_text(get_field(row, name), name, allow_empty=allow_empty)


def _check_text(value: Any, name: str, *, allow_empty: bool = False) -> str:
    value = text(value, name)
    if not allow_empty and not value.strip():
        raise RowError(f"field {name!r} is empty")
    return value


def _first_present(row: dict[str, Any], names: tuple[str, ...]) -> str:
    for name in names:
        if row.get(name) is not None:
            return name
    listed = " / ".join(repr(name) for name in names)
    raise RowError(f"missing field {listed} (row has {fields_of(row)})")


def _system(row: dict[str, Any], name: str = "system") -> str | None:
    """The optional system prompt: present and truthy, else None (Axolotl adds no system block then)."""
    value = row.get(name)
    if not value:
        return None
    return _check_text(value, name)


def _message_content(row: dict[str, Any], name: str, position: int) -> str:
    """`row[name][position]["content"]` of a message list, as the chatml/llama3 *_chat formats read it."""
    messages = get_field(row, name)
    if not isinstance(messages, list):
        raise RowError(f"field {name!r} must be a list of messages, got {type(messages).__name__}")
    if len(messages) <= position:
        raise RowError(f"field {name!r} needs at least {position + 1} messages, has {len(messages)}")
    message = messages[position]
    if not isinstance(message, dict) or message.get("content") is None:
        raise RowError(f"missing field '{name}[{position}].content'")
    return _check_text(message["content"], f"{name}[{position}].content", allow_empty=position == 0)


def parse_label(value: Any, name: str = "label") -> bool:
    """A KTO label: a bool, 0/1, or the strings true/false (any case); anything else is a RowError."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, float) and value in (0.0, 1.0):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    raise RowError(f"field {name!r} must be a boolean (true/false, 1/0), got {value!r}")


def _margin(row: dict[str, Any]) -> float | None:
    value = row.get("margin")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise RowError(f"field 'margin' must be a number, got {type(value).__name__}")
    try:
        return float(value)
    except ValueError:
        raise RowError(f"field 'margin' must be a number, got {value!r}") from None


def is_degenerate_pair(record: Record) -> bool:
    """True when chosen and rejected are the same text: the pair carries no preference signal."""
    return record.get("chosen") == record.get("rejected")


# ------------------------------------------------------------------- chatml / llama3 (C2, C3, C7)


@dataclass(frozen=True)
class Delimiters:
    """The literal strings of one fixed prompt template."""

    system: str  # with {system}
    turn: str  # the user turn and the assistant header, with {prompt}
    end: str  # appended to every answer

    def prompt(self, prompt: str, system: str | None = None) -> str:
        head = self.system.format(system=system) if system else ""
        return head + self.turn.format(prompt=prompt)


CHATML = Delimiters(
    system="<|im_start|>system\n{system}<|im_end|>\n",
    turn="<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n",
    end="<|im_end|>",
)
LLAMA3 = Delimiters(
    system="<|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>",
    turn="<|start_header_id|>user<|end_header_id|>\n\n{prompt}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    end="<|eot_id|>",
)


def _field_pair(delims: Delimiters, prompt_keys: tuple[str, ...], chosen_keys: tuple[str, ...],
                rejected_keys: tuple[str, ...]) -> FormatFactory:
    """Prompt, chosen and rejected are plain string columns (the first present of each key list)."""

    def factory(ds, tokenizer, method) -> RowFormat:
        def convert(row: dict[str, Any]) -> Record:
            prompt = _text(row, _first_present(row, prompt_keys), allow_empty=True)
            return {
                "prompt": delims.prompt(prompt, _system(row)),
                "chosen": _text(row, _first_present(row, chosen_keys)) + delims.end,
                "rejected": _text(row, _first_present(row, rejected_keys)) + delims.end,
            }

        return convert

    return factory


def _ultra_pair(delims: Delimiters) -> FormatFactory:
    """`prompt` string; answers are message lists whose second message is the answer."""

    def factory(ds, tokenizer, method) -> RowFormat:
        def convert(row: dict[str, Any]) -> Record:
            return {
                "prompt": delims.prompt(_text(row, "prompt", allow_empty=True), _system(row)),
                "chosen": _message_content(row, "chosen", 1) + delims.end,
                "rejected": _message_content(row, "rejected", 1) + delims.end,
            }

        return convert

    return factory


def _argilla_chat_pair(delims: Delimiters) -> FormatFactory:
    """Answers are [user, assistant] lists; the prompt is chosen[0]; a system column is ignored."""

    def factory(ds, tokenizer, method) -> RowFormat:
        def convert(row: dict[str, Any]) -> Record:
            return {
                "prompt": delims.prompt(_message_content(row, "chosen", 0)),
                "chosen": _message_content(row, "chosen", 1) + delims.end,
                "rejected": _message_content(row, "rejected", 1) + delims.end,
            }

        return convert

    return factory


def _delimited_pair_formats(prefix: str, delims: Delimiters) -> dict[str, FormatFactory]:
    default = _field_pair(delims, ("prompt", "input", "question", "instruction"),
                          ("chosen", "chosen_response"), ("rejected", "rejected_response"))
    return {
        f"{prefix}.default": default,
        f"{prefix}.argilla": default,  # documented name, renamed to default upstream
        f"{prefix}.argilla_chat": _argilla_chat_pair(delims),
        f"{prefix}.icr": _field_pair(delims, ("input",), ("chosen",), ("rejected",)),
        f"{prefix}.intel": _field_pair(delims, ("question",), ("chosen",), ("rejected",)),
        f"{prefix}.prompt_pairs": _field_pair(delims, ("prompt",), ("chosen",), ("rejected",)),
        f"{prefix}.ultra": _ultra_pair(delims),
    }


def _field_kto(delims: Delimiters, prompt_key: str) -> FormatFactory:
    def factory(ds, tokenizer, method) -> RowFormat:
        def convert(row: dict[str, Any]) -> Record:
            return {
                "prompt": delims.prompt(_text(row, prompt_key, allow_empty=True), _system(row)),
                "completion": _text(row, "completion") + delims.end,
                "label": parse_label(get_field(row, "label")),
            }

        return convert

    return factory


def _argilla_chat_kto(delims: Delimiters) -> FormatFactory:
    """`completion` is a [user, assistant] list: the prompt is its first message, the answer its second."""

    def factory(ds, tokenizer, method) -> RowFormat:
        def convert(row: dict[str, Any]) -> Record:
            return {
                "prompt": delims.prompt(_message_content(row, "completion", 0)),
                "completion": _message_content(row, "completion", 1) + delims.end,
                "label": parse_label(get_field(row, "label")),
            }

        return convert

    return factory


def _delimited_kto_formats(prefix: str, delims: Delimiters) -> dict[str, FormatFactory]:
    return {
        f"{prefix}.argilla": _field_kto(delims, "instruction"),
        f"{prefix}.argilla_chat": _argilla_chat_kto(delims),
        f"{prefix}.intel": _field_kto(delims, "question"),
        f"{prefix}.prompt_pairs": _field_kto(delims, "prompt"),
        f"{prefix}.ultra": _field_kto(delims, "prompt"),
    }


# --------------------------------------------------------------------------- zephyr.nectar (C4)

ZEPHYR_PROMPT = "<|system|>\n</s>\n<|user|>\n{prompt}</s>\n<|assistant|>\n"


def zephyr_nectar(ds, tokenizer, method) -> RowFormat:
    """`prompt` + `answers: [{answer, rank}]`; chosen = best rank (lowest number), rejected = second best.

    Deviation: Axolotl picks the two LARGEST rank numbers, i.e. the worst answers as chosen; in
    Nectar rank 1 is the best answer, so the reference looks inverted and we do not copy it.
    No suffix is added to the answers (as in Axolotl).
    """

    def convert(row: dict[str, Any]) -> Record:
        answers = get_field(row, "answers")
        if not isinstance(answers, list) or len(answers) < 2:
            raise RowError("field 'answers' must be a list of at least 2 {answer, rank} items")
        ranked = []
        for position, item in enumerate(answers):
            if not isinstance(item, dict):
                raise RowError(f"field 'answers[{position}]' must be a mapping with answer and rank")
            rank = item.get("rank")
            if isinstance(rank, bool) or not isinstance(rank, (int, float)):
                raise RowError(f"field 'answers[{position}].rank' must be a number, got {rank!r}")
            ranked.append((rank, position, item))
        ranked.sort(key=lambda entry: entry[:2])  # stable on ties: the earlier answer wins
        (_, best, chosen), (_, second, rejected) = ranked[0], ranked[1]
        return {
            "prompt": ZEPHYR_PROMPT.format(prompt=_text(row, "prompt", allow_empty=True)),
            "chosen": _check_text(chosen.get("answer"), f"answers[{best}].answer"),
            "rejected": _check_text(rejected.get("answer"), f"answers[{second}].answer"),
        }

    return convert


# ---------------------------------------------------------------- chat templates (C5, C8, RM)


class _MessagesAt:
    """`ds` seen with `field_messages` pointing at another column, to reuse `chat_template_format`."""

    def __init__(self, ds, field_name: str):
        self._ds = ds
        self.field_messages = field_name

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ds, name)


def dataset_chat_template(ds) -> str | None:
    """The dataset-level `chat_template` (+ `chat_template_jinja`) override, if the entry has one."""
    name = getattr(ds, "chat_template", None)
    if not name or name == "tokenizer_default":
        return None
    from rlft.data.tokenizer import apply_chat_template_setting

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
        self.ds, self.tokenizer, self.template = ds, tokenizer, template
        self._normalisers: dict[str, RowFormat] = {}

    def messages(self, value: Any, name: str) -> list[dict[str, str]]:
        """A message list (a plain string is one user message), with roles and keys mapped."""
        if isinstance(value, str):
            return [{"role": "user", "content": value}]
        if not isinstance(value, list):
            raise RowError(f"field {name!r} must be a list of messages, got {type(value).__name__}")
        if name not in self._normalisers:
            self._normalisers[name] = chat_template_format(_MessagesAt(self.ds, name))
        nested: Any = value
        for part in reversed(name.split(".")):  # so `get_field` finds a dotted name where it looks
            nested = {part: nested}
        return self._normalisers[name](nested)["messages"]

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
        _check_text(message["content"], name)
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
    the answer's content on, right-stripped (C5). For reward models, a row without `field_messages`
    whose answers are whole conversations is a Bradley-Terry row (see `bradley_terry_record`).
    """
    chat = ChatRenderer(ds, tokenizer, dataset_chat_template(ds))

    def convert(row: dict[str, Any]) -> Record:
        if method == "reward_model" and _is_bradley_terry(row, ds):
            return bradley_terry_record(chat, row, ds.field_chosen, ds.field_rejected)
        return _conversation_record(chat, row, ds.field_messages, ds.field_chosen, ds.field_rejected)

    return convert


def _conversation_record(chat: ChatRenderer, row: dict[str, Any], messages_key: str, chosen_key: str,
                         rejected_key: str) -> Record:
    messages = chat.messages(get_field(row, messages_key), messages_key)
    return {
        "prompt": chat.render(messages, generation_prompt=True),
        "chosen": chat.answer_text(chat.answer(get_field(row, chosen_key), chosen_key), chosen_key),
        "rejected": chat.answer_text(chat.answer(get_field(row, rejected_key), rejected_key), rejected_key),
    }


def chat_template_argilla_chat(ds, tokenizer, method) -> RowFormat:
    """Answers are whole conversations: prompt = template(chosen[:-1]) with the generation prompt;
    chosen = chosen[-1], rejected = rejected[-1], each by the dummy-user trick (C5)."""
    chat = ChatRenderer(ds, tokenizer, dataset_chat_template(ds))

    def convert(row: dict[str, Any]) -> Record:
        return _argilla_chat_record(chat, row, ds.field_chosen, ds.field_rejected)

    return convert


def _argilla_chat_record(chat: ChatRenderer, row: dict[str, Any], chosen_key: str, rejected_key: str) -> Record:
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
    _check_text(messages[-1]["content"], key)
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
    """ORPO `chat_template.argilla` (C8): answers are whole alternating user/assistant conversations.

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
        system = _system(row)
        if system:
            prompt_messages.append({"role": "system", "content": system})
        user_prompt = _text(row, "prompt", allow_empty=True) if row.get("prompt") is not None else None
        turns = len(chosen) // 2
        for turn in range(turns):
            user = user_prompt if user_prompt is not None else chosen[2 * turn]["content"]
            prompt_messages.append({"role": "user", "content": user})
            if turn < turns - 1:
                prompt_messages.append({"role": "assistant", "content": chosen[2 * turn + 1]["content"]})
        prompt = chat.render(prompt_messages, generation_prompt=True)
        record = {"prompt": prompt}
        for side, messages, key in (("chosen", chosen, chosen_key), ("rejected", rejected, rejected_key)):
            content = _check_text(messages[-1]["content"], key)
            whole = chat.render(prompt_messages + [{"role": "assistant", "content": content}], generation_prompt=False)
            if not whole.startswith(prompt):
                raise RowError(
                    f"field {key!r}: the chat template's render of the prompt is not a prefix of its render "
                    "with the answer, so the answer cannot be cut out (use chat_template.default instead)"
                )
            record[side] = whole[len(prompt):]
        return record

    return convert


# ------------------------------------------------------------ user_defined, passthrough, no type


def _checked_template(template: str, default: str, allowed: tuple[str, ...], key: str) -> str:
    """An empty format string falls back to its default; an unknown `{placeholder}` is a config error."""
    template = template or default
    try:
        template.format(**{name: "" for name in allowed})
    except (KeyError, IndexError, ValueError) as exc:
        names = ", ".join("{" + name + "}" for name in allowed)
        raise DataError(f"type.{key} {template!r} cannot be rendered ({type(exc).__name__}: {exc}); it may use {names}") from None
    return template


def _user_defined_spec(ds):
    from rlft.config import UserDefinedType

    return ds.type if isinstance(ds.type, UserDefinedType) else UserDefinedType()


def user_defined_pair(ds, tokenizer, method) -> RowFormat:
    """`type:` as a mapping (C6): fields and `{placeholder}` formats of prompt, chosen and rejected."""
    spec = _user_defined_spec(ds)
    prompt_format = _checked_template(spec.prompt_format, "{prompt}", ("system", "prompt"), "prompt_format")
    chosen_format = _checked_template(spec.chosen_format, "{chosen}", ("chosen",), "chosen_format")
    rejected_format = _checked_template(spec.rejected_format, "{rejected}", ("rejected",), "rejected_format")

    def convert(row: dict[str, Any]) -> Record:
        system = _system(row, spec.field_system) or spec.system_prompt or ""
        return {
            "prompt": prompt_format.format(system=system, prompt=_text(row, spec.field_prompt, allow_empty=True)),
            "chosen": chosen_format.format(chosen=_text(row, spec.field_chosen)),
            "rejected": rejected_format.format(rejected=_text(row, spec.field_rejected)),
        }

    return convert


def user_defined_kto(ds, tokenizer, method) -> RowFormat:
    """`type:` as a mapping for KTO (C7): prompt/system/completion/label fields and formats."""
    spec = _user_defined_spec(ds)
    prompt_format = _checked_template(spec.prompt_format, "{prompt}", ("system", "prompt"), "prompt_format")
    completion_format = _checked_template(spec.completion_format, "{completion}", ("completion",), "completion_format")

    def convert(row: dict[str, Any]) -> Record:
        system = _system(row, spec.field_system) or spec.system_prompt or ""
        return {
            "prompt": prompt_format.format(system=system, prompt=_text(row, spec.field_prompt, allow_empty=True)),
            "completion": completion_format.format(completion=_text(row, spec.field_completion)),
            "label": parse_label(get_field(row, spec.field_label), spec.field_label),
        }

    return convert


def _check_answer_type(value: Any, name: str) -> None:
    if not isinstance(value, (str, dict, list)):
        raise RowError(f"field {name!r} must be a string, a message or a list of messages, got {type(value).__name__}")


def canonical_pair(ds, tokenizer, method) -> RowFormat:
    """No `type` (and `passthrough.default`): the row already holds the pair.

    * `prompt`, `chosen`, `rejected` strings: used as they are (a reward model may omit `prompt`).
    * Chat rows, rendered with the tokenizer's chat template like `chat_template.*`: a prompt
      conversation in `prompt` (a list, or a string meaning one user message) or in `messages`, with
      answers as strings / messages / lists -> `chat_template.default`; no prompt and answers as whole
      conversations -> `chat_template.argilla_chat` (reward models: Bradley-Terry).
    """
    renderer: list[ChatRenderer] = []  # built on the first chat row, so string rows need no template

    def chat() -> ChatRenderer:
        if not renderer:
            renderer.append(ChatRenderer(ds, tokenizer, dataset_chat_template(ds)))
        return renderer[0]

    def convert(row: dict[str, Any]) -> Record:
        chosen, rejected = row.get("chosen"), row.get("rejected")
        prompt, messages = row.get("prompt"), row.get("messages")
        if isinstance(prompt, str) and not prompt.strip() and isinstance(chosen, list):
            prompt = None  # a blank prompt column beside whole conversations: their own user turns are the prompt
        # ready-made strings (a `messages` column beside a string prompt is not the prompt: it would be templated twice)
        if isinstance(chosen, str) and isinstance(rejected, str) and (messages is None or isinstance(prompt, str)):
            if prompt is None and method != "reward_model":
                raise RowError(f"missing field 'prompt' (row has {fields_of(row)})")
            if prompt is None or isinstance(prompt, str):
                return {"prompt": prompt or "", "chosen": _text(row, "chosen"), "rejected": _text(row, "rejected")}
        for key in ("chosen", "rejected"):  # name a missing or mistyped answer before rendering anything
            _check_answer_type(get_field(row, key), key)
        if prompt is not None:
            return _conversation_record(chat(), row, "prompt", "chosen", "rejected")
        row = {key: value for key, value in row.items() if key != "prompt"}
        if messages is not None:
            return _conversation_record(chat(), row, "messages", "chosen", "rejected")
        if method == "reward_model" and isinstance(chosen, list) and isinstance(rejected, list):
            return bradley_terry_record(chat(), row, "chosen", "rejected")
        return _argilla_chat_record(chat(), row, "chosen", "rejected")

    return convert


def canonical_kto(ds, tokenizer, method) -> RowFormat:
    """No `type`: the row holds `prompt`, `completion` and `label` (strings, or chat messages rendered
    with the chat template: the prompt with the generation prompt, the completion's last message by
    the dummy-user trick)."""
    renderer: list[ChatRenderer] = []

    def chat() -> ChatRenderer:
        if not renderer:
            renderer.append(ChatRenderer(ds, tokenizer, dataset_chat_template(ds)))
        return renderer[0]

    def convert(row: dict[str, Any]) -> Record:
        prompt, completion = get_field(row, "prompt"), get_field(row, "completion")
        label = parse_label(get_field(row, "label"))
        if isinstance(prompt, str) and isinstance(completion, str):
            return {"prompt": prompt, "completion": _text(row, "completion"), "label": label}
        _check_answer_type(prompt, "prompt")
        _check_answer_type(completion, "completion")
        renderer_ = chat()
        return {
            "prompt": renderer_.render(renderer_.messages(prompt, "prompt"), generation_prompt=True),
            "completion": renderer_.answer_text(renderer_.answer(completion, "completion"), "completion"),
            "label": label,
        }

    return convert


# ---------------------------------------------------------------------------- tables, resolving

PREFERENCE_FORMATS: dict[str, FormatFactory] = {
    **_delimited_pair_formats("chatml", CHATML),
    **_delimited_pair_formats("llama3", LLAMA3),
    "zephyr.nectar": zephyr_nectar,
    "chat_template.default": chat_template_default,
    "chat_template.argilla_chat": chat_template_argilla_chat,
    "user_defined.default": user_defined_pair,
    "passthrough.default": canonical_pair,
}
"""Pair formats of dpo / ipo / simpo / reward_model (reward models: `chat_template.default` also
reads Bradley-Terry rows); `rl: orpo` adds `ORPO_FORMATS`."""

ORPO_FORMATS: dict[str, FormatFactory] = {"chat_template.argilla": orpo_chat_template_argilla}
"""Formats only `rl: orpo` has (Axolotl ships only this one for ORPO; the DPO ones work too)."""

KTO_FORMATS: dict[str, FormatFactory] = {
    **_delimited_kto_formats("chatml", CHATML),
    **_delimited_kto_formats("llama3", LLAMA3),
    "user_defined.default": user_defined_kto,
}


def formats_for(method: str) -> dict[str, FormatFactory]:
    """The built-in `type:` names of a method."""
    if method == "kto":
        return KTO_FORMATS
    if method == "orpo":
        return {**PREFERENCE_FORMATS, **ORPO_FORMATS}
    if method in PAIR_METHODS:
        return PREFERENCE_FORMATS
    raise DataError(f"no preference data formats for method {method!r}: expected one of {', '.join(METHODS)}")


def resolve_preference_format(ds, cfg, index: int, where: str, tokenizer, method: str) -> Callable[[dict], dict]:
    """The function that turns one raw row of dataset `ds` into a canonical pair or KTO record.

    `method` is dpo, ipo, simpo, orpo, kto or reward_model. Resolution follows Axolotl (§C1).
    """
    from rlft.config import UserDefinedType

    table = formats_for(method)
    canonical = canonical_kto if method == "kto" else canonical_pair
    kind = ds.type
    try:
        if kind is None:
            convert = canonical(ds, tokenizer, method)
        elif isinstance(kind, UserDefinedType):
            convert = table["user_defined.default"](ds, tokenizer, method)
        else:
            name = kind if "." in kind else f"{kind}.default"
            if name in table:
                convert = table[name](ds, tokenizer, method)
            else:
                convert = _user_transform_format(name, ds, cfg, index, where, tokenizer, method, canonical(ds, tokenizer, method))
    except RlftError as exc:
        if str(exc).startswith(where):
            raise
        raise type(exc)(f"{where}: {exc}") from exc
    if method == "reward_model":
        return _with_margin(convert)
    return convert


def _with_margin(convert: RowFormat) -> RowFormat:
    def with_margin(row: dict[str, Any]) -> Record:
        record = convert(row)
        margin = _margin(row)
        if margin is not None:
            record["margin"] = margin
        return record

    return with_margin


def _user_transform_format(name: str, ds, cfg, index: int, where: str, tokenizer, method: str, canonical: RowFormat) -> RowFormat:
    """A user `module.fn` (called as fn(cfg, dataset_idx=i)); its output is merged into the row like
    `datasets.map` does (honouring `remove_columns`, "__all__" = every original column), then read as
    a row of no `type`."""
    found = user_transform(name, cfg, index, where)
    if found is None:
        names = ", ".join(sorted(formats_for(method)))
        raise DataError(
            f"{where}: unknown type {ds.type!r}: the {method} formats are {names}; a mapping means "
            "user_defined; a user transform `module.fn` must be importable from the working directory"
        )
    transform, map_kwargs = found
    transform = bind_tokenizer(transform, tokenizer)
    removed = map_kwargs.get("remove_columns") or ()

    def convert(row: dict[str, Any]) -> Record:
        out = call_transform(transform, name, row)
        merged = {} if removed == "__all__" else {key: value for key, value in row.items() if key not in removed}
        merged.update(out)
        return canonical(merged)

    return convert

