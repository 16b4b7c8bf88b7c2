"""NeMo Gym environments: tasks from Gym's JSONL files, servers found through the head server; single turn here.

Multi-turn episodes (an agent's `/run`) are in nemo_gym_episodes.py, starting the servers in nemo_gym_launch.py.

The servers are NeMo Gym's own (`ng_run`, from the `nemo-gym` package). rlft asks the head server
(`GET /global_config_dict_yaml` on `nemo_gym_head_port`) where each resource server listens, turns every row of
`nemo_gym_datasets` into a prompt (the first user message of `responses_create_params.input`) whose columns carry
the row and its server's `/verify` URL, and scores each completion by posting the row with a Responses-API
shaped answer to that URL. The reward function needs nothing but its columns, so it
also runs in reward worker processes.

A verification that fails (an error status, a timeout, a refused connection after retries, a response without a
reward, or one the server marks `mask_sample`) gives None: the completion is unscorable, so it is counted in
`rewards/<fn>/unscorable` and its group's advantages ignore it, never a silent 0.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import yaml

from rlft.config.settings.rollout import NemoGymSettings
from rlft.data.loading import PLACE, read_json_rows
from rlft.errors import ConfigError, DataError

VERIFY_URL, VERIFY_ROW, VERIFY_TIMEOUT, VERIFY_MODEL = "nemo_gym_verify_url", "verify_extra", "nemo_gym_verify_timeout", "nemo_gym_model"
AGENT_URL, AGENT_NAME = "nemo_gym_agent_url", "nemo_gym_agent"  # multi-turn rows: where their episodes are played
CONNECT_RETRIES = 3  # connection errors only: a server that answered (even with an error) is not asked again
POOL = 16  # verifications in flight at once


def gym_dir(setting: str | None) -> Path:
    return Path(setting or "~/Gym").expanduser()


def head_config(head_port: int, timeout: float = 10.0) -> dict[str, Any]:
    """NeMo Gym's global config, from the head server (`GET /global_config_dict_yaml`)."""
    url = f"http://127.0.0.1:{head_port}/global_config_dict_yaml"
    try:
        response = httpx.get(url, timeout=timeout)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise ConfigError(f"no NeMo Gym head server answered at {url} ({type(exc).__name__}): start the Gym servers with "
                          "ng_run (see docs/environments.md) or set nemo_gym_auto_start: true, or set nemo_gym_head_port to "
                          "the head server's port") from None
    try:
        config = response.json()
        config = yaml.safe_load(config) if isinstance(config, str) else config  # Gym sends YAML inside a JSON string
    except (ValueError, yaml.YAMLError):
        config = None
    if not isinstance(config, dict):
        raise ConfigError(f"the server at {url} did not answer with NeMo Gym's global config: is nemo_gym_head_port the "
                          "head server's port?")
    return config


def servers_of(config: dict[str, Any], kind: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """{top-level name: (base URL, its settings)} of the started servers of one kind (`resources_servers`,
    `responses_api_agents`) in a global config."""
    found = {}
    for top, section in config.items():
        group = section.get(kind) if isinstance(section, dict) else None
        for server in (group or {}).values() if isinstance(group, dict) else ():
            if not isinstance(server, dict) or not server.get("port"):
                continue  # not started (no port yet)
            host = server.get("host") or "127.0.0.1"
            host = "127.0.0.1" if host in ("0.0.0.0", "localhost") else host
            found[top] = (f"http://{host}:{server['port']}", server)
    return found


def resource_servers(head_port: int, timeout: float = 10.0) -> dict[str, str]:
    """{resource server name: its /verify URL}, from the head server's global config."""
    return {name: url + "/verify" for name, (url, _) in servers_of(head_config(head_port, timeout), "resources_servers").items()}


def agent_servers(head_port: int, timeout: float = 10.0) -> dict[str, tuple[str, str | None]]:
    """{agent name: (its /run URL, the resource server it plays against)}, from the head server's global config."""
    agents = {}
    for name, (url, server) in servers_of(head_config(head_port, timeout), "responses_api_agents").items():
        resources = server.get("resources_server")
        agents[name] = (url + "/run", resources.get("name") if isinstance(resources, dict) else None)
    return agents


def task_prompt(row: dict[str, Any], where: str) -> str:
    """The first user message of `responses_create_params.input` (else its last message): Axolotl's choice."""
    params = row.get("responses_create_params")
    messages = params.get("input") if isinstance(params, dict) else None
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: no responses_create_params.input messages: a NeMo Gym task row holds the prompt there "
                        "as {\"responses_create_params\": {\"input\": [{\"role\": \"user\", \"content\": ...}]}, ...}")
    user = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    message = user[0] if user else messages[-1]
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):  # content parts
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    if not isinstance(content, str) or not content:
        raise DataError(f"{where}: the prompt message of responses_create_params.input has no text content")
    return content


def task_rows(gym: NemoGymSettings, servers: dict[str, str],
              agents: dict[str, tuple[str, str | None]] | None = None) -> list[dict[str, Any]]:
    """Prompt records (`prompt` plus reward columns) from every entry of `nemo_gym_datasets`, shuffled (seeded).

    With `agents` (multi-turn), each row goes to an agent instead: the one its `agent_ref` names, else the one that
    plays against its resource server."""
    base = gym_dir(gym.dir)
    rng = random.Random(gym.seed)
    records: list[dict[str, Any]] = []
    for index, entry in enumerate(gym.datasets):
        path = Path(entry.path).expanduser()
        path = path if path.is_absolute() else base / path
        where = f"nemo_gym_datasets[{index}] ({path})"
        if not path.is_file():
            raise DataError(f"{where}: no such file: paths are relative to nemo_gym_dir ({base}) unless absolute")
        rows = read_json_rows(path, where)
        if entry.max_samples is not None and entry.max_samples < len(rows):
            rows = rng.sample(rows, entry.max_samples)
        for place, row in rows:
            here = f"{where}, {place}"
            record = {"prompt": [{"role": "user", "content": task_prompt(row, here)}], VERIFY_ROW: row, PLACE: here}
            ref = row.get("agent_ref") if isinstance(row.get("agent_ref"), dict) else {}
            names_agent = bool(ref.get("name")) and ref.get("type") in (None, "responses_api_agents")
            server = ref["name"] if ref.get("name") and ref.get("type") != "responses_api_agents" else entry.server_name
            if agents is not None:
                agent = ref["name"] if names_agent and ref["name"] in agents else _agent_for(agents, server, here)
                record.update({AGENT_URL: agents[agent][0], AGENT_NAME: agent})
            elif server not in servers:
                known = ", ".join(sorted(servers)) or "none"
                raise ConfigError(f"{here}: the NeMo Gym head server knows no resource server {server!r} (it knows: "
                                  f"{known}): fix server_name, or start that server")
            else:
                record.update({VERIFY_URL: servers[server], VERIFY_TIMEOUT: gym.verify_timeout, VERIFY_MODEL: gym.model_name})
            records.append(record)
    rng.shuffle(records)
    return records


def _agent_for(agents: dict[str, tuple[str, str | None]], server: str, where: str) -> str:
    playing = sorted(name for name, (_, resources) in agents.items() if resources == server)
    if not playing:
        known = ", ".join(f"{name} (plays {resources})" for name, (_, resources) in sorted(agents.items())) or "none"
        raise ConfigError(f"{where}: no NeMo Gym agent plays against resource server {server!r} (the head server knows "
                          f"these agents: {known}): fix server_name, or start an agent for it (nemo_gym_multi_turn needs "
                          "an agent server, e.g. simple_agent)")
    return playing[0]


def verify_body(row: dict[str, Any], prompt: str, text: str, model: str) -> dict[str, Any]:
    """The /verify request: the task row, its prompt, and the completion as a Responses-API response."""
    body = {key: value for key, value in row.items() if value is not None}
    body["responses_create_params"] = {**(row.get("responses_create_params") or {}),
                                       "input": [{"role": "user", "content": prompt}]}
    body["response"] = {"id": "resp", "created_at": 0, "model": model, "object": "response", "parallel_tool_calls": True,
                        "tool_choice": "auto", "tools": [],
                        "output": [{"id": "msg", "role": "assistant", "type": "message", "status": "completed",
                                    "content": [{"type": "output_text", "text": text, "annotations": []}]}]}
    return body


def verify_one(client: httpx.Client, url: str, body: dict[str, Any]) -> float | None:
    for attempt in range(CONNECT_RETRIES):
        try:
            response = client.post(url, json=body)
        except httpx.ConnectError:  # nothing reached the server: ask again
            time.sleep(0.5 * (attempt + 1))
            continue
        except httpx.HTTPError:  # a timeout, a dropped connection: the server may have verified it; do not repeat
            return None
        if response.status_code != 200:
            return None
        try:
            answer = response.json()
        except ValueError:
            return None
        reward = answer.get("reward") if isinstance(answer, dict) else None
        if not isinstance(reward, (int, float)) or answer.get("mask_sample"):
            return None
        return float(reward)
    return None


def _text(completion: Any) -> str:
    if isinstance(completion, list):  # conversational: [{"role": "assistant", "content": ...}]
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    return str(completion)


def reward_nemo_gym_verify(prompts, completions, **columns) -> list[float | None]:
    """Reward of each completion from its task's NeMo Gym resource server (`/verify`); None when it cannot be had."""
    urls, rows = columns[VERIFY_URL], columns[VERIFY_ROW]
    timeouts, models = columns[VERIFY_TIMEOUT], columns[VERIFY_MODEL]
    pool = ThreadPoolExecutor(POOL)
    try:
        with httpx.Client(timeout=httpx.Timeout(float(max(timeouts)), connect=5.0)) as client:
            jobs = [pool.submit(verify_one, client, url,
                                verify_body(row, _text(prompt[-1]["content"] if isinstance(prompt, list) else prompt),
                                            _text(completion), model))
                    for url, row, prompt, completion, model in zip(urls, rows, prompts, completions, models)]
            return [job.result() for job in jobs]
    finally:  # the reward timeout (trl.reward_timeout) may interrupt the wait: drop what has not started
        pool.shutdown(wait=False, cancel_futures=True)


def reward_env(completions, **columns) -> list[float | None]:
    """The environment's own reward, passed through from the `env_reward` column (a rollout function's); None (not
    scorable, counted) where there is none."""
    values = columns.get("env_reward")
    if values is None:
        return [None] * len(completions)
    return [None if v is None else float(v) for v in (values if isinstance(values, list) else [values] * len(completions))]
