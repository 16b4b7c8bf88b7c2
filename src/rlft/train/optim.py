"""Optimizer and learning-rate schedule from the run's `OptimSettings`, through transformers (the HF Trainer's names and curves).

`optimizer:` takes transformers' optimizer names (`adamw_torch`, `adamw_torch_fused`, `adafactor`,
`adamw_bnb_8bit`, `paged_adamw_8bit`, `lion_32bit`, `adamw_torch_8bit`, `schedule_free_adamw`, ...) plus
`adamw` and `adam`; transformers picks the class and its keyword arguments, so a name behaves as in
the HF Trainer and Axolotl. `lr_scheduler:` takes transformers' schedule names and runs
`transformers.get_scheduler`.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import warnings
from types import SimpleNamespace

import torch

from rlft.config.optimizers import ALIASES, TORCH_ADAMW
from rlft.config.settings.training import OptimSettings
from rlft.errors import ConfigError
from rlft.train import zero

NO_DECAY = ("bias", "norm", "layernorm", "ln_")


def optimizer_class(optim: OptimSettings, model: torch.nn.Module | None = None) -> tuple[type, dict]:
    """The optimizer class and keyword arguments transformers gives `optim.optimizer` (checked before the model loads)."""
    name = ALIASES.get(optim.optimizer, optim.optimizer)
    adam = {"lr": optim.learning_rate, "betas": optim.adam_betas, "eps": optim.adam_epsilon}
    if name == "adam":  # not one of transformers' names
        return torch.optim.Adam, adam
    if name in TORCH_ADAMW:
        return torch.optim.AdamW, {**adam, **TORCH_ADAMW[name]}
    from transformers import Trainer, TrainingArguments  # transformers: seconds, off the launching command's path

    # TrainingArguments' defaults without building one (its __post_init__ sets up devices and process groups)
    defaults = {f.name: f.default for f in dataclasses.fields(TrainingArguments) if f.default is not dataclasses.MISSING}
    beta1, beta2 = optim.adam_betas
    args = SimpleNamespace(**{**defaults, "optim": name, "learning_rate": optim.learning_rate, "adam_beta1": beta1,
                              "adam_beta2": beta2, "adam_epsilon": optim.adam_epsilon, "weight_decay": optim.weight_decay})
    try:
        return Trainer.get_optimizer_cls_and_kwargs(args, model)
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"optimizer: {optim.optimizer} cannot be built here: {str(exc).splitlines()[0]} "
                          "(adamw_torch_fused, the default, needs nothing extra)") from None


def build_optimizer(optim: OptimSettings, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The configured optimizer over trainable parameters; no weight decay on biases and norms."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if param.ndim < 2 or any(key in name.lower() for key in NO_DECAY) else decay).append(param)
    groups = [{"params": decay, "weight_decay": optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    cls, kwargs = optimizer_class(optim, model)
    return cls(groups, **kwargs)


DEFAULT_WARMUP_RATIO, DEFAULT_WARMUP_CAP = 0.03, 100  # Axolotl's warm-up when neither key is set


def warmup_steps(optim: OptimSettings, total_steps: int, epoch_steps: int | None = None) -> int:
    """The warm-up steps Axolotl gives the same config (`core/builders/base.py`), so that its configs run the same
    schedule here. `total_steps`: the steps the run trains; `epoch_steps`: the steps its `num_epochs` take (max_steps
    aside; default `total_steps`).

    `warmup_steps` when set (below 1, a fraction: `ceil(fraction * total_steps)`, as transformers reads it). For
    GRPO and EBFT Axolotl knows no step count and hands transformers a ratio:
    `ceil(r * total_steps)` with `r` = `warmup_ratio`, else 0.03. For the other methods it counts steps from the data,
    `epoch_steps`, capped by `max_steps` for SFT and reward models (the preference methods ignore `max_steps` there):
    `int(warmup_ratio * steps)`, else `min(int(0.03 * steps), 100)`. A count of 1 (not a ratio's) becomes 2."""
    if isinstance(optim.warmup_steps, float):  # below 1: a fraction of the run, as transformers' TrainingArguments reads it
        return math.ceil(optim.warmup_steps * total_steps)
    if optim.warmup_steps is not None:
        steps = optim.warmup_steps
    elif optim.warmup_as_ratio:  # Axolotl counts no steps: transformers applies a ratio
        return math.ceil((optim.warmup_ratio if optim.warmup_ratio is not None else DEFAULT_WARMUP_RATIO) * total_steps)
    else:
        counted = epoch_steps or total_steps
        if optim.warmup_count_cap:
            counted = min(counted, optim.warmup_count_cap)
        if optim.warmup_ratio is not None:
            steps = int(optim.warmup_ratio * counted)
        else:
            steps = min(int(DEFAULT_WARMUP_RATIO * counted), DEFAULT_WARMUP_CAP)
    return 2 if steps == 1 else steps


MIN_LR_SCHEDULES = ("cosine", "cosine_with_min_lr", "cosine_warmup_with_min_lr")
# each schedule's own arguments in transformers (required ones without a default), read here without importing
# transformers.optimization, which loads transformers' model modules: seconds of the launcher's start-up.
# tests/unit/test_optim.py checks the table against transformers' functions.
SCHEDULE_ARGUMENTS = {
    "linear": ((), ()), "cosine": (("num_cycles",), ()), "cosine_with_restarts": (("num_cycles",), ()),
    "polynomial": (("lr_end", "power"), ()), "constant": ((), ()), "constant_with_warmup": ((), ()),
    "inverse_sqrt": (("timescale",), ()), "cosine_with_min_lr": (("num_cycles", "min_lr", "min_lr_rate"), ()),
    "cosine_warmup_with_min_lr": (("num_cycles", "min_lr", "min_lr_rate", "warmup_lr_rate"), ()),
    "warmup_stable_decay": (("num_stable_steps", "warmup_type", "decay_type", "min_lr_ratio", "num_cycles"), ("num_decay_steps",)),
}


def schedule_name(optim: OptimSettings) -> str:
    """transformers' name for the config's schedule: `cosine` with `cosine_min_lr_ratio` > 0 is `cosine_with_min_lr`."""
    return "cosine_with_min_lr" if optim.lr_scheduler == "cosine" and optim.cosine_min_lr_ratio else optim.lr_scheduler


def scheduler_problem(optim: OptimSettings) -> str | None:
    """What transformers would refuse in the schedule's keys after the model has loaded (a missing or misspelt
    `lr_scheduler_kwargs` entry), or drop without a word (`cosine_min_lr_ratio` on another schedule; any kwargs of
    `constant` and `constant_with_warmup`, which transformers does not pass on)."""
    name, given = optim.lr_scheduler, set(optim.lr_scheduler_kwargs)
    if optim.cosine_min_lr_ratio and name not in MIN_LR_SCHEDULES:
        return (f"cosine_min_lr_ratio sets the final learning rate of a cosine schedule, and lr_scheduler is {name}: remove "
                "it, or use lr_scheduler: cosine")
    if name in ("constant", "constant_with_warmup"):
        return (f"lr_scheduler_kwargs: {name} takes none (transformers would drop {sorted(given)}): remove them"
                if given else None)
    name = schedule_name(optim)
    optional, required = SCHEDULE_ARGUMENTS[name]
    if unknown := sorted(given - set(optional) - set(required)):
        return (f"lr_scheduler_kwargs: {', '.join(unknown)} is not an argument of the {name} schedule; it takes "
                f"{', '.join(required + optional) or 'none'}")
    if {"min_lr", "min_lr_rate"} <= given:
        return "lr_scheduler_kwargs: min_lr and min_lr_rate both set the final learning rate: keep one"
    if missing := [key for key in required if key not in given]:
        return f"lr_scheduler_kwargs: the {name} schedule needs {', '.join(missing)}, e.g. lr_scheduler_kwargs: {{{missing[0]}: 100}}"
    return None


def build_scheduler(optim: OptimSettings, optimizer: torch.optim.Optimizer, total_steps: int, epoch_steps: int | None = None):
    """`transformers.get_scheduler` for `schedule_name(optim)` with the config's warm-up (`warmup_steps`)."""
    from transformers import get_scheduler  # transformers: seconds, off the launching command's path

    name, kwargs = schedule_name(optim), dict(optim.lr_scheduler_kwargs)
    if name in ("cosine_with_min_lr", "cosine_warmup_with_min_lr") and "min_lr" not in kwargs:
        kwargs.setdefault("min_lr_rate", optim.cosine_min_lr_ratio)
    return get_scheduler(name, optimizer, num_warmup_steps=warmup_steps(optim, total_steps, epoch_steps), num_training_steps=total_steps,
                         scheduler_specific_kwargs=kwargs or None)


def advance_schedule(scheduler, updated: bool) -> None:
    """`scheduler.step()`. The schedule counts steps whether or not the weights were updated; after a step the recipe
    skipped (no learning signal) it moves without torch's warning that it moved before the optimizer's first step."""
    if updated:
        scheduler.step()
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`")
        scheduler.step()


def inner_optimizer(optimizer):
    """The torch optimizer inside accelerate's `AcceleratedOptimizer` (any other optimizer as it is)."""
    return getattr(optimizer, "optimizer", optimizer)


def optimizer_mode(optimizer, training: bool) -> None:
    """Schedule-free optimizers (`schedule_free_adamw`, `schedule_free_radam`, `schedule_free_sgd`: schedulefree's, Defazio
    et al. 2024, arXiv:2405.15682) take their steps at one point and evaluate at another, the average: `train()` before
    steps and `eval()` before an evaluation, as transformers' Trainer calls them, and before a save, as the authors ask
    (a checkpoint and the final model hold the averaged weights). Other optimizers have neither method."""
    inner = optimizer
    while not callable(getattr(inner, "train", None)) and hasattr(inner, "optimizer"):  # accelerate's, DeepSpeed's wrappers
        inner = inner.optimizer
    switch = getattr(inner, "train" if training else "eval", None)
    if callable(switch):
        switch()


def reset_state(model, optimizer) -> None:
    """Start the optimizer's state again as a new optimizer's (Cosmos-RL's reset_optimizer_with_reference): Adam's
    moments zero and its step count 0; the parameter groups (learning rate, weight decay) and the schedule go on.

    The state is created at once rather than left empty: one step with zero gradients at learning rate and weight
    decay 0 (no weight moves), then every step count back to 0. An empty state would be created that way, with a step
    count of 1, by the next checkpoint save (torch.distributed.checkpoint's get_optimizer_state_dict), so a run saved
    right after a reset would train on differently from one that was not."""
    if zero.is_deepspeed(model):
        inner = zero.restart_optimizer(model)
    else:
        inner = inner_optimizer(optimizer)
        inner.state.clear()
        trained = [param for group in inner.param_groups for param in group["params"] if param.requires_grad]
        kept = [(group["lr"], group.get("weight_decay")) for group in inner.param_groups]
        for param in trained:
            param.grad = torch.zeros_like(param)
        for group in inner.param_groups:
            group["lr"] = torch.zeros_like(group["lr"]) if torch.is_tensor(group["lr"]) else 0.0
            if "weight_decay" in group:
                group["weight_decay"] = 0.0
        inner.step()
        for group, (rate, decay) in zip(inner.param_groups, kept):
            group["lr"] = rate
            if decay is not None:
                group["weight_decay"] = decay
        for param in trained:
            param.grad = None
    for state in inner.state.values():
        if torch.is_tensor(state.get("step")):
            state["step"].zero_()
        elif "step" in state:
            state["step"] = 0


def step_was_skipped(optimizer) -> bool:
    """Whether the last optimizer step left the weights as they were because fp16's loss scaler found an overflow.
    transformers' Trainer then leaves the learning-rate schedule where it is, and so does rlft. (DeepSpeed runs no
    fp16: `rlft.config.parallel` refuses it.)"""
    return bool(getattr(optimizer, "step_was_skipped", False))


def stepping_optimizer(optimizer):
    """What the loop calls `step` and `zero_grad` on: the torch optimizer inside accelerate's `AcceleratedOptimizer`
    where the wrapper adds only time, that is without a gradient scaler (fp16), off XLA and for an optimizer with a
    `step` of its own (LOMO's updates happen in the backward; the wrapper skips its step). The wrapper's `step` looks
    on disk for the LOMO package twice per call and its `zero_grad` reads the optimizer's signature, every step: the
    optimizer phase of a compiled SFT step at size S on 2 CPU cores took 2.25 ms through it, 1.75 ms without
    (`bench/optimizer_step.py`). Every rlft step syncs its gradients (the loop accumulates them itself), so the
    wrapper would call the same two methods. Any other optimizer (DeepSpeed's ZeRO optimizer) is returned as it is."""
    # accelerate imports torch.distributed's machinery: off the launching command's path
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.utils import DistributedType

    if (isinstance(optimizer, AcceleratedOptimizer) and optimizer.scaler is None and optimizer.gradient_state.sync_gradients
            and optimizer.accelerator_state.distributed_type != DistributedType.XLA
            and inspect.unwrap(type(optimizer.optimizer).step) is not inspect.unwrap(torch.optim.Optimizer.step)):
        return optimizer.optimizer
    return optimizer
