"""Rules on the multi-process keys: DDP, FSDP, DeepSpeed and context parallelism."""

from __future__ import annotations

from rlft.config.parallel import deepspeed_settings, fsdp_settings


def ddp_problems(cfg):
    defaults = {"ddp_find_unused_parameters": False, "ddp_broadcast_buffers": True}  # what DDP does anyway
    ddp_keys = [key for key in ("ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers")
                if getattr(cfg, key) is not None and getattr(cfg, key) != defaults.get(key)]
    if ddp_keys and (cfg.fsdp or cfg.fsdp_config or cfg.deepspeed):
        yield (f"{ddp_keys[0]} sets up DDP (plain data parallelism), and {'deepspeed' if cfg.deepspeed else 'fsdp'} reduces "
               "gradients its own way: remove it")


def sharding_problems(cfg):
    for settings in (fsdp_settings, deepspeed_settings):
        try:
            settings(cfg)
        except ValueError as exc:
            yield str(exc)
    if cfg.deepspeed and (cfg.fsdp or cfg.fsdp_config):
        yield "deepspeed and fsdp are both set: choose one way to shard the model"
    if cfg.context_parallel_size > 1 and (cfg.trl.async_prefetch or cfg.trl.use_data_producer):
        yield "context_parallel_size > 1 cannot be combined with trl.async_prefetch / trl.use_data_producer"
