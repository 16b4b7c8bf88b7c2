"""NeMo Gym multi-turn episodes: the agent server's `/run` plays one episode, rlft trains on it.

The agent (e.g. Gym's simple_agent) asks its model server for each turn; that model server calls rlft's rollout
server (`/v1/chat/completions`), which answers with the turn's `prompt_token_ids`, `generation_token_ids` and
`generation_log_probs`. The agent runs the tool calls against its resource server, feeds the results back, and ends
with `/verify`, whose reward `/run` returns along with every output item (the model's items carry their turn's
token ids). `stitch` turns those items into one training sequence: the first turn's prompt, then for each turn the
tokens its prompt adds to what came before (tool results, the template's turn markers: `env_mask` 0, never trained
on, log-prob 0) and the tokens the model sampled (`env_mask` 1, with their sampling log-probs, the importance
sampling correction's denominator).

An episode that cannot be trained on (the agent failed or timed out, no turn carries token ids, a turn's prompt does
not extend the previous turns' tokens, more turns than `nemo_gym_max_turns`) keeps its row with a fully masked
completion and no reward: it is counted (`rollout/env_failures`, `rewards/<fn>/unscorable`), never a silent 0.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from rlft.rollout.envs.nemo_gym import AGENT_NAME, AGENT_URL, CONNECT_RETRIES, POOL, VERIFY_ROW
from rlft.rollout.types import Rollout, SamplingParams


@dataclass
class Episode:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    env_mask: list[int]
    num_turns: int
    reward: float | None
    error: str | None = None


def failed(prompt_ids: list[int], eos: int, error: str, num_turns: int = 0) -> Episode:
    """A row that trains on nothing and has no reward (its group's advantages leave it out)."""
    return Episode(list(prompt_ids), [eos], [0.0], [0], num_turns, None, error)


def model_turns(output: list[Any]) -> list[dict[str, Any]]:
    """The output items that carry a model call's token ids (the last item of each call), in order."""
    return [item for item in output if isinstance(item, dict) and item.get("generation_token_ids")]


def stitch(answer: Any, fallback_prompt: list[int], eos: int, max_turns: int | None = None) -> Episode:
    """One training sequence from a `/run` answer (see the module docstring)."""
    if not isinstance(answer, dict):
        return failed(fallback_prompt, eos, f"the agent answered {type(answer).__name__}, not a JSON object")
    response = answer.get("response") if isinstance(answer.get("response"), dict) else {}
    turns = model_turns(response.get("output") or [])
    reward = answer.get("reward")
    if not turns:
        return failed(fallback_prompt, eos, "no output item carries token ids: set return_token_id_information: true on "
                      "the Gym model server (vllm_model) that points at rlft's rollout server")
    if max_turns is not None and len(turns) > max_turns:
        return failed(fallback_prompt, eos, f"{len(turns)} turns, over nemo_gym_max_turns={max_turns}", len(turns))
    prompt = [int(t) for t in turns[0].get("prompt_token_ids") or []]
    seen = list(prompt)
    completion: list[int] = []
    logprobs: list[float] = []
    mask: list[int] = []
    for number, turn in enumerate(turns):
        turn_prompt = [int(t) for t in turn.get("prompt_token_ids") or []]
        if turn_prompt[: len(seen)] != seen:
            return failed(prompt or fallback_prompt, eos, f"turn {number + 1}'s prompt does not extend the tokens of the turns "
                          "before it (the chat template renders earlier turns differently from how they were sampled)",
                          len(turns))
        added = turn_prompt[len(seen):]
        generated = [int(t) for t in turn["generation_token_ids"]]
        turn_logps = [float(x) for x in turn.get("generation_log_probs") or []]
        if len(turn_logps) != len(generated):
            return failed(prompt or fallback_prompt, eos, f"turn {number + 1} has {len(generated)} tokens and "
                          f"{len(turn_logps)} log-probs", len(turns))
        completion += added + generated
        logprobs += [0.0] * len(added) + turn_logps
        mask += [0] * len(added) + [1] * len(generated)
        seen = turn_prompt + generated
    if not isinstance(reward, (int, float)) or isinstance(reward, bool):
        return Episode(prompt, completion, logprobs, mask, len(turns), None, "the /run answer has no numeric reward")
    return Episode(prompt, completion, logprobs, mask, len(turns), float(reward))


def run_body(row: dict[str, Any], agent: str, sampling: SamplingParams) -> dict[str, Any]:
    """The `/run` request: the task row with its agent and the run's sampling settings, as Axolotl sends it. The
    temperature and top_p are always the run's (the trainer's log-probs assume them; a task file's own, e.g. 0.6 or a
    greedy 0.0, would bias the loss); `max_output_tokens` is the row's where it sets one."""
    body = {key: value for key, value in row.items() if value is not None}
    body.setdefault("agent_ref", {"type": "responses_api_agents", "name": agent})
    params = {key: value for key, value in (body.get("responses_create_params") or {}).items() if value is not None}
    params.setdefault("max_output_tokens", sampling.max_new_tokens)
    params["temperature"] = sampling.temperature
    params["top_p"] = sampling.top_p if sampling.top_p < 1.0 else 0.999  # Axolotl's: 1.0 reads as unset
    body["responses_create_params"] = params
    return body


class NemoGymAgents:
    """The multi-turn environment: plays G episodes per prompt through the agents' `/run`, concurrently."""

    def __init__(self, eos_token_id: int, run_timeout: float, max_turns: int | None, max_completion_length: int):
        self.eos, self.timeout, self.max_turns = eos_token_id, float(run_timeout), max_turns
        self.max_completion_length = max_completion_length

    def rollout(self, prompts: list[dict[str, Any]], group: int, sampling: SamplingParams, engine,
                seed: int | None = None) -> tuple[Rollout, dict[str, list]]:
        """G episodes per prompt (`prompt_ids` and `columns` with the task row and its agent, from `task_rows`). The
        agents ask the rollout server themselves: of `engine` only its weight version is read; `seed` is unused."""
        version = engine.version
        jobs = [(p, run_body(p["columns"][VERIFY_ROW], p["columns"][AGENT_NAME], sampling)) for p in prompts for _ in range(group)]
        with httpx.Client(timeout=httpx.Timeout(self.timeout, connect=5.0), limits=httpx.Limits(max_connections=POOL)) as client, \
                ThreadPoolExecutor(POOL) as pool:
            episodes = list(pool.map(lambda job: self.play(client, job[0], job[1]), jobs))
        truncated = []
        for episode in episodes:  # a stitched episode longer than the completion budget is cut, as a long answer is
            cut = len(episode.completion_ids) > self.max_completion_length
            if cut:
                keep = self.max_completion_length
                episode.completion_ids, episode.logprobs = episode.completion_ids[:keep], episode.logprobs[:keep]
                episode.env_mask = episode.env_mask[:keep]
            truncated.append(cut)
        rollout = Rollout([e.prompt_ids for e in episodes], [e.completion_ids for e in episodes], [e.logprobs for e in episodes],
                          truncated, env_mask=[e.env_mask for e in episodes], weight_versions=[version] * len(episodes))
        extra = {"env_reward": [e.reward for e in episodes], "num_turns": [e.num_turns for e in episodes],
                 "env_error": [e.error for e in episodes]}
        return rollout, extra

    def play(self, client: httpx.Client, prompt: dict[str, Any], body: dict[str, Any]) -> Episode:
        url = prompt["columns"][AGENT_URL]
        for attempt in range(CONNECT_RETRIES):
            try:
                response = client.post(url, json=body)
                break
            except httpx.ConnectError:  # nothing reached the agent: ask again
                time.sleep(0.5 * (attempt + 1))
            except httpx.TimeoutException:
                return failed(prompt["prompt_ids"], self.eos, f"/run took over nemo_gym_run_timeout={self.timeout:g} s (an "
                              "agent that never ends: limit its turns, or raise the timeout)")
            except httpx.HTTPError as exc:
                return failed(prompt["prompt_ids"], self.eos, f"/run failed: {type(exc).__name__}: {exc}")
        else:
            return failed(prompt["prompt_ids"], self.eos, f"no agent answered at {url} ({CONNECT_RETRIES} tries)")
        if response.status_code != 200:
            return failed(prompt["prompt_ids"], self.eos, f"/run answered {response.status_code}: {response.text[:300]}")
        try:
            answer = response.json()
        except ValueError:
            return failed(prompt["prompt_ids"], self.eos, "/run answered something that is not JSON")
        return stitch(answer, prompt["prompt_ids"], self.eos, self.max_turns)
