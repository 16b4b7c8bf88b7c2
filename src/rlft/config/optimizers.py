"""The names `optimizer:` takes: transformers' optimizer names, rlft's aliases, and Axolotl's own optimizers (they
validate; `train` names an alternative)."""

from __future__ import annotations

import difflib

# names rlft adds to transformers' list
ALIASES = {"adamw": "adamw_torch"}
# what transformers' Trainer.get_optimizer_cls_and_kwargs gives these names (torch.optim.AdamW), without importing its
# Trainer: seconds of every run's start-up. tests/unit/test_optim.py checks that the two agree.
TORCH_ADAMW = {"adamw_torch": {}, "adamw_torch_fused": {"fused": True}}
# Axolotl's own optimizers (its CustomSupportedOptimizers): they validate, `train` names an alternative
AXOLOTL_OPTIMIZERS = ("optimi_adamw", "ao_adamw_4bit", "ao_adamw_8bit", "ao_adamw_fp8", "adopt_adamw", "came_pytorch", "muon",
                      "dion", "sinkgd", "flash_adamw", "flash_adam", "flash_sgd", "flash_sgdw", "flash_lion", "q_galore_adamw8bit")


def optimizer_names() -> list[str]:
    # transformers is imported here, not at the top: `rlft validate` reaches this only for a name outside TORCH_ADAMW
    # and ALIASES, and importing transformers costs seconds of its start-up
    from transformers.training_args import OptimizerNames

    return sorted({name.value for name in OptimizerNames} | set(ALIASES) | {"adam"})


def check_optimizer(value: str) -> str:
    """`value` when `optimizer:` takes it; ValueError naming the closest name otherwise."""
    if value in TORCH_ADAMW or value in ALIASES or value == "adam":  # no need to import transformers' list
        return value
    names = optimizer_names()
    if value in names or value in AXOLOTL_OPTIMIZERS:
        return value
    guess = difflib.get_close_matches(value, names, n=1, cutoff=0.6)
    raise ValueError(f"unknown optimizer {value!r}" + (f": did you mean {guess[0]!r}?" if guess else "")
                     + " (transformers' names, e.g. adamw_torch, adamw_torch_fused, adafactor, adamw_bnb_8bit)")
