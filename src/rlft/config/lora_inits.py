"""`peft_init_lora_weights`: the LoRA inits rlft runs, those it refuses, and those that rewrite the base weights."""

from __future__ import annotations

import re

# PiSSA and OLoRA start the adapter from the base weights' principal directions and train on the residual base
BASE_CHANGING_INITS = ("pissa", "olora")
REFUSED_LORA_INITS = {
    "loftq": "LoftQ replaces the base weights with their 4-bit rounding, and its adapter fits only that rounded base, "
             "which rlft does not save: on the original base the trained adapter would be wrong",
    "eva": "EVA initialises the adapter from a pass over training data (PEFT's initialize_lora_eva_weights), which rlft "
           "does not run: the adapter would start as plain LoRA",
    "corda": "CorDA needs a pass over training data first (PEFT's preprocess_corda), which rlft does not run",
}
LORA_INITS = re.compile(r"gaussian|orthogonal|mica|olora|pissa(_niter_\d+)?")


def rewriting(init) -> bool:
    """Whether a LoRA init (PEFT's `init_lora_weights`: a bool or a name) rewrites the base weights."""
    return isinstance(init, str) and init.startswith(BASE_CHANGING_INITS)
