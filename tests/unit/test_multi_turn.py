"""Multi-turn rollouts with Python tools (`trl.multi_turn_config`): the episode loop against a scripted engine, the
tools' failures, the chat template's checks, the config's rules, and what the reward functions receive.

The engine is a script (each episode's turns as text); it also checks that every later turn's prompt is exactly the
episode's earlier prompt plus the tokens it sampled there (token in, token out)."""

from __future__ import annotations

import textwrap
import threading
from types import SimpleNamespace

import pytest
import torch
from transformers.utils import get_json_schema

from rlft.config.settings import resolve
from rlft.data.batches import BatchPlan, PlanCursor
from rlft.data.chat_templates import CHATML_TEMPLATE, TEMPLATES
from rlft.data.prompts import tokenize_prompt
from rlft.errors import ConfigError
from rlft.rollout.envs.multi_turn import COMPLETION_MESSAGES, ToolEpisodes, tool_metrics
from rlft.rollout.envs.python_tools import PythonTool, load_tools
from rlft.rollout.producer import RolloutProducer
from rlft.rollout.rewards.loading import RewardFunction
from rlft.rollout.rewards.runner import RewardRunner
from rlft.rollout.scoring import FunctionScorer
from rlft.rollout.types import Rollout, SamplingParams

END = "<|im_end|>"
RESULT_TURN = "\n<|im_start|>user\n<tool_response>\n{}\n</tool_response><|im_end|>\n"
OPENING = "<|im_start|>assistant\n"


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    add.calls += 1
    return a + b


add.calls = 0


def fail(x: str) -> str:
    """Always raises.

    Args:
        x: Anything.
    """
    raise ValueError("no luck")


RELEASE = threading.Event()  # the hanging tool's thread ends when a test sets it


def hang(x: str) -> str:
    """Waits until released.

    Args:
        x: Anything.
    """
    RELEASE.wait(60)
    return "late"


def tool(fn) -> PythonTool:
    return PythonTool(fn.__name__, f"tests.{fn.__name__}", fn, get_json_schema(fn))


TOOLS = [tool(add), tool(fail), tool(hang)]


def call(name: str, **arguments) -> str:
    import json
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


class ScriptedEngine:
    """Episode e's k-th turn is scripts[e][k] (text with its stop token), sampled with log-prob -(k + 1) / 10 per token.
    A later call's prompts must each be an earlier episode's prompt plus exactly the tokens sampled for it, and more."""

    def __init__(self, tokenizer, scripts: list[list[str]], version: int = 3):
        self.tokenizer, self.scripts, self.version = tokenizer, scripts, version
        self.seen: list[list[int]] = []  # each episode's last prompt + sampled turn
        self.turns: list[int] = []
        self.calls: list[dict] = []

    def generate(self, prompt_ids, params, num_samples=1, seed=None):
        self.calls.append({"prompts": len(prompt_ids) * num_samples, "max_new_tokens": params.max_new_tokens, "seed": seed})
        expanded = [p for p in prompt_ids for _ in range(num_samples)]
        if not self.seen:
            episodes = list(range(len(expanded)))
            self.seen, self.turns = [[] for _ in expanded], [0] * len(expanded)
        else:
            episodes = []
            for prompt in expanded:
                matches = [e for e, seen in enumerate(self.seen) if prompt[:len(seen)] == seen and len(prompt) > len(seen)
                           and e not in episodes]
                assert matches, "a later turn's prompt does not extend an episode's tokens as they were sampled"
                episodes.append(matches[0])
        completions, logprobs, truncated = [], [], []
        for prompt, e in zip(expanded, episodes):
            ids = self.tokenizer(self.scripts[e][self.turns[e]], add_special_tokens=False)["input_ids"]
            cut = len(ids) > params.max_new_tokens
            ids = ids[:params.max_new_tokens]
            completions.append(ids)
            logprobs.append([-(self.turns[e] + 1) / 10] * len(ids))
            truncated.append(cut)
            self.seen[e] = list(prompt) + ids
            self.turns[e] += 1
        return Rollout(expanded, completions, logprobs, truncated, weight_versions=[self.version] * len(expanded))


def prompt_row(tok, text="What is 2+3?", tools=TOOLS, **kwargs) -> dict:
    record = {"prompt": [{"role": "user", "content": text}], "answer": "5"}
    return tokenize_prompt(record, tok, {"tools": [t.schema for t in tools], **kwargs})


def play(tok, scripts, group=None, max_turns=4, limit=2000, timeout=5.0, tools=TOOLS, seed=11, **kwargs):
    engine = ScriptedEngine(tok, scripts)
    episodes = ToolEpisodes(tok, tools, kwargs, max_turns, timeout)
    rollout, extra = episodes.rollout([prompt_row(tok, tools=tools, **kwargs)], group or len(scripts),
                                      SamplingParams(max_new_tokens=limit, stop_token_ids=(tok.eos_token_id,)), engine, seed)
    return rollout, extra, engine


def test_an_episode_is_its_sampled_turns_then_the_rendered_results_with_only_sampled_tokens_trained(tok):
    first, answer = call("add", a=2, b=3) + END, "The sum is 5." + END
    rollout, extra, engine = play(tok, [[first, answer], ["5" + END]])
    def ids(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    bridge = ids(RESULT_TURN.format(5) + OPENING)
    assert rollout.completion_ids[0] == ids(first) + bridge + ids(answer)
    assert rollout.env_mask[0] == [1] * len(ids(first)) + [0] * len(bridge) + [1] * len(ids(answer))
    assert rollout.logprobs[0] == [-0.1] * len(ids(first)) + [0.0] * len(bridge) + [-0.2] * len(ids(answer))
    assert rollout.completion_ids[1] == ids("5" + END) and rollout.env_mask[1] == [1, 1]
    assert rollout.truncated == [False, False] and rollout.weight_versions == [3, 3]
    # the second turn was sampled for the first episode only, seeded from the batch's seed, with the room left
    assert [c["prompts"] for c in engine.calls] == [2, 1] and engine.calls[1]["seed"] not in (None, 11)
    assert engine.calls[1]["max_new_tokens"] == 2000 - len(ids(first)) - len(bridge)
    assert extra["num_turns"] == [2, 1] and extra["env_error"] == [None, None]
    messages = extra[COMPLETION_MESSAGES][0]
    assert [m["role"] for m in messages] == ["assistant", "tool", "assistant"]
    assert messages[0]["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 2, "b": 3}}
    assert messages[1] == {"role": "tool", "content": "5", "name": "add"} and messages[2]["content"] == "The sum is 5."
    assert tool_metrics(extra)["tools/call_frequency"] == 0.5 and tool_metrics(extra)["tools/failure_frequency"] == 0.0


def test_what_goes_wrong_in_a_call_is_the_models_to_read_and_is_counted(tok):
    turn = (call("nosuch") + call("fail", x="a") + call("hang", x="b") + "<tool_call>{not json}</tool_call>"
            + call("add", c=1) + END)
    try:
        rollout, extra, _ = play(tok, [[turn, "ok" + END]], timeout=0.2)
    finally:
        RELEASE.set()
    results = tok.decode([t for t, m in zip(rollout.completion_ids[0], rollout.env_mask[0]) if not m])
    assert "Error: there is no tool named 'nosuch'; the tools are: add, fail, hang." in results
    assert "Error: fail raised ValueError: no luck" in results
    assert "Error: hang did not finish within 0.2 s." in results
    assert "Error: add(a: " in results and "cannot take these arguments: missing a required argument: 'a'" in results
    assert "Error: the tool call '{not json}' is not JSON" in results and 'Write a call as <tool_call>{"name"' in results
    assert extra["num_turns"] == [2] and extra["env_error"] == [None]  # the episode went on after the errors
    assert extra["tool_counts"] == [{"calls": 5, "error": 2, "timeout": 1, "unknown": 1, "malformed": 1}]
    metrics = tool_metrics(extra)
    assert metrics["tools/failure_frequency"] == 1.0 and metrics["tools/malformed_calls"] == 1.0
    assert metrics["tools/timeouts"] == 1.0 and metrics["tools/unknown_tools"] == 1.0 and metrics["tools/errors"] == 2.0


def test_the_last_allowed_turn_ends_the_episode_and_its_calls_are_not_run(tok):
    add.calls = 0
    rollout, extra, engine = play(tok, [[call("add", a=1, b=1) + END, call("add", a=2, b=2) + END, "x" + END]],
                                  max_turns=2)
    assert extra["num_turns"] == [2] and add.calls == 1 and len(engine.calls) == 2
    assert rollout.env_mask[0][-1] == 1  # ends on the model's own end token, no results after it


def test_a_turn_cut_by_the_engine_or_the_budget_ends_the_episode_as_truncated(tok):
    first = call("add", a=2, b=3) + END
    length = len(tok(first, add_special_tokens=False)["input_ids"])
    rollout, extra, _ = play(tok, [[first, "never"]], limit=length + 10)  # no room for the results and another turn
    assert extra["num_turns"] == [1] and rollout.truncated == [True] and len(rollout.completion_ids[0]) == length
    rollout, extra, _ = play(tok, [[first]], limit=length - 1)  # the engine cuts the first turn: no call runs
    assert rollout.truncated == [True] and extra["tool_counts"][0]["calls"] == 0
    long_answer = "a" * 400 + END
    rollout, extra, engine = play(tok, [[first, long_answer]], limit=length + 120)
    assert rollout.truncated == [True] and len(rollout.completion_ids[0]) == length + 120
    assert engine.calls[1]["max_new_tokens"] < 120


def test_enable_thinking_and_the_opening_reach_the_chat_template(tok):
    thinking = CHATML_TEMPLATE.replace(
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
        "{% if enable_thinking is defined and not enable_thinking %}{{ '<think>\n\n</think>\n\n' }}{% endif %}{% endif %}")
    original, tok.chat_template = tok.chat_template, thinking
    try:
        assert tok.decode(prompt_row(tok, enable_thinking=False)["prompt_ids"]).endswith(OPENING + "<think>\n\n</think>\n\n")
        assert tok.decode(prompt_row(tok, enable_thinking=True)["prompt_ids"]).endswith(OPENING)
        rollout, _, _ = play(tok, [[call("add", a=1, b=2) + END, "3" + END]], enable_thinking=False)
        bridge = [t for t, m in zip(rollout.completion_ids[0], rollout.env_mask[0]) if not m]
        assert tok.decode(bridge) == RESULT_TURN.format(3) + OPENING + "<think>\n\n</think>\n\n"
    finally:
        tok.chat_template = original


def test_a_template_that_renders_the_last_assistant_turn_its_own_way_still_bridges_exactly(tok):
    """Qwen3's template writes an empty <think> block before the text of the last assistant turn only: the bridge is
    taken after the assistant's text, so what the template writes before it does not matter."""
    last_only = CHATML_TEMPLATE.replace("{% generation %}{{ message['content'] or '' }}",
                                        "{% generation %}{{ '<think>\n\n</think>\n\n' if loop.last else '' }}"
                                        "{{ message['content'] or '' }}")
    assert last_only != CHATML_TEMPLATE
    original, tok.chat_template = tok.chat_template, last_only
    try:
        rollout, _, _ = play(tok, [[call("add", a=1, b=2) + END, "3" + END]])
    finally:
        tok.chat_template = original
    bridge = [t for t, m in zip(rollout.completion_ids[0], rollout.env_mask[0]) if not m]
    assert tok.decode(bridge) == RESULT_TURN.format(3) + OPENING


CALLS_AS_JSON = ("{% for t in tools or [] %}{{ t | tojson }}{% endfor %}{% for m in messages %}{{ m['content'] or '' }}"
                 "{% for c in m['tool_calls'] or [] %}{{ c | tojson }}{% endfor %}{% endfor %}")
NO_RESULTS = ("{% for t in tools or [] %}{{ t | tojson }}{% endfor %}{% for m in messages %}{% if m['role'] != 'tool' %}"
              "{{ m['content'] or '' }}{% for c in m['tool_calls'] or [] %}<tool_call>{% endfor %}{% endif %}{% endfor %}")


@pytest.mark.parametrize("template,words", [
    ("llama4", "chat_template: llama4 is written in rlft for text chats, not `tools`"),
    ("llama3", "it does not show the tools"),
    (CALLS_AS_JSON, "it writes tool calls in another form"),
    (NO_RESULTS, "it leaves out tool results"),
])
def test_a_chat_template_that_cannot_play_tool_episodes_is_refused_before_anything_loads(tok, template, words):
    original, tok.chat_template = tok.chat_template, TEMPLATES.get(template, (template,))[0]
    try:
        with pytest.raises(ConfigError) as caught:
            ToolEpisodes(tok, TOOLS, {}, 3, 1.0)
    finally:
        tok.chat_template = original
    assert words in str(caught.value) and "chat_template: chatml" in str(caught.value)


def test_tools_are_loaded_by_name_with_their_schemas_and_bad_ones_are_config_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mt_tools_a.py").write_text(textwrap.dedent('''
        def weather(city: str) -> str:
            """The weather in a city.

            Args:
                city: Where.
            """
            return "sunny"

        def undocumented(city: str) -> str:
            return "?"
    '''))
    (tmp_path / "mt_tools_b.py").write_text("from mt_tools_a import weather\n")
    [loaded] = load_tools(["mt_tools_a.weather"])
    assert loaded.name == "weather" and loaded.schema["function"]["parameters"]["required"] == ["city"]
    for names, words in ((["mt_tools_a.undocumented"], "mt_tools_a.undocumented"), (["mt_no_such_module.fn"], "no module"),
                         (["mt_tools_a.weather", "mt_tools_b.weather"], "are both called 'weather'")):
        with pytest.raises(ConfigError, match="trl.multi_turn_config.tools") as caught:
            load_tools(names)
        assert words in str(caught.value)


MULTI_TURN = {"rl": "grpo", "micro_batch_size": 2, "trl": {"reward_funcs": ["m.r"], "num_generations": 2}}


def multi_turn(**section) -> dict:
    return {**MULTI_TURN, "trl": {**MULTI_TURN["trl"], "multi_turn_config": section}}


@pytest.mark.parametrize("overrides,words", [
    (multi_turn(tools=["m.f"]), "trl.multi_turn_config.tools is read with trl.multi_turn_config.enable: true"),
    (multi_turn(enable=True), "trl.multi_turn_config.enable without tools"),
    (multi_turn(enable=True, enable_tools=True), "trl.multi_turn_config.enable_tools is true and tools lists none"),
    (multi_turn(enable=True, enable_tools=False, tools=["m.f"]), "trl.multi_turn_config.tools is listed but enable_tools"),
    ({**multi_turn(enable=True, tools=["m.f"]), "rl": "dpo"}, "trl.multi_turn_config.enable plays GRPO-family rollouts"),
    ({**MULTI_TURN, "trl": {**multi_turn(enable=True, tools=["m.f"])["trl"], "rollout_func": "m.g"}},
     "trl.rollout_func and trl.multi_turn_config.enable"),
    ({**MULTI_TURN, "trl": {**multi_turn(enable=True, tools=["m.f"], enable_thinking=True)["trl"],
                            "chat_template_kwargs": {"enable_thinking": False}}}, "trl.multi_turn_config.enable_thinking is true"),
])
def test_multi_turn_combinations_name_the_fix(config_problems, overrides, words):
    problems = config_problems(**overrides)
    assert any(what.startswith(words) for _, what in problems), problems


def test_multi_turn_settings_resolve_cosmos_defaults(config):
    turns = resolve(config(**multi_turn(enable=True, tools=["m.f"], enable_thinking=False))).multi_turn
    assert turns.enabled and turns.tools == ("m.f",) and turns.template_kwargs == {"enable_thinking": False}
    assert (turns.max_assistant_turns, turns.add_generation_prompt, turns.continue_final_message) == (5, True, False)
    assert resolve(config(**MULTI_TURN)).multi_turn.enabled is False


def test_the_first_turn_may_continue_the_prompts_assistant_message_and_turns_may_open_themselves(tok, config, tmp_path,
                                                                                                  monkeypatch):
    from rlft.train.methods import tool_episodes

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mt_opening_tools.py").write_text(textwrap.dedent('''
        def add(a: int, b: int) -> int:
            """Add.

            Args:
                a: A number.
                b: Another.
            """
            return a + b
    '''))
    record = {"prompt": [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "Let me add"}]}
    cfg = config(**multi_turn(enable=True, tools=["mt_opening_tools.add"], continue_final_message=True,
                              add_generation_prompt=False))
    episodes, kwargs = tool_episodes(resolve(cfg), tok)
    assert tok.decode(tokenize_prompt(record, tok, kwargs)["prompt_ids"]).endswith("<|im_start|>assistant\nLet me add")
    bridge = episodes.template.bridge(call("add", a=2, b=3) + END, [episodes.runner.run(
        [{"function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}])[0]])
    assert tok.decode(bridge) == RESULT_TURN.format(5)  # no opening: the model writes <|im_start|>assistant itself


class Recorded:
    """A reward function that keeps what it was given: 1.0 when the episode's last message says 5."""

    def __init__(self):
        self.completions = []

    def __call__(self, completions, **kwargs):
        self.completions += completions
        return [1.0 if "5" in c[-1]["content"] else 0.0 for c in completions]


def test_the_reward_functions_score_whole_episodes_and_the_batch_reports_turns_and_tool_use(tok):
    reward = Recorded()
    runner = RewardRunner([RewardFunction("r", 1.0, "tests.r", reward)], timeout=None)
    rows = [prompt_row(tok)]
    cursor = PlanCursor(BatchPlan(rows, 1, seed=0, pad_id=0, collate=lambda r: {"prompts": r}))
    settings = SimpleNamespace(num_generations=2, prompts_per_step=1, steps_per_generation=1, filter_reward_metric=(),
                               dynamic_sampling_max_retries=0, scale_rewards="group", advantage_estimator="grpo",
                               multi_objective_aggregation="sum_then_normalize", skip_zero_advantage_batches=False,
                               overlong_penalty=False, rollout_func=None, max_completion_length=2000, streaming=False,
                               streaming_min_groups=1)
    engine = ScriptedEngine(tok, [[call("add", a=2, b=3) + END, "It is 5." + END], ["It is 4." + END]])
    producer = RolloutProducer(engine, FunctionScorer(runner, tok), cursor, settings, tok,
                               SamplingParams(max_new_tokens=2000), environment=ToolEpisodes(tok, TOOLS, {}, 3, 5.0))
    scored = producer.produce()
    assert [c[-1]["content"] for c in reward.completions] == ["It is 5.", "It is 4."]
    assert [m["role"] for m in reward.completions[0]] == ["assistant", "tool", "assistant"]
    assert scored.scores.total.tolist() == [1.0, 0.0] and scored.advantages[0] > 0 > scored.advantages[1]
    metrics = scored.metrics.take_step()
    assert metrics["rollout/num_turns/mean"] == 1.5 and metrics["tools/call_frequency"] == 0.5
    assert metrics["rollout/env_failures"] == 0.0 and torch.isfinite(scored.advantages).all()


def test_evaluation_plays_episodes_with_its_own_sampling_and_length(tok):
    runner = RewardRunner([RewardFunction("r", 1.0, "tests.r", Recorded())], timeout=None)
    cursor = PlanCursor(BatchPlan([prompt_row(tok)], 1, seed=0, pad_id=0, collate=lambda r: {"prompts": r}))
    engine = ScriptedEngine(tok, [[call("add", a=2, b=3) + END, "It is 5." + END], ["It is 5." + END]])
    producer = RolloutProducer(engine, FunctionScorer(runner, tok), cursor, SimpleNamespace(num_generations=2), tok,
                               SamplingParams(max_new_tokens=2000), environment=ToolEpisodes(tok, TOOLS, {}, 3, 5.0))
    rollout, scores = producer.evaluate([prompt_row(tok)], SamplingParams(max_new_tokens=300, temperature=0.0), 2, None, 7)
    assert len(rollout) == 2 and scores.total.tolist() == [1.0, 1.0]
    assert engine.calls[0] == {"prompts": 2, "max_new_tokens": 300, "seed": 7}  # the evaluation's length bounds episodes
    assert max(len(ids) for ids in rollout.completion_ids) <= 300 and 0 in rollout.env_mask[0]


def test_a_string_prompts_completion_is_scored_on_the_tokens_the_model_sampled(tok):
    """An episode of a string prompt holds the tool's result as environment tokens (env_mask 0): the reward
    functions get the model's own text, not the tool's answer."""
    seen = []

    def reward(completions, **kwargs):
        seen.extend(completions)
        return [0.0] * len(completions)

    own, tool = tok.encode("The answer:", add_special_tokens=False), tok.encode(" 5 from the tool.", add_special_tokens=False)
    rollout = Rollout([[1]], [own + tool], [[0.0] * (len(own) + len(tool))], [False],
                      env_mask=[[1] * len(own) + [0] * len(tool)])
    runner = RewardRunner([RewardFunction("r", 1.0, "tests.r", reward)], timeout=None)
    FunctionScorer(runner, tok).score([{"prompt": "What is 2+3?", "columns": {}}], rollout, 1)
    assert seen == ["The answer:"]


def test_the_two_shares_of_one_draw_play_episodes_on_different_seeds(tok):
    """A draw sampled in two shares (`part`): the second share's episodes are not replays of the first's."""
    runner = RewardRunner([RewardFunction("r", 1.0, "tests.r", Recorded())], timeout=None)
    cursor = PlanCursor(BatchPlan([prompt_row(tok)], 1, seed=0, pad_id=0, collate=lambda r: {"prompts": r}))
    seeds = []
    for part in (0, 1):
        engine = ScriptedEngine(tok, [["It is 5." + END]])  # a script per share: each plays one new episode
        producer = RolloutProducer(engine, FunctionScorer(runner, tok), cursor, SimpleNamespace(num_generations=1), tok,
                                   SamplingParams(max_new_tokens=50), environment=ToolEpisodes(tok, TOOLS, {}, 3, 5.0))
        producer.sample([prompt_row(tok)], index=4, part=part)
        seeds.append(engine.calls[0]["seed"])
    assert None not in seeds and seeds[0] != seeds[1]


def test_a_tool_with_many_calls_hung_past_their_timeout_starts_no_more_threads():
    """A call past its timeout goes on in the background (a thread cannot be killed): once a tool has MAX_HUNG such
    calls running, its new calls are answered with a timeout at once, and run again once the hung ones end."""
    from rlft.rollout.envs.python_tools import ToolRunner

    release, started = threading.Event(), []

    def stuck() -> str:
        started.append(1)
        release.wait(30)
        return "late"

    runner = ToolRunner([PythonTool("stuck", "m.stuck", stuck, {})], timeout=0.05)
    runner.MAX_HUNG = 2
    call = {"function": {"name": "stuck", "arguments": "{}"}}
    assert [r.outcome for r in runner.run([call, call])] == ["timeout", "timeout"] and len(started) == 2
    assert [r.outcome for r in runner.run([call])] == ["timeout"] and len(started) == 2  # no third thread
    release.set()
    for thread in runner.hung["stuck"]:
        thread.join(5)
    release.clear()
    assert [r.outcome for r in runner.run([call])] == ["timeout"] and len(started) == 3  # it runs again
    release.set()
