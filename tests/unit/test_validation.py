"""The online-RL evaluation of `validation:` (Cosmos-RL's section): pass@k against hand values and Chen et al.'s
product form, the metrics of hand-made scores, the keys and their defaults, the refusals, set names, and the
evaluation's batches and seeds (a stand-in producer)."""

from __future__ import annotations

import math

import pytest
import torch

from rlft.config.loading import build_config
from rlft.config.settings import resolve
from rlft.data.validation_sets import ValidationSet, set_names
from rlft.errors import ConfigError
from rlft.rollout.rewards.loading import load_reward_functions
from rlft.rollout.scoring import make_scores
from rlft.rollout.types import Rollout, SamplingParams
from rlft.rollout.validation import SetTally, pass_at_k, validation_metrics, validation_sampling
from rlft.train.recipes.validation import Validation

BASE = {"base_model": "./model", "datasets": [{"path": "data.jsonl"}], "output_dir": "out", "micro_batch_size": 8,
        "rl": "grpo", "trl": {"reward_funcs": ["m.r"]}}
VALIDATION = {"enable": True, "datasets": [{"path": "val.jsonl"}]}


def _config(**keys):
    return build_config({**BASE, **keys}, source="test")


# ---- pass@k ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 2, 1 - 3 / 10),      # 1 - C(3,2)/C(5,2)
    (4, 1, 2, 1 - 3 / 6),       # 1 - C(3,2)/C(4,2)
    (10, 3, 5, 1 - 21 / 252),   # 1 - C(7,5)/C(10,5)
    (4, 1, 1, 0.25),            # pass@1 is the share that passed
    (4, 1, 4, 1.0),             # pass@n: any passed
    (4, 0, 4, 0.0),
    (1, 1, 1, 1.0),             # one sample
    (1, 0, 1, 0.0),
    (8, 8, 3, 1.0),             # all pass
    (8, 0, 3, 0.0),             # none pass
    (8, 6, 3, 1.0),             # fewer failures than k: every draw of k holds a pass
])
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_equals_the_papers_product_form():
    """Chen et al. 2021's numerically stable form: 1 - prod_{i=n-c+1}^{n} (1 - k/i)."""
    for n in range(1, 21):
        for c in range(n + 1):
            for k in range(1, n + 1):
                product = 1.0 if n - c < k else 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))
                assert pass_at_k(n, c, k) == pytest.approx(product, abs=1e-9), (n, c, k)


@pytest.mark.parametrize("n, c, k, words", [
    (4, 1, 5, "1 <= k <= n"), (4, 1, 0, "1 <= k <= n"), (4, 5, 2, "not a count"), (0, 0, 1, "at least one sample"),
    (4, -1, 2, "not a count"),
])
def test_pass_at_k_refuses_what_n_samples_cannot_estimate(n, c, k, words):
    with pytest.raises(ValueError, match=words):
        pass_at_k(n, c, k)


# ---- metrics ---------------------------------------------------------------------------------------------------------


def _scored(totals: list[float], lengths: list[int], truncated: list[bool]) -> tuple[Rollout, object]:
    rollout = Rollout([[1]] * len(totals), [[7] * length for length in lengths], [[0.0] * length for length in lengths],
                      truncated)
    return rollout, make_scores(torch.tensor([[t] for t in totals]), ["acc"], [1.0])


def test_set_metrics_by_hand():
    """Two prompts, two samples each: totals (1, 0) and (unscorable, 0.5); a pass needs 1.0."""
    tally = SetTally()
    tally.add(*_scored([1.0, 0.0, float("nan"), 0.5], [2, 3, 4, 3], [False, False, True, False]))
    metrics = tally.metrics(n=2, threshold=1.0)
    assert metrics["reward"] == pytest.approx((1 + 0 + 0 + 0.5) / 4)  # unscorable as 0
    assert metrics["reward_std"] == pytest.approx(float(torch.tensor([1, 0, 0, 0.5]).std(unbiased=False)))
    assert (metrics["reward_min"], metrics["reward_max"], metrics["rollout_count"]) == (0.0, 1.0, 4.0)
    assert metrics["rewards/acc/mean"] == pytest.approx(0.375)
    assert metrics["pass@1"] == pytest.approx((1 / 2 + 0) / 2)  # prompt 1: 1 of 2 passed; prompt 2: none
    assert metrics["pass@2"] == pytest.approx((1 + 0) / 2)
    assert metrics["completions/mean_length"] == 3.0 and metrics["completions/clipped_ratio"] == 0.25


def test_one_sample_per_prompt_logs_pass_at_1_only():
    tally = SetTally()
    tally.add(*_scored([1.0, 0.0, 2.0], [1, 1, 1], [False] * 3))
    metrics = tally.metrics(n=1, threshold=1.0)
    assert metrics["pass@1"] == pytest.approx(2 / 3) and not any(k.startswith("pass@") and k != "pass@1" for k in metrics)


def test_one_set_logs_eval_keys_and_several_sets_log_each_and_the_pooled_completions():
    a, b = SetTally(), SetTally()
    a.add(*_scored([1.0, 1.0, 0.0, 1.0], [1] * 4, [False] * 4))
    b.add(*_scored([0.0, 0.0], [1] * 2, [False] * 2))
    alone = validation_metrics({"a": a}, n=2, threshold=1.0)
    assert alone["eval/reward"] == 0.75 and not any(key.startswith("eval/a/") for key in alone)
    both = validation_metrics({"a": a, "b": b}, n=2, threshold=1.0)
    assert both["eval/a/reward"] == 0.75 and both["eval/b/reward"] == 0.0
    assert both["eval/reward"] == pytest.approx(3 / 6)  # every completion weighs the same
    assert both["eval/pass@2"] == pytest.approx((1 + 1 + 0) / 3) and both["eval/rollout_count"] == 6.0
    assert validation_metrics({"a": SetTally()}, n=2, threshold=1.0) == {}


def test_validation_sampling_keeps_the_trainings_stops_and_min_p():
    cfg = _config(trl={"reward_funcs": ["m.r"], "top_p": 0.9, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1,
                       "max_completion_length": 64},
                  validation={**VALIDATION, "temperature": 0.7, "top_k": 5, "max_response_length": 32})
    training = SamplingParams(max_new_tokens=64, temperature=1.0, top_p=0.9, top_k=20, min_p=0.05, repetition_penalty=1.1,
                              stop_token_ids=(2,), stop_strings=("END",))
    params = validation_sampling(training, resolve(cfg).validation)
    assert params == SamplingParams(max_new_tokens=32, temperature=0.7, top_p=0.9, top_k=5, min_p=0.05,
                                    repetition_penalty=1.1, stop_token_ids=(2,), stop_strings=("END",))


# ---- keys, defaults and refusals -------------------------------------------------------------------------------------


def test_defaults_are_cosmos_rls_and_a_run_without_the_section_has_no_validation():
    section = _config().validation
    assert (section.enable, section.temperature, section.n_generation, section.pass_threshold) == (False, 0.0, 1, 1.0)
    assert section.top_p is None and section.max_response_length is None and section.reward_function is None
    assert resolve(_config(val_set_size=0.1)).validation is None


def test_unset_keys_take_the_trl_options_and_reward_forms_resolve_to_names_and_weights():
    cfg = _config(trl={"reward_funcs": ["m.r"], "top_p": 0.8, "top_k": 10, "repetition_penalty": 1.2,
                       "max_completion_length": 48}, validation={**VALIDATION, "reward_function": "boxed_math"})
    settings = resolve(cfg).validation
    assert (settings.temperature, settings.top_p, settings.top_k, settings.repetition_penalty, settings.max_new_tokens) == \
        (0.0, 0.8, 10, 1.2, 48)
    assert settings.greedy
    assert (settings.reward_funcs, settings.reward_weights) == (("boxed_math",), (1.0,))
    listed = resolve(_config(validation={**VALIDATION, "reward_function": ["boxed_math", "format"]})).validation
    assert (listed.reward_funcs, listed.reward_weights) == (("boxed_math", "format"), (1.0, 1.0))
    weighted = resolve(_config(validation={**VALIDATION, "reward_function": {"single_choice": 0.9, "format": 0.1}})).validation
    assert (weighted.reward_funcs, weighted.reward_weights) == (("single_choice", "format"), (0.9, 0.1))
    assert resolve(_config(validation={**VALIDATION})).validation.reward_funcs == ()  # the training's
    assert resolve(_config(validation={**VALIDATION, "temperature": 1.0, "top_k": 1})).validation.greedy  # Cosmos's top_k


@pytest.mark.parametrize("keys, words", [
    ({"validation": {"temperature": 1.0, "n_generation": 4}},
     "validation.n_generation, validation.temperature change nothing while validation.enable is false"),
    ({"validation": {"pass_threshold": 0.5}},
     "validation.pass_threshold changes nothing while validation.enable is false \\(the default\\): set "
     "validation.enable: true, or remove it"),
    ({"validation": {"enable": True}}, "has no prompts to evaluate on"),
    ({"validation": VALIDATION, "val_set_size": 0.1}, "validation.datasets and val_set_size are both set"),
    ({"validation": VALIDATION, "test_datasets": [{"path": "t.jsonl"}]}, "validation.datasets and test_datasets"),
    ({"validation": VALIDATION, "eval_strategy": "no"}, "nothing would evaluate"),
    ({"validation": VALIDATION, "rl": "dpo", "trl": {}}, "rl: dpo evaluates its own way"),
    ({"validation": VALIDATION, "nemo_gym_enabled": True, "nemo_gym_datasets": [{"path": "t.jsonl", "server_name": "s"}]},
     "evaluation on Gym tasks is not built yet"),
    ({"validation": {"freq": 20}}, "write eval_steps: N"),
    ({"validation": {"batch_size": 8}}, "write eval_batch_size: N"),
    ({"validation": {"dataset": {"name": "gsm8k"}}}, "validation.datasets: \\[\\{path"),
    ({"validation": {**VALIDATION, "reward_function": ["boxed_math", " "]}}, "a reward function's name is empty"),
    ({"validation": {**VALIDATION, "reward_function": {"boxed_math": True}}},
     "validation.reward_function: the weight of 'boxed_math' is True; give a finite number"),
    ({"validation": {**VALIDATION, "reward_function": {"": 1.0}}}, "the key '' is not a reward function's name"),
    ({"validation": {**VALIDATION, "n_generation": 4}},
     "validation.n_generation 4 with validation.temperature 0 samples greedily: a prompt's 4 completions would be the "
     "same one, so pass@4 would equal pass@1"),
    ({"validation": {**VALIDATION, "n_generation": 2, "temperature": 1.0, "top_k": 1}},
     "validation.n_generation 2 with validation.top_k 1 samples greedily"),
    ({"validation": {**VALIDATION, "n_generation": 2, "temperature": 1.0}, "trl": {"reward_funcs": ["m.r"], "top_k": 1}},
     "validation.n_generation 2 with top_k 1 \\(trl.top_k, as validation.top_k is unset\\) samples greedily"),
    ({"validation": {**VALIDATION, "n_generation": 0}}, "validation.n_generation"),
    ({"validation": {**VALIDATION, "top_p": 0}}, "validation.top_p"),
])
def test_refusals_name_the_keys_and_the_fix(keys, words):
    with pytest.raises(ConfigError, match=words):
        _config(**keys)


def test_the_eval_split_is_enough_for_validation():
    assert resolve(_config(val_set_size=0.1, validation={"enable": True})).validation is not None


def test_several_samples_a_prompt_need_a_sampling_temperature():
    sampled = resolve(_config(validation={**VALIDATION, "n_generation": 4, "temperature": 1.0, "top_k": 0})).validation
    assert (sampled.n_generation, sampled.greedy) == (4, False)
    assert resolve(_config(validation={**VALIDATION, "n_generation": 1})).validation.greedy  # one greedy answer: pass@1


def test_an_unknown_validation_reward_is_reported_under_its_key():
    with pytest.raises(ConfigError, match=r"validation\.reward_function\[1\]: 'nosuch'"):
        load_reward_functions(["format", "nosuch"], [1.0, 1.0], "validation.reward_function")


# ---- sets and the evaluation -----------------------------------------------------------------------------------------


def test_set_names_come_from_files_and_hub_ids_and_stay_apart():
    cfg = _config(validation={"enable": True, "datasets": [
        {"path": "data/math_test.jsonl"}, {"path": "openai/gsm8k", "name": "main", "split": "test"},
        {"path": "openai/gsm8k", "name": "socratic", "split": "test"}, {"path": "a/rewards.parquet"},
        {"path": "x/v.jsonl"}, {"path": "y/v.jsonl"}, {"path": "z/v.jsonl", "split": "test"}]})
    assert set_names(cfg.validation.datasets) == ["math_test", "gsm8k_main", "gsm8k_socratic", "rewards_set", "v_train_4",
                                                  "v_train_5", "v_test"]


class StandInProducer:
    """Answers every prompt `samples` times: completion i scores 1.0 when i is even; records the seeds it got."""

    def __init__(self):
        self.calls = []

    def evaluate(self, prompts, params, samples, scorer, seed):
        self.calls.append((len(prompts), params, samples, scorer, seed))
        rows = len(prompts) * samples
        return _scored([float(i % 2 == 0) for i in range(rows)], [1] * rows, [False] * rows)


def test_evaluation_batches_by_set_and_seeds_each_batch_the_same_at_every_evaluation():
    cfg = _config(validation={**VALIDATION, "temperature": 1.0, "n_generation": 2})
    prompts = [{"prompt": str(i), "prompt_ids": [i], "columns": {}} for i in range(5)]
    validation = Validation([ValidationSet("a", prompts[:3]), ValidationSet("b", prompts[3:])], resolve(cfg).validation,
                            scorer=None, batch_size=2, seed=42)
    batches = validation.batches()
    assert [(b["set"], len(b["prompts"])) for b in batches] == [("a", 2), ("a", 1), ("b", 2)]
    producer = StandInProducer()
    training = SamplingParams(max_new_tokens=16, stop_token_ids=(2,))
    first, notes = validation.evaluate(producer, batches, training)
    second, _ = validation.evaluate(producer, batches, training)
    seeds = [call[4] for call in producer.calls]
    assert seeds[:3] == seeds[3:] and len(set(seeds[:3])) == 3 and first == second and notes == []
    assert all(call[1].temperature == 1.0 and call[2] == 2 and call[3] is None for call in producer.calls)
    assert first["eval/a/rollout_count"] == 6 and first["eval/b/rollout_count"] == 4
    assert first["eval/pass@1"] == 0.5 and first["eval/pass@2"] == 1.0
    assert "a 3 prompts, b 2 prompts; 2 completion(s) per prompt, temperature 1" in validation.describe()


def test_greedy_evaluation_draws_no_seed():
    cfg = _config(validation={**VALIDATION})
    validation = Validation([ValidationSet("a", [{"prompt": "1", "prompt_ids": [1], "columns": {}}])],
                            resolve(cfg).validation, scorer=None, batch_size=8, seed=0)
    producer = StandInProducer()
    validation.evaluate(producer, validation.batches(), SamplingParams(max_new_tokens=4))
    assert producer.calls[0][4] is None and producer.calls[0][1].temperature == 0.0 and producer.calls[0][2] == 1