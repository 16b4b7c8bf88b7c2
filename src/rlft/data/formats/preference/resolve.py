"""`type:` of a preference or KTO dataset entry -> the function that turns its rows into canonical records: the
built-in formats of the method, `user_defined` mappings, rows that need no format, and user transforms."""

from __future__ import annotations

from typing import Any, Callable

from rlft.config import UserDefinedType
from rlft.config.methods import METHODS, method_spec
from rlft.data.formats.preference.chat import (ChatRenderer, argilla_chat_record, bradley_terry_record,
                                               chat_template_argilla_chat, chat_template_default, conversation_record,
                                               dataset_chat_template, orpo_chat_template_argilla)
from rlft.data.formats.preference.delimited import CHATML, LLAMA3, delimited_kto_formats, delimited_pair_formats, zephyr_nectar
from rlft.data.formats.preference.fields import (FormatFactory, Record, RowFormat, margin_of, parse_label, required_text,
                                                 system_text)
from rlft.data.formats.rows import RowError, bind_tokenizer, call_transform, fields_of, get_field, user_transform
from rlft.errors import DataError, RlftError


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
    return ds.type if isinstance(ds.type, UserDefinedType) else UserDefinedType()


def user_defined_pair(ds, tokenizer, method) -> RowFormat:
    """`type:` as a mapping: fields and `{placeholder}` formats of prompt, chosen and rejected."""
    spec = _user_defined_spec(ds)
    prompt_format = _checked_template(spec.prompt_format, "{prompt}", ("system", "prompt"), "prompt_format")
    chosen_format = _checked_template(spec.chosen_format, "{chosen}", ("chosen",), "chosen_format")
    rejected_format = _checked_template(spec.rejected_format, "{rejected}", ("rejected",), "rejected_format")

    def convert(row: dict[str, Any]) -> Record:
        system = system_text(row, spec.field_system) or spec.system_prompt or ""
        return {
            "prompt": prompt_format.format(system=system, prompt=required_text(row, spec.field_prompt, allow_empty=True)),
            "chosen": chosen_format.format(chosen=required_text(row, spec.field_chosen)),
            "rejected": rejected_format.format(rejected=required_text(row, spec.field_rejected)),
        }

    return convert


def user_defined_kto(ds, tokenizer, method) -> RowFormat:
    """`type:` as a mapping for KTO: prompt/system/completion/label fields and formats."""
    spec = _user_defined_spec(ds)
    prompt_format = _checked_template(spec.prompt_format, "{prompt}", ("system", "prompt"), "prompt_format")
    completion_format = _checked_template(spec.completion_format, "{completion}", ("completion",), "completion_format")

    def convert(row: dict[str, Any]) -> Record:
        system = system_text(row, spec.field_system) or spec.system_prompt or ""
        return {
            "prompt": prompt_format.format(system=system, prompt=required_text(row, spec.field_prompt, allow_empty=True)),
            "completion": completion_format.format(completion=required_text(row, spec.field_completion)),
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
            if prompt is None and not method_spec(method).bradley_terry:
                raise RowError(f"missing field 'prompt' (row has {fields_of(row)})")
            if prompt is None or isinstance(prompt, str):
                return {"prompt": prompt or "", "chosen": required_text(row, "chosen"), "rejected": required_text(row, "rejected")}
        for key in ("chosen", "rejected"):  # name a missing or mistyped answer before rendering anything
            _check_answer_type(get_field(row, key), key)
        if prompt is not None:
            return conversation_record(chat(), row, "prompt", "chosen", "rejected")
        row = {key: value for key, value in row.items() if key != "prompt"}
        if messages is not None:
            return conversation_record(chat(), row, "messages", "chosen", "rejected")
        if method_spec(method).bradley_terry and isinstance(chosen, list) and isinstance(rejected, list):
            return bradley_terry_record(chat(), row, "chosen", "rejected")
        return argilla_chat_record(chat(), row, "chosen", "rejected")

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
            return {"prompt": prompt, "completion": required_text(row, "completion"), "label": label}
        _check_answer_type(prompt, "prompt")
        _check_answer_type(completion, "completion")
        renderer_ = chat()
        return {
            "prompt": renderer_.render(renderer_.messages(prompt, "prompt"), generation_prompt=True),
            "completion": renderer_.answer_text(renderer_.answer(completion, "completion"), "completion"),
            "label": label,
        }

    return convert


PREFERENCE_FORMATS: dict[str, FormatFactory] = {
    **delimited_pair_formats("chatml", CHATML),
    **delimited_pair_formats("llama3", LLAMA3),
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
    **delimited_kto_formats("chatml", CHATML),
    **delimited_kto_formats("llama3", LLAMA3),
    "user_defined.default": user_defined_kto,
}


# the built-in formats, and the reading of a row of no `type`, of each kind of preference rows (`MethodSpec.data`)
ROWS: dict[str, tuple[dict[str, FormatFactory], FormatFactory]] = {
    "pair": (PREFERENCE_FORMATS, canonical_pair),
    "unpaired": (KTO_FORMATS, canonical_kto),
}
PREFERENCE_METHODS = tuple(name for name, spec in METHODS.items() if spec.data in ROWS)


def _rows_of(method: str) -> tuple[dict[str, FormatFactory], FormatFactory]:
    spec = METHODS.get(method)
    if spec is None or spec.data not in ROWS:
        raise DataError(f"no preference data formats for method {method!r}: expected one of {', '.join(PREFERENCE_METHODS)}")
    formats, canonical = ROWS[spec.data]
    return ({**formats, **ORPO_FORMATS} if spec.orpo_formats else formats), canonical


def formats_for(method: str) -> dict[str, FormatFactory]:
    """The built-in `type:` names of a method."""
    return _rows_of(method)[0]


def resolve_preference_format(ds, cfg, index: int, where: str, tokenizer, method: str) -> Callable[[dict], dict]:
    """The function that turns one raw row of dataset `ds` into a canonical pair or KTO record.

    `method` is dpo, ipo, simpo, orpo, kto or reward_model. Resolution follows Axolotl (see the package docstring).
    """
    table, canonical = _rows_of(method)
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
    if method_spec(method).bradley_terry:
        return _with_margin(convert)
    return convert


def _with_margin(convert: RowFormat) -> RowFormat:
    def with_margin(row: dict[str, Any]) -> Record:
        record = convert(row)
        margin = margin_of(row)
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
