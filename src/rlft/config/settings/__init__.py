"""The settings a run uses, resolved once from the validated config: one immutable object per concern.

`resolve(cfg)` applies what a run decides beyond the schema (the `trl:` variant and defaults, `rlft.config.rl`; the
attention implementation; the adapter; the process count) and returns `Settings`. `rlft.models`, `rlft.rollout` and
`rlft.losses` take the part they read (`Settings.model`, `.rl`, `.server`, ...), never the whole config; the whole
config stops at `rlft.train` and `rlft.cli`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlft.config.rl import RLSettings, rl_settings
from rlft.config.settings.model import ModelSettings, model_settings
from rlft.config.settings.profiling import ProfileSettings, profile_settings
from rlft.config.settings.rollout import (MultiTurnSettings, NemoGymSettings, ServerSettings, multi_turn_settings,
                                          nemo_gym_settings, server_settings)
from rlft.config.settings.training import (DataSettings, LossSettings, OptimSettings, ParallelSettings, RunSettings,
                                           data_settings, loss_settings, optim_settings, parallel_settings,
                                           run_settings)
from rlft.config.settings.validation import ValidationSettings, validation_settings


@dataclass(frozen=True)
class Settings:
    """Everything a run reads, by concern."""

    model: ModelSettings  # the model, its tokenizer and its adapter (rlft.models)
    data: DataSettings  # row lengths and layouts
    optim: OptimSettings  # the optimizer and its schedule
    rl: RLSettings  # the trl: options: rollouts, rewards, the policy loss, the engine (rlft.rollout, the GRPO family)
    server: ServerSettings  # the rollout server (rlft vllm-serve, the colocated engine)
    nemo_gym: NemoGymSettings  # NeMo Gym's environments
    multi_turn: MultiTurnSettings  # multi-turn rollouts with Python tools
    loss: LossSettings  # the preference losses' weights
    run: RunSettings  # steps, logging, saving, the output folder
    parallel: ParallelSettings  # processes and rows per step
    profile: ProfileSettings  # the profiled steps and ranks, and what the trace holds (rlft.train.profiling)
    validation: ValidationSettings | None = None  # the online-RL evaluation's own settings (validation.enable), else None


def resolve(cfg) -> Settings:
    """The settings of a validated config (`rlft.config.build_config`), built once per run."""
    model, rl = model_settings(cfg), rl_settings(cfg)
    return Settings(model=model, data=data_settings(cfg), optim=optim_settings(cfg), rl=rl,
                    server=server_settings(cfg, model), nemo_gym=nemo_gym_settings(cfg),
                    multi_turn=multi_turn_settings(cfg), loss=loss_settings(cfg),
                    run=run_settings(cfg), parallel=parallel_settings(cfg), profile=profile_settings(cfg),
                    validation=validation_settings(cfg, rl))
