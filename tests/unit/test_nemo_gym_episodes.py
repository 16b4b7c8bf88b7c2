"""NeMo Gym multi-turn logic on its own: stitching `/run` answers, the `/run` request, agent routing, tool calls on the
chat route, the tool-aware ChatML template, and what auto start checks before it launches anything.

Small HTTP servers in the test stand in for agents here; tests/integration/test_nemo_gym_agents.py plays real episodes
with NeMo Gym's simple_agent, and tests/integration/test_nemo_gym.py starts real servers with auto start."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from rlft.config.sections.nemo_gym import NemoGymDataset
from rlft.config.settings.rollout import NemoGymSettings
from rlft.errors import ConfigError
from rlft.rollout.envs.nemo_gym import AGENT_NAME, AGENT_URL, VERIFY_ROW, task_rows
from rlft.rollout.envs.nemo_gym_episodes import NemoGymAgents, run_body, stitch
from rlft.rollout.envs.nemo_gym_launch import configured_servers, find_ng_run, overrides
from rlft.rollout.server.tool_calls import decoded_arguments, parse_tool_calls
from rlft.rollout.types import SamplingParams
from server_utils import stand_in

EOS = 9


def turn(prompt, generated, logps=None, kind="message"):
    return {"type": kind, "prompt_token_ids": prompt, "generation_token_ids": generated,
            "generation_log_probs": logps if logps is not None else [-0.5] * len(generated)}


def test_two_turns_stitch_into_one_sequence_with_the_tool_result_masked():
    answer = {"reward": 1.0, "response": {"output": [
        turn([1, 2], [3, 4], [-0.1, -0.2], "function_call"),
        {"type": "function_call_output", "output": "cold"},  # no token ids: the environment's item
        turn([1, 2, 3, 4, 7, 7, 7], [5, EOS], [-0.3, -0.4])]}}
    episode = stitch(answer, [0], EOS)
    assert episode.error is None and episode.reward == 1.0 and episode.num_turns == 2
    assert episode.prompt_ids == [1, 2]
    assert episode.completion_ids == [3, 4, 7, 7, 7, 5, EOS]
    assert episode.env_mask == [1, 1, 0, 0, 0, 1, 1]
    assert episode.logprobs == [-0.1, -0.2, 0.0, 0.0, 0.0, -0.3, -0.4]


@pytest.mark.parametrize("answer,words", [
    ("oops", "not a JSON object"),
    ({"reward": 1.0, "response": {"output": [{"type": "message", "content": "hi"}]}}, "return_token_id_information: true"),
    ({"reward": 1.0, "response": {"output": [turn([1, 2], [3]), turn([1, 9, 3], [4])]}}, "turn 2's prompt does not extend"),
    ({"reward": 1.0, "response": {"output": [turn([1], [3], [-0.1, -0.2])]}}, "turn 1 has 1 tokens and 2 log-probs"),
    ({"reward": 1.0, "response": {"output": [turn([1], [2]), turn([1, 2], [3]), turn([1, 2, 3], [4])]}}, "3 turns, over nemo_gym_max_turns=2"),
    ({"response": {"output": [turn([1], [2])]}}, "no numeric reward"),
])
def test_an_episode_that_cannot_be_trained_on_is_masked_with_its_reason_and_no_reward(answer, words):
    episode = stitch(answer, [5, 6], EOS, max_turns=2)
    assert words in episode.error and episode.reward is None
    if episode.completion_ids == [EOS]:
        assert episode.env_mask == [0]


def test_run_body_samples_at_the_runs_temperature_and_top_p_whatever_the_row_says():
    """As Axolotl sends it: the trainer's log-probs assume the run's temperature and top_p, so a task file's own (Gym's
    google_search has 0.6, critpt a greedy 0.0) must not win; a null is no setting; the row's max_output_tokens stays."""
    row = {"responses_create_params": {"input": [{"role": "user", "content": "hi"}], "temperature": 0.2, "top_p": None},
           "extra": None}
    body = run_body(row, "agent_a", SamplingParams(max_new_tokens=64, temperature=0.8, top_p=1.0))
    assert body["agent_ref"] == {"type": "responses_api_agents", "name": "agent_a"} and "extra" not in body
    assert body["responses_create_params"]["temperature"] == 0.8
    assert body["responses_create_params"]["max_output_tokens"] == 64 and body["responses_create_params"]["top_p"] == 0.999
    nulls = {"responses_create_params": {"input": [], "max_output_tokens": None}}
    assert run_body(nulls, "a", SamplingParams(max_new_tokens=64))["responses_create_params"]["max_output_tokens"] == 64
    own = {"responses_create_params": {"input": [], "max_output_tokens": 16}}
    assert run_body(own, "a", SamplingParams(max_new_tokens=64))["responses_create_params"]["max_output_tokens"] == 16


def play(path: str, body: dict) -> tuple[int, dict]:
    """/ok plays a two-turn episode, /slow never ends in time, /500 fails."""
    kind = path.split("/")[1]
    if kind == "slow":
        time.sleep(3)
    if kind == "500":
        return 500, {"detail": "boom"}
    return 200, {"reward": 0.5, "response": {"output": [turn([1], [2]), turn([1, 2, 8], [3])]}}


@pytest.fixture(scope="module")
def agent():
    with stand_in(play) as url:
        yield url


def test_episodes_come_back_in_order_and_failures_are_counted_with_their_reason(agent):
    prompts = [{"prompt_ids": [1], "columns": {VERIFY_ROW: {"responses_create_params": {}}, AGENT_NAME: "a", AGENT_URL: f"{agent}/{kind}"}}
               for kind in ("ok", "slow", "500")]
    rollout, extra = NemoGymAgents(EOS, run_timeout=1, max_turns=None, max_completion_length=2).rollout(
        prompts, 2, SamplingParams(max_new_tokens=8), SimpleNamespace(version=3))
    assert extra["env_reward"] == [0.5, 0.5, None, None, None, None]
    assert extra["num_turns"][:2] == [2, 2]
    assert extra["env_error"][2].startswith("/run took over nemo_gym_run_timeout=1 s") and "/run answered 500" in extra["env_error"][4]
    assert rollout.completion_ids[0] == [2, 8] and rollout.truncated[:2] == [True, True]  # 4 stitched tokens cut to 2
    assert rollout.env_mask[0] == [1, 0] and rollout.weight_versions == [3] * 6
    assert rollout.completion_ids[2] == [EOS] and rollout.env_mask[2] == [0]


def test_an_agent_that_is_down_is_a_failed_episode_not_an_exception():
    prompts = [{"prompt_ids": [1], "columns": {VERIFY_ROW: {}, AGENT_NAME: "a", AGENT_URL: "http://127.0.0.1:9/run"}}]
    _, extra = NemoGymAgents(EOS, 1, None, 8).rollout(prompts, 1, SamplingParams(max_new_tokens=8), SimpleNamespace(version=0))
    assert extra["env_error"][0].startswith("no agent answered at http://127.0.0.1:9/run")


def _cfg(tmp_path, path, **entry):
    return NemoGymSettings(dir=str(tmp_path), config_paths=(), head_port=11000, server_timeout=60, verify_timeout=30,
                           run_timeout=60, max_turns=None, model_name="tiny", seed=0, log=tmp_path / "ng_run.log",
                           datasets=(NemoGymDataset(path=path, server_name="weather", max_samples=entry.get("max_samples")),))


def test_multi_turn_rows_go_to_the_agent_of_their_resource_server_or_the_one_they_name(tmp_path):
    row = {"responses_create_params": {"input": [{"role": "user", "content": "sf?"}]}}
    named = {**row, "agent_ref": {"type": "responses_api_agents", "name": "other_agent"}}
    (tmp_path / "t.jsonl").write_text(json.dumps(row) + "\n" + json.dumps(named) + "\n")
    agents = {"weather_agent": ("http://h:1/run", "weather"), "other_agent": ("http://h:2/run", "maps")}
    rows = sorted(task_rows(_cfg(tmp_path, "t.jsonl"), {}, agents), key=lambda r: r[AGENT_NAME])
    assert [(r[AGENT_NAME], r[AGENT_URL]) for r in rows] == [("other_agent", "http://h:2/run"), ("weather_agent", "http://h:1/run")]
    with pytest.raises(ConfigError, match="no NeMo Gym agent plays against resource server 'weather'.*other_agent \\(plays maps\\)"):
        task_rows(_cfg(tmp_path, "t.jsonl"), {}, {"other_agent": ("http://h:2/run", "maps")})


def test_hermes_tool_calls_are_parsed_and_their_arguments_decoded_for_the_template():
    content, calls = parse_tool_calls('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "SF"}}\n</tool_call>')
    assert content == "Let me look." and len(calls) == 1
    assert calls[0]["type"] == "function" and calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "SF"}'}
    assert parse_tool_calls("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])
    assert parse_tool_calls("plain") == ("plain", [])
    message = decoded_arguments({"role": "assistant", "tool_calls": calls})
    assert message["tool_calls"][0]["function"]["arguments"] == {"city": "SF"}


def test_the_chatml_template_renders_tools_and_a_call_exactly_as_the_model_writes_it():
    from rlft.data.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    plain = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert tokenizer.apply_chat_template(plain, tokenize=False) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
    written = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "SF"}}\n</tool_call>'
    _, calls = parse_tool_calls(written)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    chat = [{"role": "user", "content": "sf?"}, decoded_arguments({"role": "assistant", "content": None, "tool_calls": calls}),
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": "cold"}]
    text = tokenizer.apply_chat_template(chat, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n# Tools") and '"name": "get_weather"' in text
    assert f"<|im_start|>assistant\n{written}<|im_end|>\n" in text  # the call comes back as it was sampled
    assert text.endswith("<|im_start|>user\n<tool_response>\ncold\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_auto_start_names_a_wrong_gym_folder_and_a_missing_launcher(tmp_path):
    with pytest.raises(ConfigError, match="holds no resources_servers/ folder, so it is not NeMo Gym.*make nemo-gym"):
        find_ng_run(tmp_path)
    (tmp_path / "resources_servers").mkdir()
    with pytest.raises(ConfigError, match="ng_run is not installed for .*make nemo-gym"):
        find_ng_run(tmp_path)


def test_auto_start_reads_the_servers_of_the_config_files_and_limits_agent_turns(tmp_path):
    (tmp_path / "a.yaml").write_text("weather:\n  resources_servers:\n    weather:\n      entrypoint: app.py\n"
                                     "weather_agent:\n  responses_api_agents:\n    simple_agent:\n      entrypoint: app.py\n")
    servers = configured_servers(tmp_path, ["a.yaml"])
    assert servers == {"weather": ("resources_servers", "weather"), "weather_agent": ("responses_api_agents", "simple_agent")}
    gym = NemoGymSettings(dir=str(tmp_path), config_paths=("a.yaml",), head_port=11001, server_timeout=60, verify_timeout=30,
                          run_timeout=60, max_turns=4, datasets=(), model_name="m", seed=0, log=tmp_path / "ng_run.log")
    args = overrides(gym, servers, {"base_url": "http://127.0.0.1:8000/v1", "api_key": "k", "model": "m"})
    assert "+config_paths=[a.yaml]" in args and "+head_server={host: 127.0.0.1, port: 11001}" in args
    assert "+policy_base_url=http://127.0.0.1:8000/v1" in args
    assert "++weather_agent.responses_api_agents.simple_agent.max_steps=4" in args
    with pytest.raises(ConfigError, match="no such file .*missing.yaml"):
        configured_servers(tmp_path, ["missing.yaml"])
    (tmp_path / "empty.yaml").write_text("x: 1\n")
    with pytest.raises(ConfigError, match="declare no NeMo Gym server"):
        configured_servers(tmp_path, ["empty.yaml"])


def test_auto_start_refuses_a_head_port_that_something_else_answers_on():
    from rlft.rollout.envs.nemo_gym_launch import _refuse_busy_port

    with stand_in(play) as url:
        port = int(url.rsplit(":", 1)[1])
        with pytest.raises(ConfigError, match=f"nemo_gym_head_port {port} is already in use"):
            _refuse_busy_port(port)
