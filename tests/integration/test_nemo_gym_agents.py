"""Multi-turn NeMo Gym episodes against the real servers: Gym's simple_agent plays its example_single_tool_call
(weather) tasks, asking Gym's vllm_model server, which asks rlft's rollout server (`rlft vllm-serve`) for each turn.

The policy is a tiny byte-level model taught (a few seconds of SFT) to call get_weather and then to answer, so an
episode has two model turns with a tool result between them. Every process is stopped by session when the module ends.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml

from gym_utils import gym_site, link_servers, needs_gym, start_ng_run, wait_for_gym
from rlft.rollout.envs.nemo_gym import VERIFY_ROW, agent_servers
from rlft.rollout.envs.nemo_gym_episodes import AGENT_NAME, AGENT_URL, NemoGymAgents
from rlft.rollout.types import SamplingParams
from rlft.train.metrics import read_metrics
from server_utils import REPO, free_port, kill_group, kill_session, run_cli, wait_for_health

pytestmark = [pytest.mark.slow, needs_gym]
TASKS = "resources_servers/example_single_tool_call/data/example.jsonl"
CONFIGS = ["resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml",
           "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "SF"}}\n</tool_call>'
ANSWER = "Cold."


def _tasks() -> list[dict]:
    return [json.loads(line) for line in (gym_site() / TASKS).read_text().splitlines() if line.strip()]


def _chat_tools(row: dict) -> list[dict]:
    """The tools as Gym's model server passes them to an OpenAI chat route."""
    return [{"function": {"name": tool["name"], "description": tool.get("description", ""), "parameters": tool["parameters"]},
             "type": "function"} for tool in row["responses_create_params"]["tools"]]


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    """A tiny model that answers a weather question with a get_weather call, and a tool result with "Cold."."""
    from rlft.cli import main
    from rlft.models.tiny import write_tiny_model
    from rlft.models.tokenizer import byte_tokenizer

    root = tmp_path_factory.mktemp("tool-model")
    tokenizer = byte_tokenizer()
    rows = []
    for task in _tasks()[:4]:
        messages = [{k: v for k, v in m.items() if k in ("role", "content")} for m in task["responses_create_params"]["input"]]
        tools = _chat_tools(task)
        rows.append({"prompt": tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False),
                     "completion": CALL})
        called = messages + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "SF"}}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(
                {"city": "SF", "weather_description": "The weather in SF is cold."})}]
        rows.append({"prompt": tokenizer.apply_chat_template(called, tools=tools, add_generation_prompt=True, tokenize=False),
                     "completion": ANSWER})
    data = root / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = write_tiny_model(root / "base", "XS", max_positions=1024)
    config = root / "sft.yaml"
    config.write_text(yaml.safe_dump({
        "base_model": str(base), "random_init": True, "datasets": [{"path": str(data)}], "sequence_len": 1024,
        "micro_batch_size": 8, "max_steps": 100, "learning_rate": 1e-2, "warmup_steps": 5, "logging_steps": 50, "seed": 0,
        "output_dir": str(root / "sft")}))
    assert main(["train", str(config)]) == 0
    return root / "sft"


@pytest.fixture(scope="module")
def servers(tool_model, tmp_path_factory):
    """rlft's rollout server on the tool model, and ng_run with the weather environment, its agent and Gym's
    vllm_model server pointing at rlft's server."""
    root = tmp_path_factory.mktemp("agents")
    port, head = free_port(), free_port()
    config = root / "serve.yaml"
    config.write_text(yaml.safe_dump({"base_model": str(tool_model), "rl": "grpo", "micro_batch_size": 8,
                                      "vllm": {"host": "127.0.0.1", "port": port, "max_lora_rank": 16},
                                      "trl": {"use_vllm": True, "reward_funcs": ["axolotl.integrations.nemo_gym.rewards.reward_env"]},
                                      "datasets": [{"path": "unused.jsonl"}]}))
    server_log, gym_log = root / "serve.log", root / "ng_run.log"
    server = run_cli("vllm-serve", str(config), log=server_log)
    gym = None
    try:
        wait_for_health(server, port, server_log)
        link_servers("resources_servers/example_single_tool_call", "responses_api_agents/simple_agent",
                     "responses_api_models/vllm_model", "environment_servers/legacy_agent")
        gym = start_ng_run(CONFIGS, head, gym_log, f"+policy_base_url=http://127.0.0.1:{port}/v1", "+policy_api_key=EMPTY",
                           f"+policy_model_name={tool_model}")
        wait_for_gym(gym, head, gym_log, servers=4)
        yield {"port": port, "head": head, "model": tool_model, "root": root}
    finally:
        if gym is not None:
            kill_session(gym)
        kill_group(server)


def test_one_episode_with_a_tool_call_is_stitched_with_env_mask_and_sampling_logprobs(servers):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    agents = agent_servers(servers["head"])
    (name, (url, resources)), = agents.items()
    assert resources == "example_single_tool_call"
    task = _tasks()[0]
    prompt = {"prompt_ids": [1, 2, 3], "columns": {VERIFY_ROW: task, AGENT_URL: url, AGENT_NAME: name}}
    sampling = SamplingParams(max_new_tokens=96, temperature=0.3)
    rollout, extra = NemoGymAgents(eos_token_id=259, run_timeout=120, max_turns=None, max_completion_length=512).rollout(
        [prompt], 1, sampling, version=0)
    assert extra["env_error"] == [None] and extra["num_turns"] == [2] and extra["env_reward"] == [1.0]
    tokenizer = AutoTokenizer.from_pretrained(servers["model"])
    prompt_ids, completion, mask, logps = rollout.prompt_ids[0], rollout.completion_ids[0], rollout.env_mask[0], rollout.logprobs[0]
    assert tokenizer.decode(prompt_ids).endswith("what's it like in sf?<|im_end|>\n<|im_start|>assistant\n")
    model_text = tokenizer.decode([t for t, m in zip(completion, mask) if m])
    env_text = tokenizer.decode([t for t, m in zip(completion, mask) if not m])
    assert model_text == f"{CALL}<|im_end|>{ANSWER}<|im_end|>"
    assert env_text.startswith("\n<|im_start|>user\n<tool_response>\n") and "The weather in SF is cold." in env_text
    assert env_text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert all(lp == 0.0 for lp, m in zip(logps, mask) if not m)
    # the model turns' log-probs are the sampling distribution's (temperature 0.3) under the served weights
    model = AutoModelForCausalLM.from_pretrained(servers["model"])
    ids = torch.tensor([prompt_ids + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float() / 0.3
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
    model_rows = [i for i, m in enumerate(mask) if m]
    assert max(abs(float(expected[i]) - logps[i]) for i in model_rows) < 1e-3
    assert all(math.isfinite(logps[i]) and logps[i] <= 0 for i in model_rows)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_seed_config_29_trains_on_multi_turn_episodes(servers, cli, tmp_path, monkeypatch, mode):
    """The guide's multi-turn config (seed 29) on the tool model: LoRA synced to the server, rewards from /run."""
    monkeypatch.chdir(tmp_path)
    seed = yaml.safe_load((REPO.parent / "shared" / "seeds" / "configs" / "29-multi-turn-with-async-grpo-recommended.yaml").read_text())
    seed.update({"base_model": str(servers["model"]), "nemo_gym_dir": str(gym_site()), "nemo_gym_head_port": servers["head"],
                 "nemo_gym_datasets": [{"path": TASKS, "server_name": "example_single_tool_call", "max_samples": 8}],
                 "lora_target_modules": ["q_proj", "v_proj"], "sequence_len": 1024, "micro_batch_size": 8, "max_steps": 3,
                 "logging_steps": 1, "learning_rate": 1e-3, "output_dir": str(tmp_path / "out")})
    seed["trl"].update({"vllm_server_host": "127.0.0.1", "vllm_server_port": servers["port"], "max_completion_length": 256,
                        "vllm_sync_interval": 1, "async_prefetch": mode == "async",
                        "vllm_importance_sampling_correction": True,
                        "skip_zero_advantage_batches": False})  # the confident tool model scores 1.0 on every episode
    del seed["vllm"]
    (tmp_path / "gym.yaml").write_text(yaml.safe_dump(seed))
    assert cli("train", tmp_path / "gym.yaml") == 0
    steps = [m for m in read_metrics(tmp_path / "out" / "metrics.jsonl") if "reward" in m]
    assert len(steps) == 3
    assert all(m["rollout/env_failures"] == 0 and m["rewards/reward_env/unscorable"] == 0 for m in steps), steps
    assert all(m["rollout/num_turns/max"] >= 2 and 0 <= m["rewards/reward_env/mean"] <= 1 for m in steps), steps
    assert all("sampling/importance_sampling_ratio/mean" in m for m in steps)
