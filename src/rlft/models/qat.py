"""Quantization-aware training (`qat:`, Axolotl's section) through torchao's fake quantizers.

The model's linear layers (and with `quantize_embedding` its embedding) become torchao's fake-quantized layers: the
forward rounds weights (and activations) to the target format and back, so training learns weights that survive the
rounding; the backward passes through the rounding unchanged (straight-through). The weights stay float: checkpoints
and the final model hold the trained weights under their usual names and load without torchao, as Axolotl's
converted model does; quantize them for deployment with torchao's `quantize_` and the same format
(docs/training.md#quantization-aware-training-qat).

The int4 and float8 formats and their fake quantizers follow Axolotl's `prepare_model_for_qat`: int4 weights in groups
of `group_size` (alone, or with int8 per-token activations, or with float8 activations), float8 weights and
activations. MXFP4 and NVFP4 round weights and activations together (docs/training.md says where Axolotl differs).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from rlft.config.sections.qat import QATConfig as QATSection
from rlft.config.settings.model import ModelSettings
from rlft.errors import ModelError


def _configs(qat, embedding: bool = False):
    """torchao's QATConfig for the linear layers (or, `embedding`, for the embedding: weights only)."""
    from torchao.quantization.qat import QATConfig  # torchao: an optional package (the qat extra)
    from torchao.quantization.qat.fake_quantize_config import (Float8FakeQuantizeConfig, Int4WeightFakeQuantizeConfig,
                                                                IntxFakeQuantizeConfig)

    activation = None if embedding else qat.activation
    if qat.weight == "mxfp4":  # weights and activations: torchao has no weight-only MX QAT
        from torchao.prototype.qat import MXFakeQuantizeConfig  # optional, as above

        mx = MXFakeQuantizeConfig(dtype=torch.float4_e2m1fn_x2, block_size=32)
        return QATConfig(weight_config=mx, activation_config=mx)
    if qat.weight == "nvfp4":  # weights and activations: torchao has no weight-only NVFP4 QAT
        from torchao.prototype.qat import NVFP4FakeQuantizeConfig  # optional, as above

        return QATConfig(weight_config=NVFP4FakeQuantizeConfig(), activation_config=NVFP4FakeQuantizeConfig())
    if qat.weight == "float8":
        fp8 = Float8FakeQuantizeConfig(dtype=torch.float8_e4m3fn)
        return QATConfig(weight_config=fp8, activation_config=None if embedding else fp8)
    # int4 weights: the activations' dtype for the weight's fake quantizer as Axolotl gives it
    compute = {"int8": torch.bfloat16, "float8": torch.float8_e4m3fn}.get(activation)
    weight = Int4WeightFakeQuantizeConfig(group_size=qat.group_size or 128, **({"activation_dtype": compute} if compute else {}))
    activations = {"int8": IntxFakeQuantizeConfig(dtype=torch.int8, granularity="per_token", is_symmetric=False),
                   "float8": Float8FakeQuantizeConfig(dtype=torch.float8_e4m3fn)}.get(activation)
    return QATConfig(weight_config=weight, activation_config=activations)


def check_qat(settings: ModelSettings, device_type: str) -> None:
    """Refuse what cannot run here, before the model loads."""
    qat = settings.qat
    if importlib.util.find_spec("torchao") is None:
        raise ModelError("qat needs the torchao package: pip install -c constraints.txt 'rlft[qat]'")
    if qat.weight == "nvfp4" and (device_type != "cuda" or torch.cuda.get_device_capability() < (10, 0)):
        where = device_type if device_type != "cuda" else f"a GPU of compute capability {torch.cuda.get_device_capability()}"
        raise ModelError(f"qat with nvfp4 needs a Blackwell GPU (compute capability 10.0 or more: torchao's NVFP4 fake "
                         f"quantizer multiplies in FP4); on {where} use int4 weights (with int8 activations), float8 or mxfp4")
    half = settings.fp16 or settings.bf16 is True or (settings.bf16 == "auto" and device_type == "cuda")
    if qat.weight == "mxfp4" and half:
        raise ModelError("qat with mxfp4 under bf16/fp16: rlft keeps float32 weights and computes in bf16 under autocast, "
                         "and torchao's MXFP4 layer needs its input in its weights' dtype; set bf16: false (float32) or "
                         "use int4 / float8")


def _check_groups(model: torch.nn.Module, qat) -> None:
    """Every layer to round has a width its groups divide (torchao would fail in the first forward without saying
    which layer)."""
    group = {"int4": qat.group_size or 128, "mxfp4": 32, "nvfp4": 16}.get(qat.weight)
    if group is None:
        return
    for name, module in model.named_modules():
        width = module.in_features if type(module) is torch.nn.Linear else (
            module.embedding_dim if qat.quantize_embedding and type(module) is torch.nn.Embedding else None)
        if width is not None and width % group:
            raise ModelError(f"qat: {name} is {width} wide, which groups of {group} do not divide "
                             f"({qat.weight} weights): set qat.group_size to a divisor of every layer's width (e.g. 32)")


def _plain(kind: type):
    """torchao's filter for layers of exactly `kind`: a subclass (an MoE router, a scaled embedding) has its own forward,
    which torchao's swap would drop."""
    return lambda module, _: type(module) is kind


def prepare_qat(model: torch.nn.Module, qat) -> int:
    """Swap the linear layers (and the embedding with `quantize_embedding`) for torchao's fake-quantized ones; returns
    how many layers were swapped. Weight tying (embedding and output layer) is kept."""
    from torchao.quantization import quantize_  # torchao: an optional package (the qat extra)

    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if qat.quantize_embedding and embedding is not None and type(embedding) is not torch.nn.Embedding:
        raise ModelError(f"qat.quantize_embedding: this model's embedding is a {type(embedding).__name__} with a forward of "
                         "its own (a scale, a position offset), which torchao's fake-quantized embedding would drop: remove "
                         "quantize_embedding")
    _check_groups(model, qat)
    tied = {name: id(p) for name, p in model.named_parameters(remove_duplicate=False)}
    before = sum(1 for m in model.modules() if type(m) in (torch.nn.Linear, torch.nn.Embedding))
    quantize_(model, _configs(qat), filter_fn=_plain(torch.nn.Linear))
    if qat.quantize_embedding:
        quantize_(model, _configs(qat, embedding=True), filter_fn=_plain(torch.nn.Embedding))
    after = {name: id(p) for name, p in model.named_parameters(remove_duplicate=False)}
    if len(set(after.values())) != len(set(tied.values())):  # a swapped layer copied a weight that was shared
        raise ModelError("qat: torchao's fake-quantized layers broke this model's weight tying; set tie_word_embeddings: "
                         "false in a copy of the model's config.json, or train without qat")
    return before - sum(1 for m in model.modules() if type(m) in (torch.nn.Linear, torch.nn.Embedding))


def set_fake_quant(model: torch.nn.Module, enabled: bool) -> None:
    """Turn every fake quantizer of the model on or off (`fake_quant_after_n_steps` trains its first steps without)."""
    for module in model.modules():
        for name in ("weight_fake_quantizer", "activation_fake_quantizer"):
            quantizer = getattr(module, name, None)
            if quantizer is not None and hasattr(quantizer, "enabled"):
                quantizer.enabled = enabled


def fake_quant_schedule(qat: QATSection | None) -> Any:
    """`follow(model, global_step)` for the loop: fake quantization on from step `fake_quant_after_n_steps` of the `qat:`
    section."""
    after = qat.fake_quant_after_n_steps if qat else None

    def follow(model: torch.nn.Module, step: int) -> None:
        if after:
            set_fake_quant(model, step >= after)

    return follow


def describe(qat) -> str:
    """The plan's line: what is rounded to what, and from which step."""
    weights = {"int4": f"int4 weights in groups of {qat.group_size or 128}", "float8": "float8 weights",
               "nvfp4": "NVFP4 weights", "mxfp4": "MXFP4 weights"}[qat.weight]
    activations = {"int8": ", int8 activations per token", "float8": ", float8 activations", "nvfp4": ", NVFP4 activations",
                   "mxfp4": ", MXFP4 activations"}
    text = weights + activations.get(qat.activation, "")
    text += ", the embedding too" if qat.quantize_embedding else ""
    after = qat.fake_quant_after_n_steps
    return (f"torchao fake quantization: {text}, " + (f"from step {after + 1}" if after else "from the first step")
            + "; the saved weights stay float (docs/training.md#quantization-aware-training-qat)")
