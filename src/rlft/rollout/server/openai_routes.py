"""OpenAI-compatible routes, so agent frameworks (and NeMo Gym) can use the server as a policy endpoint.

Besides the OpenAI fields, every choice carries `prompt_token_ids`, `generation_token_ids` and
`generation_log_probs` (as Axolotl's server expects), and so does every chat message (where NeMo Gym's
model server looks first): what a trainer needs to learn from an agent's calls. With `tools` in a chat
request, Hermes `<tool_call>` blocks in the answer come back as `tool_calls` (rollout/server/tool_calls.py).
These routes stop at the model's end-of-text ids as OpenAI servers do (the tokenizer's EOS and those of the model's
generation_config.json: `rlft.data.tokenizer.end_ids`); `/generate` stops only at the ids it is sent. The `model` field of a request is not checked.
Every other field is honoured or refused with a 400 (`openai_fields.py`); `stream: true` answers as server-sent
events (`openai_stream.py`).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import FastAPI

from rlft.rollout.server.openai_fields import check_fields, check_room
from rlft.rollout.server.openai_stream import chat_chunks, completion_chunks, event_stream, pieces
from rlft.rollout.server.protocol import Generated, ServerError, ServingBackend
from rlft.rollout.server.requests import ChatBody, CompletionBody, OpenAISamplingBody, TokenizeBody, generation_request
from rlft.rollout.server.routes import add_route
from rlft.rollout.server.tool_calls import decoded_arguments, parse_tool_calls

MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content")


def add_openai_routes(app: FastAPI, backend: ServingBackend, model_name: str, ends: tuple[int, ...]) -> None:
    tokenizer = backend.tokenizer
    created = int(time.time())

    def token_text(token_id: int, as_ids: bool) -> str:
        return f"token_id:{token_id}" if as_ids else tokenizer.decode([token_id])

    def stop_ids(body: OpenAISamplingBody) -> list[int]:
        ids = list(body.stop_token_ids or [])
        return ids if body.ignore_eos else ids + [token for token in ends if token not in ids]

    def text_of(ids: list[int], stops: list[str], body: OpenAISamplingBody) -> str:
        text = tokenizer.decode(ids, skip_special_tokens=body.skip_special_tokens)
        cuts = [text.find(stop) + (len(stop) if body.include_stop_str_in_output else 0)
                for stop in stops if stop and stop in text]
        return text[: min(cuts)] if cuts else text  # the stop string itself is not part of the answer, unless asked

    def token_pieces(ids: list[int], text: str, body: OpenAISamplingBody) -> list[str]:
        return pieces(lambda prefix: tokenizer.decode(prefix, skip_special_tokens=body.skip_special_tokens), ids, text)

    def render(clean: list[dict[str, Any]], tools, add_generation_prompt: bool, kwargs) -> list[int]:
        try:
            return list(tokenizer.apply_chat_template(clean, tools=tools, add_generation_prompt=add_generation_prompt,
                                                      tokenize=True, return_dict=False, **(kwargs or {})))
        except Exception as exc:  # noqa: BLE001 - a template that cannot render these messages is the request's problem
            raise ServerError(400, f"the chat template cannot render these messages: {type(exc).__name__}: {exc}") from None

    def chat_prompt(messages: list[dict[str, Any]], tools, add_generation_prompt: bool, kwargs) -> list[int]:
        clean = [decoded_arguments({key: _content_text(value) if key == "content" else value
                                    for key, value in message.items() if key in MESSAGE_KEYS})
                 for message in messages]
        ids = render(clean, tools, add_generation_prompt, kwargs)
        # token in, token out: an earlier answer sent back with the ids it was sampled as (NeMo Gym does) is put back
        # as those ids, so the next turn's prompt extends exactly what the model saw and wrote
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant" and m.get("generation_token_ids")
                    and m.get("prompt_token_ids")), default=None)
        if last is None:
            return ids
        try:
            sampled = [int(t) for t in messages[last]["prompt_token_ids"]] + [int(t) for t in messages[last]["generation_token_ids"]]
        except (TypeError, ValueError):
            raise ServerError(400, f"messages[{last}]: prompt_token_ids and generation_token_ids must be lists of token ids "
                                   "(integers)") from None
        return splice_sampled_turn(ids, render(clean[: last + 1], tools, False, kwargs), sampled, set(tokenizer.all_special_ids))

    def usage(prompts: list[list[int]], out: Generated) -> dict[str, int]:
        prompt_tokens = sum(len(ids) for ids in prompts)
        completion_tokens = sum(len(ids) for ids in out.completion_ids)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}

    def token_extras(prompt: list[int], out: Generated, row: int) -> dict[str, Any]:
        return {"prompt_token_ids": prompt, "generation_token_ids": out.completion_ids[row], "generation_log_probs": out.logprobs[row],
                "weight_version": out.weight_version}

    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created, "owned_by": "rlft",
                                            "root": model_name, "max_model_len": backend.max_model_len}]}

    async def completions(body: CompletionBody) -> Any:
        check_fields(body.model_extra, "/v1/completions", body.best_of, body.n, body.stream_options, body.stream)
        prompts = _completion_prompts(body.prompt, tokenizer)
        check_room(prompts, body.max_tokens, backend.max_model_len)
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        top = body.logprobs or 0
        request = generation_request(
            backend, prompts, n=body.n, max_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p,
            top_k=body.top_k, min_p=body.min_p, repetition_penalty=body.repetition_penalty,
            stop_token_ids=stop_ids(body), stop=stops, seed=body.seed, top_logprobs=top)
        out = await backend.generate(request)
        choices = []
        for row, ids in enumerate(out.completion_ids):
            logprobs = None
            if body.logprobs is not None:
                tokens = [token_text(t, body.return_tokens_as_token_ids) for t in ids]
                tops = None
                if top and out.top_logprobs is not None:
                    tops = [{token_text(t, body.return_tokens_as_token_ids): lp for t, lp in step} for step in out.top_logprobs[row]]
                offsets, position = [], 0
                for token in tokens:
                    offsets.append(position)
                    position += len(token)
                logprobs = {"tokens": tokens, "token_logprobs": out.logprobs[row], "top_logprobs": tops, "text_offset": offsets}
            choices.append({"index": row, "text": text_of(ids, stops, body), "logprobs": logprobs,
                            "finish_reason": "length" if out.truncated[row] else "stop",
                            **token_extras(prompts[row // body.n], out, row)})
        answer = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                  "model": model_name, "choices": choices, "usage": usage(prompts, out)}
        if not body.stream:
            return answer
        texts = [token_pieces(ids, choice["text"], body) for ids, choice in zip(out.completion_ids, choices)]
        return event_stream(completion_chunks(answer, texts, body.include_usage))

    async def chat_completions(body: ChatBody) -> Any:
        check_fields(body.model_extra, "/v1/chat/completions", stream_options=body.stream_options, stream=body.stream)
        if body.tool_choice not in (None, "none", "auto"):
            raise ServerError(400, f"/v1/chat/completions: tool_choice={body.tool_choice!r}: forcing a tool call is not "
                                   "implemented; send 'auto' (the model decides) or 'none'")
        template_kwargs = dict(body.chat_template_kwargs or {})
        if body.continue_final_message:
            template_kwargs["continue_final_message"] = True
        prompt = chat_prompt(body.messages, body.tools, body.add_generation_prompt and not body.continue_final_message,
                             template_kwargs)
        max_tokens = body.max_completion_tokens or body.max_tokens
        check_room([prompt], max_tokens, backend.max_model_len)
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        top = (body.top_logprobs or 0) if body.logprobs else 0
        request = generation_request(
            backend, [prompt], n=body.n, max_tokens=max_tokens, temperature=body.temperature,
            top_p=body.top_p, top_k=body.top_k, min_p=body.min_p, repetition_penalty=body.repetition_penalty,
            stop_token_ids=stop_ids(body), stop=stops, seed=body.seed, top_logprobs=top)
        out = await backend.generate(request)
        choices = []
        for row, ids in enumerate(out.completion_ids):
            logprobs = None
            if body.logprobs:
                content = []
                for step, (token_id, logprob) in enumerate(zip(ids, out.logprobs[row])):
                    token = token_text(token_id, body.return_tokens_as_token_ids)
                    alternatives = []
                    if top and out.top_logprobs is not None:
                        for alt_id, alt_lp in out.top_logprobs[row][step]:
                            alt = token_text(alt_id, body.return_tokens_as_token_ids)
                            alternatives.append({"token": alt, "logprob": alt_lp, "bytes": list(alt.encode())})
                    content.append({"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": alternatives})
                logprobs = {"content": content}
            content, calls = text_of(ids, stops, body), []
            if body.tools and body.tool_choice != "none":
                content, calls = parse_tool_calls(content)
                calls = calls[:1] if body.parallel_tool_calls is False else calls
            extras = token_extras(prompt, out, row)
            message = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {}), **extras}
            finish = "length" if out.truncated[row] else "tool_calls" if calls else "stop"
            choices.append({"index": row, "message": message, "logprobs": logprobs, "finish_reason": finish, **extras})
        answer = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                  "model": model_name, "choices": choices, "usage": usage([prompt], out)}
        if not body.stream:
            return answer
        # an answer with tool calls streams its content and calls whole (chat_chunks): pieces only for the others
        texts = [[] if choice["message"].get("tool_calls") else token_pieces(ids, choice["message"]["content"], body)
                 for ids, choice in zip(out.completion_ids, choices)]
        return event_stream(chat_chunks(answer, texts, body.include_usage))

    async def tokenize(body: TokenizeBody) -> dict[str, Any]:
        if body.messages is not None:
            tokens = chat_prompt(body.messages, body.tools, body.add_generation_prompt, body.chat_template_kwargs)
        elif body.prompt is not None:
            tokens = tokenizer(body.prompt, add_special_tokens=body.add_special_tokens)["input_ids"]
        else:
            raise ServerError(400, "tokenize needs `prompt` (a string) or `messages` (a chat)")
        return {"tokens": tokens, "count": len(tokens), "max_model_len": backend.max_model_len}

    add_route(app, "/v1/models", models, ["GET"])
    add_route(app, "/v1/completions", completions, ["POST"])
    add_route(app, "/v1/chat/completions", chat_completions, ["POST"])
    add_route(app, "/tokenize", tokenize, ["POST"])


def splice_sampled_turn(rendered: list[int], head: list[int], sampled: list[int], markers: set[int]) -> list[int]:
    """`rendered` (the template's ids of the whole chat) with its start replaced by the ids an earlier turn was sampled as.

    `head` is the template's rendering up to and including that assistant turn; `sampled` is the turn's prompt ids plus
    its generated ids. The template may render the answer differently from how it was sampled (JSON arguments
    re-serialised, text after a tool call dropped, another tokenisation); the part of `head` after the turn's last
    sampled token (the newline after the end-of-turn marker) is kept. When the turn did not end with a special token
    (`markers`: it was cut off), `head` is not a prefix of `rendered`, or `head` lacks that token, the rendering is
    returned as it is.
    """
    if not sampled or sampled[-1] not in markers or rendered[: len(head)] != head or sampled[-1] not in head:
        return rendered
    end = len(head) - 1 - head[::-1].index(sampled[-1])  # the template's copy of the turn's last token
    return sampled + head[end + 1 :] + rendered[len(head) :]


def _content_text(content: Any) -> Any:
    """OpenAI content parts ([{"type": "text", "text": ...}]) as the plain string chat templates expect."""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content


def _completion_prompts(prompt: Any, tokenizer) -> list[list[int]]:
    if isinstance(prompt, str):
        return [tokenizer(prompt)["input_ids"]]
    if not prompt:
        raise ServerError(400, "prompt is empty")
    if all(isinstance(item, int) for item in prompt):
        return [list(prompt)]
    if all(isinstance(item, str) for item in prompt):
        return [tokenizer(text)["input_ids"] for text in prompt]
    return [list(ids) for ids in prompt]
