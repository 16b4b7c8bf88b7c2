"""Axolotl's multi-process keys, read into the settings rlft runs with.

`fsdp: [full_shard, auto_wrap]` with `fsdp_config: {...}` asks for sharded data parallelism. rlft runs it
as FSDP2 (`torch.distributed.fsdp.fully_shard`), whatever `fsdp_version` says: FSDP1 is deprecated in
PyTorch, and FSDP2 shards the same parameters with the same wrapping. `fsdp_config` keys are read with or
without their `fsdp_` prefix, as Axolotl and accelerate write them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

FSDP_OPTIONS = {"full_shard", "shard_grad_op", "auto_wrap", "offload"}
# FSDP1 knobs with no counterpart in FSDP2 (it always keeps original parameters, loads and syncs as it shards)
FSDP1_ONLY = {"use_orig_params", "sync_module_states", "cpu_ram_efficient_loading", "limit_all_gathers",
              "backward_prefetch", "forward_prefetch"}
FSDP_KEYS = {"version", "transformer_layer_cls_to_wrap", "reshard_after_forward", "offload_params",
             "activation_checkpointing", "auto_wrap_policy", "state_dict_type", "sharding_strategy"} | FSDP1_ONLY


def launched() -> tuple[int, int]:
    """(this process's rank, the number of training processes), as the launcher (torchrun, accelerate launch, `rlft
    train --num-processes`) set them in RANK and WORLD_SIZE; (0, 1) without a launcher. The one place rlft reads them."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def rows_per_process(cfg) -> int:
    """Rows one process trains per optimizer step: micro_batch_size x gradient_accumulation_steps."""
    return cfg.micro_batch_size * cfg.gradient_accumulation_steps


def rows_per_step(cfg, processes: int | None = None) -> int:
    """Rows one optimizer step trains over all processes: micro_batch_size x gradient_accumulation_steps x processes,
    the processes counted by `launched` (the launcher's WORLD_SIZE) unless given."""
    return rows_per_process(cfg) * (processes or launched()[1])


@dataclass(frozen=True)
class FsdpSettings:
    layer_classes: tuple[str, ...]  # empty: the model's own `_no_split_modules` (its decoder layer)
    wrap_layers: bool = True  # each such layer is its own FSDP unit (auto_wrap); False: one unit for the whole model
    reshard_after_forward: bool = True  # False: ZeRO-2-like (shard_grad_op), parameters stay gathered until backward
    offload_params: bool = False  # parameters, gradients and optimizer state live on the CPU
    activation_checkpointing: bool = False
    notes: tuple[str, ...] = ()  # keys read but without effect under FSDP2, said once at start


def _flag(value, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "false"):
        return str(value).lower() == "true"
    raise ValueError(f"fsdp_config.{key}: expected true or false, got {value!r}")


def fsdp_settings(cfg) -> FsdpSettings | None:
    """The FSDP2 settings `fsdp` / `fsdp_config` ask for, or None when FSDP is off. Raises ValueError naming the key."""
    options = set(cfg.fsdp or [])
    raw = dict(cfg.fsdp_config or {})
    if not options and not raw:
        return None
    unknown_options = sorted(options - FSDP_OPTIONS)
    if unknown_options:
        raise ValueError(f"fsdp: {', '.join(unknown_options)} not supported; use {sorted(FSDP_OPTIONS)} "
                         "(hybrid_shard and no_shard are not built: for plain data parallelism leave fsdp unset)")
    if raw and not options:
        options = {"full_shard", "auto_wrap"}  # fsdp_config alone: Axolotl's FSDP2 form
    config = {(key[5:] if key.startswith("fsdp_") else key): value for key, value in raw.items()}
    unknown = sorted(set(config) - FSDP_KEYS)
    if unknown:
        raise ValueError(f"fsdp_config: unknown keys {', '.join(unknown)}; known: {', '.join(sorted(FSDP_KEYS))}")
    if "full_shard" in options and "shard_grad_op" in options:
        raise ValueError("fsdp: full_shard and shard_grad_op are both listed: choose one")
    version = config.get("version", 2)
    if str(version) not in ("1", "2"):
        raise ValueError(f"fsdp_config.fsdp_version: expected 1 or 2, got {version!r}")
    notes = [f"fsdp_config.{key} has no effect under FSDP2" for key in sorted(set(config) & FSDP1_ONLY)]
    if str(version) == "1":
        notes.append("fsdp_version 1 runs as FSDP2 (FSDP1 is deprecated in PyTorch; same sharding, same wrapping)")
    policy = config.get("auto_wrap_policy", "TRANSFORMER_BASED_WRAP")
    if str(policy).upper() != "TRANSFORMER_BASED_WRAP":
        raise ValueError(f"fsdp_config.auto_wrap_policy: {policy!r} is not built; TRANSFORMER_BASED_WRAP (per decoder "
                         "layer) is what rlft shards by")
    state_dict_type = str(config.get("state_dict_type", "SHARDED_STATE_DICT")).upper()
    if state_dict_type not in ("SHARDED_STATE_DICT", "FULL_STATE_DICT"):
        raise ValueError(f"fsdp_config.state_dict_type: {state_dict_type!r}; expected SHARDED_STATE_DICT or FULL_STATE_DICT")
    if "state_dict_type" in config:
        notes.append("checkpoints hold both: a sharded optimizer state (torch.distributed.checkpoint) and the full model "
                     "as safetensors, whatever fsdp_state_dict_type says")
    strategy = str(config.get("sharding_strategy", "")).upper()
    if strategy and strategy not in ("FULL_SHARD", "SHARD_GRAD_OP", "1", "2"):
        raise ValueError(f"fsdp_config.sharding_strategy: {strategy!r} not supported; use FULL_SHARD or SHARD_GRAD_OP")
    reshard = _flag(config.get("reshard_after_forward", not ("shard_grad_op" in options or strategy in ("SHARD_GRAD_OP", "2"))),
                    "reshard_after_forward")
    classes = config.get("transformer_layer_cls_to_wrap") or ()
    if isinstance(classes, str):
        classes = tuple(name.strip() for name in classes.split(",") if name.strip())
    if not isinstance(classes, (list, tuple)) or not all(isinstance(name, str) for name in classes):
        raise ValueError(f"fsdp_config.transformer_layer_cls_to_wrap: expected a layer class name or a list of them (e.g. "
                         f"LlamaDecoderLayer), got {classes!r}")
    return FsdpSettings(
        layer_classes=tuple(classes), wrap_layers="auto_wrap" in options or bool(raw), reshard_after_forward=reshard,
        offload_params="offload" in options or _flag(config.get("offload_params", False), "offload_params"),
        activation_checkpointing=_flag(config.get("activation_checkpointing", False), "activation_checkpointing"),
        notes=tuple(notes),
    )


# DeepSpeed JSON files rlft ships, found by name when `deepspeed:` names a path that does not exist here
SHIPPED_DEEPSPEED = Path(__file__).resolve().parent.parent / "deepspeed_configs"
# sections of a DeepSpeed file that rlft builds from its own keys instead, or does not run
DEEPSPEED_REFUSED = {
    "optimizer": "rlft builds the optimizer from the config's optimizer, learning_rate, weight_decay and adam_* keys",
    "scheduler": "rlft builds the learning-rate schedule from lr_scheduler, warmup_steps / warmup_ratio",
}


@dataclass(frozen=True)
class DeepSpeedSettings:
    path: Path  # the file read
    config: dict  # its JSON; "auto" values are filled at train time (train/zero.py)
    stage: int  # ZeRO stage, 1-3
    offload: bool  # optimizer state or parameters live on the CPU


def deepspeed_file(setting: str) -> Path:
    """The file `deepspeed:` names: as written (relative to the working directory), else the shipped file of that
    name (Axolotl's `deepspeed_configs/zero3_bf16.json` idiom). Raises ValueError naming what exists."""
    path = Path(setting).expanduser()
    if path.is_file():
        return path
    shipped = SHIPPED_DEEPSPEED / path.name
    if not path.is_absolute() and shipped.is_file():
        return shipped
    names = ", ".join(sorted(p.name for p in SHIPPED_DEEPSPEED.glob("*.json")))
    raise ValueError(f"deepspeed: {setting} does not exist (relative paths start in the working directory {Path.cwd()}); "
                     f"rlft ships {names} under deepspeed_configs/, usable by that path from any folder")


def deepspeed_settings(cfg) -> DeepSpeedSettings | None:
    """The DeepSpeed file `deepspeed:` names, read and checked against the config, or None when unset. Raises
    ValueError naming the file and the problem."""

    if not cfg.deepspeed:
        return None
    path = deepspeed_file(cfg.deepspeed)
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"deepspeed: {path} is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"deepspeed: {path} holds a {type(config).__name__}, expected a JSON object")
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise ValueError(f"deepspeed: {path}: zero_optimization must be an object, got {zero!r}")
    stage = zero.get("stage", 0)
    if stage not in (1, 2, 3):
        raise ValueError(f"deepspeed: {path}: zero_optimization.stage must be 1, 2 or 3, got {stage!r} (stage 0 is plain data "
                         "parallelism: leave deepspeed unset and start several processes)")
    for section, why in DEEPSPEED_REFUSED.items():
        if section in config:
            raise ValueError(f"deepspeed: {path} has a {section!r} section, which rlft does not read: {why}. Remove it")
    compile_ = config.get("compile")
    if isinstance(compile_, dict) and compile_.get("disable", True) is False:
        raise ValueError(f"deepspeed: {path}: its compile section (DeepSpeed's torch.compile) is not built in rlft; remove it "
                         "(or use Axolotl's zero1.json / zero2.json / zero3.json without _torch_compile)")
    devices = {zero[key].get("device") for key in ("offload_optimizer", "offload_param") if isinstance(zero.get(key), dict)}
    if "nvme" in devices:
        raise ValueError(f"deepspeed: {path}: offload to nvme is not built in rlft (checkpoints read the optimizer state in "
                         "memory); offload to cpu, or remove the offload section")
    fp16 = config.get("fp16", {}).get("enabled") if isinstance(config.get("fp16"), dict) else None
    if fp16 is True or cfg.fp16:
        raise ValueError(f"deepspeed: fp16 with DeepSpeed is not built in rlft (its dynamic loss scale would fight rlft's "
                         f"gradient accumulation); use bf16 (in {path} and in the config)")
    bf16 = config.get("bf16", {}).get("enabled") if isinstance(config.get("bf16"), dict) else None
    if isinstance(bf16, bool) and isinstance(cfg.bf16, bool) and "bf16" in cfg.model_fields_set and bf16 != cfg.bf16:
        raise ValueError(f"deepspeed: {path} sets bf16.enabled: {str(bf16).lower()} and the config bf16: "
                         f"{str(cfg.bf16).lower()}: make them agree (or write \"auto\" in the file)")
    for key, ours, name in (("train_micro_batch_size_per_gpu", cfg.micro_batch_size, "micro_batch_size"),
                            ("gradient_accumulation_steps", cfg.gradient_accumulation_steps, "gradient_accumulation_steps"),
                            ("gradient_clipping", cfg.max_grad_norm or 0.0, "max_grad_norm")):
        value = config.get(key, "auto")
        if value != "auto" and value != ours:
            raise ValueError(f"deepspeed: {path} sets {key}: {value} and the config {name}: {ours}: make them agree (or "
                             "write \"auto\" in the file: rlft fills it from the config)")
    if "train_batch_size" in config and config["train_batch_size"] != "auto":
        raise ValueError(f"deepspeed: {path}: train_batch_size must be \"auto\": rlft sets it to micro_batch_size x "
                         "gradient_accumulation_steps x processes")
    return DeepSpeedSettings(path=path, config=config, stage=stage, offload="cpu" in devices)  # "none": no offload


def partitioned(cfg, processes: int) -> bool:
    """Whether the weights are split over the `processes` (FSDP2 or ZeRO-3), so that a whole copy must be gathered.
    DeepSpeed partitions ZeRO-3's parameters on one process too (each holds no elements outside the forward); FSDP2 on
    one process shards nothing (`rlft.train.wrap`)."""
    settings = deepspeed_settings(cfg)
    if settings is not None and settings.stage == 3:
        return True
    return processes >= 2 and fsdp_settings(cfg) is not None
