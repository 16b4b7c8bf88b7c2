"""A NeMo Gym resource server of rlft's addition task: the smallest environment to copy when writing your own.

A task row is `{"responses_create_params": {"input": [{"role": "user", "content": "12+34="}]}, "answer": "46"}`;
`/verify` reads the answer text out of the Responses-API `response` and gives partial credit, 1 - |error| / 10 floored
at 0 (dense, so a small model's first steps already see a signal). Install it by copying this folder to
`<nemo_gym_dir>/resources_servers/rlft_addition` (docs/environments.md, "Writing your own environment").
"""

from __future__ import annotations

import re

from nemo_gym.base_resources_server import (BaseResourcesServerConfig, BaseVerifyRequest, BaseVerifyResponse,
                                            SimpleResourcesServer)

NUMBER = re.compile(r"-?\d+")


class AdditionConfig(BaseResourcesServerConfig):
    pass


class AdditionVerifyRequest(BaseVerifyRequest):
    answer: str  # the task row's own field: Gym sends the whole row back with the response


class AdditionVerifyResponse(BaseVerifyResponse):
    parsed: int | None


def answer_text(response) -> str:
    """The text of the message items of a Responses-API response."""
    parts = []
    for item in response.output:
        if item.type != "message":
            continue
        if isinstance(item.content, str):
            parts.append(item.content)
        else:
            parts += [content.text for content in item.content if content.type == "output_text"]
    return "".join(parts)


class AdditionServer(SimpleResourcesServer):
    ray_enabled = False  # it needs no Ray workers
    config: AdditionConfig

    async def verify(self, body: AdditionVerifyRequest) -> AdditionVerifyResponse:
        text = answer_text(body.response).strip()
        parsed = int(text) if NUMBER.fullmatch(text) else None
        reward = 0.0 if parsed is None else max(0.0, 1.0 - abs(parsed - int(body.answer)) / 10)
        return AdditionVerifyResponse(**body.model_dump(), reward=reward, parsed=parsed)


if __name__ == "__main__":
    AdditionServer.run_webserver()
