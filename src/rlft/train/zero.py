"""DeepSpeed ZeRO (`deepspeed: file.json`), fitted to rlft's one training loop.

rlft calls `deepspeed.initialize` itself with the optimizer it builds from the config (as it calls FSDP2 itself),
so the loop keeps its own gradient accumulation: each micro-batch's loss sum goes through `engine.backward`, the
last one of a step marks the accumulation boundary, and the step's scale (loss units over the window and the
ranks) is applied as ZeRO's loss scale just before `engine.step()`, which clips with `gradient_clipping`
(= max_grad_norm) and updates. The file's "auto" values are filled from the config, as Axolotl does.

Checkpoints keep the optimizer state per parameter name, whole (`optimizer/zero.json` and `zero-R.safetensors`,
each parameter written by one process): it loads on any number of processes and any ZeRO stage, and reads no
code. DeepSpeed's own checkpoint files would need `torch.load(weights_only=False)` and the same process count.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file

from rlft.config.parallel import DeepSpeedSettings
from rlft.config.settings.training import OptimSettings, ParallelSettings

INDEX = "zero.json"


def is_deepspeed(model) -> bool:
    return type(model).__name__ == "DeepSpeedEngine"


def zero3_parameters(module: torch.nn.Module) -> bool:
    """Whether ZeRO-3 holds `module`'s parameters as partitions (each process keeps a slice; numel() is 0)."""
    return any(hasattr(p, "ds_id") for p in module.parameters())


def engine_config(settings: DeepSpeedSettings, parallel: ParallelSettings, optim: OptimSettings, bf16: bool,
                  hidden_size: int | None) -> dict[str, Any]:
    """The DeepSpeed config to run: the file, with its "auto" values filled from the rlft config."""
    config = json.loads(json.dumps(settings.config))  # a deep copy
    config["train_micro_batch_size_per_gpu"] = parallel.micro_batch_size
    config["gradient_accumulation_steps"] = parallel.gradient_accumulation_steps
    config["train_batch_size"] = parallel.rows_per_step
    config["gradient_clipping"] = optim.max_grad_norm
    config["bf16"] = {**config.get("bf16", {}), "enabled": bf16}
    config["fp16"] = {**config.get("fp16", {}), "enabled": False}
    config.setdefault("steps_per_print", 2**31 - 1)  # rlft prints its own step lines
    config["zero_allow_untested_optimizer"] = True  # the optimizer is transformers' choice, by `optimizer:`
    zero = config.setdefault("zero_optimization", {})
    if settings.offload:  # a torch optimizer on CPU tensors, not DeepSpeed's compiled CPU Adam
        config["zero_force_ds_cpu_optimizer"] = False
    sizes = {"reduce_bucket_size": 1.0, "stage3_prefetch_bucket_size": 0.9, "stage3_param_persistence_threshold": 10}
    for key, factor in sizes.items():
        if zero.get(key) == "auto":
            if hidden_size:
                zero[key] = int(factor * hidden_size * (hidden_size if key != "stage3_param_persistence_threshold" else 1))
            else:
                del zero[key]  # DeepSpeed's default
    return config


def initialize(settings: DeepSpeedSettings, parallel: ParallelSettings, optim: OptimSettings, model: torch.nn.Module,
               optimizer, bf16: bool):
    """`deepspeed.initialize` on the model and rlft's optimizer: (engine, ZeRO optimizer)."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")  # said, not guessed with a warning
    import deepspeed  # optional (rlft[deepspeed]) and slow to import: only for a `deepspeed:` run
    import deepspeed.ops

    # On a CPU DeepSpeed would compile its shared-memory collectives with g++ on first use (45 s on 2 cores), which only
    # its inference all-reduce calls; training's collectives go through torch.distributed (gloo). Its table of ops
    # this machine can build is kept in the module for such edits.
    if not torch.cuda.is_available():
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    # DeepSpeed calls torch.distributed functions that torch has renamed: not the user's concern
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)
    hidden = getattr(getattr(model, "config", None), "hidden_size", None)
    config = engine_config(settings, parallel, optim, bf16, hidden)
    engine, zero_optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config, dist_init_required=False)
    return engine, zero_optimizer


def backward(engine, loss: torch.Tensor, last: bool) -> None:
    """One micro-batch's backward; `last` marks the step's accumulation boundary (gradients reduced there)."""
    if engine.optimizer.loss_scale != 1.0:
        engine.optimizer.override_loss_scale(1.0)
    engine.set_gradient_accumulation_boundary(last)
    engine.backward(loss, scale_wrt_gas=False)


def step(engine, factor: float) -> float:
    """Scale the accumulated gradients by `factor`, clip (`gradient_clipping`) and update. Returns the gradient norm
    before clipping (of the scaled gradients, as with the other strategies)."""
    engine.optimizer.override_loss_scale(1.0 / factor)  # ZeRO divides the gradients by its loss scale
    engine.step()
    norm = engine.get_global_grad_norm()
    engine.optimizer.override_loss_scale(1.0)
    return float(norm if norm is not None else 0.0)


def local_values(param: torch.Tensor) -> torch.Tensor:
    """The values this process holds of `param` (its ZeRO-3 partition)."""
    return param.ds_tensor if hasattr(param, "ds_tensor") else param


def gathered_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A ZeRO-3 module's whole state dict on the CPU of rank 0 (empty elsewhere), gathered one parameter at a time:
    a collective, every rank calls it."""
    import deepspeed  # optional, as in initialize

    rank0 = dist.get_rank() == 0
    owner = next((p._z3_optimizer for p in module.parameters() if hasattr(p, "_z3_optimizer")), None)
    if owner is not None:  # an evaluation may have left prefetched parameters in flight: settle them first
        owner.empty_partition_cache()
    gathered: dict[int, torch.Tensor] = {}
    for param in module.parameters():
        with deepspeed.zero.GatheredParameters([param]):
            if rank0:
                gathered[id(param)] = param.detach().to("cpu", copy=True)
    if not rank0:
        return {}
    return {key: gathered.get(id(value), value.detach().cpu()) for key, value in module.state_dict(keep_vars=True).items()}


# ------------------------------------------------------------------ optimizer state in checkpoints

def _inner(engine):
    return engine.optimizer.optimizer  # the torch optimizer over ZeRO's flat fp32 partitions


def _trained(engine) -> list[tuple[str, torch.nn.Parameter]]:
    return [(name, p) for name, p in engine.module.named_parameters() if p.requires_grad]


def _flats(engine) -> list[tuple[dict, torch.Tensor]]:
    """ZeRO's flat fp32 partitions with the optimizer parameter group of each (ZeRO-3 splits groups into sub-groups)."""
    zero_optimizer, groups = engine.optimizer, _inner(engine).param_groups
    if hasattr(zero_optimizer, "fp32_partitioned_groups_flat"):  # ZeRO-3
        return [(groups[zero_optimizer.sub_group_to_group_id[i]], flat)
                for i, flat in enumerate(zero_optimizer.fp32_partitioned_groups_flat)]
    return list(zip(groups, zero_optimizer.single_partition_of_fp32_groups))  # ZeRO-1/2


def _state_keys(engine) -> tuple[list[str], dict[str, Any]]:
    """The optimizer state's per-element keys (exp_avg, ...) and its scalars (step), read from the flat partitions."""
    inner = _inner(engine)
    for _, flat in _flats(engine):
        state = inner.state.get(flat)
        if state:
            keys = [k for k, v in state.items() if torch.is_tensor(v) and v.numel() == flat.numel() and v.numel() > 1]
            scalars = {k: float(v) for k, v in state.items() if k not in keys and (torch.is_tensor(v) or isinstance(v, (int, float)))}
            return keys, scalars
    return [], {}


@dataclass
class OptimizerShard:
    """What one process writes of the optimizer state: its parameters' values, copied to the CPU, and (rank 0) the
    index."""

    rank: int
    values: dict[str, torch.Tensor]
    index: dict[str, Any] | None


def optimizer_shard(engine) -> OptimizerShard:
    """Each trained parameter's whole optimizer state (and fp32 master weights when the model trains in bf16), held by
    one process (parameter i by rank i mod processes), as tensors that later steps leave alone: DeepSpeed's
    safe_get_full_* gather each into a buffer of its own (a zeroed or empty one filled by an all-reduce or all-gather),
    which goes to the CPU in fp32 without a further copy where it is there already. A collective: every rank calls it."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state  # optional, as in initialize

    rank, world = dist.get_rank(), dist.get_world_size()
    keys, scalars = _state_keys(engine)
    _link(engine)
    master = any(p.dtype != torch.float32 for _, p in _trained(engine))
    mine: dict[str, torch.Tensor] = {}
    owners: dict[str, int] = {}
    for index, (name, param) in enumerate(_trained(engine)):
        owner = index % world
        owners[name] = owner
        values = {key: safe_get_full_optimizer_state(param, key) for key in keys}
        if master:
            values["fp32"] = safe_get_full_fp32_param(param)
        if owner == rank:  # each value is a new buffer the gather filled, which no later step writes: moved, not copied
            mine.update({f"{name}::{key}": value.detach().to("cpu", torch.float32).contiguous() for key, value in values.items()})
    index = {"format": "rlft-zero-1", "processes": world, "keys": keys + (["fp32"] if master else []), "scalars": scalars,
             "owners": owners} if rank == 0 else None
    return OptimizerShard(rank, mine, index)


def write_optimizer(shard: OptimizerShard, folder: Path) -> None:
    """Write `shard` into `folder`: zero-R.safetensors, and zero.json from rank 0. Any thread; no collective."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file(shard.values, str(folder / f"zero-{shard.rank}.safetensors"))
    if shard.index is not None:
        (folder / INDEX).write_text(json.dumps(shard.index, indent=1))


def _prime(engine) -> None:
    """Create the optimizer's state (torch optimizers do it at their first step) without changing anything: one step
    of each flat partition with a zero gradient at learning rate 0."""
    inner = _inner(engine)
    saved = [(group["params"], group["lr"]) for group in inner.param_groups]
    for group, flat in _flats(engine):
        for other in inner.param_groups:
            other["params"], other["lr"] = [], 0.0
        group["params"] = [flat]
        kept = flat.grad  # offloaded optimizer state: ZeRO's own gradient buffer, kept (zeroed) between steps
        flat.grad = torch.zeros_like(flat) if kept is None else kept.zero_()
        inner.step()
        flat.grad = kept
    for group, (params, lr) in zip(inner.param_groups, saved):
        group["params"], group["lr"] = params, lr
    _link(engine)


def _link(engine) -> None:
    """ZeRO-1/2: point each parameter's view (what safe_get/set_full_optimizer_state read) at its group's optimizer
    state. DeepSpeed links once, after its first update of the first group, when a second group (the parameters
    without weight decay) has no state yet."""
    optimizer = engine.optimizer
    if hasattr(optimizer, "_lazy_init_hp_params_optimizer_state"):
        optimizer._hp_optimizer_states_linked = False
        optimizer._lazy_init_hp_params_optimizer_state()


def load_optimizer(engine, folder: Path) -> None:
    """Load what `write_optimizer` wrote, written by any number of processes, into this run's partitions."""
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state  # optional, as in initialize

    index = json.loads((folder / INDEX).read_text())
    _prime(engine)
    handles = {rank: safe_open(str(folder / f"zero-{rank}.safetensors"), framework="pt") for rank in set(index["owners"].values())}
    trained = dict(_trained(engine))
    missing = sorted(set(trained) - set(index["owners"]))
    if missing:
        raise KeyError(f"the optimizer state has no entry for {missing[:3]}: was it saved for another model or adapter?")
    for name, param in trained.items():
        handle = handles[index["owners"][name]]
        for key in index["keys"]:
            value = handle.get_tensor(f"{name}::{key}").to(local_values(param).device)
            if key == "fp32":
                safe_set_full_fp32_param(param, value)
            else:
                safe_set_full_optimizer_state(param, value, key)
    inner = _inner(engine)
    for _, flat in _flats(engine):
        state = inner.state[flat]
        for key, value in index["scalars"].items():
            if key in state:
                state[key] = torch.tensor(value, dtype=state[key].dtype) if torch.is_tensor(state[key]) else type(state[key])(value)


def restart_optimizer(engine):
    """Drop the optimizer state of ZeRO's flat partitions and create it again as its first step would (`_prime`); the
    torch optimizer that holds it (rlft.train.optim.reset_state sets its step counts back to 0)."""
    inner = _inner(engine)
    inner.state.clear()
    _prime(engine)
    return inner


def optimizer_files_problem(folder: Path) -> str | None:
    """Why the ZeRO optimizer folder cannot be read (an unreadable index, a missing or unreadable shard), or None."""
    try:
        index = json.loads((folder / INDEX).read_text())
        owners = set(index["owners"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"optimizer/{INDEX} is unreadable ({type(exc).__name__}: {exc})"
    for rank in sorted(owners):
        shard = folder / f"zero-{rank}.safetensors"
        try:
            with safe_open(str(shard), framework="pt") as handle:
                handle.keys()
        except Exception as exc:  # safetensors raises its own error types for truncated files
            return f"optimizer/{shard.name} is unreadable ({exc})"
    return None
