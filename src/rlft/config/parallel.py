"""Axolotl's multi-process keys, read into the settings rlft runs with.

`fsdp: [full_shard, auto_wrap]` with `fsdp_config: {...}` asks for sharded data parallelism. rlft runs it
as FSDP2 (`torch.distributed.fsdp.fully_shard`), whatever `fsdp_version` says: FSDP1 is deprecated in
PyTorch, and FSDP2 shards the same parameters with the same wrapping. `fsdp_config` keys are read with or
without their `fsdp_` prefix, as Axolotl and accelerate write them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

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
    return FsdpSettings(
        layer_classes=tuple(classes), wrap_layers="auto_wrap" in options or bool(raw), reshard_after_forward=reshard,
        offload_params="offload" in options or _flag(config.get("offload_params", False), "offload_params"),
        activation_checkpointing=_flag(config.get("activation_checkpointing", False), "activation_checkpointing"),
        notes=tuple(notes),
    )
