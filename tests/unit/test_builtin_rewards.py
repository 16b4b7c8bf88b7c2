"""The built-in rewards (Cosmos-RL's boxed_math, single_choice, format) on hand-written completions, and how
`trl.reward_funcs` names them: bare names, the {name: weight} mapping, the refusals."""

from __future__ import annotations

import pytest

from rlft.config.loading import build_config
from rlft.config.rl import rl_settings
from rlft.errors import ConfigError
from rlft.rollout.rewards.builtin import format as format_reward
from rlft.rollout.rewards.builtin import single_choice
from rlft.rollout.rewards.loading import load_reward_functions
from rlft.rollout.rewards.runner import RewardRunner

THINK = "<think>2+2 is 4, and 4*2 is 8</think>\n\n"


# ---- boxed_math ------------------------------------------------------------------------------------------------------


@pytest.fixture
def boxed_math():
    pytest.importorskip("math_verify")
    from rlft.rollout.rewards.builtin import boxed_math

    return boxed_math


@pytest.mark.parametrize("completion, reference, expected", [
    ("so the answer is \\boxed{8}.", "8", 1.0),                                # right
    ("so the answer is \\boxed{9}.", "8", 0.0),                                # wrong
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),                                     # symbolic equality
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("x = \\boxed{\\sqrt{\\frac{1}{4}}}", "1/2", 1.0),                          # nested braces
    ("\\boxed{x^{2}+1}", "x^2+1", 1.0),
    ("the answer is 8", "8", 1.0),                                              # no box: a number is still an answer
    ("I do not know", "8", 0.0),                                                # missing box, no answer at all
    ("\\boxed{8", "8", 0.0),                                                    # unclosed box
    ("<answer>8</answer>", "8", 0.0),                                           # a bare number needs a space before it
    ("<answer> 8</answer>", "8", 1.0),
    ("\\boxed{8} and then I counted 7 apples", "8", 1.0),                       # a box outranks a later plain number
    ("The final answer is 7. Also \\boxed{8}", "8", 1.0),                       # same rank: the one ending last
    ("\\boxed{7}, no wait, \\boxed{8}", "8", 0.0),                              # several boxes read as the set {7, 8}
    ("\\boxed{7}, no wait, \\boxed{8}", "\\boxed{\\{7, 8\\}}", 1.0),
    ("<think>...</think>\n\n<answer>\\boxed{8}</answer>", "The answer is $\\boxed{8}$", 1.0),  # a boxed reference
    ([{"role": "assistant", "content": "\\boxed{8}"}], "8", 1.0),                # message completions
])
def test_boxed_math(boxed_math, completion, reference, expected):
    assert boxed_math([completion], [reference]) == [expected]


def test_boxed_math_unscorable_reference(boxed_math):
    # no reference, or one math-verify parses nothing from even when boxed: unscorable, not 0
    assert boxed_math(["\\boxed{8}", "\\boxed{8}", "\\boxed{8}"], [None, "", 8]) == [None, None, 1.0]


# ---- single_choice ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("completion, reference, expected", [
    ("B", "B", 1.0),
    (" b \n", "B", 1.0),                                                        # case and surrounding space ignored
    ("C", "B", 0.0),
    ("(B)", "B", 0.0),                                                          # the text, not a letter found in it
    ("B because the others are wrong", "B", 0.0),
    (THINK + "<answer> b </answer>", "B", 1.0),                                 # the first answer tag holds the choice
    (THINK + "<answer>B</answer> <answer>C</answer>", "B", 1.0),
    (THINK + "<answer>C</answer>", "<answer>c</answer>", 1.0),                  # the reference's tag too
    ("<answer>B", "B", 0.0),                                                    # an unclosed tag is plain text
    ([{"role": "assistant", "content": "<answer>A</answer>"}], "A", 1.0),
    ([{"role": "assistant", "content": None, "tool_calls": [{}]}, {"role": "tool", "content": "B is listed"},
      {"role": "assistant", "content": "B"}], "B", 1.0),                        # a tool's result is not the model's text
])
def test_single_choice(completion, reference, expected):
    assert single_choice([completion], [reference]) == [expected]


def test_single_choice_without_reference_is_unscorable():
    assert single_choice(["A"], [None]) == [None]


# ---- format ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("completion, expected", [
    (THINK + "<answer>8</answer>", 1.0),
    (THINK + "<answer>8</answer>\n", 1.0),                                      # one final newline allowed
    ("<think>a\nb < c</think>\n\n<answer>x\n</answer>y</answer>", 1.0),          # any text inside, a lone '<' too
    ("<think></think>\n\n<answer></answer>", 1.0),
    (THINK + "<answer>8</answer>\n\n", 0.0),                                    # two newlines after
    (THINK + "<answer>8</answer> done", 0.0),                                   # text after the answer
    (" " + THINK + "<answer>8</answer>", 0.0),                                  # text before <think>
    ("<think>x</think>\n<answer>8</answer>", 0.0),                              # one newline, not a blank line
    ("<think>x</think> \n\n<answer>8</answer>", 0.0),
    ("<think>a <think> b</think>\n\n<answer>8</answer>", 0.0),                  # a nested think tag
    ("<think>a</think> b</think>\n\n<answer>8</answer>", 0.0),                  # a second closing tag
    ("<think>x</think>\n\n<answer>8", 0.0),                                     # unclosed answer
    ("<answer>8</answer>", 0.0),                                                # no think block
    ("the answer is 8", 0.0),
    ([{"role": "assistant", "content": THINK + "<answer>8</answer>"}], 1.0),
])
def test_format(completion, expected):
    assert format_reward([completion]) == [expected]


# ---- naming them in trl.reward_funcs ---------------------------------------------------------------------------------


def test_bare_names_load_the_builtins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    functions = load_reward_functions(["single_choice", "format"], [0.9, 0.1])
    assert [(f.name, f.weight, f.import_path) for f in functions] == [
        ("single_choice", 0.9, "rlft.rollout.rewards.builtin.single_choice"),
        ("format", 0.1, "rlft.rollout.rewards.builtin.format"),
    ]
    assert functions[0].required_columns == ("answer",) and functions[1].required_columns == ()
    with RewardRunner(functions) as runner:
        scores = runner.score(["q"] * 2, [THINK + "<answer>B</answer>", "B"], [[1], [2]], {"answer": ["B", "B"]})
    assert scores.names == ["single_choice", "format"]
    assert scores.values.tolist() == [[1.0, 1.0], [1.0, 0.0]]
    assert scores.metrics["rewards/single_choice/mean"] == 1.0 and scores.metrics["rewards/format/mean"] == 0.5


def test_a_folder_named_like_a_builtin_is_ambiguous(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "format").mkdir()
    with pytest.raises(ConfigError) as caught:
        load_reward_functions(["format"])
    assert "`./format` for the folder" in str(caught.value)
    assert "`rlft.rollout.rewards.builtin.format` for the built-in" in str(caught.value)
    assert load_reward_functions(["rlft.rollout.rewards.builtin.format"])[0].name == "format"


GRPO = {"base_model": "m", "rl": "grpo", "micro_batch_size": 8, "datasets": [{"path": "d.jsonl"}]}


def test_mapping_form_is_the_list_and_weights_form():
    mapping = build_config({**GRPO, "trl": {"reward_funcs": {"boxed_math": 0.9, "format": 0.1}}})
    listed = build_config({**GRPO, "trl": {"reward_funcs": ["boxed_math", "format"], "reward_weights": [0.9, 0.1]}})
    assert mapping.trl.reward_funcs == ["boxed_math", "format"] and mapping.trl.reward_weights == [0.9, 0.1]
    assert mapping.trl.model_dump() == listed.trl.model_dump()
    assert rl_settings(mapping) == rl_settings(listed)
    integer = build_config({**GRPO, "trl": {"reward_funcs": {"format": 2}}})
    assert integer.trl.reward_weights == [2.0]


@pytest.mark.parametrize("trl, said", [
    ({"reward_funcs": {"boxed_math": 0.9, "format": 0.1}, "reward_weights": [0.9, 0.1]},
     "reward_funcs is a mapping {function: weight} and reward_weights is set too"),
    ({"reward_funcs": {"format": "heavy"}}, "the weight of 'format' is 'heavy'; give a finite number"),
    ({"reward_funcs": {"format": True}}, "the weight of 'format' is True"),
    ({"reward_funcs": {1: 1.0}}, "the key 1 is not a reward function's name"),
])
def test_mapping_refusals(trl, said):
    with pytest.raises(ConfigError) as caught:
        build_config({**GRPO, "trl": trl})
    assert said in str(caught.value) and "trl" in str(caught.value)
