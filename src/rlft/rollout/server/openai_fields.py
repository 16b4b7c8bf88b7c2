"""Every field of an OpenAI request is honoured or refused with a 400, never dropped in silence.

The request bodies (`requests.py`) declare what the server honours: OpenAI's sampling fields, `stream`, the vLLM
extensions (`top_k`, `min_p`, `repetition_penalty`, `stop_token_ids`, `return_tokens_as_token_ids`, ...). OpenAI
fields the server cannot honour are refused here unless they hold the value that asks for nothing (a presence penalty
of 0, an empty logit bias); a field that neither OpenAI nor vLLM defines is refused by name. Fields that only label
a request (`user`, `metadata`, `prompt_cache_key`, `safety_identifier`) change no output and are taken as they are.
"""

from __future__ import annotations

from typing import Any, Callable

from rlft.rollout.server.protocol import ServerError

# field -> (does this value ask for nothing?, why the server cannot honour anything else)
NOT_HONOURED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "presence_penalty": (lambda v: v == 0, "presence and frequency penalties are not implemented: use repetition_penalty"),
    "frequency_penalty": (lambda v: v == 0, "presence and frequency penalties are not implemented: use repetition_penalty"),
    "logit_bias": (lambda v: not v, "logit_bias is not implemented"),
    "response_format": (lambda v: isinstance(v, dict) and v.get("type") == "text",
                        "structured output (json_object, json_schema) is not implemented: ask in the prompt"),
    "modalities": (lambda v: list(v) == ["text"], "this server answers with text only"),
    "audio": (lambda v: False, "this server answers with text only"),
    "prediction": (lambda v: False, "predicted outputs are not implemented"),
    "functions": (lambda v: False, "the deprecated `functions` field: send `tools`"),
    "function_call": (lambda v: False, "the deprecated `function_call` field: send `tool_choice`"),
    "store": (lambda v: v is False, "this server stores no completions"),
    "service_tier": (lambda v: v in ("auto", "default"), "this server has one tier"),
    "reasoning_effort": (lambda v: False, "reasoning effort is not implemented: pass chat_template_kwargs to the "
                                          "chat template (e.g. {enable_thinking: false})"),
    "web_search_options": (lambda v: False, "web search is not implemented"),
    "verbosity": (lambda v: False, "verbosity is not implemented"),
    "echo": (lambda v: v is False, "echo is not implemented: the answer's `prompt_token_ids` hold the prompt"),
    "suffix": (lambda v: v == "", "suffix (insertion) is not implemented"),
    "min_tokens": (lambda v: v == 0, "min_tokens is not implemented"),
    "prompt_logprobs": (lambda v: False, "prompt_logprobs is not implemented: score the prompt with /generate's "
                                         "log-probs of a completion instead"),
    "guided_json": (lambda v: False, "guided decoding is not implemented"),
    "guided_regex": (lambda v: False, "guided decoding is not implemented"),
    "guided_choice": (lambda v: False, "guided decoding is not implemented"),
    "structured_outputs": (lambda v: False, "guided decoding is not implemented"),
    "priority": (lambda v: v == 0, "request priorities are not implemented"),
}
LABELS = {"user", "metadata", "prompt_cache_key", "safety_identifier", "request_id"}  # label a request, change no output


def check_fields(extra: dict[str, Any] | None, route: str, best_of: int | None = None, n: int = 1,
                 stream_options: dict[str, Any] | None = None, stream: bool = False) -> None:
    """400 for a field of `extra` (what the body model does not declare) that the server cannot honour, or knows not,
    and for stream_options without stream (OpenAI's rule: it has nothing to act on)."""
    if stream_options and not stream:
        raise ServerError(400, f"{route}: stream_options is only for a streamed answer: set stream: true, or remove it")
    unknown = []
    for field, value in (extra or {}).items():
        if value is None or field in LABELS:
            continue
        if field in NOT_HONOURED:
            asks_nothing, why = NOT_HONOURED[field]
            if not asks_nothing(value):
                raise ServerError(400, f"{route}: {field}={value!r}: {why}")
            continue
        unknown.append(field)
    if unknown:
        raise ServerError(400, f"{route}: unknown field(s) {', '.join(sorted(unknown))}: neither OpenAI's API nor vLLM's "
                               "extensions that this server implements; remove them")
    if best_of is not None and best_of != n:
        raise ServerError(400, f"{route}: best_of={best_of} with n={n}: ranking samples by likelihood is not implemented; "
                               "leave best_of unset (or equal to n)")


def check_room(prompts: list[list[int]], max_tokens: int | None, limit: int) -> None:
    """vLLM's rule on the OpenAI routes: a prompt plus max_tokens must fit the context (a 400, not a silent cut)."""
    longest = max(len(ids) for ids in prompts)
    if max_tokens is not None and longest + max_tokens > limit:
        raise ServerError(400, f"max_tokens={max_tokens} with a prompt of {longest} tokens exceeds the context of {limit} "
                               f"tokens (vllm.max_model_len): ask for at most {max(limit - longest, 0)} tokens")
