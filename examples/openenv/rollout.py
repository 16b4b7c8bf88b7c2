"""A TRL-form `trl.rollout_func` that plays the addition game of `examples.openenv.server` through OpenEnv's client.

For every prompt row: a fresh episode is reset with the numbers of the dataset prompt ("12+30=", or the last user
message of a chat), so the environment poses the same problem (a prompt without two numbers gets a problem the
environment draws itself, the same one for every row of that prompt). The environment's prompt is tokenised as rlft
tokenises dataset prompts, the policy samples one completion per row (all rows in one batch), and the decoded text is
the action of the episode's single step; the step's reward is returned as the `env_reward` column, which
`rlft.rollout.envs.nemo_gym.reward_env` hands on as the reward.

One WebSocket session serves the whole call: OpenEnv keeps one episode per session, so a first reset per distinct
problem reads the prompt, and each row's episode is then reset again (same arguments, same prompt) and stepped.
The server is at $OPENENV_URL (read at every call; default http://127.0.0.1:8011).
"""

from __future__ import annotations

import os
import random
import re
from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from examples.openenv.server import AdditionAction, AdditionObservation, AdditionState

DEFAULT_URL = "http://127.0.0.1:8011"
CONNECT_TIMEOUT_S = 10.0
MESSAGE_TIMEOUT_S = 30.0  # per reset or step
PROBLEM = re.compile(r"(\d+)\s*\+\s*(\d+)")


class AdditionClient(EnvClient[AdditionAction, AdditionObservation, AdditionState]):
    """OpenEnv's WebSocket client, typed for the addition environment."""

    def _step_payload(self, action: AdditionAction) -> dict[str, Any]:
        return action.model_dump()

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[AdditionObservation]:
        reward, done = payload.get("reward"), bool(payload.get("done", False))
        observation = AdditionObservation(**payload.get("observation", {}), reward=reward, done=done)
        return StepResult(observation=observation, reward=reward, done=done)

    def _parse_state(self, payload: dict[str, Any]) -> AdditionState:
        return AdditionState(**payload)


def question(prompt: str | list[dict[str, Any]]) -> str:
    """The problem text: a string prompt itself, or the content of a chat's last user message."""
    if isinstance(prompt, str):
        return prompt
    return next((str(m.get("content", "")) for m in reversed(prompt) if m.get("role") == "user"), "")


def with_question(prompt: str | list[dict[str, Any]], text: str) -> str | list[dict[str, Any]]:
    """`prompt` with its problem replaced by the environment's `text` (a chat keeps its other messages)."""
    if isinstance(prompt, str):
        return text
    last = max((i for i, m in enumerate(prompt) if m.get("role") == "user"), default=None)
    if last is None:
        return [*prompt, {"role": "user", "content": text}]
    return [{**m, "content": text} if i == last else m for i, m in enumerate(prompt)]


def prompt_ids(prompt: str | list[dict[str, Any]], tokenizer, chat_template_kwargs: dict | None) -> list[int]:
    """Tokens as rlft makes them from a dataset prompt: a string as is (with BOS if the tokenizer adds one), a chat
    through the chat template with the generation prompt."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True, **(chat_template_kwargs or {}))
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def reset_arguments(prompt: str | list[dict[str, Any]], rng: random.Random) -> dict[str, int]:
    """Reset with the prompt's own numbers; no two numbers: a seed, so the environment's own draw can be replayed."""
    found = PROBLEM.search(question(prompt))
    return {"a": int(found[1]), "b": int(found[2])} if found else {"seed": rng.randrange(2**31)}


def rollout_func(prompts: list[Any], trainer) -> dict[str, list]:
    url = os.environ.get("OPENENV_URL", DEFAULT_URL)
    tokenizer = trainer.processing_class
    template_kwargs = getattr(trainer.args, "chat_template_kwargs", None)
    rng = random.Random()
    arguments: dict[str, dict[str, int]] = {}  # per distinct prompt
    for prompt in prompts:
        arguments.setdefault(repr(prompt), reset_arguments(prompt, rng))
    client = AdditionClient(url, connect_timeout_s=CONNECT_TIMEOUT_S, message_timeout_s=MESSAGE_TIMEOUT_S).sync()
    try:
        try:
            client.connect()
        except ConnectionError as exc:
            raise ConnectionError(f"{exc}; start the environment first (python -m examples.openenv.server --port PORT) "
                                  "and set OPENENV_URL=http://127.0.0.1:PORT") from exc
        posed = {key: client.reset(**kwargs).observation.prompt for key, kwargs in arguments.items()}
        ids = [prompt_ids(with_question(p, posed[repr(p)]), tokenizer, template_kwargs) for p in prompts]
        out = trainer.generate(ids, num_samples=1)  # the prompts already come G times each
        rewards: list[float | None] = []
        for prompt, completion in zip(prompts, out.completion_ids):
            key = repr(prompt)
            started = client.reset(**arguments[key]).observation.prompt
            if started != posed[key]:
                raise RuntimeError(f"the environment posed {started!r} for {arguments[key]}, earlier {posed[key]!r}")
            result = client.step(AdditionAction(answer=tokenizer.decode(completion, skip_special_tokens=True)))
            rewards.append(None if result.reward is None else float(result.reward))
    finally:
        client.close()
    return {"prompt_ids": out.prompt_ids, "completion_ids": out.completion_ids, "logprobs": out.logprobs,
            "env_reward": rewards}
