"""The trained model as the processes run it: wrapped (DDP), sharded (FSDP2) or a DeepSpeed engine, with its
optimizer; and, with `torch_compile`, the compiled forward the recipe calls."""

from __future__ import annotations

import torch
from rich.console import Console

from rlft.config.parallel import deepspeed_settings, fsdp_settings
from rlft.config.settings import Settings
from rlft.config.settings.model import ModelSettings
from rlft.models import varlen
from rlft.models.compile import RECOMPILE_LIMIT, compile_options
from rlft.train import zero
from rlft.train.optim import build_optimizer
from rlft.train.parallel import shard_model, trains_in_bf16


def wrap(cfg, settings: Settings, model, accelerator, console: Console):
    """The model as the processes train it (as it is, DDP, sharded with FSDP2, or a DeepSpeed engine) and its
    optimizer (`settings.optim`)."""
    optim = settings.optim
    ds = deepspeed_settings(cfg)
    if ds is not None:  # also on one process: the same engine, so that runs compare across process counts
        return zero.initialize(ds, settings.parallel, optim, model, build_optimizer(optim, model), trains_in_bf16(cfg))
    fsdp = fsdp_settings(cfg)
    if fsdp is not None and accelerator.is_main_process:
        for note in fsdp.notes if accelerator.num_processes > 1 else ("fsdp with one process: nothing to shard",):
            console.print(f"note: {note}", markup=False, highlight=False)
    if fsdp is None or accelerator.num_processes == 1:
        return accelerator.prepare(model, build_optimizer(optim, model))
    shard_model(model.to(accelerator.device), fsdp)
    return model, accelerator.prepare(build_optimizer(optim, model))


def compiled_forward(model_settings: ModelSettings, model):
    """`torch_compile`: the trained model behind `torch.compile` (inductor; shapes that vary between batches make it
    compile a dynamic graph after the second one), else the model itself. Checkpoints, gradient sync and weight
    pushes keep using the model. Short rows on a CPU attend through SDPA's math path (`rlft.models.varlen`), unless
    the mode autotunes GEMMs."""
    options = compile_options(model_settings)
    if options is None:
        return model
    varlen.install()
    mode, backend = options
    # torch._inductor is imported only for torch_compile (seconds)
    from torch._inductor import config as inductor  # TORCHINDUCTOR_MAX_AUTOTUNE(_GEMM)=1 autotunes without a mode
    from torch._inductor import list_mode_options

    varlen.SHORT_ROWS_MATH = not (list_mode_options(mode or "default").get("max_autotune") or inductor.max_autotune
                                  or inductor.max_autotune_gemm)
    return torch.compile(model, backend=backend, mode=mode, recompile_limit=RECOMPILE_LIMIT)
