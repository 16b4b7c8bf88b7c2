"""Whether a config checkpoints the decoder layers' activations."""

from __future__ import annotations

from rlft.config.parallel import fsdp_settings


def checkpoints(cfg) -> bool:
    """Whether the layers are checkpointed: `gradient_checkpointing`, or fsdp_config's `activation_checkpointing`, which
    means the same (docs/distributed.md)."""
    settings = fsdp_settings(cfg)
    return bool(cfg.gradient_checkpointing) or bool(settings is not None and settings.activation_checkpointing)
