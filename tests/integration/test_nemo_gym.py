"""NeMo Gym's real servers (`ng_run` from the nemo-gym package) on 127.0.0.1, in one ng_run for the module started by
rlft's own auto start (`GymServers`): reasoning_gym (tasks made offline by its generator), rlft's example addition server
(examples/nemo_gym/rlft_addition), and the weather tool-calling environment (example_single_tool_call) with Gym's
simple_agent and vllm_model, whose policy is rlft's rollout server (`rlft vllm-serve`) on a tiny model taught (a few
seconds of SFT) to call get_weather and then to answer.

`make nemo-gym` builds `.venv-nemo-gym`; without it this module is skipped. Every process of the run is stopped when
the module ends, and the teardown checks that none of ng_run's session is left; a separate test checks the same after
Ctrl-C through `rlft train`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from rich.console import Console

from cli_process import CliProcess
from gym_utils import VENV, gym_site, needs_gym
from rlft.config.settings.rollout import NemoGymSettings
from rlft.rollout.envs.nemo_gym import (AGENT_NAME, AGENT_URL, VERIFY_MODEL, VERIFY_ROW, VERIFY_TIMEOUT, VERIFY_URL,
                                        agent_servers, resource_servers, reward_nemo_gym_verify)
from rlft.rollout.envs.nemo_gym_episodes import NemoGymAgents
from rlft.rollout.envs.nemo_gym_launch import GymServers, session_members
from rlft.rollout.types import SamplingParams
from rlft.train.metrics import read_metrics
from server_utils import REPO, free_port, kill_group, kill_session, run_cli, server_env, wait_for_health

pytestmark = [pytest.mark.slow, pytest.mark.server, pytest.mark.nemo_gym, needs_gym]
SEEDS = REPO / "tests" / "data" / "seed_configs"  # the seed guide's YAML examples, verbatim
ARITHMETIC = "resources_servers/reasoning_gym/data/train_basic_arithmetic.jsonl"  # where the guide's config reads it
WEATHER = "resources_servers/example_single_tool_call/data/example.jsonl"
CONFIGS = ["resources_servers/reasoning_gym/configs/resources_only.yaml",
           "resources_servers/rlft_addition/configs/rlft_addition.yaml",
           "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml",
           "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "SF"}}\n</tool_call>'
ANSWER = "Cold."


def _install_examples(site: Path) -> None:
    """rlft's example resource server into Gym's folder (as the docs say), and reasoning_gym's task file."""
    shutil.copytree(REPO / "examples" / "nemo_gym" / "rlft_addition", site / "resources_servers" / "rlft_addition",
                    dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", ".venv"))
    if not (site / ARITHMETIC).exists():
        subprocess.run([str(VENV / "bin" / "python"), "scripts/create_dataset.py", "--task", "basic_arithmetic", "--size", "48",
                        "--seed", "0", "--config", json.dumps({"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                                                               "operators": ["+"]}),
                        "--output", str(site / ARITHMETIC)], cwd=site / "resources_servers" / "reasoning_gym", check=True,
                       capture_output=True, timeout=120)


def _weather_tasks() -> list[dict]:
    return [json.loads(line) for line in (gym_site() / WEATHER).read_text().splitlines() if line.strip()]


def _chat_tools(row: dict) -> list[dict]:
    """The tools as Gym's model server passes them to an OpenAI chat route."""
    return [{"function": {"name": tool["name"], "description": tool.get("description", ""), "parameters": tool["parameters"]},
             "type": "function"} for tool in row["responses_create_params"]["tools"]]


def start_tool_model(root: Path) -> tuple[Path, CliProcess]:
    """A tiny model that answers a weather question with a get_weather call, and a tool result with "Cold.": its
    folder, and the `rlft train` process (forked, `tests/cli_process.py`) that trains it there."""
    from rlft.models.tiny import write_tiny_model
    from rlft.data.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    rows = []
    for task in _weather_tasks()[:2]:
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
        "micro_batch_size": 4, "max_steps": 100, "learning_rate": 1e-2, "warmup_steps": 5, "logging_steps": 50, "seed": 0,
        "output_dir": str(root / "sft")}))
    return root / "sft", CliProcess("train", config, stdout=root / "sft.log")


@pytest.fixture(scope="module")
def gym(tmp_path_factory):
    """Every Gym server of the module in one ng_run, started and stopped by rlft's auto start, while the tool model
    trains beside it (ng_run's start is mostly waiting); then rlft's rollout server on the tool model. The teardown
    checks that nothing of ng_run's session is left."""
    root = tmp_path_factory.mktemp("gym")
    site = gym_site()
    _install_examples(site)
    tool_model, training = start_tool_model(tmp_path_factory.mktemp("tool-model"))
    port, head = free_port(), free_port()
    config = root / "serve.yaml"
    config.write_text(yaml.safe_dump({"base_model": str(tool_model), "rl": "grpo", "micro_batch_size": 8,
                                      "vllm": {"host": "127.0.0.1", "port": port, "max_lora_rank": 16},
                                      "trl": {"use_vllm": True, "reward_funcs": ["axolotl.integrations.nemo_gym.rewards.reward_env"]},
                                      "datasets": [{"path": "unused.jsonl"}]}))
    server_log = root / "serve.log"
    gym = NemoGymSettings(dir=str(site), config_paths=tuple(CONFIGS), head_port=head, server_timeout=300,
                          verify_timeout=30, run_timeout=60, max_turns=4, datasets=(), model_name=str(tool_model),
                          seed=0, log=root / "nemo_gym" / "ng_run.log")
    servers = GymServers(gym, Console(file=(root / "console.txt").open("w")),
                         {"base_url": f"http://127.0.0.1:{port}/v1", "api_key": "EMPTY", "model": str(tool_model)})
    server = None
    try:
        with servers:  # the policy's URL is known before its server runs: Gym's servers call it only when asked to
            session = servers.process.pid
            output, _ = training.communicate(timeout=300)
            assert training.returncode == 0, output[-3000:]
            server = run_cli("vllm-serve", str(config), log=server_log)
            wait_for_health(server, port, server_log)
            yield {"port": port, "head": head, "model": tool_model, "root": root, "site": site,
                   "servers": resource_servers(head)}
        assert session_members(session) == [], "processes of ng_run's session are still running"
    finally:
        training.kill_group()
        if server is not None:
            kill_group(server)


def test_the_real_resource_server_scores_right_and_wrong_answers(gym):
    rows = [json.loads(line) for line in (gym["site"] / ARITHMETIC).read_text().splitlines()[:2]]
    url = gym["servers"]["reasoning_gym"]
    prompts = [[{"role": "user", "content": row["question"]}] for row in rows]
    completions = [rows[0]["answer"], "I do not know"]
    rewards = reward_nemo_gym_verify(prompts, completions, **{VERIFY_URL: [url] * 2, VERIFY_ROW: rows,
                                                               VERIFY_TIMEOUT: [30] * 2, VERIFY_MODEL: ["tiny"] * 2})
    assert rewards == [1.0, 0.0]


def test_seed_config_28_trains_on_a_gym_environment(gym, warm_model, cli, tmp_path, monkeypatch, capsys):
    """The guide's single-turn config as printed, on a local model and this Gym's folder and port."""
    monkeypatch.chdir(tmp_path)
    assert cli("train", SEEDS / "28-single-turn-simplest.yaml", f"--base_model={warm_model}", f"--nemo_gym_dir={gym['site']}",
               f"--nemo_gym_head_port={gym['head']}", "--trl.max_completion_length=8", "--sequence_len=96",
               "--micro_batch_size=8", "--max_steps=4", "--logging_steps=1", "--learning_rate=1e-3",
               f"--output_dir={tmp_path / 'out'}") == 0
    assert "datasets: is replaced by nemo_gym_datasets" in capsys.readouterr().out
    steps = [m for m in read_metrics(tmp_path / "out" / "metrics.jsonl") if "reward" in m]
    assert len(steps) == 4
    assert all(m["rewards/reward_nemo_gym_verify/unscorable"] == 0 for m in steps)
    assert all(0.0 <= m["rewards/reward_nemo_gym_verify/mean"] <= 1.0 for m in steps)


def test_rewards_from_the_example_addition_server_rise(gym, warm_model, cli, tmp_path, monkeypatch, repo_root):
    """examples/nemo_gym/addition.yaml (servers already up: nemo_gym_auto_start false): GRPO learns from /verify."""
    monkeypatch.chdir(repo_root)
    out = tmp_path / "out"
    assert cli("train", "examples/nemo_gym/addition.yaml", f"--nemo_gym_dir={gym['site']}", "--nemo_gym_auto_start=false",
               f"--nemo_gym_head_port={gym['head']}", f"--output_dir={out}", "--max_steps=60", "--logging_steps=1",
               f"--base_model={warm_model}") == 0
    steps = [m for m in read_metrics(out / "metrics.jsonl") if "reward" in m]
    assert all(m["rewards/reward_nemo_gym_verify/unscorable"] == 0 for m in steps)
    mean = lambda rows: sum(r["reward"] for r in rows) / len(rows)  # noqa: E731
    # the last 20 steps against the first 10: 5-step means move by about 0.03 between neighbours; two seeds rose by
    # 0.086 and 0.067 at lr 7e-4 (at 1e-3 and 2e-3 the reward could rise, then collapse to 0.04)
    assert len(steps) == 60 and mean(steps[-20:]) > mean(steps[:10]) + 0.03, (mean(steps[:10]), mean(steps[-20:]))


def test_an_unknown_server_name_is_refused_with_the_known_ones(gym, warm_model, cli, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "gym.yaml"
    config.write_text(yaml.safe_dump({
        "base_model": str(warm_model), "rl": "grpo", "plugins": ["axolotl.integrations.nemo_gym.NemoGymPlugin"],
        "nemo_gym_auto_start": False, "nemo_gym_head_port": gym["head"],
        "nemo_gym_datasets": [{"path": str(gym["site"] / ARITHMETIC), "server_name": "maths"}],
        "trl": {"num_generations": 4, "max_completion_length": 8,
                "reward_funcs": ["axolotl.integrations.nemo_gym.rewards.reward_nemo_gym_verify"]},
        "sequence_len": 96, "micro_batch_size": 8, "max_steps": 1, "output_dir": str(tmp_path / "out")}))
    assert cli("train", config) != 0
    err = capsys.readouterr().err
    assert "knows no resource server 'maths' (it knows: example_single_tool_call, reasoning_gym, rlft_addition)" in err


def test_one_episode_with_a_tool_call_is_stitched_with_env_mask_and_sampling_logprobs(gym):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    agents = agent_servers(gym["head"])
    (name, (url, resources)), = agents.items()
    assert resources == "example_single_tool_call"
    task = _weather_tasks()[0]
    # Gym's model server forwards metadata.extra_body into its chat request: a seed makes the sampled turns reproducible
    # (unseeded, a turn at temperature 0.3 strayed from the taught call about once in eight runs)
    task["responses_create_params"]["metadata"] = {"extra_body": json.dumps({"seed": 0})}
    prompt = {"prompt_ids": [1, 2, 3], "columns": {VERIFY_ROW: task, AGENT_URL: url, AGENT_NAME: name}}
    sampling = SamplingParams(max_new_tokens=96, temperature=0.3)
    rollout, extra = NemoGymAgents(eos_token_id=259, run_timeout=120, max_turns=None, max_completion_length=512).rollout(
        [prompt], 1, sampling, SimpleNamespace(version=0))
    assert extra["env_error"] == [None] and extra["num_turns"] == [2] and extra["env_reward"] == [1.0]
    tokenizer = AutoTokenizer.from_pretrained(gym["model"])
    prompt_ids, completion, mask, logps = rollout.prompt_ids[0], rollout.completion_ids[0], rollout.env_mask[0], rollout.logprobs[0]
    assert tokenizer.decode(prompt_ids).endswith("what's it like in sf?<|im_end|>\n<|im_start|>assistant\n")
    model_text = tokenizer.decode([t for t, m in zip(completion, mask) if m])
    env_text = tokenizer.decode([t for t, m in zip(completion, mask) if not m])
    assert model_text == f"{CALL}<|im_end|>{ANSWER}<|im_end|>"
    assert env_text.startswith("\n<|im_start|>user\n<tool_response>\n") and "The weather in SF is cold." in env_text
    assert env_text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert all(lp == 0.0 for lp, m in zip(logps, mask) if not m)
    # the model turns' log-probs are the sampling distribution's (temperature 0.3) under the served weights
    model = AutoModelForCausalLM.from_pretrained(gym["model"])
    ids = torch.tensor([prompt_ids + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float() / 0.3
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
    model_rows = [i for i, m in enumerate(mask) if m]
    assert max(abs(float(expected[i]) - logps[i]) for i in model_rows) < 1e-3
    assert all(math.isfinite(logps[i]) and logps[i] <= 0 for i in model_rows)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_seed_config_29_trains_on_multi_turn_episodes(gym, cli, tmp_path, monkeypatch, mode):
    """The guide's multi-turn config (seed 29) on the tool model: LoRA synced to the server, rewards from /run."""
    monkeypatch.chdir(tmp_path)
    seed = yaml.safe_load((SEEDS / "29-multi-turn-with-async-grpo-recommended.yaml").read_text())
    seed.update({"base_model": str(gym["model"]), "nemo_gym_dir": str(gym_site()), "nemo_gym_head_port": gym["head"],
                 "nemo_gym_datasets": [{"path": WEATHER, "server_name": "example_single_tool_call", "max_samples": 8}],
                 "lora_target_modules": ["q_proj", "v_proj"], "sequence_len": 1024, "micro_batch_size": 8, "max_steps": 3,
                 "logging_steps": 1, "learning_rate": 1e-3, "output_dir": str(tmp_path / "out")})
    seed["trl"].update({"vllm_server_host": "127.0.0.1", "vllm_server_port": gym["port"], "max_completion_length": 256,
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


@pytest.mark.parametrize("stop, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_while_rlft_starts_the_servers_leaves_nothing_running(warm_model, tmp_path, stop, code):
    """`rlft train` with auto start, interrupted (Ctrl-C, or a scheduler's SIGTERM) while ng_run brings its servers up:
    every process of ng_run's session is stopped (the end of a run, normal or not, is the module fixture's teardown
    check)."""
    _install_examples(gym_site())
    log = tmp_path / "train.log"
    train = CliProcess("train", "examples/nemo_gym/addition.yaml", f"--nemo_gym_dir={gym_site()}",
                       f"--nemo_gym_head_port={free_port()}", f"--output_dir={tmp_path / 'out'}", f"--base_model={warm_model}",
                       cwd=REPO, env=server_env(), stdout=log)
    gym_session = None
    try:
        deadline = time.monotonic() + 120
        while gym_session is None or len(session_members(gym_session)) < 4:  # ng_run and Ray's first processes
            assert train.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            gym_session = gym_session or _child_session(train.pid, "ng_run")
            time.sleep(0.5)
        train.send_signal(stop)
        assert train.wait(timeout=60) == code, log.read_text()[-3000:]
        assert session_members(gym_session) == []
    finally:
        kill_session(train)
        if gym_session is not None:
            for pid in session_members(gym_session):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _child_session(parent: int, name: str) -> int | None:
    """The pid (= session id) of `parent`'s child whose command line names `name`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(fields[1]) == parent and name in command:
            return int(entry.name)
    return None
