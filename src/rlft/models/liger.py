"""Liger Kernel's Triton kernels, switched on by Axolotl's `liger_*` keys (its LigerPlugin; Hsu et al. 2024,
arXiv:2410.10989): RoPE, RMSNorm, LayerNorm and the gated MLP of the loaded model, and a fused linear cross-entropy.

CUDA GPUs only: Triton has no CPU backend (liger-kernel on a CPU raises "0 active drivers").
The layers are replaced with liger's `apply_liger_kernel_to_<model type>(model=...)`, which patches the loaded
model and its module's classes, so a reference or frozen copy loaded later in the process gets the same layers and
agrees with the policy. Liger's cross-entropy switches replace the loss of the model's own `labels=` path, which
rlft never calls (its losses never build the (B, T, V) logits): here they run the SFT loss through Liger's fused
linear cross-entropy kernel instead of rlft's chunked torch one. Preference and online-RL methods score tokens with
rlft's chunked log-probs either way.
"""

from __future__ import annotations

import importlib.util
import inspect

import torch

from rlft.config.methods import method_spec
from rlft.config.settings.model import LIGER_LAYER_KEYS as LAYER_KEYS
from rlft.config.settings.model import LIGER_LOSS_KEYS as LOSS_KEYS
from rlft.config.settings.model import ModelSettings
from rlft.errors import ModelError


def liger_loss(settings: ModelSettings) -> bool:
    """SFT's loss through Liger's fused linear cross-entropy kernel."""
    return any(key in settings.liger for key in LOSS_KEYS)


def liger_problems(settings: ModelSettings, cuda: bool) -> list[str]:
    """What keeps the `liger_*` keys from running here, one sentence each (checked before the model loads)."""
    keys = settings.liger
    if not keys:
        return []
    if not cuda:
        return [f"{', '.join(keys)}: Liger Kernel's kernels are Triton kernels for CUDA GPUs, and this machine has none: "
                "remove the liger_* keys here (rlft's losses never build the full logits on any device; "
                "docs/training.md#liger-kernel)"]
    if importlib.util.find_spec("liger_kernel") is None:
        return [f"{keys[0]}: needs the liger-kernel package: pip install -c constraints.txt 'rlft[liger]'"]
    return []


def liger_switches(settings: ModelSettings, parameters) -> tuple[dict[str, bool], list[str]]:
    """(keyword switches for liger's apply function, whose `parameters` are given; the keys naming a layer this
    model type does not have). Liger's own cross-entropy switches stay off: rlft does not call the model's loss."""
    switches = {name: False for name in ("rope", "rms_norm", "layer_norm", "swiglu", "geglu", "cross_entropy",
                                         "fused_linear_cross_entropy") if name in parameters}
    absent = []
    for key, name in LAYER_KEYS.items():
        if key not in settings.liger:
            continue
        if name == "swiglu" and "swiglu" not in parameters and "geglu" in parameters:  # Gemma's gated MLP is GeGLU
            name = "geglu"
        if name in parameters:
            switches[name] = True
        else:
            absent.append(key)
    return switches, absent


def _apply_function(model_type: str):
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN  # liger-kernel: optional (rlft[liger])

    function = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if function is None:
        raise ModelError(f"liger_*: Liger Kernel has no kernels for model type {model_type!r} (it has "
                         f"{', '.join(sorted(MODEL_TYPE_TO_APPLY_LIGER_FN))}): remove the liger_* keys")
    return function


def check_liger(settings: ModelSettings, device_type: str) -> None:
    """Raise ModelError when the `liger_*` keys cannot run on this device (before a model loads)."""
    problems = liger_problems(settings, cuda=device_type == "cuda")
    if problems:
        raise ModelError(problems[0])


def apply_liger(model: torch.nn.Module, settings: ModelSettings) -> None:
    """Replace the model's layers in place with Liger's kernels (nothing without `liger_*` keys)."""
    if not settings.liger:
        return
    function = _apply_function(model.config.model_type)
    switches, _ = liger_switches(settings, inspect.signature(function).parameters)
    if any(switches.values()):
        function(model=model, **switches)


def liger_summary(settings: ModelSettings, model_type: str, logits_reason: str = "") -> str:
    """The plan's line: which kernels run, and which keys name a layer the model does not have. `logits_reason`: why
    SFT's loss takes the model's logits (models.head.logits_reason), so the fused linear cross-entropy cannot run."""
    switches, absent = liger_switches(settings, inspect.signature(_apply_function(model_type)).parameters)
    done = [name for name, on in switches.items() if on]
    unused = ""
    if liger_loss(settings) and settings.qat:  # the kernel would read the weight unrounded
        unused = ("; not the fused linear cross-entropy: qat rounds the output layer in its own forward, so the loss "
                  "takes the model's logits")
    elif liger_loss(settings) and method_spec(settings.method).fused_cross_entropy and logits_reason:
        unused = f"; not the fused linear cross-entropy: the loss takes the model's logits, because {logits_reason}"
    elif liger_loss(settings):
        done.append("fused linear cross-entropy" + ("" if method_spec(settings.method).fused_cross_entropy else
                                                    " (for SFT's loss; this method's chunked log-probs never build the "
                                                    "logits either)"))
    text = f"Liger: {', '.join(done) or 'nothing'}" + unused
    return text + (f"; {model_type} has no layer for {', '.join(absent)}" if absent else "")


def liger_linear_cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                                   targets: torch.Tensor) -> torch.Tensor:
    """`rlft.losses.linear_ce.linear_cross_entropy_sum` through Liger's Triton kernel: the summed NLL of `targets`
    under softmax(hidden @ weight.T + bias), logits never held for more than one chunk. The weight is used in the
    hidden states' dtype (what autocast gives a plain matmul); gradients accumulate in float32."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy  # optional (rlft[liger])

    dtype = hidden.dtype
    return liger_fused_linear_cross_entropy(hidden, weight.to(dtype), targets, None if bias is None else bias.to(dtype),
                                            reduction="sum", accum_dtype=torch.float32).float()
