"""NeMo Gym's real servers (`ng_run` from the nemo-gym package, its reasoning_gym resource server) on 127.0.0.1.

`make nemo-gym` builds `.venv-nemo-gym`; without it this module is skipped. The task file is made offline by
reasoning_gym's own generator (basic arithmetic). Every process ng_run starts, Ray's included, is killed by session
when the module ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from rlft.rollout.envs.nemo_gym import (VERIFY_MODEL, VERIFY_ROW, VERIFY_TIMEOUT, VERIFY_URL, resource_servers,
                                        reward_nemo_gym_verify)
from rlft.train.metrics import read_metrics
from server_utils import REPO, free_port, kill_session

VENV = REPO / ".venv-nemo-gym"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not (VENV / ".installed").exists(),
                                                   reason="NeMo Gym's environment is not built: `make nemo-gym`")]


@pytest.fixture(scope="module")
def gym(tmp_path_factory):
    root = tmp_path_factory.mktemp("gym")
    site = next(VENV.glob("lib/python*/site-packages"))
    server_dir = site / "resources_servers" / "reasoning_gym"
    venv_link = server_dir / ".venv"
    if not venv_link.exists():  # ng_run +skip_venv_if_present=true runs the server with this environment
        venv_link.symlink_to(VENV.resolve())
    tasks = root / "arithmetic.jsonl"
    subprocess.run([str(VENV / "bin" / "python"), "scripts/create_dataset.py", "--task", "basic_arithmetic", "--size", "48",
                    "--seed", "0", "--config", json.dumps({"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                                                           "operators": ["+"]}), "--output", str(tasks)],
                   cwd=server_dir, check=True, capture_output=True, timeout=120)
    port, log = free_port(), root / "ng_run.log"
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", PATH=f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}")
    with open(log, "wb") as out:
        process = subprocess.Popen([str(VENV / "bin" / "ng_run"), "+config_paths=[resources_servers/reasoning_gym/configs/resources_only.yaml]",
                                    "+skip_venv_if_present=true", f"+head_server={{host: 127.0.0.1, port: {port}}}"],
                                   cwd=site, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        servers = _wait_for_gym(process, port, log)
        yield {"port": port, "servers": servers, "tasks": tasks, "site": site, "root": root}
    finally:
        kill_session(process)


def _wait_for_gym(process, port: int, log: Path, timeout: float = 180.0) -> dict[str, str]:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"ng_run exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            servers = resource_servers(port, timeout=2)
            url = servers["reasoning_gym"].removesuffix("/verify")
            httpx.get(url + "/", timeout=2)  # the resource server itself answers (any status)
            return servers
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(1)
    raise RuntimeError(f"NeMo Gym did not come up within {timeout} s:\n{log.read_text()[-3000:]}")


def test_the_real_resource_server_scores_right_and_wrong_answers(gym):
    rows = [json.loads(line) for line in gym["tasks"].read_text().splitlines()[:2]]
    url = gym["servers"]["reasoning_gym"]
    prompts = [[{"role": "user", "content": row["question"]}] for row in rows]
    completions = [rows[0]["answer"], "I do not know"]
    rewards = reward_nemo_gym_verify(prompts, completions, **{VERIFY_URL: [url] * 2, VERIFY_ROW: rows,
                                                               VERIFY_TIMEOUT: [30] * 2, VERIFY_MODEL: ["tiny"] * 2})
    assert rewards == [1.0, 0.0]


def test_grpo_trains_on_a_gym_environment_with_the_guides_keys(gym, warm_model, cli, tmp_path, monkeypatch):
    """Seed config 28's keys on a local model: tasks from nemo_gym_datasets, rewards from /verify."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "gym.yaml"
    config.write_text(yaml.safe_dump({
        "base_model": str(warm_model), "rl": "grpo", "chat_template": "tokenizer_default",
        "plugins": ["axolotl.integrations.nemo_gym.NemoGymPlugin"], "nemo_gym_enabled": True,
        "nemo_gym_dir": str(gym["site"]), "nemo_gym_auto_start": False, "nemo_gym_head_port": gym["port"],
        "nemo_gym_datasets": [{"path": str(gym["tasks"]), "server_name": "reasoning_gym"}],
        "trl": {"num_generations": 4, "max_completion_length": 8, "temperature": 0.9,
                "reward_funcs": ["axolotl.integrations.nemo_gym.rewards.reward_nemo_gym_verify"]},
        "sequence_len": 96, "micro_batch_size": 8, "max_steps": 4, "logging_steps": 1, "learning_rate": 1e-3,
        "output_dir": str(tmp_path / "out")}))
    assert cli("train", config) == 0
    steps = [m for m in read_metrics(tmp_path / "out" / "metrics.jsonl") if "reward" in m]
    assert len(steps) == 4
    assert all(m["rewards/reward_nemo_gym_verify/unscorable"] == 0 for m in steps)
    assert all(0.0 <= m["rewards/reward_nemo_gym_verify/mean"] <= 1.0 for m in steps)


def test_an_unknown_server_name_is_refused_with_the_known_ones(gym, warm_model, cli, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "gym.yaml"
    config.write_text(yaml.safe_dump({
        "base_model": str(warm_model), "rl": "grpo", "plugins": ["axolotl.integrations.nemo_gym.NemoGymPlugin"],
        "nemo_gym_auto_start": False, "nemo_gym_head_port": gym["port"],
        "nemo_gym_datasets": [{"path": str(gym["tasks"]), "server_name": "maths"}],
        "trl": {"num_generations": 4, "max_completion_length": 8,
                "reward_funcs": ["axolotl.integrations.nemo_gym.rewards.reward_nemo_gym_verify"]},
        "sequence_len": 96, "micro_batch_size": 8, "max_steps": 1, "output_dir": str(tmp_path / "out")}))
    assert cli("train", config) != 0
    err = capsys.readouterr().err
    assert "knows no resource server 'maths' (it knows: reasoning_gym)" in err
