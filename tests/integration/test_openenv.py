"""The OpenEnv example: the addition environment served by OpenEnv's `create_app` in a subprocess, played through
OpenEnv's client, and a GRPO run whose rewards all come from it (`examples/openenv/openenv.yaml`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="openenv-core is not installed: pip install -e .[openenv] (it is in the dev extra)")

from rlft.train.metrics import read_metrics  # noqa: E402
from server_utils import REPO, free_port, kill_session, server_env, wait_for_health  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.server]
EXAMPLE = "examples/openenv/openenv.yaml"


@pytest.fixture(scope="module")
def openenv_url(tmp_path_factory):
    """`python -m examples.openenv.server` on a free port, for this module; its whole session is killed after."""
    port = free_port()
    log = tmp_path_factory.mktemp("openenv") / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "examples.openenv.server", "--port", str(port)], stdout=out,
                                   stderr=subprocess.STDOUT, env=server_env(), cwd=REPO, start_new_session=True)
    try:
        wait_for_health(process, port, log, timeout=90.0)
        yield f"http://127.0.0.1:{port}"
    finally:
        kill_session(process)


@pytest.fixture
def example_path(monkeypatch):
    """The repository root on sys.path, so `examples.openenv` imports from any working directory."""
    monkeypatch.syspath_prepend(str(REPO))


def _client(url: str):
    from examples.openenv.rollout import AdditionClient

    return AdditionClient(url, connect_timeout_s=10, message_timeout_s=10).sync()


def test_environment_poses_and_scores(openenv_url, example_path):
    from examples.openenv.server import AdditionAction

    with _client(openenv_url) as env:
        assert env.reset(a=12, b=30).observation.prompt == "12+30="
        result = env.step(AdditionAction(answer="42"))
        assert (result.reward, result.done, result.observation.feedback) == (1.0, True, "correct")
        with pytest.raises(RuntimeError, match="call reset"):  # the episode is over
            env.step(AdditionAction(answer="42"))
        for answer, reward in [(" 45", 0.7), ("30", 0.0), ("forty-two", 0.0), ("", 0.0)]:
            env.reset(a=12, b=30)
            assert env.step(AdditionAction(answer=answer)).reward == pytest.approx(reward), answer
        drawn = env.reset(seed=7).observation.prompt
        assert env.reset(seed=7).observation.prompt == drawn and env.state().a is not None


def test_prompt_tokens_match_the_dataset_prompt(example_path):
    from examples.openenv.rollout import prompt_ids, question, reset_arguments, with_question
    from rlft.data.prompts import tokenize_prompt
    from rlft.data.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    assert prompt_ids("15+34=", tokenizer, None) == tokenize_prompt({"prompt": "15+34="}, tokenizer, None)["prompt_ids"]
    chat = [{"role": "system", "content": "Add."}, {"role": "user", "content": "What is 3 + 4?"}]
    assert reset_arguments(chat, None) == {"a": 3, "b": 4}
    assert question(with_question(chat, "3+4=")) == "3+4=" and with_question(chat, "3+4=")[0] == chat[0]


def test_grpo_learns_from_environment_rewards(warm_model, cli, tmp_path, monkeypatch, repo_root, openenv_url):
    """The shipped config, shorter, from a weak model: every reward is the environment's, and it rises. A step's mean
    reward (8 prompts x 8 answers) swings by about 0.05 with its prompts; after 60 steps the last third's mean was within
    that of the first third's on some trajectories (0.204 -> 0.212 on an AVX2-only AMD EPYC with seed 0). After 120
    steps the last quarter's mean rose by 0.084 to 0.138 over the first quarter's for seeds 0-3 with AVX2 kernels
    (ATEN_CPU_CAPABILITY=avx2) and by 0.100 and 0.109 for seeds 0 and 2 with AVX-512 (an AMD EPYC): the margin of 0.03
    is under half the smallest rise."""
    monkeypatch.chdir(repo_root)
    monkeypatch.setenv("OPENENV_URL", openenv_url)
    out = tmp_path / "openenv"
    assert cli("train", EXAMPLE, f"--base_model={warm_model}", f"--output_dir={out}", "--max_steps=120",
               "--logging_steps=1", "--learning_rate=1e-3") == 0
    steps = [m for m in read_metrics(Path(out) / "metrics.jsonl") if "reward" in m]
    assert len(steps) == 120
    for m in steps:
        assert "rewards/reward_env/mean" in m, sorted(m)
        assert m["rewards/reward_env/unscorable"] == 0 and m["rewards/reward_env/failures"] == 0, m
    quarter = len(steps) // 4
    mean = lambda rows: sum(r["rewards/reward_env/mean"] for r in rows) / len(rows)  # noqa: E731
    first, last = mean(steps[:quarter]), mean(steps[-quarter:])
    print(f"env reward: first quarter {first:.3f}, last quarter {last:.3f}")
    assert last > first + 0.03, (first, last)
