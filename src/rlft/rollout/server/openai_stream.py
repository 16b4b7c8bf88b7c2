"""`stream: true` on the OpenAI routes: the answer as server-sent events in OpenAI's chunk format.

The engine decodes a batch at once, so the chunks are written when the batch is done: one chunk per token of each
choice (its text piece, and its log-prob where asked), then a chunk with the choice's `finish_reason` and rlft's token
fields (`prompt_token_ids`, `generation_token_ids`, `generation_log_probs`), then, with `stream_options:
{include_usage: true}`, a chunk without choices that holds the usage, then `data: [DONE]`. A client reads the same
text, log-probs and finish reasons as from the answer without `stream`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from fastapi.responses import StreamingResponse

from rlft.rollout.server.routes import json_text

EXTRAS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs", "weight_version")


def pieces(decode: Callable[[list[int]], str], ids: list[int], text: str) -> list[str]:
    """The text each token adds to the answer, by decoding growing prefixes (a byte-level token that ends inside a
    character adds nothing until the character is whole), cut where the answer's text ends (a stop string)."""
    out, sent = [], 0
    for end in range(1, len(ids) + 1):
        whole = decode(ids[:end])
        if whole.endswith("\ufffd") and end < len(ids):  # half a character: wait for the rest
            out.append("")
            continue
        upto = min(len(whole), len(text))
        out.append(text[sent:upto] if upto > sent else "")
        sent = max(sent, upto)
    if out and sent < len(text):
        out[-1] += text[sent:]
    return out


def event_stream(chunks: Iterator[dict[str, Any]]) -> StreamingResponse:
    def lines() -> Iterator[str]:
        for chunk in chunks:
            yield f"data: {json_text(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(lines(), media_type="text/event-stream")


def completion_chunks(answer: dict[str, Any], texts: list[list[str]], include_usage: bool) -> Iterator[dict[str, Any]]:
    """The chunks of a /v1/completions answer; `texts[i]`: choice i's text piece per token."""
    head = {key: answer[key] for key in ("id", "object", "created", "model")}
    for choice, parts in zip(answer["choices"], texts):
        logprobs = choice["logprobs"]
        for step, part in enumerate(parts):
            piece = None
            if logprobs is not None:
                piece = {"tokens": [logprobs["tokens"][step]], "token_logprobs": [logprobs["token_logprobs"][step]],
                         "top_logprobs": [logprobs["top_logprobs"][step]] if logprobs["top_logprobs"] else None,
                         "text_offset": [logprobs["text_offset"][step]]}
            yield {**head, "choices": [{"index": choice["index"], "text": part, "logprobs": piece, "finish_reason": None}]}
        extras = {key: choice[key] for key in EXTRAS if key in choice}
        yield {**head, "choices": [{"index": choice["index"], "text": "", "logprobs": None,
                                    "finish_reason": choice["finish_reason"], **extras}]}
    if include_usage:
        yield {**head, "choices": [], "usage": answer["usage"]}


def chat_chunks(answer: dict[str, Any], texts: list[list[str]], include_usage: bool) -> Iterator[dict[str, Any]]:
    """The chunks of a /v1/chat/completions answer; `texts[i]`: choice i's text piece per token (used when the answer
    has no tool calls; with calls, the content and the calls come as one delta each, as a parser sees them whole)."""
    head = {key: answer[key] for key in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    for choice, parts in zip(answer["choices"], texts):
        index, message, logprobs = choice["index"], choice["message"], choice["logprobs"]
        yield {**head, "choices": [{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                    "finish_reason": None}]}
        if message.get("tool_calls"):
            if message["content"]:
                yield {**head, "choices": [{"index": index, "delta": {"content": message["content"]}, "logprobs": None,
                                            "finish_reason": None}]}
            calls = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
            yield {**head, "choices": [{"index": index, "delta": {"tool_calls": calls},
                                        "logprobs": logprobs, "finish_reason": None}]}
        else:
            for step, part in enumerate(parts):
                piece = {"content": [logprobs["content"][step]]} if logprobs else None
                yield {**head, "choices": [{"index": index, "delta": {"content": part}, "logprobs": piece,
                                            "finish_reason": None}]}
        extras = {key: choice[key] for key in EXTRAS if key in choice}
        yield {**head, "choices": [{"index": index, "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"],
                                    **extras}]}
    if include_usage:
        yield {**head, "choices": [], "usage": answer["usage"]}
