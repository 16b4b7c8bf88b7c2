"""What `rlft train` refuses among the Axolotl keys rlft knows but does not run (`rlft.config.axolotl_tables`).

A listed key set to anything but Axolotl's default or "off" (null, false, 0, empty) is refused with the reason
of its category, unless the value means what rlft does anyway (`SAME_AS_RLFT`).
"""

from __future__ import annotations

from typing import Any, Callable

from rlft.config.axolotl_tables import DATASET, TOP_LEVEL, TRL, VLLM, refusal
from rlft.config.methods import spec_of
from rlft.config.plugins import IMPLEMENTED as IMPLEMENTED_PLUGINS
from rlft.config.sections.model import ATTENTION
from rlft.config.template_names import NOT_SHIPPED


def _any_of(*values: Any) -> Callable[[Any], bool]:
    return lambda value: value in values


# values that mean what rlft does anyway
SAME_AS_RLFT: dict[str, Callable[[Any], bool]] = {
    "fsdp_version": _any_of(2, "2"),  # rlft always runs FSDP2
    "save_safetensors": _any_of(True),
    "include_tokens_per_second": _any_of(True),
    "include_tkps": _any_of(True),
    "tokenizer_use_fast": _any_of(True),
    "low_cpu_mem_usage": _any_of(True),
    "swanlab_log_completions": _any_of(False),  # rlft logs no completions to SwanLab
}


def is_off(value: Any, default: Any) -> bool:
    """Null, Axolotl's default, or an empty / false / zero value where Axolotl's default is off."""
    return value is None or value == default or (default in (None, False) and value in (False, 0, "", [], {}))


def unsupported_settings(cfg) -> tuple[list[tuple[str, str]], list[str]]:
    """([(key path, why train refuses it)], [key paths of Axolotl's computed values]) for a validated config."""
    refused, derived = [], []
    sections = [("", cfg, TOP_LEVEL), ("trl.", cfg.trl, TRL), ("vllm.", cfg.vllm, VLLM)]
    for list_name in ("datasets", "test_datasets", "pretraining_dataset"):
        sections += [(f"{list_name}[{i}].", ds, DATASET) for i, ds in enumerate(getattr(cfg, list_name) or [])]
    for prefix, section, table in sections:
        for attribute, info in type(section).model_fields.items():
            extra = info.json_schema_extra
            if not (isinstance(extra, dict) and "axolotl_only" in extra) or attribute not in section.model_fields_set:
                continue
            key = info.alias or attribute
            category, default = table[key]
            value = getattr(section, attribute)
            if category == "derived":
                derived.append(prefix + key)
            elif not is_off(value, default) and not SAME_AS_RLFT.get(key, lambda _: False)(value):
                refused.append((prefix + key, refusal(key, category)))
    for plugin in cfg.plugins or []:
        if plugin not in IMPLEMENTED_PLUGINS:
            refused.append((f"plugins: {plugin}", "Axolotl's plugin classes do not run in rlft (it implements the NeMo Gym, "
                                                  "SwanLab, Liger and Cut Cross-Entropy ones); its switches are refused one by "
                                                  "one above where set"))
    if cfg.attn_implementation and cfg.attn_implementation not in ATTENTION:
        refused.append((f"attn_implementation: {cfg.attn_implementation}", f"not built in rlft: use one of {', '.join(ATTENTION)}"))
    if cfg.chat_template in NOT_SHIPPED:
        refused.append((f"chat_template: {cfg.chat_template}", "a vision template; use a text template or tokenizer_default "
                        "(rlft trains text-only models)"))
    model_type = cfg.model_type or "AutoModelForCausalLM"
    spec = spec_of(cfg)
    if spec.sequence_classification and model_type not in ("AutoModelForCausalLM", "AutoModelForSequenceClassification"):
        refused.append((f"model_type: {model_type}", "reward models load as AutoModelForSequenceClassification (one score head)"))
    elif not spec.sequence_classification and not model_type.endswith("ForCausalLM"):
        refused.append((f"model_type: {model_type}", "rlft trains causal language models: AutoModelForCausalLM or a *ForCausalLM class"))
    if cfg.skip_prepare_dataset and not spec.engine:
        refused.append(("skip_prepare_dataset", "applies to prompt datasets (grpo, gdpo, structured ebft); other methods need "
                                                "rows tokenised and fitted to sequence_len"))
    if cfg.gradient_checkpointing == "offload_disk":
        refused.append(("gradient_checkpointing: offload_disk", "offloading activations to disk is not built: use "
                        "gradient_checkpointing: offload (to host memory)"))
    if cfg.activation_offloading == "disk":
        refused.append(("activation_offloading: disk", "offloading activations to disk is not built: use "
                        "activation_offloading: true (to host memory)"))
    return refused, derived
