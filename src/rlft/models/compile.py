"""`torch_compile`: whether and how this run compiles its forwards (the training forward, `rlft.train.wrap`, and the
rollout's decode step, `rlft.rollout.compiled`)."""

from __future__ import annotations

import os

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


def compile_plan(settings: ModelSettings, engine_decodes: bool = False) -> str | None:
    """The plan's line on compiling: which compile runs and why, what the first steps pay for it, or None when nothing
    compiles and nothing asked to. `engine_decodes`: the run's in-process rollout engine decodes too (through a static
    KV cache and a compiled step, `rlft.rollout.compiled`).

    `accelerate launch` sets ACCELERATE_DYNAMO_BACKEND from a user's `accelerate config`, and accelerate's `prepare`
    would then wrap the model in a compile of its own; rlft's accelerator is made with that plugin off
    (`rlft.train.parallel.make_accelerator`), so `torch_compile` alone decides and the model is compiled once."""
    asked = os.environ.get("ACCELERATE_DYNAMO_BACKEND", "")
    accelerate = f"ACCELERATE_DYNAMO_BACKEND={asked} (accelerate's compile, from `accelerate config`)"
    asked = asked.lower() not in ("", "no")
    flag = str(settings.torch_compile).lower()
    options = compile_options(settings)
    if options is None:
        if not asked:
            return None
        why = "auto: CUDA GPUs only" if flag == "auto" else flag
        return (f"none (torch_compile: {why}); {accelerate} is not applied: rlft compiles only as torch_compile says "
                "(set torch_compile: true, with torch_compile_backend for a backend other than inductor)")
    mode, backend = options
    line = f"rlft's torch.compile of the training forward (torch_compile: {flag}; {backend}, mode {mode or 'default'})"
    if engine_decodes:
        line += "; the rollout engine decodes with a static KV cache and a compiled step"
    if asked:
        line += f"; {accelerate} is not applied on top: the model is compiled once"
    return line + "; the first steps compile (seconds to a minute), then run faster"
