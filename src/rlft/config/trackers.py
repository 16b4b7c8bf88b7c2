"""Experiment trackers: the Axolotl keys of each, the `logger:` list that names them (Cosmos-RL's logging.logger), and
the accelerate tracker they turn on.

metrics.jsonl is always written; these add TensorBoard, Weights & Biases, MLflow, Comet, Trackio or
SwanLab through accelerate's tracker classes. A tracker that is configured but whose package is missing is
an error before the model loads (`missing_tracker_packages`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field as dataclass_field
from typing import Any, Literal, Optional

from pydantic import field_validator

from rlft.config.base import Section, field

# `logger:` names: console (the progress lines and metrics.jsonl, always on), then the trackers with their use_X keys
USE_KEYS = {"tensorboard": "use_tensorboard", "wandb": "use_wandb", "mlflow": "use_mlflow", "comet": "use_comet",
            "trackio": "use_trackio", "swanlab": "use_swanlab"}
SINKS = ("console", *USE_KEYS)


class TrackerFields(Section):
    logger: Optional[list[str]] = field(
        None, f"Where the metrics go, as a list (Cosmos-RL's logging.logger): {', '.join(SINKS)}. A tracker named here is "
        "on as its use_X key turns it on, its other keys still set it up (wandb_project, wandb_name, ...); console, the "
        "progress lines and metrics.jsonl, is always on, so naming it changes nothing. Set, the list is the whole "
        "choice: a key that turns on a tracker it leaves out is an error. Default: unset (the use_X keys decide).")
    use_tensorboard: bool = field(False, "Also log to TensorBoard under output_dir/runs (needs tensorboard).")
    use_wandb: bool = field(False, "Also log to Weights & Biases (needs wandb).")
    wandb_project: Optional[str] = field(None, "W&B project (default: rlft; Cosmos-RL's logging.project_name); setting it "
                                               "turns W&B on.")
    wandb_entity: Optional[str] = field(None, "W&B entity.")
    wandb_name: Optional[str] = field(None, "W&B run name (Cosmos-RL's logging.experiment_name; default: one W&B picks).")
    wandb_mode: Optional[Literal["online", "offline", "disabled"]] = field(None, "W&B mode.")
    use_mlflow: Optional[bool] = field(None, "Also log to MLflow (needs mlflow); mlflow_tracking_uri or mlflow_experiment_name "
                                             "turn it on too.")
    mlflow_tracking_uri: Optional[str] = field(None, "MLflow tracking server or folder (MLFLOW_TRACKING_URI).")
    mlflow_experiment_name: Optional[str] = field(None, "MLflow experiment (default: rlft).")
    mlflow_run_name: Optional[str] = field(None, "MLflow run name.")
    use_comet: Optional[bool] = field(None, "Also log to Comet (needs comet_ml); comet_project_name turns it on too.")
    comet_api_key: Optional[str] = field(None, "Comet API key (default: COMET_API_KEY).")
    comet_workspace: Optional[str] = field(None, "Comet workspace.")
    comet_project_name: Optional[str] = field(None, "Comet project (default: rlft).")
    comet_experiment_key: Optional[str] = field(None, "Comet experiment key, to continue an experiment.")
    comet_mode: Optional[str] = field(None, "Comet mode: create, get or get_or_create.")
    comet_online: Optional[bool] = field(None, "false: log offline.")
    use_trackio: Optional[bool] = field(None, "Also log to Trackio (needs trackio); trackio_project_name turns it on too.")
    trackio_project_name: Optional[str] = field(None, "Trackio project (default: rlft).")
    trackio_run_name: Optional[str] = field(None, "Trackio run name.")
    trackio_space_id: Optional[str] = field(None, "Hugging Face Space that hosts the Trackio dashboard.")
    use_swanlab: Optional[bool] = field(None, "Also log to SwanLab (needs swanlab); swanlab_project turns it on too (false: off).")
    swanlab_project: Optional[str] = field(None, "SwanLab project (default: rlft).")
    swanlab_experiment_name: Optional[str] = field(None, "SwanLab experiment name.")
    swanlab_description: Optional[str] = field(None, "SwanLab experiment description.")
    swanlab_workspace: Optional[str] = field(None, "SwanLab workspace (organisation).")
    swanlab_mode: Optional[Literal["cloud", "local", "offline", "disabled"]] = field(None, "SwanLab mode (default: cloud).")
    swanlab_api_key: Optional[str] = field(None, "SwanLab API key (default: SWANLAB_API_KEY or `swanlab login`).")

    @field_validator("logger")
    @classmethod
    def _known_sinks(cls, value: Optional[list[str]]) -> Optional[list[str]]:
        """Names in any case (Cosmos-RL lowercases them), each once."""
        if value is None:
            return None
        names = list(dict.fromkeys(name.lower() for name in value))
        unknown = [name for name in names if name not in SINKS]
        if unknown:
            raise ValueError(f"rlft has no logger named {', '.join(map(repr, unknown))}: the known ones are {', '.join(SINKS)}")
        return names


@dataclass
class TrackerSpec:
    name: str  # accelerate's logger name
    package: str  # the module it imports
    keys: str  # the config keys that turned it on (for messages)
    arguments: dict[str, Any] = dataclass_field(default_factory=dict)


def _turned_on(cfg) -> dict[str, str]:
    """The trackers the use_X keys and their companions turn on, each with those keys (for messages)."""
    on = {}
    if cfg.use_tensorboard:
        on["tensorboard"] = "use_tensorboard"
    if cfg.use_wandb or cfg.wandb_project:
        on["wandb"] = "use_wandb / wandb_project"
    if cfg.use_mlflow or (cfg.use_mlflow is None and (cfg.mlflow_tracking_uri or cfg.mlflow_experiment_name)):
        on["mlflow"] = "use_mlflow / mlflow_tracking_uri / mlflow_experiment_name"
    if cfg.use_comet or (cfg.use_comet is None and cfg.comet_project_name):
        on["comet"] = "use_comet / comet_project_name"
    if cfg.use_trackio or (cfg.use_trackio is None and cfg.trackio_project_name):
        on["trackio"] = "use_trackio / trackio_project_name"
    if cfg.use_swanlab or (cfg.use_swanlab is None and cfg.swanlab_project):
        on["swanlab"] = "use_swanlab / swanlab_project"
    return on


def logger_problems(cfg):
    """`logger:`, when set, is the whole list of trackers: the use_X keys may not add one it leaves out, or switch off
    one it names."""
    if cfg.logger is None:
        return
    listed = f"logger: [{', '.join(cfg.logger)}]"
    for name, keys in _turned_on(cfg).items():
        if name not in cfg.logger:
            yield f"{_turn_on(keys)} {name}, and {listed} leaves it out: add {name} to logger, or remove {keys}"
    for name, key in USE_KEYS.items():
        if name in cfg.logger and key in cfg.model_fields_set and getattr(cfg, key) is False:
            yield f"{key}: false, and {listed} names {name}: remove one of them"


def tracker_specs(cfg) -> list[TrackerSpec]:
    """The trackers the config turns on, with their accelerate constructor arguments (no imports)."""
    on = _turned_on(cfg)
    for name in cfg.logger or []:
        if name != "console":
            on.setdefault(name, "logger")
    specs = []
    if "tensorboard" in on:
        specs.append(TrackerSpec("tensorboard", "tensorboard", on["tensorboard"],
                                 {"run_name": "runs", "logging_dir": cfg.output_dir}))
    if "wandb" in on:
        extra = {k: v for k, v in (("entity", cfg.wandb_entity), ("name", cfg.wandb_name), ("mode", cfg.wandb_mode)) if v}
        specs.append(TrackerSpec("wandb", "wandb", on["wandb"], {"run_name": cfg.wandb_project or "rlft", **extra}))
    if "mlflow" in on:
        specs.append(TrackerSpec("mlflow", "mlflow", on["mlflow"],
                                 {"experiment_name": cfg.mlflow_experiment_name or "rlft", "run_name": cfg.mlflow_run_name}))
    if "comet" in on:
        extra = {k: v for k, v in (("api_key", cfg.comet_api_key), ("workspace", cfg.comet_workspace), ("experiment_key",
                 cfg.comet_experiment_key), ("mode", cfg.comet_mode), ("online", cfg.comet_online)) if v is not None}
        specs.append(TrackerSpec("comet_ml", "comet_ml", on["comet"], {"run_name": cfg.comet_project_name or "rlft", **extra}))
    if "trackio" in on:
        extra = {k: v for k, v in (("name", cfg.trackio_run_name), ("space_id", cfg.trackio_space_id)) if v}
        specs.append(TrackerSpec("trackio", "trackio", on["trackio"], {"run_name": cfg.trackio_project_name or "rlft", **extra}))
    if "swanlab" in on:
        extra = {k: v for k, v in (("experiment_name", cfg.swanlab_experiment_name), ("description", cfg.swanlab_description),
                                   ("workspace", cfg.swanlab_workspace), ("mode", cfg.swanlab_mode)) if v}
        specs.append(TrackerSpec("swanlab", "swanlab", on["swanlab"], {"run_name": cfg.swanlab_project or "rlft", **extra}))
    return specs


def missing_tracker_packages(cfg) -> list[str]:
    """One sentence per configured tracker whose package is not installed."""
    return [f"{_turn_on(spec.keys)} {spec.name}, but its package is not installed: pip install -c constraints.txt "
            f"'rlft[{spec.package.replace('_ml', '')}]' (or pip install {spec.package.replace('_', '-')})"
            for spec in tracker_specs(cfg) if importlib.util.find_spec(spec.package) is None]


def _turn_on(keys: str) -> str:
    return f"{keys} {'turn' if '/' in keys else 'turns'} on"
