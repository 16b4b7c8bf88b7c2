"""Request bodies of the server's endpoints and the checks that turn one into a `GenerationRequest` or a clear 400.
The trainer-facing routes ignore fields they do not read (vLLM's and TRL's clients send extras); the OpenAI routes
keep every other field for `openai_fields.check_fields`, which honours or refuses each."""

from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, model_validator

from rlft.rollout.server.protocol import GenerationRequest, ServerError, ServingBackend
from rlft.rollout.types import SamplingParams


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class GenerateBody(Body):
    prompt_ids: list[list[int]]
    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    stop_token_ids: list[int] = []
    stop: list[str] = []
    seed: Optional[int] = None


class WeightsPathBody(Body):
    path: str
    version: int
    checksum: Optional[str] = None


class VersionBody(Body):
    from_version: int  # what the trainer believes the server serves
    version: int


class LoadAdapterBody(Body):
    lora_path: str
    version: Optional[int] = None
    checksum: Optional[str] = None
    lora_name: Optional[str] = None
    lora_int_id: Optional[int] = None  # Axolotl's /set_lora_adapter/: the version


class OpenAISamplingBody(Body):
    """The sampling fields both OpenAI routes take (vLLM's extensions included); a null is the default, as OpenAI's and
    vLLM's servers read it. Other fields are kept (`model_extra`) for `openai_fields.check_fields`."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:
        return {key: value for key, value in data.items() if value is not None} if isinstance(data, dict) else data

    model: Optional[str] = None
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    stop: Union[str, list[str], None] = None
    stop_token_ids: Optional[list[int]] = None
    seed: Optional[int] = None
    return_tokens_as_token_ids: bool = False
    stream: bool = False
    stream_options: Optional[dict[str, Any]] = None  # {include_usage: true}: a last chunk with the usage
    ignore_eos: bool = False  # vLLM's: stop only at max_tokens, stop strings and stop_token_ids
    skip_special_tokens: bool = True  # vLLM's: special tokens left out of the text
    include_stop_str_in_output: bool = False  # vLLM's: the stop string that ended an answer stays in its text
    return_token_ids: Optional[bool] = None  # vLLM's: the ids are in every answer (prompt_token_ids, generation_token_ids)

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class CompletionBody(OpenAISamplingBody):
    prompt: Union[str, list[int], list[str], list[list[int]]]
    max_tokens: Optional[int] = 16
    logprobs: Optional[int] = None
    best_of: Optional[int] = None


class ChatBody(OpenAISamplingBody):
    messages: list[dict[str, Any]]
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Any] = None  # "none" turns tool-call parsing off; anything else leaves it to the model
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    logprobs: bool = False
    top_logprobs: Optional[int] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    parallel_tool_calls: Optional[bool] = None  # false: the first call of an answer only
    add_generation_prompt: bool = True  # vLLM's
    continue_final_message: bool = False  # vLLM's: the answer continues the last (assistant) message


class TokenizeBody(Body):
    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[dict[str, Any]]] = None
    tools: Optional[list[dict[str, Any]]] = None
    add_generation_prompt: bool = True
    add_special_tokens: bool = True
    chat_template_kwargs: Optional[dict[str, Any]] = None


def generation_request(backend: ServingBackend, prompts: list[list[int]], *, n: int, max_tokens: int | None,
                       temperature: float, top_p: float, top_k: int, min_p: float, repetition_penalty: float,
                       stop_token_ids: list[int], stop: list[str], seed: int | None, top_logprobs: int = 0) -> GenerationRequest:
    """Check a generation request against the served model; max_tokens is cut to what max_model_len leaves."""
    if n < 1:
        raise ServerError(400, f"n={n}: ask for at least one sample per prompt")
    if not prompts:
        raise ServerError(400, "no prompts: send at least one")
    limit = backend.max_model_len
    for index, ids in enumerate(prompts):
        if not ids:
            raise ServerError(400, f"prompt {index} is empty: send at least one token")
        if len(ids) >= limit:
            raise ServerError(400, f"prompt {index} has {len(ids)} tokens; vllm.max_model_len is {limit} (prompt + completion): "
                                   "shorten the prompt or raise vllm.max_model_len")
        bad = next((t for t in ids if not 0 <= t < backend.vocab_size), None)
        if bad is not None:
            raise ServerError(400, f"prompt {index} holds token id {bad}, outside the vocabulary (0..{backend.vocab_size - 1})")
    if max_tokens is not None and max_tokens < 1:
        raise ServerError(400, f"max_tokens={max_tokens}: ask for at least one token")
    room = limit - max(len(ids) for ids in prompts)
    checks = [(temperature < 0, f"temperature={temperature} must be >= 0 (0 = greedy)"),
              (not 0 < top_p <= 1, f"top_p={top_p} must be in (0, 1]"),
              (not 0 <= min_p <= 1, f"min_p={min_p} must be in [0, 1]"),
              (repetition_penalty <= 0, f"repetition_penalty={repetition_penalty} must be > 0"),
              (not 0 <= top_logprobs <= 20, f"top_logprobs={top_logprobs} must be in 0..20")]
    for failed, message in checks:
        if failed:
            raise ServerError(400, message)
    params = SamplingParams(
        max_new_tokens=min(max_tokens or room, room), temperature=temperature, top_p=top_p, top_k=max(top_k, 0), min_p=min_p,
        repetition_penalty=repetition_penalty, stop_token_ids=tuple(stop_token_ids), stop_strings=tuple(s for s in stop if s),
    )
    return GenerationRequest([list(ids) for ids in prompts], n, params, seed, top_logprobs)
