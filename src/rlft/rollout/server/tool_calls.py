"""Tool calls on the OpenAI chat route, in the Hermes convention (vLLM's `--tool-call-parser hermes`).

A model that calls a tool writes `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in its answer (Qwen's
and rlft's ChatML templates teach it so). The server returns those calls as OpenAI `tool_calls` and the text before
them as `content`; a block that is not a JSON object with a `name` stays in the text. Calls that come back in a
later request carry `arguments` as a JSON string (OpenAI's wire form): chat templates want the object, so it is
decoded before rendering, as vLLM does. rlft's own multi-turn rollouts (`rlft.rollout.envs.multi_turn`) read the
calls of each turn the same way and answer a malformed block with an error (`read_tool_calls`).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def read_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]], list[str]]:
    """(content, OpenAI tool_calls, malformed blocks) of an answer: each `<tool_call>` block that is not a JSON object
    with a string `name` is returned as it was written, with why, in the third list. No calls: (text, [], [...])."""
    calls, malformed = [], []
    for block in BLOCK.findall(text):
        try:
            call = json.loads(block)
        except json.JSONDecodeError as exc:
            malformed.append(f"{block[:200]!r} is not JSON ({exc.msg} at character {exc.pos})")
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            malformed.append(f"{block[:200]!r} is not a JSON object with a string \"name\"")
            continue
        arguments = call.get("arguments", call.get("parameters", {}))
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": call["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}})
    if not calls:
        return text, [], malformed
    content = text[: text.index("<tool_call>")].strip()
    return content or None, calls, malformed


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, OpenAI tool_calls) of an answer; no calls: (text, []). A malformed block stays in the text."""
    content, calls, _ = read_tool_calls(text)
    return content, calls


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
