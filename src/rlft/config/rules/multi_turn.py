"""Rules on multi-turn rollouts with Python tools (`trl.multi_turn_config`)."""

from __future__ import annotations

from rlft.config.methods import spec_of
from rlft.config.plugins import nemo_gym_enabled

SECTION = "trl.multi_turn_config"


def multi_turn_problems(cfg):
    section = cfg.trl.multi_turn_config
    if not section.enable:
        written = sorted(key for key in section.model_fields_set if key != "enable")
        if written:
            keys = ", ".join(f"{SECTION}.{key}" for key in written)
            yield f"{keys} {'is' if len(written) == 1 else 'are'} read with {SECTION}.enable: true: set it, or remove them"
        return
    spec = spec_of(cfg)
    if not (spec.engine and spec.reward_functions) or spec.feature_matching:
        yield f"{SECTION}.enable plays GRPO-family rollouts with tools: set rl: grpo (or gdpo), not {cfg.rl or 'sft'}"
    if cfg.trl.rollout_func:
        yield f"trl.rollout_func and {SECTION}.enable both produce the rollouts: keep one of them"
    if nemo_gym_enabled(cfg):
        yield (f"NeMo Gym and {SECTION}.enable both decide what an episode is (Gym's tasks, verifiers and agents, or "
               "rlft's Python tools): keep one of them")
    if section.enable_tools and not section.tools:
        yield (f"{SECTION}.enable_tools is true and tools lists none: list the Python tools as 'module.function', e.g. "
               "tools: [tools.get_weather]")
    elif section.enable_tools is False and section.tools:
        yield (f"{SECTION}.tools is listed but enable_tools is false, so no tool would be shown or run: remove "
               "enable_tools (it is true when tools are listed), or remove tools")
    elif not section.tools:
        yield (f"{SECTION}.enable without tools: an episode goes on only after the model calls a tool, so every episode "
               "would be a single answer; list the Python tools (tools: [module.function]), or remove enable")
    thinking = (cfg.trl.chat_template_kwargs or {}).get("enable_thinking")
    if section.enable_thinking is not None and thinking is not None and thinking != section.enable_thinking:
        yield (f"{SECTION}.enable_thinking is {str(section.enable_thinking).lower()} and trl.chat_template_kwargs sets "
               f"enable_thinking: {thinking}: keep one of them")
