"""`torch_compile`: whether and how this run compiles its forwards (the training forward, `rlft.train.wrap`, and the
rollout's decode step, `rlft.rollout.compiled`)."""

from __future__ import annotations

import torch

from rlft.config.settings.model import ModelSettings

# graphs that one compiled function keeps (dynamo's default is 8): of a decoder's step, the batch sizes of training,
# evaluation and the last chunk, and each cache growth; of the training forward, its batch shapes
RECOMPILE_LIMIT = 64


def compile_options(settings: ModelSettings) -> tuple[str | None, str] | None:
    """(mode, backend) of the compiled forwards when `torch_compile` asks for them on this machine, else None."""
    if settings.torch_compile is True or (settings.torch_compile == "auto" and torch.cuda.is_available()):
        return settings.torch_compile_mode, settings.torch_compile_backend
    return None
