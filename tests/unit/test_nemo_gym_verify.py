"""NeMo Gym single-turn logic on its own: task rows, routing, the /verify request and every way a verification fails.

A small HTTP server in the test stands in for a resource server here; tests/integration/test_nemo_gym.py runs the
real NeMo Gym servers."""

from __future__ import annotations

import json
import time

import pytest

from rlft.config.sections.nemo_gym import NemoGymDataset
from rlft.config.settings.rollout import NemoGymSettings
from rlft.errors import ConfigError, DataError
from rlft.rollout.envs.nemo_gym import (VERIFY_MODEL, VERIFY_ROW, VERIFY_TIMEOUT, VERIFY_URL, reward_env,
                                        reward_nemo_gym_verify, task_prompt, task_rows, verify_body)
from server_utils import stand_in

ROW = {"responses_create_params": {"input": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]},
       "answer": "4", "metadata": None}


SEEN: list = []  # the bodies /verify received


def verify(path: str, body: dict) -> tuple[int, dict]:
    """/verify answers by path: /ok scores "4" as 1.0, /422 refuses, /slow sleeps, /masked masks, /noreward omits it."""
    SEEN.append(body)
    kind = path.split("/")[1]
    if kind == "slow":
        time.sleep(3)
    if kind == "422":
        return 422, {"detail": "bad"}
    if kind == "masked":
        return 200, {"reward": 0.0, "mask_sample": True}
    if kind == "noreward":
        return 200, {"score": 1}
    return 200, {"reward": float(body["response"]["output"][0]["content"][0]["text"] == body["answer"])}


@pytest.fixture(scope="module")
def gym():
    with stand_in(verify) as url:
        yield url


def columns(urls, timeout=1):
    return {VERIFY_URL: urls, VERIFY_ROW: [ROW] * len(urls), VERIFY_TIMEOUT: [timeout] * len(urls), VERIFY_MODEL: ["m"] * len(urls)}


def test_right_and_wrong_answers_are_scored_by_the_server(gym):
    prompts = [[{"role": "user", "content": "2+2?"}]] * 2
    assert reward_nemo_gym_verify(prompts, ["4", "5"], **columns([gym + "/ok/verify"] * 2)) == [1.0, 0.0]
    body = SEEN[-1]
    assert body["responses_create_params"]["input"] == [{"role": "user", "content": "2+2?"}] and "metadata" not in body
    assert body["response"]["output"][0]["content"][0]["type"] == "output_text"


@pytest.mark.parametrize("kind", ["422", "masked", "noreward", "slow"])
def test_a_failed_verification_is_unscorable_never_zero(gym, kind):
    assert reward_nemo_gym_verify(["2+2?"], ["4"], **columns([f"{gym}/{kind}/verify"])) == [None]


def test_a_server_that_is_down_is_unscorable_after_retries():
    began = time.monotonic()
    assert reward_nemo_gym_verify(["2+2?"], ["4"], **columns(["http://127.0.0.1:9/verify"])) == [None]
    assert time.monotonic() - began < 10


def test_the_task_prompt_is_the_first_user_message():
    assert task_prompt(ROW, "here") == "2+2?"
    with pytest.raises(DataError, match="here: no responses_create_params.input messages"):
        task_prompt({"question": "2+2?"}, "here")


def test_verify_body_keeps_the_row_and_replaces_the_input():
    body = verify_body(ROW, "2+2?", "4", "tiny")
    assert body["answer"] == "4" and body["response"]["model"] == "tiny"
    assert body["responses_create_params"]["input"] == [{"role": "user", "content": "2+2?"}]


def _cfg(tmp_path, path, server="math", **extra):
    return NemoGymSettings(dir=str(tmp_path), config_paths=(), head_port=11000, server_timeout=60, verify_timeout=5,
                           run_timeout=60, max_turns=None, model_name="tiny", seed=0, log=tmp_path / "ng_run.log",
                           datasets=(NemoGymDataset(path=path, server_name=server, max_samples=extra.get("max_samples")),))


def test_task_rows_route_to_the_named_server_and_sample(tmp_path):
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps({**ROW, "answer": str(i)}) + "\n" for i in range(5)))
    rows = task_rows(_cfg(tmp_path, "tasks.jsonl", max_samples=3), {"math": "http://127.0.0.1:1/verify"})
    assert len(rows) == 3 and all(r[VERIFY_URL] == "http://127.0.0.1:1/verify" for r in rows)
    assert rows[0]["prompt"] == [{"role": "user", "content": "2+2?"}] and rows[0][VERIFY_MODEL] == "tiny"


def test_task_rows_name_the_fix(tmp_path):
    (tmp_path / "tasks.jsonl").write_text(json.dumps(ROW) + "\n")
    with pytest.raises(ConfigError, match="knows no resource server 'math' \\(it knows: other\\)"):
        task_rows(_cfg(tmp_path, "tasks.jsonl"), {"other": "u"})
    with pytest.raises(DataError, match="no such file: paths are relative to nemo_gym_dir"):
        task_rows(_cfg(tmp_path, "missing.jsonl"), {"math": "u"})
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(DataError, match=r"\(.*bad.jsonl\): bad.jsonl line 1 is not valid JSON: Expecting property name"):
        task_rows(_cfg(tmp_path, "bad.jsonl"), {"math": "u"})


def test_no_head_server_says_what_to_start():
    from rlft.rollout.envs.nemo_gym import resource_servers

    with pytest.raises(ConfigError, match="no NeMo Gym head server answered at http://127.0.0.1:9/.*ng_run"):
        resource_servers(9, timeout=2)


def test_env_reward_passes_through_and_is_unscorable_when_absent():
    assert reward_env(["a", "b"], env_reward=[1, 0.5]) == [1.0, 0.5]
    assert reward_env(["a", "b"], env_reward=2) == [2.0, 2.0]
    assert reward_env(["a"]) == [None]


def test_task_rows_that_are_not_objects_are_named(tmp_path):
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    with pytest.raises(DataError, match=r"list.jsonl line 1 is list \[1, 2\], not an object"):
        task_rows(_cfg(tmp_path, "list.jsonl"), {"math": "u"})


def test_a_head_port_that_is_not_gyms_is_named(gym):
    from rlft.rollout.envs.nemo_gym import resource_servers

    port = int(gym.rsplit(":", 1)[1])  # the stand-in answers GET with 501: no global config there
    with pytest.raises(ConfigError):
        resource_servers(port, timeout=2)
