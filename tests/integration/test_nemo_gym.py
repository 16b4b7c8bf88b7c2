"""NeMo Gym's real servers (`ng_run` from the nemo-gym package) on 127.0.0.1: its reasoning_gym resource server, started by
the tests, and rlft's example addition server (examples/nemo_gym/rlft_addition), started by `rlft train` itself
(`nemo_gym_auto_start`).

`make nemo-gym` builds `.venv-nemo-gym`; without it this module is skipped. Task files are made offline by
reasoning_gym's own generator (basic arithmetic) or shipped (addition). Every process ng_run starts, Ray's included, is
killed by session when the module ends; the auto-start tests check that rlft leaves none behind.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from gym_utils import gym_site, link_servers, needs_gym, session_members, start_ng_run, wait_for_gym
from rlft.rollout.envs import nemo_gym_launch
from rlft.rollout.envs.nemo_gym import (VERIFY_MODEL, VERIFY_ROW, VERIFY_TIMEOUT, VERIFY_URL, resource_servers,
                                        reward_nemo_gym_verify)
from rlft.train.metrics import read_metrics
from server_utils import REPO, free_port, kill_session, server_env

pytestmark = [pytest.mark.slow, needs_gym]
SEEDS = REPO.parent / "shared" / "seeds" / "configs"
ARITHMETIC = "resources_servers/reasoning_gym/data/train_basic_arithmetic.jsonl"  # where the guide's config reads it


@pytest.fixture(scope="module")
def gym(tmp_path_factory):
    root = tmp_path_factory.mktemp("gym")
    site = gym_site()
    link_servers("resources_servers/reasoning_gym")
    tasks = site / ARITHMETIC
    if not tasks.exists():
        subprocess.run([str(REPO / ".venv-nemo-gym" / "bin" / "python"), "scripts/create_dataset.py",
                        "--task", "basic_arithmetic", "--size", "48", "--seed", "0", "--config",
                        json.dumps({"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"]}),
                        "--output", str(tasks)], cwd=site / "resources_servers" / "reasoning_gym", check=True,
                       capture_output=True, timeout=120)
    port, log = free_port(), root / "ng_run.log"
    process = start_ng_run(["resources_servers/reasoning_gym/configs/resources_only.yaml"], port, log)
    try:
        config = wait_for_gym(process, port, log, servers=1)
        yield {"port": port, "servers": resource_servers(port), "tasks": tasks, "site": site, "root": root, "config": config}
    finally:
        kill_session(process)


@pytest.fixture(scope="module")
def addition_gym():
    """rlft's example resource server, installed into Gym's folder as the docs say."""
    shutil.copytree(REPO / "examples" / "nemo_gym" / "rlft_addition", gym_site() / "resources_servers" / "rlft_addition",
                    dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", ".venv"))
    return gym_site()


def test_the_real_resource_server_scores_right_and_wrong_answers(gym):
    rows = [json.loads(line) for line in gym["tasks"].read_text().splitlines()[:2]]
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
               f"--nemo_gym_head_port={gym['port']}", "--trl.max_completion_length=8", "--sequence_len=96",
               "--micro_batch_size=8", "--max_steps=4", "--logging_steps=1", "--learning_rate=1e-3",
               f"--output_dir={tmp_path / 'out'}") == 0
    assert "datasets: is replaced by nemo_gym_datasets" in capsys.readouterr().out
    steps = [m for m in read_metrics(tmp_path / "out" / "metrics.jsonl") if "reward" in m]
    assert len(steps) == 4
    assert all(m["rewards/reward_nemo_gym_verify/unscorable"] == 0 for m in steps)
    assert all(0.0 <= m["rewards/reward_nemo_gym_verify/mean"] <= 1.0 for m in steps)


def _addition_args(site, out, head: int, steps: int) -> list[str]:
    return ["examples/nemo_gym/addition.yaml", f"--nemo_gym_dir={site}", f"--nemo_gym_head_port={head}", f"--output_dir={out}",
            f"--max_steps={steps}", "--logging_steps=1"]


def test_auto_started_environment_rewards_rise_and_nothing_is_left_running(addition_gym, warm_model, cli, tmp_path,
                                                                           monkeypatch, repo_root):
    """rlft starts ng_run with the example addition server, GRPO learns from its /verify, and every process ng_run
    started is gone when the run ends."""
    monkeypatch.chdir(repo_root)
    sessions = []
    enter = nemo_gym_launch.GymServers.__enter__

    def spy(self):
        result = enter(self)
        sessions.append(self.process.pid)
        return result

    monkeypatch.setattr(nemo_gym_launch.GymServers, "__enter__", spy)
    out = tmp_path / "out"
    assert cli("train", *_addition_args(addition_gym, out, free_port(), 60), f"--base_model={warm_model}") == 0
    assert len(sessions) == 1 and session_members(sessions[0]) == []
    steps = [m for m in read_metrics(out / "metrics.jsonl") if "reward" in m]
    assert all(m["rewards/reward_nemo_gym_verify/unscorable"] == 0 for m in steps)
    mean = lambda rows: sum(r["reward"] for r in rows) / len(rows)  # noqa: E731
    assert mean(steps[-15:]) > mean(steps[:15]) + 0.03, (mean(steps[:15]), mean(steps[-15:]))
    assert (out / "nemo_gym" / "ng_run.log").exists()


def test_ctrl_c_stops_every_auto_started_gym_process(addition_gym, warm_model, tmp_path):
    out, head = tmp_path / "out", free_port()
    log = tmp_path / "train.log"
    with open(log, "wb") as handle:
        train = subprocess.Popen([sys.executable, "-m", "rlft.cli", "train", *_addition_args(addition_gym, out, head, 10_000),
                                  f"--base_model={warm_model}"], cwd=REPO, env=server_env(), stdout=handle,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    gym_session = None
    try:
        deadline = time.monotonic() + 300
        while not (out / "metrics.jsonl").exists() or not read_metrics(out / "metrics.jsonl"):
            assert train.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            gym_session = gym_session or _child_session(train.pid, "ng_run")
            time.sleep(0.5)
        assert gym_session is not None and session_members(gym_session)
        train.send_signal(signal.SIGINT)
        assert train.wait(timeout=90) == 130, log.read_text()[-3000:]
        assert session_members(gym_session) == []
        assert "interrupted at step" in log.read_text()
    finally:
        kill_session(train)
        if gym_session is not None:
            for pid in session_members(gym_session):
                subprocess.run(["kill", "-9", str(pid)], check=False)


def _child_session(parent: int, name: str) -> int | None:
    """The pid (= session id) of `parent`'s child whose command line names `name`."""
    from pathlib import Path

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
