"""What `rlft train` refuses before it loads anything: methods, losses and settings not built yet, and packages or tools
the config needs that this machine lacks. Light to import: the launching command checks a config with it before it
starts any training process. It runs before a run resolves its settings (`rlft.config.settings.resolve`), and in
the launching command, which resolves none: it builds the parts it checks (`model_settings`, `optim_settings`,
`profile_settings`)."""

from __future__ import annotations

import importlib.util
import os
import shutil

import torch

from rlft.config import planned_settings
from rlft.config.axolotl_keys import unsupported_settings
from rlft.config.methods import method_spec
from rlft.config.optimizers import AXOLOTL_OPTIMIZERS
from rlft.config.settings.model import model_settings
from rlft.config.settings.profiling import profile_problems, profile_settings
from rlft.config.settings.training import optim_settings
from rlft.config.parallel import launched, partitioned
from rlft.config.trackers import missing_tracker_packages
from rlft.errors import ConfigError, NotImplementedYet
from rlft.models.liger import liger_problems
from rlft.models.compile import compile_options
from rlft.train.optim import optimizer_class, scheduler_problem

UNBUILT_LOSS_TYPES = {"sapo", "luspo", "vespo"}


def refuse_unbuilt(cfg, processes: int | None = None) -> None:
    """Stop before loading anything when the config asks for something not built yet (`processes`: the training
    processes, by default those the launcher started)."""
    if method_spec(cfg.method).generates and cfg.trl.loss_type in UNBUILT_LOSS_TYPES:
        raise NotImplementedYet(f"trl.loss_type {cfg.trl.loss_type!r} is not implemented yet: use grpo, bnpo, dr_grpo, dapo, "
                                "cispo, token-mean or seq-mean-token-mean")
    if method_spec(cfg.method).feature_matching and cfg.trl.reward_funcs:
        raise NotImplementedYet("trl.reward_funcs with rl: ebft: the feature-matching reward replaces reward functions, and "
                                "combining the two is not built; remove trl.reward_funcs (or train with rl: grpo)")
    processes = processes or launched()[1]
    resets = [key for key in ("reference_reset_interval", "sync_ref_model") if getattr(cfg.trl, key, None)]
    spec = method_spec(cfg.method)
    if resets and (not spec.generates or (spec.feature_matching and cfg.ebft is not None and cfg.ebft.mode == "strided")):
        where = f"rl: {cfg.method}" + (" in strided mode" if spec.generates else "")
        raise NotImplementedYet(f"trl.{resets[0]} with {where}: moving the reference model during training (TR-DPO, arXiv "
                                "2404.09656) is built for the GRPO family and structured EBFT only; remove the key")
    if resets and partitioned(cfg, processes):
        raise NotImplementedYet(f"trl.{resets[0]} with fsdp or DeepSpeed ZeRO-3: moving a reference copy towards sharded "
                                "weights is not built yet; use plain data parallelism or ZeRO-1/2, or drop the key")
    if cfg.context_parallel_size > 1:
        device = "CUDA GPUs" if torch.cuda.is_available() else "CUDA GPUs (this machine has none)"
        raise NotImplementedYet(f"context_parallel_size: {cfg.context_parallel_size}: context parallelism splits each sequence "
                                f"over processes with ring attention on CUDA SDPA kernels and FSDP2, so it needs {device}; "
                                "rlft does not build it. Remove the key; for long rows use "
                                "gradient_checkpointing and a smaller micro_batch_size")
    if cfg.lora_target_parameters and (why := parameter_lora_unbuilt(cfg)):
        raise NotImplementedYet(f"lora_target_parameters {why}")
    if cfg.optimizer in AXOLOTL_OPTIMIZERS:
        raise NotImplementedYet(f"optimizer: {cfg.optimizer} is one of Axolotl's own optimizers, not built into rlft: use one of "
                                "transformers' names (adamw_torch, adamw_torch_fused, adafactor, adamw_bnb_8bit, ...)")
    if "lomo" in cfg.optimizer:
        raise NotImplementedYet(f"optimizer: {cfg.optimizer} updates the weights inside the backward pass, driven by its "
                                "fused_backward (transformers' Trainer calls it with the learning rate); rlft's loop does "
                                "not, so it would ignore the schedule, clipping and accumulation: use adamw_torch_fused, "
                                "adafactor or an 8-bit AdamW")
    if "schedule_free" in cfg.optimizer and cfg.deepspeed:
        raise NotImplementedYet(f"optimizer: {cfg.optimizer} with deepspeed: ZeRO keeps the optimizer's weights as its own "
                                "fp32 partitions, so switching to the averaged weights for evaluations and saves would "
                                "not reach the model; use it without deepspeed (plain or fsdp), or another optimizer")
    if not any(key in cfg.optimizer for key in ("galore", "apollo")):  # those need the model to resolve
        optimizer_class(optim_settings(cfg))  # a missing package is said now, before the model loads
    if problem := scheduler_problem(optim_settings(cfg)):
        raise ConfigError(problem)
    missing = missing_tracker_packages(cfg) + missing_build_tools(cfg) + liger_problems(model_settings(cfg), torch.cuda.is_available())
    missing += profile_problems(profile_settings(cfg), processes, torch.cuda.is_available())
    if missing:
        raise ConfigError("\n".join(missing))
    refused, _ = unsupported_settings(cfg)
    if refused:
        listed = "\n".join(f"  - {key}: {why}" for key, why in refused)
        raise NotImplementedYet(f"these Axolotl settings do not run in rlft; remove them (or set them to their default):\n{listed}")
    unbuilt = planned_settings(cfg)
    if unbuilt:
        listed = "\n".join(f"  - {key} (not built: {what})" for key, what in unbuilt)
        raise NotImplementedYet(f"these settings are not implemented yet; remove them or leave them at their defaults:\n{listed}")


def missing_build_tools(cfg) -> list[str]:
    """What `deepspeed:` and `torch_compile` need that this machine lacks: the DeepSpeed package, and on a CPU a C++
    compiler for inductor's kernels, one sentence each. (DeepSpeed compiles nothing here: `rlft.train.zero.initialize`.)"""
    problems = []
    if cfg.deepspeed and importlib.util.find_spec("deepspeed") is None:
        problems.append(f"deepspeed: {cfg.deepspeed} asks for DeepSpeed, which is not installed: pip install -c "
                        "constraints.txt 'rlft[deepspeed]'")
    if compile_options(model_settings(cfg)) is not None and not torch.cuda.is_available() and not (
            os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        problems.append("torch_compile: on a CPU it compiles C++ code, and no C++ compiler was found (c++, g++, clang++ or "
                        "$CXX): install one (e.g. apt install g++) or remove the key")
    return problems


def parameter_lora_unbuilt(cfg) -> str | None:
    """What PEFT's LoRA on parameters is not built for in rlft yet (online RL, sharding), or None."""
    if method_spec(cfg.method).generates:
        return (f"with rl: {cfg.method}: sending parameter adapters' weights to the rollout engine is not built yet; use "
                "lora_target_modules, or train the experts with SFT or a preference method")
    if cfg.fsdp or cfg.fsdp_config or cfg.deepspeed:
        return f"with {'deepspeed' if cfg.deepspeed else 'fsdp'}: not built yet (tested on one process and DDP); remove one"
    return None  # (reference moves are the GRPO family's, which the first case refuses)
