"""Reward functions: loading `module.fn` / reward-model folders, the TRL calling convention, failures,
timeouts in-process and in worker processes."""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import textwrap

import pytest
import torch

from rlft.errors import ConfigError, RolloutError
from rlft.rollout.rewards.loading import load_reward_functions
from rlft.rollout.rewards.runner import RewardRunner

# The seeds' examples, verbatim (docs/rlhf.qmd, GRPO section).
SEED_REWARDS_PY = '''
# rewards.py
import random
def rand_reward_func(completions, **kwargs) -> list[float]:
    return [random.uniform(0, 1) for _ in completions]

def oai_gsm8k_transform(cfg, *args, **kwargs):
    def transform_fn(example, tokenizer=None):
        label = example["answer"].split("####")[-1].strip().replace(",", "")
        return {
            "prompt": [{"role": "user", "content": example["question"]},],
            "answer": label,
        }
    return transform_fn, {"remove_columns": ["question"]}
'''

SEED_MATH_ENV_PY = '''
# math_env.py
import re

def math_reward(prompts, completions, answers, **kwargs):
    """Reward function that checks mathematical correctness"""
    rewards = []
    for completion, correct_answer in zip(completions, answers):
        # Extract predicted answer
        match = re.search(r"FINAL ANSWER:\\s*(.+)", completion)
        predicted = match.group(1).strip() if match else ""

        # Compare with correct answer
        reward = 1.0 if predicted == str(correct_answer) else 0.0
        rewards.append(reward)
    return rewards
'''

# Functions shared by the worker tests (imported once by each worker process).
SHARED_MODULE = "rlft_rw_shared"
SHARED_PY = '''
import os, signal, time

def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]

def sleepy_reward(completions, **kwargs):
    if any("SLEEP" in c for c in completions):
        time.sleep(600)
    return [1.0] * len(completions)

def alarm_reward(completions, **kwargs):
    """A verifier guarding itself with signal.alarm, as math_verify does: needs a main thread."""
    def on_alarm(signum, frame):
        raise TimeoutError("verifier timed out")
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(5)
    try:
        return [2.0] * len(completions)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)

def crash_reward(completions, **kwargs):
    if any("CRASH" in c for c in completions):
        os._exit(3)
    return [3.0] * len(completions)
'''


def rows(n: int, conversational: bool = False):
    prompts = [[{"role": "user", "content": f"q{i // 2}"}] if conversational else f"q{i // 2}" for i in range(n)]
    completions = [f"answer {i}" for i in range(n)]
    return prompts, completions, [[i, i + 1] for i in range(n)]


# ---- the seeds' examples ------------------------------------------------------------------------


def test_seed_rewards_py_runs_unchanged_on_conversational_prompts(workdir):
    workdir("rewards", SEED_REWARDS_PY)
    functions = load_reward_functions(["rewards.rand_reward_func"], [1.0])
    assert [(f.name, f.weight) for f in functions] == [("rand_reward_func", 1.0)]
    prompts, completions, ids = rows(4, conversational=True)
    scores = RewardRunner(functions).score(prompts, completions, ids, {"answer": ["4", "4", "7", "7"]})
    assert scores.values.shape == (4, 1) and scores.values.dtype == torch.float32
    assert ((scores.values >= 0) & (scores.values <= 1)).all()
    assert not scores.failures
    assert set(scores.metrics) == {f"rewards/rand_reward_func/{k}" for k in ("mean", "std", "failures", "unscorable")}


def test_seed_math_env_reward_with_answers_column(workdir):
    workdir("math_env", SEED_MATH_ENV_PY)
    runner = RewardRunner(load_reward_functions(["math_env.math_reward"], [1.0]))
    completions = ["so FINAL ANSWER: 4", "FINAL ANSWER: 5", "no idea", "FINAL ANSWER:  7 "]
    scores = runner.score(["2+2", "2+2", "3+4", "3+4"], completions, [[1]] * 4, {"answers": [4, 4, 7, 7]})
    assert scores.values[:, 0].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert scores.metrics["rewards/math_reward/mean"] == 0.5


def test_a_required_column_missing_names_the_closest_one(workdir):
    workdir("math_env", SEED_MATH_ENV_PY)
    runner = RewardRunner(load_reward_functions(["math_env.math_reward"], None))
    with pytest.raises(RolloutError, match=r"needs dataset column\(s\) 'answers'.*did you mean 'answer'"):
        runner.score(["p"], ["FINAL ANSWER: 1"], [[1]], {"answer": ["1"]})


# ---- calling convention ------------------------------------------------------------------------

SPY_PY = '''
calls = []
def spy(prompts, completions, completion_ids, **kwargs):
    calls.append(dict(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs))
    return [0.5] * len(completions)

async def async_reward(completions, **kwargs):
    return [0.25] * len(completions)
'''


@pytest.mark.parametrize("conversational", [False, True])
def test_trl_calling_convention(workdir, conversational):
    workdir("spy_rewards", SPY_PY)
    runner = RewardRunner(load_reward_functions(["spy_rewards.spy", "spy_rewards.async_reward"], [1.0, 2.0]))
    import spy_rewards

    prompts, completions, ids = rows(4, conversational)
    columns = {"prompt": prompts, "answer": ["a", "a", "b", "b"], "level": [1, 1, 2, 2]}
    scores = runner.score(prompts, completions, ids, columns)
    call = spy_rewards.calls[-1]
    assert set(call) == {"prompts", "completions", "completion_ids", "answer", "level"}  # `prompt` is not a kwarg
    assert call["prompts"] == prompts and call["completion_ids"] == ids and call["answer"] == ["a", "a", "b", "b"]
    if conversational:
        assert call["completions"] == [[{"role": "assistant", "content": c}] for c in completions]
    else:
        assert call["completions"] == completions
    assert scores.values.tolist() == [[0.5, 0.25]] * 4
    assert runner.weights.tolist() == [1.0, 2.0] and runner.names == ["spy", "async_reward"]


# ---- what functions return ---------------------------------------------------------------------

RETURNS_PY = '''
import math
def partial(completions, **kwargs):
    return [1.0, None, math.nan, 2.0]
def raises(completions, **kwargs):
    return [1 / 0 for _ in completions]
def too_short(completions, **kwargs):
    return [1.0] * (len(completions) - 1)
def not_a_list(completions, **kwargs):
    return 1.0
def forgot_return(completions, **kwargs):
    pass
def one_bad_value(completions, **kwargs):
    return [1.0, "high", 0.5, float("inf")]
'''


def test_none_and_nan_are_unscorable_and_counted(workdir):
    workdir("returns_rw", RETURNS_PY)
    scores = RewardRunner(load_reward_functions(["returns_rw.partial"], None)).score(*rows(4), {})
    values = scores.values[:, 0]
    assert values[0] == 1.0 and values[3] == 2.0 and values[1:3].isnan().all()
    assert scores.metrics["rewards/partial/unscorable"] == 2 and scores.metrics["rewards/partial/failures"] == 0
    assert scores.metrics["rewards/partial/mean"] == pytest.approx(1.5)
    assert scores.metrics["rewards/partial/std"] == pytest.approx(math.sqrt(0.5))  # NaN-aware, Bessel as TRL
    assert not scores.failures


def test_a_raising_function_is_scored_as_failure_with_its_input(workdir, caplog):
    workdir("returns_rw", RETURNS_PY)
    functions = load_reward_functions(["returns_rw.raises", "returns_rw.partial"], None)
    prompts, completions, ids = rows(4)
    with caplog.at_level(logging.WARNING, logger="rlft.rewards"):
        scores = RewardRunner(functions, failure_score=-1.0).score(prompts, completions, ids, {})
    assert scores.values[:, 0].tolist() == [-1.0] * 4 and scores.values[0, 1] == 1.0  # the other function still ran
    (failure,) = scores.failures
    assert failure["function"] == "raises" and failure["rows"] == 4
    assert failure["error"].startswith("ZeroDivisionError: division by zero (at ") and "returns_rw.py" in failure["error"]
    assert failure["example"]["prompt"] == prompts[0] and failure["example"]["completion"] == completions[0]
    assert scores.metrics["rewards/raises/failures"] == 4
    warnings = [r for r in caplog.records if r.name == "rlft.rewards"]
    assert len(warnings) == 1 and "ZeroDivisionError" in warnings[0].getMessage() and "answer 0" in warnings[0].getMessage()

    nan_scores = RewardRunner(functions[:1], failure_score=None).score(prompts, completions, ids, {})
    assert nan_scores.values.isnan().all() and nan_scores.metrics["rewards/raises/failures"] == 4


def test_bad_return_values(workdir):
    workdir("returns_rw", RETURNS_PY)
    names = ["returns_rw.not_a_list", "returns_rw.forgot_return", "returns_rw.one_bad_value"]
    scores = RewardRunner(load_reward_functions(names, None)).score(*rows(4), {})
    errors = {f["function"]: f for f in scores.failures}
    assert "instead of a list" in errors["not_a_list"]["error"] and "missing `return`" in errors["forgot_return"]["error"]
    assert scores.values[:, :2].eq(0).all()
    # a non-numeric or infinite element fails just its row
    assert scores.values[:, 2].tolist() == [1.0, 0.0, 0.5, 0.0]
    assert errors["one_bad_value"]["rows"] == 2 and "'high'" in errors["one_bad_value"]["error"]
    assert errors["one_bad_value"]["example"]["completion"] == "answer 1"


def test_wrong_number_of_values_is_an_error(workdir):
    workdir("returns_rw", RETURNS_PY)
    runner = RewardRunner(load_reward_functions(["returns_rw.too_short"], None))
    with pytest.raises(RolloutError, match=r"'too_short'.*returns_rw\.py.*expected 4, got 3"):
        runner.score(*rows(4), {})


# ---- loading errors ------------------------------------------------------------------------------

BAD_PY = '''
LIMIT = 3
def no_kwargs(completions):
    return [0.0] * len(completions)
def positional_only(completions, /, **kwargs):
    return [0.0] * len(completions)
def good(completions, **kwargs):
    return [0.0] * len(completions)
'''


def load_error(names, weights=None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_reward_functions(names, weights)
    return str(caught.value)


def test_loading_errors_name_the_function_the_file_and_the_fix(workdir, tmp_path):
    workdir("bad_rw", BAD_PY)
    message = load_error(["bad_rw.no_kwargs"])
    assert "bad_rw.py" in message and "(completions)" in message and "add **kwargs" in message
    assert "positional-only" in load_error(["bad_rw.positional_only"])
    message = load_error(["bad_rw.goood"])
    assert "has no function 'goood'" in message and "bad_rw.good" in message and "bad_rw.py" in message
    assert "is a int, not a function" in load_error(["bad_rw.LIMIT"])
    message = load_error(["nowhere_rw.reward"])
    assert "no module 'nowhere_rw'" in message and str(tmp_path) in message
    message = load_error(["plainname"])
    assert "neither a built-in reward (boxed_math, single_choice, format), nor `module.fn`" in message
    assert "did you mean the built-in 'boxed_math'" in load_error(["boxed-math"])
    message = load_error(["bad_rw.good", "bad_rw.good"], [1.0])
    assert "reward_weights has 1 value(s)" in message and "reward_funcs has 2" in message


def test_module_that_fails_to_import_says_why(workdir):
    workdir("syntax_rw", "def reward(completions, **kwargs)\n    return []\n")
    message = load_error(["syntax_rw.reward"])
    assert "syntax_rw.py" in message and "SyntaxError" in message and "failed to import" in message
    workdir("needs_dep_rw", "import surely_not_installed_pkg\ndef reward(completions, **kwargs):\n    return []\n")
    message = load_error(["needs_dep_rw.reward"])
    assert "needs_dep_rw.py" in message and "surely_not_installed_pkg" in message and "Install" in message


# ---- timeouts in-process -----------------------------------------------------------------------------


def test_in_process_timeout_then_the_next_call_works(workdir):
    workdir(SHARED_MODULE, SHARED_PY)
    runner = RewardRunner(load_reward_functions([f"{SHARED_MODULE}.sleepy_reward"], None), timeout=1.0, failure_score=0.0)
    handler = signal.getsignal(signal.SIGALRM)
    scores = runner.score(["p", "p"], ["fine", "SLEEP"], [[1], [2]], {})
    assert scores.values[:, 0].tolist() == [0.0, 0.0]
    assert "TimeoutError" in scores.failures[0]["error"] and "1s" in scores.failures[0]["error"]
    assert signal.getsignal(signal.SIGALRM) is handler and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert runner.score(["p"], ["fine"], [[1]], {}).values.tolist() == [[1.0]]


# ---- worker processes -----------------------------------------------------------------------------

WORKER_FUNCTIONS = ["length_reward", "sleepy_reward", "alarm_reward", "crash_reward"]


@pytest.fixture(scope="module")
def worker_runner(tmp_path_factory):
    """One pool of 2 spawn workers shared by the worker tests (each spawn costs a fraction of a second)."""
    folder = tmp_path_factory.mktemp("reward_workers")
    (folder / f"{SHARED_MODULE}.py").write_text(textwrap.dedent(SHARED_PY))
    sys.modules.pop(SHARED_MODULE, None)
    previous, previous_path = os.getcwd(), list(sys.path)
    os.chdir(folder)
    try:
        functions = load_reward_functions([f"{SHARED_MODULE}.{name}" for name in WORKER_FUNCTIONS], None)
        runner = RewardRunner(functions, num_workers=2, timeout=1.0, failure_score=-1.0)
    finally:
        os.chdir(previous)  # the workers run in the runner's directory, whatever ours is
    with runner:
        runner.score(["p"] * 4, ["a", "b", "c", "d"], [[1]] * 4, {})  # started: a test run alone (-k) sees warm workers too
        yield runner
    sys.path[:] = previous_path
    sys.modules.pop(SHARED_MODULE, None)
    assert runner.worker_pids == []


def test_workers_give_the_same_values_as_in_process(worker_runner):
    completions = ["a", "bb", "ccc", "dddd", "eeeee"]
    args = (["p"] * 5, completions, [[1]] * 5, {"answer": list("abcde")})
    with_workers = worker_runner.score(*args)
    assert not with_workers.failures and len(worker_runner.worker_pids) == 2
    in_process = RewardRunner(worker_runner.functions[:1]).score(*args)
    assert with_workers.values[:, 0].tolist() == in_process.values[:, 0].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert with_workers.values[:, 2].eq(2.0).all()  # signal.alarm inside the function works in a worker


def test_a_hung_worker_is_replaced_and_the_run_continues(worker_runner):
    before = worker_runner.worker_pids
    completions = ["a", "bb", "SLEEP", "dddd"]  # rows 2-3 are the second worker's share
    scores = worker_runner.score(["p"] * 4, completions, [[1]] * 4, {})
    (failure,) = scores.failures
    assert failure["function"] == "sleepy_reward" and "TimeoutError" in failure["error"] and failure["rows"] == 2
    assert failure["example"]["completion"] == "SLEEP"
    assert scores.values[:, 1].tolist() == [1.0, 1.0, -1.0, -1.0]
    # the functions after the hung one ran on the replacement worker
    assert scores.values[:, 0].tolist() == [1.0, 2.0, 5.0, 4.0] and scores.values[:, 2:].ge(2.0).all()
    after = worker_runner.worker_pids
    assert after[0] == before[0] and after[1] != before[1]
    assert not worker_runner.score(["p"] * 2, ["x", "y"], [[1]] * 2, {}).failures


def test_a_crashed_worker_is_replaced(worker_runner):
    scores = worker_runner.score(["p"] * 4, ["CRASH", "b", "c", "d"], [[1]] * 4, {})
    (failure,) = scores.failures
    assert failure["function"] == "crash_reward" and "exit code 3" in failure["error"] and failure["rows"] == 2
    assert scores.values[:, 3].tolist() == [-1.0, -1.0, 3.0, 3.0]
    assert not worker_runner.score(["p"] * 2, ["x", "y"], [[1]] * 2, {}).failures


# ---- a trained reward model as a reward function ---------------------------------------------------


def test_reward_model_folder_as_reward_function(tmp_path, workdir):
    from transformers import AutoModelForSequenceClassification, LlamaConfig

    from rlft.data.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, num_labels=1, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    (function,) = load_reward_functions(["rm"], [0.5])
    assert function.name == "rm" and function.weight == 0.5
    prompts, completions, ids = rows(4, conversational=True)
    scores = RewardRunner([function], num_workers=2).score(prompts, completions, ids, {"answer": list("abcd")})
    assert scores.values.shape == (4, 1) and torch.isfinite(scores.values).all() and not scores.failures
    assert scores.values[0, 0] != scores.values[1, 0]  # a score of the text, not a constant
    assert "holds no config.json" in load_error(["."])
