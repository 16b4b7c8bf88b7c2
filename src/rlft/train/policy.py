"""The trainable policy of a run and the frozen network of its initial weights (a reference model, EBFT's feature
network): a second model, the policy with its adapter disabled, or the policy with its initial adapter."""

from __future__ import annotations

from pathlib import Path

from rlft.config.parallel import deepspeed_settings, fsdp_settings
from rlft.config.settings.model import ModelSettings
from rlft.models.base_changing import rewrites_base
from rlft.models.frozen import FrozenPolicy
from rlft.models.loading import attach_adapter, disable_dropout, load_model
from rlft.models.reference import load_reference_model
from rlft.train.wrap import compiled_forward


def shards_parameters(cfg, accelerator) -> bool:
    """Whether the processes hold shards of the parameters (FSDP2 on several processes, DeepSpeed ZeRO-3)."""
    return (fsdp_settings(cfg) is not None and accelerator.num_processes > 1) or getattr(deepspeed_settings(cfg), "stage", 0) == 3


def keeps_initial_adapter(cfg, model_settings: ModelSettings, accelerator) -> bool:
    """Whether the frozen network is the policy with its adapter's initial tensors (FrozenPolicy.initial_trainables):
    an adapter whose init rewrote the base (PiSSA, OLoRA) with whole parameters, rather than a copy of the model.
    Sharded parameters live in the sharding's own tensors, which a view cannot swap: those keep the copy."""
    return (bool(cfg.adapter) and not cfg.rl_adapter_ref_model and rewrites_base(model_settings.adapter)
            and not shards_parameters(cfg, accelerator))


def attach_with_frozen(cfg, model_settings: ModelSettings, tokenizer, model, accelerator, *, need_frozen: bool,
                       unchanged_policy: bool = False):
    """The model with its adapter attached (where the config has one) and, when `need_frozen`, the frozen network of its
    initial weights: `ref_model`; the policy with its adapter disabled (no second model; PiSSA's and OLoRA's would be
    the residual base), or with its initial adapter for those (`keeps_initial_adapter`); the policy itself in full
    fine-tuning when `unchanged_policy` (read before any update); else a frozen copy, taken before the adapter."""
    initial = need_frozen and not cfg.ref_model and keeps_initial_adapter(cfg, model_settings, accelerator)
    frozen = None
    if need_frozen and not initial:
        if cfg.ref_model:
            frozen = FrozenPolicy(load_reference_model(model_settings, tokenizer, model))
        elif cfg.adapter and not cfg.rl_adapter_ref_model and not rewrites_base(model_settings.adapter):
            frozen = FrozenPolicy.adapter_disabled()
        elif unchanged_policy and not cfg.adapter:
            frozen = FrozenPolicy(model)
        else:
            frozen = FrozenPolicy.copy_of(model)
    if cfg.adapter:
        model = attach_adapter(model, model_settings)
        if initial:
            frozen = FrozenPolicy.initial_trainables(model)
    return model, frozen


def policy_and_frozen(cfg, model_settings: ModelSettings, tokenizer, accelerator, init_base: Path | None,
                      need_frozen: bool):
    """The trainable policy (adapter attached, dropout off) and, when `need_frozen`, a frozen network of the
    initial weights (`attach_with_frozen`), both on the device."""
    model = load_model(model_settings, tokenizer, accelerator.device.type, init_base_dir=init_base, with_adapter=False)
    model, frozen = attach_with_frozen(cfg, model_settings, tokenizer, model, accelerator, need_frozen=need_frozen)
    if cfg.disable_dropout:
        disable_dropout(model)
    model.to(accelerator.device)
    if frozen is not None:
        frozen.to(accelerator.device)
    return model, frozen


def compile_frozen(model_settings: ModelSettings, frozen: FrozenPolicy | None) -> None:
    """`torch_compile`: a frozen copy that runs every step (a reference model) runs through torch.compile as the policy
    does (`compiled_forward`), a graph of its own without gradients; its weights stay the copy's, so a reset or a
    soft update reaches it. A view of the policy runs the policy's own forward."""
    if frozen is not None and frozen.is_copy:
        frozen.runs = compiled_forward(model_settings, frozen.model)
