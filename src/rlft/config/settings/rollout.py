"""What `rlft.rollout` reads besides the `trl:` options (`rlft.config.rl.RLSettings`): the rollout server, NeMo Gym and
multi-turn rollouts with Python tools."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlft.config.sections.vllm import VLLMConfig
from rlft.config.settings.model import ModelSettings, model_settings


@dataclass(frozen=True)
class ServerSettings:
    """`rlft vllm-serve` and the colocated engine: the `vllm:` section and the model it serves."""

    vllm: VLLMConfig  # the vllm: section, with `rlft vllm-serve`'s flags applied
    model: ModelSettings  # the served model (base_model at revision_of_model)
    lora_sync: bool  # trl.vllm_lora_sync: the trainer sends LoRA adapters, so the engine enables LoRA
    max_lora_rank: int  # the largest adapter rank served: vllm.max_lora_rank, else lora_r


@dataclass(frozen=True)
class NemoGymSettings:
    """NeMo Gym's environments (the `nemo_gym_*` keys)."""

    dir: str | None  # nemo_gym_dir: the NeMo Gym checkout
    config_paths: tuple[str, ...]  # nemo_gym_config_paths: the server configs ng_run starts
    head_port: int  # nemo_gym_head_port: the head server's port
    server_timeout: int  # nemo_gym_server_timeout: seconds to wait for ng_run's servers
    verify_timeout: int  # nemo_gym_verify_timeout: seconds a /verify call may take
    run_timeout: int  # nemo_gym_run_timeout: seconds an agent's /run may take
    max_turns: int | None  # nemo_gym_max_turns: an agent's step limit (None: the agent's own)
    datasets: tuple[Any, ...]  # nemo_gym_datasets: the task files and the server each routes to
    model_name: str  # the model name sent to /verify: nemo_gym_model_name, else base_model
    seed: int  # seed: for sampling max_samples tasks
    log: Path  # where ng_run's output goes: output_dir/nemo_gym/ng_run.log


@dataclass(frozen=True)
class MultiTurnSettings:
    """Multi-turn rollouts with Python tools (`trl.multi_turn_config`), resolved."""

    enabled: bool  # enable
    tools: tuple[str, ...]  # the tools' 'module.function' names, when enable_tools (else none)
    template_kwargs: dict[str, Any]  # for every render: trl.chat_template_kwargs with enable_thinking where set
    max_assistant_turns: int
    add_generation_prompt: bool
    continue_final_message: bool
    tool_timeout: float  # seconds per tool call


def multi_turn_settings(cfg) -> MultiTurnSettings:
    """The multi-turn settings of `cfg`: enable_tools None -> true when tools are listed."""
    section = cfg.trl.multi_turn_config
    use_tools = section.enable_tools if section.enable_tools is not None else bool(section.tools)
    kwargs = dict(cfg.trl.chat_template_kwargs or {})
    if section.enable_thinking is not None:
        kwargs["enable_thinking"] = section.enable_thinking
    return MultiTurnSettings(
        enabled=section.enable, tools=tuple(section.tools or ()) if use_tools else (), template_kwargs=kwargs,
        max_assistant_turns=section.max_assistant_turns, add_generation_prompt=section.add_generation_prompt,
        continue_final_message=section.continue_final_message, tool_timeout=float(section.tool_timeout),
    )


def server_settings(cfg, model: ModelSettings | None = None) -> ServerSettings:
    """The rollout server's settings of `cfg` (after `rlft vllm-serve`'s flags are set on `cfg.vllm`); `model`: its
    model settings where already resolved."""
    return ServerSettings(vllm=cfg.vllm, model=model or model_settings(cfg), lora_sync=bool(cfg.trl.vllm_lora_sync),
                          max_lora_rank=cfg.vllm.max_lora_rank or cfg.lora_r)


def nemo_gym_settings(cfg) -> NemoGymSettings:
    """The NeMo Gym settings of `cfg`."""
    return NemoGymSettings(
        dir=cfg.nemo_gym_dir, config_paths=tuple(cfg.nemo_gym_config_paths or ()), head_port=cfg.nemo_gym_head_port,
        server_timeout=cfg.nemo_gym_server_timeout, verify_timeout=cfg.nemo_gym_verify_timeout,
        run_timeout=cfg.nemo_gym_run_timeout,
        max_turns=cfg.nemo_gym_max_turns, datasets=tuple(cfg.nemo_gym_datasets or ()),
        model_name=cfg.nemo_gym_model_name or str(cfg.base_model), seed=cfg.seed,
        log=Path(cfg.output_dir) / "nemo_gym" / "ng_run.log",
    )
