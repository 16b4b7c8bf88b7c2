"""load_best_model_at_end, metric_for_best_model and greater_is_better: when Axolotl turns the first on, which metric
decides, which checkpoint is best and that rotation keeps it (the whole run: tests/integration/test_cli_best_model.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rlft.config.best_model import axolotl_loads_best, best_metric, loads_best_model
from rlft.errors import ConfigError
from rlft.train.best import BestCheckpoint, better
from rlft.train.checkpoint_folders import list_checkpoints, pruned

EVAL = {"val_set_size": 0.1}


@pytest.mark.parametrize("overrides, on", [
    (dict(**EVAL, save_steps=10, eval_steps=5), True),
    (dict(**EVAL, save_steps=10, eval_steps=10), True),
    (dict(**EVAL, save_steps=10, eval_steps=3), False),  # saves between evaluations
    (dict(**EVAL, save_steps=10), False),
    (dict(**EVAL, eval_steps=5), False),
    (dict(save_steps=10, eval_steps=5), False),  # no eval set
    (dict(test_datasets=[{"path": "eval.jsonl"}], save_steps=10, eval_steps=5), True),
    (dict(**EVAL, reward_model=True, save_steps=10, eval_steps=5), True),
    # per epoch, as fractions 1 / (n * num_epochs) of the run, only below 1: 0.5 % 0.25 == 0
    (dict(**EVAL, saves_per_epoch=2, evals_per_epoch=4), True),
    (dict(**EVAL, saves_per_epoch=1, evals_per_epoch=2), False),  # 1.0 is not below 1: Axolotl sets no save_steps
    (dict(**EVAL, saves_per_epoch=1, evals_per_epoch=2, num_epochs=2), True),  # 0.5 % 0.25
    (dict(**EVAL, saves_per_epoch=3, evals_per_epoch=2), False),  # 1/3 % 1/2
    (dict(**EVAL, save_steps=10, evals_per_epoch=4), True),  # 10 % 0.25, steps against a fraction, as Axolotl has it
])
def test_axolotls_decision(config, overrides, on):
    """Axolotl's schema defaults the key to false: unset, it is on only with early_stopping_patience (and `on`: the
    schedules allow it); set true, the same schedules decide."""
    cfg = config(**overrides)
    assert not axolotl_loads_best(cfg) and not loads_best_model(cfg)
    early = cfg.model_copy(update={"early_stopping_patience": 2})
    assert axolotl_loads_best(early) is on and loads_best_model(early) is on
    assert axolotl_loads_best(cfg.model_copy(update={"load_best_model_at_end": True})) is on


def test_axolotl_decides_for_neither_eval_source_when_both_are_set(config):
    """rlft refuses test_datasets with val_set_size; Axolotl's decision, given both, loads no best model."""
    cfg = config(test_datasets=[{"path": "eval.jsonl"}], save_steps=10, eval_steps=5, early_stopping_patience=2)
    assert axolotl_loads_best(cfg) and not axolotl_loads_best(cfg.model_copy(update={"val_set_size": 0.1}))


def test_early_stopping_needs_an_evaluation_before_the_end(config_problems, config):
    """Early stopping acts on the periodic evaluations before the last step: with none it would do nothing."""
    for keys, why in ((dict(**EVAL), "no eval_steps, evals_per_epoch or eval_strategy: epoch"),
                      (dict(**EVAL, evals_per_epoch=1), "one evaluation an epoch, one epoch"),
                      (dict(**EVAL, eval_strategy="epoch"), "one evaluation an epoch, one epoch")):
        assert ("combination", "early_stopping_patience stops when the eval metric stops improving, and this run's only "
                f"evaluation before the end is at step 0 ({why}): set eval_steps or evals_per_epoch above 1, or remove "
                "early_stopping_patience") in config_problems(early_stopping_patience=2, **keys)
    for keys in (dict(**EVAL, eval_steps=5), dict(**EVAL, evals_per_epoch=2), dict(**EVAL, eval_strategy="epoch", num_epochs=3),
                 dict(**EVAL, evals_per_epoch=1, max_steps=100)):
        assert config(early_stopping_patience=2, **keys).early_stopping_patience == 2


def test_an_explicit_value_wins(config):
    dpo = dict(rl="dpo", **EVAL, save_steps=10, eval_steps=5, datasets=[{"path": "pairs.jsonl", "type": "chatml.intel"}])
    assert not loads_best_model(config(**dpo, early_stopping_patience=2))  # Axolotl's RL trainers never load the best
    assert loads_best_model(config(**dpo, load_best_model_at_end=True))
    # Axolotl turns it on with early stopping even when set to false; rlft keeps the false
    off = config(**EVAL, save_steps=10, eval_steps=5, load_best_model_at_end=False, early_stopping_patience=2)
    assert axolotl_loads_best(off) and not loads_best_model(off)


def _problems(config_problems, **keys) -> str:
    return " ".join(what for _, what in config_problems(**keys))


def test_impossible_settings_are_refused_with_the_fix(config_problems):
    text = _problems(config_problems, load_best_model_at_end=True, save_steps=5)
    assert "this run does not evaluate (no eval set): set val_set_size or test_datasets" in text
    text = _problems(config_problems, early_stopping_patience=2, eval_strategy="no", **EVAL)
    assert "early_stopping_patience stops when the eval metric stops improving, and this run does not evaluate " \
           "(eval_strategy: no)" in text
    text = _problems(config_problems, load_best_model_at_end=True, **EVAL)
    assert "without save_steps, saves_per_epoch or save_strategy: epoch or best the only one is the last step's" in text
    for key, value in (("metric_for_best_model", "accuracy"), ("greater_is_better", True)):
        text = _problems(config_problems, **{key: value})
        assert f"{key} is read by load_best_model_at_end, early_stopping_patience and save_strategy: best, and none" in text
    # Axolotl's own checks: a strategy other than steps beside the step keys
    assert "save_strategy: epoch and save_steps are both set" in _problems(config_problems, save_strategy="epoch", save_steps=5)
    assert "eval_strategy: no and evals_per_epoch are both set" in _problems(config_problems, eval_strategy="no",
                                                                             evals_per_epoch=2, **EVAL)
    assert "save_strategy: best saves after an evaluation that improves metric_for_best_model, and this run evaluates " \
           "only at its end" in _problems(config_problems, save_strategy="best", **EVAL)


def test_strategies_set_the_schedules(config):
    from rlft.config.settings.training import run_settings
    from rlft.train.step_counts import schedules

    assert schedules(run_settings(config()), 10) == (None, None)
    assert schedules(run_settings(config(**EVAL, eval_strategy="epoch", save_strategy="epoch")), 10) == (10, 10)
    assert schedules(run_settings(config(**EVAL, eval_steps=3, save_strategy="steps", saves_per_epoch=2)), 10) == (3, 5)
    assert schedules(run_settings(config(save_strategy="no")), 10) == (None, None)
    # every Nth epoch's end (Cosmos-RL's save_freq_in_epoch), with or without save_strategy: epoch
    assert schedules(run_settings(config(save_every_n_epochs=3)), 10) == (None, 30)
    assert schedules(run_settings(config(save_every_n_epochs=1, save_strategy="epoch")), 10) == (None, 10)


def test_save_every_n_epochs_is_refused_beside_another_save_schedule(config, config_problems):
    assert _problems(config_problems, save_every_n_epochs=2, save_steps=5) == "save_every_n_epochs and save_steps are both set: keep one"
    assert "save_every_n_epochs and saves_per_epoch are both set" in _problems(config_problems, save_every_n_epochs=2,
                                                                             saves_per_epoch=2)
    for strategy in ("steps", "best", "no"):
        assert f"and save_strategy: {strategy} asks for another schedule" in _problems(config_problems, save_every_n_epochs=2,
                                                                                   save_strategy=strategy, **EVAL)
    assert "must be >= 0" in _problems(config_problems, save_every_n_epochs=-1)
    config(save_every_n_epochs=2, save_strategy="epoch")
    config(save_every_n_epochs=1, load_best_model_at_end=True, eval_strategy="epoch", **EVAL)  # checkpoints to choose from


def test_asynchronous_saving_without_checkpoints_is_refused(config, config_problems):
    assert _problems(config_problems, save_mode="async", save_strategy="no").startswith(
        "save_mode: async writes the checkpoints of save_strategy on a background thread, and save_strategy: no saves none")
    config(save_mode="sync", save_strategy="no")
    config(save_mode="async", save_steps=10)


def test_save_strategy_best_saves_after_each_new_best_evaluation():
    best = _best(load_best_model_at_end=False, save_strategy="best")
    saved = []
    for step, loss in ((0, 0.1), (2, 3.0), (4, 2.0), (6, 2.5), (8, 1.0)):  # the untrained baseline does not count
        best.note(step, {"eval/loss": loss})
        saved += [step] if best.save_now(step) else []
    assert saved == [2, 4, 8]
    resumed = _best(best.state_dict(), load_best_model_at_end=False, save_strategy="best")
    resumed.note(10, {"eval/loss": 1.5})
    assert not resumed.save_now(10) and resumed.state_dict() == {"eval_best": 1.0, "key": "eval/loss", "higher": False}


def test_the_metric_as_transformers_names_it(config):
    assert best_metric(config()) == ("eval/loss", False)
    for name in ("loss", "eval_loss", "eval/loss"):
        assert best_metric(config(metric_for_best_model=name, early_stopping_patience=2, eval_steps=5, **EVAL)) == ("eval/loss", False)
    assert best_metric(config(metric_for_best_model="accuracy", early_stopping_patience=2, eval_steps=5, **EVAL)) == (
        "eval/accuracy", True)
    assert best_metric(config(metric_for_best_model="eval_perplexity", greater_is_better=False,
                              early_stopping_patience=2, eval_steps=5, **EVAL)) == ("eval/perplexity", False)


def _best(state=None, **keys):
    cfg = SimpleNamespace(method="sft", load_best_model_at_end=True, metric_for_best_model=None, greater_is_better=None,
                          save_strategy=None)
    vars(cfg).update(keys)
    return BestCheckpoint(cfg, state)


def test_the_best_is_the_best_saved_and_evaluated_checkpoint():
    best = _best()
    for step, loss, saved in ((0, 5.0, False), (2, 4.0, True), (3, 3.0, False), (4, 3.5, True), (6, 3.5, True), (8, 4.5, True)):
        best.note(step, {"eval/loss": loss, "eval/perplexity": 1.0})
        assert not best.needs_eval(step)
        if saved:
            best.saving(step)
    # step 3 was lowest but not saved; 4 and 6 tie: the earlier stays (transformers' strict comparison)
    assert (best.step, best.value) == (4, 3.5)
    assert best.needs_eval(10)  # a save at a step that was not evaluated evaluates first
    best.saving(10)  # (an interrupted run's save without its evaluation never becomes the best)
    assert best.step == 4
    resumed = _best(best.state_dict())  # from the trainer state of a checkpoint
    assert (resumed.step, resumed.value) == (4, 3.5) and resumed.state_dict()["key"] == "eval/loss"
    assert _best(best.state_dict(), metric_for_best_model="perplexity", greater_is_better=False).step is None  # another metric
    resumed.note(12, {"eval/loss": 3.4})
    resumed.saving(12)
    assert resumed.folder(Path("out")) == Path("out/checkpoint-12")


def test_a_higher_metric_wins_where_greater_is_better():
    best = _best(metric_for_best_model="accuracy")
    for step, accuracy in ((2, 0.5), (4, 0.75), (6, 0.6)):
        best.note(step, {"eval/loss": 1.0, "eval/accuracy": accuracy})
        best.saving(step)
    assert best.step == 4
    assert better(0.7, None, True) and not better(0.7, 0.7, False)


def test_nan_is_never_the_best():
    best = _best()
    for step, loss in ((2, float("nan")), (4, 2.0)):
        best.note(step, {"eval/loss": loss})
        best.saving(step)
    assert best.step == 4


def test_grpo_and_ebft_name_the_metric_their_evaluation_reports(config_problems):
    grpo = dict(rl="grpo", **EVAL, eval_steps=2, early_stopping_patience=2,
                trl={"reward_funcs": ["rlft.rewards.addition.exact_match"]})
    text = _problems(config_problems, **grpo)
    assert "early_stopping_patience watches eval/loss, which grpo's evaluation does not report: set " \
           "metric_for_best_model: reward (eval/reward, higher is better)" in text


def test_off_it_tracks_nothing(tmp_path):
    best = _best(load_best_model_at_end=False)
    best.note(2, {"eval/loss": 1.0})
    best.saving(2)
    assert not best.needs_eval(4) and best.folder(tmp_path) is None and best.state_dict() == {}


def test_a_metric_the_evaluation_does_not_report_is_named_with_what_it_reports():
    best = _best(metric_for_best_model="accuracy")
    with pytest.raises(ConfigError, match=r"load_best_model_at_end watches eval/accuracy, .* \(it reports eval/loss, "
                                          r"eval/perplexity\): set metric_for_best_model"):
        best.note(0, {"eval/loss": 1.0, "eval/perplexity": 2.7})
    best.note(0, {})  # a run without an eval set: nothing to check


def test_rotation_keeps_the_best_checkpoint(tmp_path):
    for step in (2, 4, 6, 8):
        (tmp_path / f"checkpoint-{step}").mkdir()
    checkpoints, saved = list_checkpoints(tmp_path), tmp_path / "checkpoint-8"
    best = tmp_path / "checkpoint-2"
    assert [p.name for p in pruned(checkpoints, saved, 8, 2, best)] == ["checkpoint-4", "checkpoint-6"]
    assert [p.name for p in pruned(checkpoints, saved, 8, 3, best)] == ["checkpoint-4"]
    assert [p.name for p in pruned(checkpoints, saved, 8, 1, best)] == ["checkpoint-4", "checkpoint-6"]  # kept beside it
    assert [p.name for p in pruned(checkpoints, saved, 8, 2, saved)] == ["checkpoint-2", "checkpoint-4"]
    assert [p.name for p in pruned(checkpoints, saved, 8, 2)] == ["checkpoint-2", "checkpoint-4"]
