"""The `qat:` section (Axolotl's): quantization-aware training through torchao's fake quantizers, and the format
combinations torchao can train."""

from __future__ import annotations

from typing import Literal, Optional

from rlft.config.base import Section, field

QuantDtype = Literal["int4", "int8", "float8_e4m3fn", "fp8", "float8", "nvfp4", "mxfp4"]
QUANT_NAMES = {"float8_e4m3fn": "float8", "fp8": "float8"}  # Axolotl's other names of float8 (e4m3)


class QATConfig(Section):
    """The `qat:` section (Axolotl's): quantization-aware training through torchao's fake quantizers
    (docs/training.md#quantization-aware-training-qat)."""

    activation_dtype: Optional[QuantDtype] = field(
        None, "Format the activations entering each linear layer are rounded to: int8 (per token), float8_e4m3fn (also "
              "fp8, float8), nvfp4, mxfp4; unset: weights only.")
    weight_dtype: QuantDtype = field(
        "int8", "Format the weights are rounded to: int4 (in groups of group_size), float8_e4m3fn, nvfp4 (groups of 16), "
                "mxfp4 (blocks of 32). Axolotl's default int8 has no QAT in torchao: set it.")
    group_size: Optional[int] = field(32, "Elements per quantization group of int4 weights (nvfp4: 16, mxfp4: 32).", ge=1)
    quantize_embedding: Optional[bool] = field(False, "Also round the embedding's weights (weights only).")
    fake_quant_after_n_steps: Optional[int] = field(
        None, "Train the first N optimizer steps without rounding, then with it (unset: from the first step).", ge=0)

    @property
    def activation(self) -> Optional[str]:
        """The activation format's canonical name (float8_e4m3fn and fp8 are float8)."""
        return QUANT_NAMES.get(self.activation_dtype, self.activation_dtype)

    @property
    def weight(self) -> str:
        return QUANT_NAMES.get(self.weight_dtype, self.weight_dtype)


def combination_problem(activation: str | None, weight: str, group_size: int | None) -> str | None:
    """Why torchao 0.18 cannot train this (activation, weight) pair of canonical names, or None: the pairs Axolotl's
    `get_quantization_config` refuses, and MXFP4 / NVFP4 weights without activations of their format."""
    if weight == "nvfp4" and group_size not in (None, 16):
        return f"nvfp4 quantizes in groups of 16, and group_size is {group_size}: set group_size: 16"
    if weight == "mxfp4" and group_size not in (None, 32):
        return f"mxfp4 quantizes in blocks of 32, and group_size is {group_size}: set group_size: 32"
    if weight == "mxfp4":
        return None if activation == "mxfp4" else (
            f"torchao rounds MXFP4 weights only together with MXFP4 activations: set activation_dtype: mxfp4, not "
            f"{activation or 'unset'}")
    if weight == "nvfp4":
        return None if activation == "nvfp4" else (
            f"torchao rounds NVFP4 weights only together with NVFP4 activations: set activation_dtype: nvfp4, not "
            f"{activation or 'unset'}")
    supported = {(None, "int4"), ("int8", "int4"), ("float8", "int4"), ("float8", "float8")}
    if (activation, weight) not in supported:
        shown = lambda name: name or "unset"  # noqa: E731
        return (f"torchao has no QAT for activation_dtype {shown(activation)} with weight_dtype {weight}: use int4 weights "
                "(activations unset, int8 or float8), float8 for both, nvfp4 or mxfp4")
    return None
