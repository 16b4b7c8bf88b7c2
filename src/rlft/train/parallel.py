"""Training on several processes: the process group, how the model is wrapped, and the collectives the loop needs.

Processes come from a launcher (`rlft train --num-processes N`, `accelerate launch`, `torchrun`, `srun`)
and are found through its environment only (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT);
accelerate starts the process group (NCCL on CUDA, gloo on CPU). Strategies:

* one process: the model as it is;
* data parallel (DDP), the default with N > 1: a full copy per process, gradients all-reduced;
* FSDP2 (`fsdp` / `fsdp_config`): parameters, gradients and optimizer state sharded over the processes with
  `torch.distributed.fsdp.fully_shard`, one unit per decoder layer. rlft calls it directly, the call
  accelerate makes on GPUs, so the same code runs on CPU (gloo), where accelerate has no FSDP;
* DeepSpeed ZeRO-1/2/3 (`deepspeed: file.json`): `deepspeed.initialize`, also called directly (train/zero.py).

Every collective runs on the main thread, in the same order on every rank; a checkpoint written in the background
(`save_mode: async`) has a process group of its own (train/checkpoint_save.py).
"""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Iterator

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

from rlft.config.parallel import deepspeed_settings, fsdp_settings, launched
from rlft.config.settings.model import model_settings
from rlft.errors import ConfigError
from rlft.train.launch import check_devices
from rlft.train.zero import gathered_state_dict as zero_gathered_state_dict
from rlft.train.zero import is_deepspeed, local_values, zero3_parameters


def make_accelerator(cfg):
    cuda = torch.cuda.is_available()
    if cfg.fp16 and not cuda:
        raise ConfigError("fp16: true needs a CUDA GPU (CPUs have no fast float16 path): use bf16 or fp32")
    processes = launched()[1]
    if cuda:  # started by torchrun or accelerate launch directly: the same check as `rlft train --num-processes`
        check_devices(int(os.environ.get("LOCAL_WORLD_SIZE", processes)))
    bf16 = trains_in_bf16(cfg) and not cfg.deepspeed  # DeepSpeed keeps bf16 weights itself: no autocast on top
    if cuda:
        cuda_settings(cfg)
    # a rank that hangs (not one that dies: the launcher stops the others at once) fails the others after ddp_timeout
    handlers = [InitProcessGroupKwargs(timeout=timedelta(seconds=cfg.ddp_timeout))] if processes > 1 else []
    if processes > 1 and ddp_options(cfg):
        handlers.append(DistributedDataParallelKwargs(**ddp_options(cfg)))
    # dynamo_backend "no": torch_compile alone compiles (rlft.train.wrap.compiled_forward); accelerate would otherwise
    # compile the model too when ACCELERATE_DYNAMO_BACKEND is set (`accelerate config`): rlft.models.compile.compile_plan
    accelerator = Accelerator(mixed_precision="bf16" if bf16 else ("fp16" if cfg.fp16 else "no"), cpu=not cuda,
                              kwargs_handlers=handlers, dynamo_backend="no")
    if cfg.deepspeed and processes == 1:  # DeepSpeed needs a process group, also of one
        _single_process_group()
    return accelerator


def ddp_options(cfg) -> dict:
    """DDP's keyword arguments from the `ddp_*` keys that are set (accelerate and PyTorch's defaults otherwise)."""
    keys = {"ddp_find_unused_parameters": "find_unused_parameters", "ddp_bucket_cap_mb": "bucket_cap_mb",
            "ddp_broadcast_buffers": "broadcast_buffers"}
    return {name: getattr(cfg, key) for key, name in keys.items() if getattr(cfg, key) is not None}


def cuda_settings(cfg) -> None:
    """The training process's CUDA switches: TF32 matmuls with `tf32: true` (or `auto`, the default, on a GPU that has
    them, as Axolotl decides it: transformers' `is_torch_tf32_available`), and masked attention (SDPA with a mask)
    on PyTorch's memory-efficient kernel instead of cuDNN's. cuDNN's builds a plan for every new batch shape, and its
    backward has returned NaN gradients with attention masks on Hopper GPUs (pytorch/pytorch#196678,
    huggingface/trl#7181); rlft's GRPO on an H200 got one at its first step (docs/training.md#attention)."""
    # transformers takes seconds to import: not at the top, since `rlft train --num-processes N` imports this module
    # to check a config before it launches the processes
    from transformers.utils import is_torch_tf32_available

    if cfg.tf32 is True or (cfg.tf32 == "auto" and is_torch_tf32_available()):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.enable_cudnn_sdp(False)


def trains_in_bf16(cfg) -> bool:
    """bf16: true, or `auto` on a GPU that has it; a DeepSpeed file's explicit bf16.enabled wins over `auto` or unset."""
    settings = deepspeed_settings(cfg)
    written = (settings.config.get("bf16") or {}).get("enabled") if settings else None
    if (cfg.bf16 == "auto" or "bf16" not in cfg.model_fields_set) and isinstance(written, bool):
        return written
    return cfg.bf16 is True or (cfg.bf16 == "auto" and not cfg.fp16 and torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def precision(cfg, accelerator) -> str:
    """What the matmuls run in: bf16, fp16 or fp32."""
    if cfg.deepspeed:
        return "bf16" if trains_in_bf16(cfg) else "fp32"
    return accelerator.mixed_precision if accelerator.mixed_precision in ("bf16", "fp16") else "fp32"


def strategy(cfg, processes: int) -> str | None:
    """How the processes share the model, for the plan; None for one process as it is."""
    settings = deepspeed_settings(cfg)
    if settings is not None:
        return f"DeepSpeed ZeRO-{settings.stage} ({settings.path.name}{', offloaded to the CPU' if settings.offload else ''})"
    if processes == 1:
        return None
    if fsdp_settings(cfg):
        return "FSDP2 (parameters, gradients and optimizer state sharded)"
    options = ddp_options(cfg)
    named = {"find_unused_parameters": lambda on: "looks for unused parameters" if on else "",
             "bucket_cap_mb": lambda mib: f"{mib} MiB gradient buckets",
             "broadcast_buffers": lambda on: "" if on else "no buffer broadcast"}
    said = [text for name, value in options.items() if (text := named[name](value))]
    return f"data parallel (DDP{': ' + ', '.join(said) if said else ''})"


def _single_process_group() -> None:
    if dist.is_initialized():
        return
    with socket.socket() as probe:  # a free port on this machine only
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=0, world_size=1)
    os.environ.setdefault("LOCAL_RANK", "0")  # what a launcher would have set: DeepSpeed reads it


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule  # seconds to import: only where a model may be sharded

    return isinstance(model, FSDPModule)


def layer_classes(model: torch.nn.Module, settings) -> set[str]:
    """The class names FSDP2 makes units of (`fsdp_transformer_layer_cls_to_wrap`, else the model's own
    `_no_split_modules`); a ConfigError naming the model's layer classes when one is missing."""
    present = {type(module).__name__ for module in model.modules()}
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    classes = set(settings.layer_classes or getattr(base, "_no_split_modules", None) or ())
    missing = sorted(classes - present)
    if settings.wrap_layers and (missing or not classes):
        layers = sorted(name for name in present if name.endswith(("DecoderLayer", "Block", "Layer")))
        raise ConfigError(f"fsdp_config.fsdp_transformer_layer_cls_to_wrap: {', '.join(missing) or '(none)'} is not a layer of "
                          f"{type(base).__name__}; its layer classes: {', '.join(layers) or 'none found'}")
    return classes


def check_layer_classes(cfg) -> None:
    """Before any process starts: the layer classes `fsdp_config` names exist in the model (built on the meta device
    from its config, no weights read)."""
    settings = fsdp_settings(cfg)
    if settings is None or not settings.wrap_layers:
        return
    # transformers (and models.loading, which imports it) take seconds: imported here, only for a config that names
    # layer classes, so that the launching command stays quick otherwise (see cuda_settings)
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlft.models.loading import base_model_source, hub_revision, model_source

    model = model_settings(cfg)  # the launching command checks this before any process resolves its settings
    source = model_source(model, cfg.base_model_config, "base_model_config") if cfg.base_model_config else base_model_source(model)
    config = AutoConfig.from_pretrained(source, trust_remote_code=cfg.trust_remote_code, **hub_revision(model, source))
    with torch.device("meta"):
        layer_classes(AutoModelForCausalLM.from_config(config, trust_remote_code=cfg.trust_remote_code), settings)


def shard_model(model: torch.nn.Module, settings) -> torch.nn.Module:
    """Apply FSDP2 in place: each decoder layer (`fsdp_transformer_layer_cls_to_wrap`, else the model's own
    `_no_split_modules`) becomes a unit, then the root. Names the model's layer classes when one is missing."""
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard  # seconds to import (is_sharded)

    classes = layer_classes(model, settings)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if settings.activation_checkpointing and not base.is_activation_checkpointing:  # loading turns it on (checkpoints)
        base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    options: dict[str, Any] = {"reshard_after_forward": settings.reshard_after_forward}
    if settings.offload_params:
        options["offload_policy"] = CPUOffloadPolicy()
    if settings.wrap_layers:
        for module in model.modules():
            if type(module).__name__ in classes:
                fully_shard(module, **options)
    fully_shard(model, **options)
    return model


@contextmanager
def unused_parameters_named() -> Iterator[None]:
    """DDP's error for a parameter that got no gradient in the step before, as the key that fixes it."""
    try:
        yield
    except RuntimeError as exc:
        if "Expected to have finished reduction in the prior iteration" not in str(exc):
            raise
        which = str(exc).split("Parameter indices which did not receive grad", 1)[1:]
        detail = f" (PyTorch: parameter indices which did not receive grad{which[0].splitlines()[0]})" if which else ""
        raise ConfigError("some of the model's parameters got no gradient in the last step, and DDP expects every one "
                          "to (a module the forward skips, e.g. a vision tower in text-only training): set "
                          f"ddp_find_unused_parameters: true{detail}") from None


@contextmanager
def gradient_sync(model, sync: bool) -> Iterator[None]:
    """Reduce gradients in this backward only when `sync` (the last micro-batch of a step). DeepSpeed is told in its
    own backward (zero.backward)."""
    if sync or is_deepspeed(model):
        yield
    elif is_sharded(model):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    elif hasattr(model, "no_sync"):
        with model.no_sync():
            yield
    else:
        yield


def gathered_state_dict(model) -> dict[str, torch.Tensor] | None:
    """A sharded (FSDP2, ZeRO-3) model's whole state dict, on the CPU of rank 0 (empty elsewhere): a collective, every
    rank calls it. None for a model that is whole on every rank already (one process, DDP, ZeRO-1/2)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict  # as shard_model's

    module = getattr(model, "module", model) if is_deepspeed(model) else model
    if zero3_parameters(module):
        return zero_gathered_state_dict(module)
    if not is_sharded(model):
        return None
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def sum_across(values: list[float], device) -> list[float]:
    """Element-wise sums over all ranks (the values themselves with one process)."""
    if not distributed():
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def not_finite_anywhere(params: list[torch.Tensor], device) -> bool:
    """Whether any process holds a NaN or infinite value in its part of `params` (a collective). The count of tensors
    with one stays on `device` through the sum over processes: the host reads one number, once."""
    local = [p.to_local() if hasattr(p, "to_local") else local_values(p) for p in params]
    found = [(~torch.isfinite(values)).any().to(device) for values in local]
    count = torch.stack(found).sum(dtype=torch.float32) if found else torch.zeros((), device=device)
    if distributed():
        dist.all_reduce(count)
    return bool(count)


def max_across(value: float, device) -> float:
    if not distributed():
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor)


def mean_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Each metric averaged over the ranks that report it; phase times (`time/*`) are the slowest rank's."""
    if not distributed():
        return metrics
    gathered = gather_objects([metrics])
    out: dict[str, float] = {}
    for key in sorted({k for part in gathered for k in part}):
        values = [part[key] for part in gathered if key in part]
        out[key] = max(values) if key.startswith("time/") else sum(values) / len(values)
    return out


def gather_objects(items: list[Any]) -> list[Any]:
    """Every rank's list, concatenated in rank order, on every rank."""
    if not distributed():
        return list(items)
    gathered: list[list[Any]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, items)
    return [item for part in gathered for item in part]


def eval_share(batches: list[Any], rank: int, world: int) -> list[tuple[Any, float]]:
    """This process's evaluation batches (every world-th) with weight 1, padded with weight-0 repeats to the count
    of the others (FSDP's collectives need as many forward passes on each)."""
    mine = [(batch, 1.0) for batch in batches[rank::world]]
    most = -(-len(batches) // world)
    return mine + [(batches[0], 0.0)] * (most - len(mine)) if batches else []


def sum_dicts(values: dict[str, float]) -> dict[str, float]:
    """Key-wise sums over all ranks (the dict itself with one process)."""
    out: dict[str, float] = {}
    for part in gather_objects([values]):
        for key, value in part.items():
            out[key] = out.get(key, 0.0) + value
    return out


def broadcast_object(value: Any) -> Any:
    """Rank 0's `value` on every rank (pickled; tensors travel on the CPU)."""
    if not distributed():
        return value
    box = [value if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def peer_failure(exc: BaseException) -> bool:
    """Whether `exc` is this process's side of another process's failure: a collective whose peer went away."""
    text = str(exc)
    return launched()[1] > 1 and (isinstance(exc, getattr(dist, "DistError", ())) or "closed by peer" in text
                                         or "reset by peer" in text)


def barrier() -> None:
    if distributed():
        dist.barrier()
