"""`rlft vllm-serve`'s OpenAI routes driven by the official `openai` client, sync, async and streaming, as agent
frameworks drive them: every answer is what the whole answer holds, and every value or field the server cannot honour
gets a 400 the client raises as BadRequestError."""

from __future__ import annotations

import asyncio

import openai
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlft.models.tiny import write_tiny_model
from server_utils import free_port, kill_group, run_cli, wait_for_health

pytestmark = [pytest.mark.slow, pytest.mark.server]
CONTEXT = 128


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    root = tmp_path_factory.mktemp("openai")
    folder = write_tiny_model(root / "model", "XS", max_positions=CONTEXT)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).save_pretrained(folder)
    config = root / "serve.yaml"
    config.write_text(f"base_model: {folder}\ndatasets:\n  - path: unused.jsonl\nvllm:\n  host: 127.0.0.1\n")
    port, log = free_port(), root / "server.log"
    process = run_cli("vllm-serve", str(config), "--port", str(port), log=log)
    try:
        wait_for_health(process, port, log)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        kill_group(process)


@pytest.fixture
def client(url):
    with openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60) as client:
        yield client


def test_the_official_client_lists_completes_and_chats(client):
    [model] = client.models.list().data
    done = client.completions.create(model=model.id, prompt=["1+2=", "7+8="], n=2, max_tokens=5, logprobs=2, seed=3,
                                     temperature=1.0, user="someone")
    assert len(done.choices) == 4 and {c.finish_reason for c in done.choices} <= {"stop", "length"}
    assert done.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in done.choices)
    chat = client.chat.completions.create(model=model.id, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=4,
                                          logprobs=True, top_logprobs=2, presence_penalty=0, metadata={"run": "a"})
    [choice] = chat.choices
    assert choice.message.role == "assistant" and len(choice.logprobs.content) == chat.usage.completion_tokens
    assert all(len(step.top_logprobs) == 2 for step in choice.logprobs.content)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_streamed_completion_is_the_whole_one_in_chunks(client, temperature):
    whole = client.completions.create(model="m", prompt="12+34=", n=2, max_tokens=12, logprobs=1, seed=5,
                                      temperature=temperature)
    chunks = list(client.completions.create(model="m", prompt="12+34=", n=2, max_tokens=12, logprobs=1, seed=5,
                                            temperature=temperature, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    for choice in whole.choices:
        mine = [c.choices[0] for c in chunks[:-1] if c.choices[0].index == choice.index]
        assert "".join(c.text for c in mine) == choice.text
        assert [lp for c in mine if c.logprobs for lp in c.logprobs.token_logprobs] == choice.logprobs.token_logprobs
        assert [c.finish_reason for c in mine] == [None] * (len(mine) - 1) + [choice.finish_reason]


def test_a_streamed_chat_is_the_whole_one_in_deltas(client):
    messages = [{"role": "user", "content": "Say something"}]
    whole = client.chat.completions.create(model="m", messages=messages, max_tokens=10, seed=1, logprobs=True)
    stream = client.chat.completions.create(model="m", messages=messages, max_tokens=10, seed=1, logprobs=True, stream=True)
    chunks = [chunk.choices[0] for chunk in stream]
    assert chunks[0].delta.role == "assistant"
    assert "".join(c.delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert [s.logprob for c in chunks if c.logprobs for s in c.logprobs.content] == \
           [s.logprob for s in whole.choices[0].logprobs.content]
    assert chunks[-1].finish_reason == whole.choices[0].finish_reason


def test_the_async_client_gets_concurrent_answers(url):
    async def run() -> list[str]:
        async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60) as client:
            answers = await asyncio.gather(*(client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"{i}+1="}], max_tokens=3, seed=i) for i in range(16)))
            streamed = await client.completions.create(model="m", prompt="1+1=", max_tokens=3, seed=0, stream=True)
            return [a.choices[0].finish_reason for a in answers] + [c.choices[0].finish_reason async for c in streamed]
    reasons = asyncio.run(run())
    assert len(reasons) > 16 and set(reasons[:16]) <= {"stop", "length"}


@pytest.mark.parametrize("settings, says", [
    ({"max_tokens": 10**9}, "exceeds the context of 128 tokens (vllm.max_model_len): ask for at most"),
    ({"presence_penalty": 0.5}, "presence and frequency penalties are not implemented"),
    ({"logit_bias": {"65": 5}}, "logit_bias is not implemented"),
    ({"response_format": {"type": "json_object"}}, "structured output (json_object, json_schema) is not implemented"),
    ({"tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
     "forcing a tool call is not implemented"),
    ({"store": True}, "this server stores no completions"),
    ({"extra_body": {"frobnicate": 1}}, "unknown field(s) frobnicate"),
    ({"stream_options": {"include_usage": True}}, "stream_options is only for a streamed answer"),
])
def test_what_the_server_cannot_honour_is_a_400_naming_it(client, settings, says):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                       **{"max_tokens": 2, **settings})
    assert says in str(caught.value)


def test_completions_refuse_best_of_echo_and_a_prompt_that_leaves_no_room(client):
    for settings, says in [({"best_of": 3}, "best_of=3 with n=1"), ({"echo": True}, "echo is not implemented"),
                           ({"suffix": "x"}, "suffix (insertion) is not implemented")]:
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model="m", prompt="1+2=", max_tokens=2, **settings)
        assert says in str(caught.value)
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="m", prompt="x" * (CONTEXT - 4), max_tokens=16)
    assert "with a prompt of 124 tokens exceeds the context of 128 tokens" in str(caught.value)
    assert client.completions.create(model="m", prompt="x" * (CONTEXT - 4), max_tokens=4).usage.completion_tokens <= 4
