"""Optimizer and learning-rate schedule from the config."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR

NO_DECAY = ("bias", "norm", "layernorm", "ln_")


def build_optimizer(cfg, model: torch.nn.Module) -> torch.optim.Optimizer:
    """AdamW/Adam/SGD/RMSprop/Adagrad over trainable parameters; no weight decay on biases and norms."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if param.ndim < 2 or any(key in name.lower() for key in NO_DECAY) else decay).append(param)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    lr = cfg.learning_rate
    betas = (cfg.adam_beta1, cfg.adam_beta2)
    if cfg.optimizer in ("adamw_torch", "adamw", "adamw_torch_fused"):
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=cfg.adam_epsilon, fused=cfg.optimizer == "adamw_torch_fused" or None)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(groups, lr=lr, betas=betas, eps=cfg.adam_epsilon)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=0.9)
    if cfg.optimizer == "rmsprop":
        return torch.optim.RMSprop(groups, lr=lr, eps=cfg.adam_epsilon)
    return torch.optim.Adagrad(groups, lr=lr, eps=cfg.adam_epsilon)


def warmup_steps(cfg, total_steps: int) -> int:
    if cfg.warmup_steps is not None:
        return cfg.warmup_steps
    return math.ceil((cfg.warmup_ratio or 0.0) * total_steps)


def lr_multiplier(step: int, total: int, warmup: int, kind: str, min_ratio: float = 0.0) -> float:
    """Learning-rate factor at `step` (0-based).

    Warm-up (not for `constant`, as in transformers): (step + 1) / (warmup + 1) for step < warmup, so
    the first step already learns (transformers starts at 0). Then cosine from 1 to min_ratio, linear
    to 0, or constant 1, over the remaining total - warmup steps.
    """
    if kind == "constant":
        return 1.0
    if warmup and step < warmup:
        return (step + 1) / (warmup + 1)
    if kind == "constant_with_warmup":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if kind == "linear":
        return max(0.0, 1.0 - progress)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(cfg, optimizer: torch.optim.Optimizer, total_steps: int) -> LambdaLR:
    warmup = warmup_steps(cfg, total_steps)
    return LambdaLR(optimizer, lambda step: lr_multiplier(step, total_steps, warmup, cfg.lr_scheduler, cfg.cosine_min_lr_ratio))
