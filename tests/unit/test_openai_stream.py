"""The pieces a streamed OpenAI answer is cut into, and its chunks (rlft/rollout/server/openai_stream.py)."""

from __future__ import annotations

import pytest

from rlft.data.tokenizer import byte_tokenizer
from rlft.rollout.server.openai_fields import check_fields, check_room
from rlft.rollout.server.openai_stream import chat_chunks, completion_chunks, pieces
from rlft.rollout.server.protocol import ServerError


def test_pieces_add_up_to_the_text_and_wait_for_a_whole_character():
    tok = byte_tokenizer()
    ids = list("añb".encode())  # ñ is two bytes: the first adds nothing, the second the whole character
    decode = lambda prefix: tok.decode(prefix, skip_special_tokens=True)  # noqa: E731
    assert pieces(decode, ids, "añb") == ["a", "", "ñ", "b"]
    assert pieces(decode, ids, "añ") == ["a", "", "ñ", ""]  # a stop string cut the text: later tokens add nothing
    assert pieces(decode, [], "") == []


def test_completion_chunks_carry_each_token_then_the_finish_then_the_usage():
    answer = {"id": "c", "object": "text_completion", "created": 1, "model": "m", "usage": {"total_tokens": 3},
              "choices": [{"index": 0, "text": "ab", "finish_reason": "length", "prompt_token_ids": [1],
                           "generation_token_ids": [97, 98], "generation_log_probs": [-1.0, -2.0],
                           "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-1.0, -2.0], "top_logprobs": None,
                                        "text_offset": [0, 1]}}]}
    chunks = list(completion_chunks(answer, [["a", "b"]], include_usage=True))
    assert [c["choices"][0]["text"] for c in chunks[:3]] == ["a", "b", ""]
    assert [c["choices"][0]["logprobs"]["token_logprobs"] for c in chunks[:2]] == [[-1.0], [-2.0]]
    assert chunks[2]["choices"][0]["finish_reason"] == "length" and chunks[2]["choices"][0]["generation_token_ids"] == [97, 98]
    assert chunks[3] == {"id": "c", "object": "text_completion", "created": 1, "model": "m", "choices": [],
                         "usage": {"total_tokens": 3}}


def test_a_chat_answer_with_tool_calls_streams_its_content_and_calls_as_one_delta_each():
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    answer = {"id": "x", "created": 1, "model": "m", "usage": {},
              "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None,
                           "message": {"role": "assistant", "content": "ok", "tool_calls": [call]}}]}
    chunks = [c["choices"][0] for c in chat_chunks(answer, [["o", "k", "<", "t"]], include_usage=False)]
    assert [c["delta"] for c in chunks] == [{"role": "assistant", "content": ""}, {"content": "ok"},
                                            {"tool_calls": [{"index": 0, **call}]}, {}]
    assert chunks[-1]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("extra, says", [
    ({"frequency_penalty": 0.1}, "presence and frequency penalties"), ({"frobnicate": 1, "zap": 2}, "unknown field(s) frobnicate, zap"),
    ({"modalities": ["text", "audio"]}, "text only"), ({"service_tier": "flex"}, "one tier"),
])
def test_fields_the_server_cannot_honour_are_refused(extra, says):
    with pytest.raises(ServerError) as caught:
        check_fields(extra, "/v1/chat/completions")
    assert caught.value.status == 400 and says in caught.value.message


def test_fields_that_ask_for_nothing_or_only_label_pass():
    check_fields({"frequency_penalty": 0, "logit_bias": {}, "response_format": {"type": "text"}, "store": False,
                  "user": "u", "metadata": {"k": "v"}, "modalities": ["text"], "service_tier": "auto", "echo": None},
                 "/v1/completions", best_of=2, n=2)
    check_room([[1] * 100], 28, 128)
    with pytest.raises(ServerError, match="ask for at most 28 tokens"):
        check_room([[1] * 100], 29, 128)
