"""The step's gradient: scaled from the accumulated sum to the mean, and clipped to `max_grad_norm`.

A fused torch optimizer (`adamw_torch_fused`, the default, and any optimizer built with `fused=True`) divides every
gradient by its `grad_scale` tensor inside its own kernel, the hook torch's GradScaler uses to unscale fp16
gradients. Where the step's optimizer is one, the mean's factor and the clipping coefficient go there: the norm is
taken once over the gradients as they are (`torch._foreach_norm`, one call) and nothing writes the gradients before
the update reads them. The unfused path scales every gradient in place, then clips it (`clip_grad_norm_`), which
reads and writes every gradient twice more: at size S on a CPU the optimizer phase had about 20 more operator calls,
and at a real size each pass is a pass over the model's gradient memory. The update is the same up to rounding.

The unfused path stays for every other case: an optimizer without the hook, accelerate's wrapper with fp16's loss
scaler (which sets `grad_scale` itself), sharded gradients (FSDP's DTensors, whose norm is a collective
`clip_grad_norm_` takes), and parameters on more than one device.
"""

from __future__ import annotations

import torch


class GradientClip:
    """`norm(factor)`: scale the accumulated gradient by `factor`, clip it to `max_norm` (None: no clipping), and
    return its norm after scaling, before clipping (what `clip_grad_norm_` returns and the run logs)."""

    def __init__(self, params: list[torch.nn.Parameter], optimizer, accelerator, max_norm: float | None):
        self.params = params
        self.optimizer = optimizer
        self.accelerator = accelerator
        self.max_norm = max_norm or float("inf")
        self.folded = folds_scale(optimizer, params)

    def norm(self, factor: float) -> float:
        if self.folded:
            grads = [p.grad for p in self.params if p.grad is not None]
            if not grads:
                self.optimizer.grad_scale = None
                return 0.0
            norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))) * factor
            coefficient = torch.clamp(self.max_norm / (norm + 1e-6), max=1.0)  # clip_grad_norm_'s coefficient
            self.optimizer.grad_scale = (1.0 / (coefficient * factor)).to(torch.float32).reshape(1)
            return float(norm)
        if factor != 1.0:  # one micro-batch on one process: the sum is already the mean's scale
            for param in self.params:
                if param.grad is not None:
                    param.grad.mul_(factor)
        norm = self.accelerator.clip_grad_norm_(self.params, self.max_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # sharded: a DTensor


def folds_scale(optimizer, params: list[torch.nn.Parameter]) -> bool:
    """Whether `optimizer` (what the loop steps) takes the scale and the clipping as its `grad_scale`: a torch
    optimizer whose fused step reads it, over plain tensors on one device."""
    from torch.distributed.tensor import DTensor  # torch.distributed: on use

    return (isinstance(optimizer, torch.optim.Optimizer) and bool(getattr(optimizer, "_step_supports_amp_scaling", False))
            and bool(params) and len({p.device for p in params}) == 1 and not any(isinstance(p, DTensor) for p in params))
