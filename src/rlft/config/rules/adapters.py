"""Rules on the adapter keys (LoRA, QLoRA, PEFT inits) and on unfrozen_parameters."""

from __future__ import annotations

from rlft.config.lora_inits import LORA_INITS, REFUSED_LORA_INITS, rewriting
from rlft.config.unfrozen import parse_pattern


def adapter_key_problems(cfg):
    set_keys = cfg.model_fields_set
    lora_keys = sorted(k for k in set_keys if k.startswith(("lora_", "peft_")) and k != "lora_model_dir")
    if lora_keys and cfg.adapter is None:
        yield f"{', '.join(lora_keys)} set without `adapter`: add `adapter: lora` (or remove them)"
    if (cfg.load_in_4bit or cfg.load_in_8bit) and cfg.adapter is None:
        yield "load_in_4bit/load_in_8bit quantise frozen weights: they need `adapter: qlora` or `adapter: lora`"
    if cfg.adapter == "qlora" and not cfg.load_in_4bit:
        yield "adapter: qlora needs load_in_4bit: true"
    if cfg.lora_target_parameters:
        yield from _parameter_lora_problems(cfg)


def _parameter_lora_problems(cfg):
    if cfg.lora_dropout:
        yield (f"lora_target_parameters with lora_dropout {cfg.lora_dropout:g}: PEFT's LoRA on parameters has no dropout; set "
               "lora_dropout: 0")
    if cfg.peft_use_dora:
        yield "lora_target_parameters with peft_use_dora: PEFT has no DoRA for parameters; remove one"


def lora_init_problems(cfg):
    init = cfg.peft_init_lora_weights
    if isinstance(init, bool) or init is None:
        return
    if init in REFUSED_LORA_INITS:
        yield (f"peft_init_lora_weights: {init} is not built: {REFUSED_LORA_INITS[init]}; use true, gaussian, pissa or "
               "olora (rlft converts PiSSA and OLoRA adapters to load on the original base)")
    elif not LORA_INITS.fullmatch(init):
        yield (f"peft_init_lora_weights: {init!r} is not one rlft runs: true, false, gaussian, orthogonal, mica, pissa, "
               "pissa_niter_N (N iterations of fast SVD), olora")
    elif (cfg.load_in_4bit or cfg.load_in_8bit) and init not in ("gaussian", "olora"):
        yield (f"peft_init_lora_weights: {init} with a base loaded in {4 if cfg.load_in_4bit else 8} bits: PEFT builds it from "
               "full-precision weights only; use true, gaussian or olora, or load the base in full precision")
    elif init == "mica" and (cfg.peft_use_dora or cfg.lora_target_parameters):
        yield ("peft_init_lora_weights: mica with " + ("peft_use_dora" if cfg.peft_use_dora else "lora_target_parameters") +
               ": PEFT has no MiCA version of it; use another init")
    elif rewriting(init) and cfg.lora_target_parameters:
        yield (f"peft_init_lora_weights: {init} with lora_target_parameters: PEFT 0.21 cannot build it on an MoE model's "
               "expert tensors; use another init")
    elif init == "olora" and (cfg.load_in_4bit or cfg.load_in_8bit) and cfg.trl.use_vllm:
        yield ("peft_init_lora_weights: olora with a quantized base and trl.use_vllm: the vLLM engine keeps base_model's "
               "own weights, and an OLoRA adapter fits only the base its init rewrote; use true or gaussian, or the "
               "in-process engine (trl.use_vllm: false)")
    elif init == "orthogonal" and cfg.lora_r % 2:
        yield f"peft_init_lora_weights: orthogonal needs an even lora_r (PEFT pairs the rank's halves), got {cfg.lora_r}"


def unfrozen_problems(cfg):
    if not cfg.unfrozen_parameters:
        return
    if cfg.adapter:
        yield (f"unfrozen_parameters with adapter: {cfg.adapter}: with an adapter only the adapter trains here. Axolotl "
               "freezes by these patterns after wrapping the model in the adapter, whose parameter names start with "
               "base_model.model., so a pattern that starts with ^model. matches nothing and every weight, the "
               "adapter's too, is frozen (its log says 'All parameters are frozen'). Remove unfrozen_parameters (use "
               "lora_modules_to_save to train whole modules beside LoRA), or drop the adapter for a partial full fine-tune")
    ranged = [text for text in cfg.unfrozen_parameters if parse_pattern(text).rows is not None]
    if ranged and cfg.weight_decay:
        yield (f"unfrozen_parameters {ranged[0]!r} trains some rows of a parameter by zeroing the other rows' gradients, and "
               f"weight_decay {cfg.weight_decay:g} would still shrink those rows: set weight_decay: 0, or drop the range")
    if ranged and (cfg.deepspeed or cfg.fsdp or cfg.fsdp_config):
        yield (f"unfrozen_parameters {ranged[0]!r}: row ranges are built for one process and DDP, not for fsdp or "
               "deepspeed: drop the range (the whole parameter trains) or train without sharding")
