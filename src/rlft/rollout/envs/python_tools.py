"""Python tools for multi-turn rollouts: user functions named `module.function`, their schemas, and running their calls.

A tool is loaded as a reward function is (`rlft.usercode`: the working directory first on sys.path). Its schema, which
the chat template shows the model, is made from its signature and docstring by transformers' `get_json_schema`
(https://huggingface.co/docs/transformers/main/en/chat_extras#tools): type hints for every parameter, a summary line
and an `Args:` section. The model calls it by the function's name.

Every call of a turn runs at once, each on a daemon thread of its own, bounded by the tool timeout: a thread cannot be
stopped, so a call that overruns is answered with a timeout error and finishes (or hangs) in the background without
holding up the run or its exit. Whatever goes wrong in a call becomes the text the model reads as the tool's result,
never an exception of the run: an unknown tool, arguments that do not fit the function, an exception it raised, a
timeout, a tool-call block that is not JSON.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from transformers.utils import get_json_schema
from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

from rlft.errors import ConfigError
from rlft.usercode import UserCodeError, load_user_function

KEY = "trl.multi_turn_config.tools"
CALL_FORM = '<tool_call>{"name": "<tool name>", "arguments": {<argument>: <value>, ...}}</tool_call>'
OUTCOMES = ("ok", "error", "timeout", "unknown", "malformed")  # what became of a call (`ToolResult.outcome`)


@dataclass(frozen=True)
class PythonTool:
    name: str  # the function's name: what the model calls
    source: str  # `module.function` as configured
    fn: Callable[..., Any]
    schema: dict[str, Any]  # {"type": "function", "function": {"name", "description", "parameters"}}


@dataclass(frozen=True)
class ToolResult:
    name: str | None  # the tool called (None for a block that named none)
    text: str  # what the model reads: the tool's return value as text, or what went wrong
    outcome: str  # one of OUTCOMES


def load_tools(names: tuple[str, ...] | list[str]) -> list[PythonTool]:
    """The configured tools, each importable and with a schema; a ConfigError naming the tool and the fix otherwise."""
    tools: dict[str, PythonTool] = {}
    for source in names:
        try:
            fn, module_file = load_user_function(source)
        except UserCodeError as exc:
            raise ConfigError(f"{KEY}: {exc}") from None
        where = f"{source} ({module_file})" if module_file else source
        try:
            schema = get_json_schema(fn)
        except (DocstringParsingException, TypeHintParsingException) as exc:
            raise ConfigError(f"{KEY}: {where}: {exc} The model knows a tool by its schema, made from the function's "
                              "signature and docstring: give every parameter a type hint, and the docstring a summary line "
                              "and an `Args:` section with a `name: description` line per parameter") from None
        name = schema["function"]["name"]
        if name in tools:
            raise ConfigError(f"{KEY}: {tools[name].source} and {source} are both called {name!r}, and the model calls a "
                              "tool by its function's name: rename one of them")
        tools[name] = PythonTool(name, source, fn, schema)
    return list(tools.values())


def result_text(value: Any) -> str:
    """A tool's return value as the model reads it: a string as it is, anything else as JSON (else its str())."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


class ToolRunner:
    """Runs the model's tool calls (OpenAI `tool_calls` items, arguments as a JSON string) with a timeout each.

    A call runs on a thread of its own; one past its timeout cannot be stopped (Python threads cannot be killed) and
    goes on in the background. While `MAX_HUNG` calls of a tool still run so, its new calls are answered with a timeout
    at once instead of starting more threads."""

    MAX_HUNG = 16

    def __init__(self, tools: list[PythonTool], timeout: float):
        self.tools = {tool.name: tool for tool in tools}
        self.timeout = float(timeout)
        self.hung: dict[str, list[threading.Thread]] = {}  # per tool: its calls still running past their timeout

    def malformed(self, detail: str) -> ToolResult:
        return ToolResult(None, f"Error: the tool call {detail}. Write a call as {CALL_FORM}.", "malformed")

    def run(self, calls: list[dict[str, Any]]) -> list[ToolResult]:
        """One result per call, in order; the calls run at once."""
        started, results = [], []
        for call in calls:
            ready = self._prepare(call)
            if isinstance(ready, ToolResult):
                started.append(ready)
                continue
            tool, arguments = ready
            hung = self.hung[tool.name] = [t for t in self.hung.get(tool.name, []) if t.is_alive()]
            if len(hung) >= self.MAX_HUNG:
                started.append(ToolResult(tool.name, f"Error: {tool.name} did not finish within {self.timeout:g} s.",
                                          "timeout"))
                continue
            box: dict[str, Any] = {}
            thread = threading.Thread(target=_call, args=(tool.fn, arguments, box), daemon=True,
                                      name=f"rlft-tool-{tool.name}")
            thread.start()
            started.append((tool, thread, box))
        deadline = time.monotonic() + self.timeout
        for item in started:
            if isinstance(item, ToolResult):
                results.append(item)
                continue
            tool, thread, box = item
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                self.hung.setdefault(tool.name, []).append(thread)
                results.append(ToolResult(tool.name, f"Error: {tool.name} did not finish within {self.timeout:g} s.", "timeout"))
            elif "error" in box:
                results.append(ToolResult(tool.name, f"Error: {tool.name} raised {box['error']}", "error"))
            else:
                results.append(ToolResult(tool.name, result_text(box.get("value")), "ok"))
        return results

    def _prepare(self, call: dict[str, Any]) -> tuple[PythonTool, dict[str, Any]] | ToolResult:
        """The tool and its arguments, or the result that says why the call cannot run."""
        function = call.get("function") or {}
        name = function.get("name")
        tool = self.tools.get(name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return ToolResult(name, f"Error: there is no tool named {name!r}; the tools are: {known}.", "unknown")
        arguments = function.get("arguments", "{}")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            return ToolResult(name, f"Error: the arguments of {name} must be a JSON object of named arguments, e.g. "
                                    f"{CALL_FORM}.", "error")
        try:
            inspect.signature(tool.fn).bind(**arguments)
        except TypeError as exc:
            return ToolResult(name, f"Error: {name}{_signature(tool.fn)} cannot take these arguments: {exc}.", "error")
        except ValueError:  # a callable without a readable signature: let the call say
            pass
        return tool, arguments


def _signature(fn: Callable[..., Any]) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "(...)"


def _call(fn: Callable[..., Any], arguments: dict[str, Any], box: dict[str, Any]) -> None:
    """Run one call on its thread; its value or its error goes in `box`."""
    try:
        value = fn(**arguments)
        if inspect.isawaitable(value):  # an async tool: run it to the end on this thread's own event loop
            value = asyncio.run(_awaited(value))
        box["value"] = value
    except BaseException as exc:  # noqa: BLE001 - the user's tool: its failure is the model's to read
        box["error"] = f"{type(exc).__name__}: {exc}"


async def _awaited(value: Any) -> Any:
    return await value
