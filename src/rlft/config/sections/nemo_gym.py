"""Top-level `plugins` and `nemo_gym_*` keys: NeMo Gym environments as rewards and rollouts."""

from __future__ import annotations

from typing import Optional

from rlft.config.base import Section, field, planned


class NemoGymDataset(Section):
    """One entry of `nemo_gym_datasets`."""

    path: str = field(
        ...,
        "JSONL file, relative to nemo_gym_dir unless absolute (~ expanded).",
    )
    server_name: str = field(
        ...,
        "Resource server that verifies rows without their own agent_ref.",
    )
    max_samples: Optional[int] = field(
        None,
        "Rows sampled at random from the file; None = all.",
        ge=1,
    )


class NemoGymFields(Section):
    """Top-level `plugins` and `nemo_gym_*` keys (NeMo Gym environments as rewards / rollouts)."""

    plugins: Optional[list[str]] = field(
        None,
        "Integration plugins, e.g. axolotl.integrations.nemo_gym.NemoGymPlugin.",
    )
    nemo_gym_enabled: Optional[bool] = field(
        None,
        "Enable NeMo Gym; None -> true when the NeMo Gym plugin is listed.",
    )
    nemo_gym_dir: Optional[str] = field(
        None,
        "NeMo Gym checkout; None -> ~/Gym.",
    )
    nemo_gym_auto_clone: Optional[bool] = planned(
        None,
        "Clone NeMo Gym into nemo_gym_dir if missing; None -> false.",
        what="install NeMo Gym with `make nemo-gym` instead: a clone needs GitHub and its own `uv sync`",
    )
    nemo_gym_config_paths: Optional[list[str]] = field(
        None,
        "Gym server configs for ng_run, relative to nemo_gym_dir (required when auto-starting).",
    )
    nemo_gym_auto_start: bool = field(
        True,
        "Start the Gym servers (ng_run with nemo_gym_config_paths) before training and stop them after.",
    )
    nemo_gym_head_port: int = field(
        11000,
        "Port of the Gym head server.",
        ge=1, le=65535,
    )
    nemo_gym_server_timeout: int = field(
        360,
        "Seconds to wait for auto-started Gym servers to answer.",
        ge=1,
    )
    nemo_gym_verify_timeout: int = field(
        30,
        "Seconds per /verify request.",
        ge=1,
    )
    nemo_gym_run_timeout: int = field(
        300,
        "Seconds per agent /run (a whole multi-turn episode).",
        ge=1,
    )
    nemo_gym_datasets: Optional[list[NemoGymDataset]] = field(
        None,
        "Gym task files (replace `datasets:`; required when enabled).",
    )
    nemo_gym_model_name: Optional[str] = field(
        None,
        "Model name sent to /verify; None -> base_model.",
    )
    nemo_gym_multi_turn: Optional[bool] = field(
        None,
        "Multi-turn episodes through the agent's /run (needs the rollout server); None -> false.",
    )
    nemo_gym_max_turns: Optional[int] = field(
        None,
        "Model turns per episode: auto-started agents stop there (max_steps), longer episodes are not trained on.",
        ge=1,
    )
