"""Reading raw dataset rows, shared by every method's formats: fields, texts, chat messages, user transforms.

`type:` is resolved like Axolotl: a built-in dotted name, else a user `module.fn` importable from the
working directory (called as `fn(cfg, dataset_idx=i)`, returning `transform_fn` or
`(transform_fn, map_kwargs)`), else a mapping meaning `user_defined`.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Callable

from jinja2 import TemplateError

from rlft.errors import DataError
from rlft.usercode import UserCodeError, load_user_function

Record = dict[str, Any]
RowFormat = Callable[[dict[str, Any]], Record]


class RowError(Exception):
    """A row lacks a field or has a wrong value; the caller adds the dataset and the row's place in its file."""


def render_chat(tokenizer, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    """The chat template's text of `messages`; a template that cannot render them (a role order it refuses, a key it
    needs) is that row's error."""
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    except TemplateError as exc:  # e.g. raise_exception("roles must alternate"), or an undefined key
        raise RowError(f"the chat template rejected the messages: {exc}") from None
    except ValueError as exc:  # transformers: no template, an empty conversation, several templates and no default
        if not getattr(tokenizer, "chat_template", None):
            raise RowError("the tokenizer has no chat template to render these messages: set `chat_template: chatml` (or "
                           "llama3, or jinja with chat_template_jinja), or use a model whose tokenizer has one") from None
        raise RowError(f"the chat template cannot render the messages: {str(exc).splitlines()[0][:200]}") from None


def fields_of(row: dict[str, Any]) -> list[str]:
    """The keys of `row` that hold a value (a JSON row has every key of its file, null where it has none)."""
    return sorted(key for key, value in row.items() if value is not None)


def call_transform(transform: Callable[[dict], Any], name: str, row: dict[str, Any]) -> dict[str, Any]:
    """A user transform's record for one row; whatever it raises or returns amiss is that row's error."""
    try:
        out = transform(dict(row))
    except RowError:
        raise
    except Exception as exc:  # the transform's failure on one row is that row's problem
        raise RowError(f"transform {name} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(out, dict):
        raise RowError(f"transform {name} returned {type(out).__name__}, not a dict")
    return out


def get_field(row: dict[str, Any], dotted: str) -> Any:
    """Read `a.b.c` from nested mappings; a missing key raises RowError naming the field."""
    node: Any = row
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise RowError(f"missing field {dotted!r} (row has {fields_of(row)})")
        if node[part] is None:  # datasets fills keys a row lacks with null, so null means absent too
            raise RowError(f"missing field {dotted!r} (absent or null in this row)")
        node = node[part]
    return node


def text(value: Any, name: str, *, optional: bool = False) -> str:
    """`value` of field `name` when it is text; anything else is the row's error (never turned into training text)."""
    if value is None and optional:
        return ""
    if isinstance(value, str):
        return value
    if value is None:
        raise RowError(f"field {name!r} is missing or null, expected text")
    kind = {list: "a list", dict: "a mapping", bool: "a boolean", int: "a number", float: "a number"}.get(type(value),
                                                                                                   type(value).__name__)
    raise RowError(f"field {name!r} is {kind} ({short(value)}), expected text")


def text_field(row: dict[str, Any], dotted: str) -> str:
    return text(get_field(row, dotted), dotted)


def short(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


UNRENDERED_FIELDS = ("tool_calls", "reasoning_content", "function_call")  # message fields that SFT rows do not carry


def chat_template_format(ds, chunks: bool = False) -> RowFormat:
    """`chat_template`: a message list at `field_messages` with configurable keys and role names (`message_list`)."""
    normalise = message_list(ds, chunks)

    def convert(row: dict[str, Any]) -> Record:
        return chat_record(ds, row, normalise(get_field(row, ds.field_messages), ds.field_messages))

    return convert


def message_list(ds, chunks: bool = False) -> Callable[[Any, str], list[dict[str, Any]]]:
    """A function `(messages, name) -> messages` that reads the message list of a row's field `name` as `chat_template`
    reads it: the keys of `message_property_mappings` and the role names of `roles`, system turns dropped with
    `drop_system_message`. With `chunks` (mistral-common, which encodes them itself) a message's content may also be a
    list of typed chunks ({"type": "text", "text": ...}, {"type": "thinking", "thinking": ...}); else it is text."""
    mapping = dict(ds.message_property_mappings or {})
    mapping.setdefault("role", ds.message_field_role or "role")
    mapping.setdefault("content", ds.message_field_content or "content")
    role_names = {"user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant", "system": "system", "tool": "tool"}
    for canonical, aliases in (ds.roles or {}).items():
        for alias in aliases:
            role_names[alias] = canonical

    def normalise(messages: Any, name: str) -> list[dict[str, Any]]:
        if not isinstance(messages, list) or not messages:
            raise RowError(f"field {name!r} must be a non-empty list of messages")
        out = []
        for turn, message in enumerate(messages):
            if not isinstance(message, dict):
                raise RowError(f"{name}[{turn}] is not a mapping")
            try:
                raw_role, content = message[mapping["role"]], message[mapping["content"]]
            except KeyError as missing:
                raise RowError(f"{name}[{turn}] lacks key {missing.args[0]!r}") from None
            where = f"{name}[{turn}]"
            raw_role = text(raw_role, f"{where}.{mapping['role']}")
            role = role_names.get(raw_role, raw_role)
            if role == "system" and ds.drop_system_message:
                continue
            carried = next((key for key in UNRENDERED_FIELDS if message.get(key)), None)
            if carried:  # dropping it would train the turn without it (a tool call's turn as an empty answer)
                raise RowError(f"{where}.{carried}: SFT rows keep each message's role and content only, and this "
                               f"{role} message's {carried} would be lost; write it into the content as the model "
                               "should produce it, or leave such rows out")
            if chunks and isinstance(content, list):
                bad = next((i for i, chunk in enumerate(content)
                            if not isinstance(chunk, dict) or chunk.get("type") not in ("text", "thinking")), None)
                if bad is not None:  # an image or audio chunk would train on its placeholder ids, its data thrown away
                    raise RowError(f"{where}.{mapping['content']}[{bad}] must be a text or thinking chunk ({{\"type\": "
                                   f"\"text\", \"text\": ...}}: rlft trains text models), got {short(content[bad])}")
                out.append({"role": role, "content": content})
                continue
            out.append({"role": role, "content": text(content, f"{where}.{mapping['content']}", optional=True)})
        return out

    return normalise


def chat_record(ds, row: dict[str, Any], messages: list[dict[str, Any]]) -> Record:
    """The `messages` record of a row's conversation. As Axolotl's chat_template strategy: a `system` column leads the
    chat unless it starts with its own system turn, and a tools column goes to the chat template (which shows the model
    the tools it may call)."""
    system = row.get("system")
    if system not in (None, "") and not ds.drop_system_message and (not messages or messages[0]["role"] != "system"):
        messages = [{"role": "system", "content": text(system, "system")}, *messages]
    tools = row.get(ds.field_tools)
    return {"messages": messages, **({"tools": tool_list(tools, ds.field_tools)} if tools not in (None, "", []) else {})}


def tool_list(value: Any, name: str) -> list[dict[str, Any]]:
    """A row's tools for the chat template: a list of tool schemas, or its JSON text (function parameters may be JSON
    text too, as Axolotl reads them)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise RowError(f"field {name!r} is text but not JSON ({exc.msg}): give a list of tool schemas") from None
    if not isinstance(value, list) or not all(isinstance(tool, dict) for tool in value):
        raise RowError(f"field {name!r} must be a list of tool schemas (mappings) for the chat template, got {short(value)} "
                       "(to leave the column out of the template, set field_tools to a name the rows lack)")
    tools = []
    for tool in value:
        function = tool.get("function")
        if isinstance(function, dict) and isinstance(function.get("parameters"), str):
            try:
                tool = {**tool, "function": {**function, "parameters": json.loads(function["parameters"])}}
            except json.JSONDecodeError as exc:
                raise RowError(f"field {name!r}: the parameters of {function.get('name', 'a tool')!r} are not JSON "
                               f"({exc.msg})") from None
        tools.append(tool)
    return tools


def user_transform(name: str, cfg, index: int, where: str) -> tuple[Callable, dict[str, Any]] | None:
    """Import `module.fn` from the working directory; None when no such module exists."""
    if not name.rpartition(".")[0]:
        return None
    try:
        factory, _ = load_user_function(name)
    except UserCodeError as exc:
        if exc.reason == "no_module":  # `type:` may be a built-in format name: the caller says which exist
            return None
        hint = ""
        if exc.reason == "not_callable":
            hint = f"; a transform is `def {exc.attr}(cfg, dataset_idx=0, **kwargs)` returning a function"
        raise DataError(f"{where}: {exc}{hint}") from exc
    try:
        made = factory(cfg, dataset_idx=index)
    except Exception as exc:
        raise DataError(f"{where}: {name}(cfg, dataset_idx={index}) raised {type(exc).__name__}: {exc}") from exc
    transform, map_kwargs = made if isinstance(made, tuple) else (made, {})
    if not callable(transform):
        raise DataError(f"{where}: {name} must return a function (or (function, map_kwargs)), got {type(transform).__name__}")
    map_kwargs = dict(map_kwargs or {})
    removed = map_kwargs.get("remove_columns")
    if isinstance(removed, str) and removed != "__all__":  # one column's name, as datasets.map takes it
        map_kwargs["remove_columns"] = [removed]
    return transform, map_kwargs


def bind_tokenizer(transform: Callable, tokenizer) -> Callable:
    """Pass the tokenizer to transforms whose signature asks for it."""
    parameters = inspect.signature(transform).parameters
    for name in ("tokenizer", "processing_class"):
        if name in parameters:
            return lambda row: transform(row, **{name: tokenizer})
    return transform
