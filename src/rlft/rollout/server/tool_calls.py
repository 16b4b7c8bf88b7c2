"""Tool calls on the OpenAI chat route, in the Hermes convention (vLLM's `--tool-call-parser hermes`).

A model that calls a tool writes `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in its answer (Qwen's
and rlft's ChatML templates teach it so). The server returns those calls as OpenAI `tool_calls` and the text before
them as `content`; a block that is not a JSON object with a `name` stays in the text. Calls that come back in a
later request carry `arguments` as a JSON string (OpenAI's wire form): chat templates want the object, so it is
decoded before rendering, as vLLM does.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, OpenAI tool_calls) of an answer; no calls: (text, [])."""
    calls = []
    for block in BLOCK.findall(text):
        try:
            call = json.loads(block)
        except json.JSONDecodeError:
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            continue
        arguments = call.get("arguments", call.get("parameters", {}))
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": call["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}})
    if not calls:
        return text, []
    content = text[: text.index("<tool_call>")].strip()
    return content or None, calls


def decoded_arguments(message: dict[str, Any]) -> dict[str, Any]:
    """The message with each tool call's JSON-string `arguments` as an object (for the chat template)."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return message
    decoded = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            try:
                function = {**function, "arguments": json.loads(function["arguments"])}
            except json.JSONDecodeError:
                pass  # not JSON: the template renders the string as it came
            call = {**call, "function": function}
        decoded.append(call)
    return {**message, "tool_calls": decoded}
