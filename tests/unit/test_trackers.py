"""Experiment trackers through accelerate: the keys that turn each on, a missing package said early."""

from __future__ import annotations

import pytest

from rlft.config.trackers import missing_tracker_packages, tracker_specs


def test_axolotl_tracker_keys_turn_trackers_on(config):
    cfg = config(use_tensorboard=True, wandb_project="p", wandb_entity="me", mlflow_tracking_uri="file:/tmp/ml",
                 comet_project_name="c", comet_online=False, trackio_project_name="t", trackio_space_id="me/space",
                 swanlab_project="s", swanlab_experiment_name="e", swanlab_mode="offline", swanlab_workspace="team")
    specs = {spec.name: spec.arguments for spec in tracker_specs(cfg)}
    assert specs == {
        "tensorboard": {"run_name": "runs", "logging_dir": "./model-out"},  # output_dir
        "wandb": {"run_name": "p", "entity": "me"},
        "mlflow": {"experiment_name": "rlft", "run_name": None},
        "comet_ml": {"run_name": "c", "online": False},
        "trackio": {"run_name": "t", "space_id": "me/space"},
        "swanlab": {"run_name": "s", "experiment_name": "e", "mode": "offline", "workspace": "team"},
    }
    assert tracker_specs(config(use_swanlab=False, swanlab_project="s")) == []  # Axolotl's switch, explicitly off
    assert tracker_specs(config()) == []
    assert tracker_specs(config(use_mlflow=False, mlflow_tracking_uri="file:/tmp/ml")) == []  # explicitly off


@pytest.mark.parametrize("overrides, package", [
    ({"use_wandb": True}, "wandb"), ({"mlflow_experiment_name": "x"}, "mlflow"), ({"use_comet": True}, "comet"),
    ({"use_trackio": True}, "trackio"), ({"swanlab_project": "s"}, "swanlab"), ({"logger": ["console", "wandb"]}, "wandb"),
])
def test_a_tracker_without_its_package_is_refused_before_anything_loads(config, overrides, package):
    from rlft.errors import ConfigError
    from rlft.train.unbuilt import refuse_unbuilt

    if not missing_tracker_packages(config(**overrides)):
        pytest.skip(f"{package} is installed here")
    with pytest.raises(ConfigError, match=rf"its package is not installed: pip install -c constraints.txt 'rlft\[{package}\]'"):
        refuse_unbuilt(config(**overrides))


def test_tensorboard_through_accelerate_writes_events_and_the_config(config, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rlft.train.metrics import MetricsLog

    log = MetricsLog(config(use_tensorboard=True, output_dir=str(tmp_path), trl={"beta": 0.1}), tmp_path)
    log.write(1, {"loss": 2.5, "learning_rate": 1e-3, "note": "text is kept out of trackers"})
    log.write(2, {"loss": 1.5})
    log.close()
    events = EventAccumulator(str(next((tmp_path / "runs").rglob("events.out.tfevents.*")).parent)).Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 2.5), (2, 1.5)]
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 2


def test_the_logger_list_turns_trackers_on_and_their_keys_set_them_up(config):
    """Cosmos-RL's logging section as rlft keys: logger -> logger, project_name -> wandb_project, experiment_name ->
    wandb_name. Names are read in any case, console is always on and adds no tracker."""
    cfg = config(logger=["Console", "tensorboard", "WANDB", "wandb"], wandb_project="cosmos_rl", wandb_name="run-1")
    assert cfg.logger == ["console", "tensorboard", "wandb"]
    assert {spec.name: (spec.keys, spec.arguments) for spec in tracker_specs(cfg)} == {
        "tensorboard": ("logger", {"run_name": "runs", "logging_dir": "./model-out"}),
        "wandb": ("use_wandb / wandb_project", {"run_name": "cosmos_rl", "name": "run-1"}),
    }
    assert tracker_specs(config(logger=["console"])) == tracker_specs(config(logger=[])) == []
    assert [spec.name for spec in tracker_specs(config(logger=["comet", "mlflow"]))] == ["mlflow", "comet_ml"]


def test_an_unknown_logger_is_refused_with_the_known_ones(config_problems):
    assert config_problems(logger=["console", "neptune"]) == [
        ("logger", "rlft has no logger named 'neptune': the known ones are console, tensorboard, wandb, mlflow, "
                  "comet, trackio, swanlab")]


@pytest.mark.parametrize("overrides, message", [
    ({"logger": ["console"], "wandb_project": "p"},
     "use_wandb / wandb_project turn on wandb, and logger: [console] leaves it out: add wandb to logger, or remove"),
    ({"logger": [], "use_tensorboard": True}, "use_tensorboard turns on tensorboard, and logger: [] leaves it out"),
    ({"logger": ["mlflow"], "use_mlflow": False}, "use_mlflow: false, and logger: [mlflow] names mlflow: remove one of them"),
])
def test_a_tracker_key_that_disagrees_with_the_logger_list_is_refused(config_problems, overrides, message):
    problems = [what for _, what in config_problems(**overrides)]
    assert len(problems) == 1 and problems[0].startswith(message), problems


def test_tensorboard_named_by_the_logger_list_writes_events(config, tmp_path):
    from rlft.train.metrics import MetricsLog

    log = MetricsLog(config(logger=["console", "tensorboard"], output_dir=str(tmp_path)), tmp_path)
    log.write(1, {"loss": 2.5})
    log.close()
    assert list((tmp_path / "runs").rglob("events.out.tfevents.*"))


def test_a_tracker_the_logger_list_names_without_its_package_says_so(config):
    if not missing_tracker_packages(config(logger=["wandb"])):
        pytest.skip("wandb is installed here")
    assert missing_tracker_packages(config(logger=["wandb"]))[0].startswith(
        "logger turns on wandb, but its package is not installed: pip install -c constraints.txt 'rlft[wandb]'")
