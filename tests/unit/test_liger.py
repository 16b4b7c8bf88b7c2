"""Liger Kernel's keys (rlft.models.liger): which switches reach liger's apply function, and what is refused where.

The kernels themselves are Triton GPU kernels: a GPU run checks their loss and speed (bench/gpu_check.py)."""

import pytest

from rlft.errors import ConfigError
from rlft.config.settings.model import model_settings
from rlft.models.liger import liger_loss, liger_problems, liger_switches

LLAMA = ("rope", "cross_entropy", "fused_linear_cross_entropy", "rms_norm", "swiglu", "model")  # apply_liger_kernel_to_llama
GEMMA = ("rope", "cross_entropy", "fused_linear_cross_entropy", "rms_norm", "geglu", "model")


def test_axolotls_llama_keys_become_liger_switches_and_its_cross_entropy_stays_off(config):
    cfg = config(liger_rope=True, liger_rms_norm=True, liger_glu_activation=True, liger_layer_norm=True,
                 liger_fused_linear_cross_entropy=True)
    switches, absent = liger_switches(model_settings(cfg), LLAMA)
    # the model's own labels= loss is never called by rlft: liger's loss patches stay off, SFT calls the kernel itself
    assert switches == {"rope": True, "rms_norm": True, "swiglu": True, "cross_entropy": False,
                        "fused_linear_cross_entropy": False}
    assert absent == ["liger_layer_norm"]  # Llama has no LayerNorm: named in the plan, not an error (Axolotl's examples set it)
    assert liger_loss(model_settings(cfg)) and list(model_settings(cfg).liger) == ["liger_rope", "liger_rms_norm", "liger_layer_norm", "liger_glu_activation",
                                                   "liger_fused_linear_cross_entropy"]


def test_the_gated_mlp_key_is_geglu_for_gemma_and_the_old_swiglu_name_works(config):
    switches, absent = liger_switches(model_settings(config(liger_swiglu=True)), GEMMA)
    assert switches["geglu"] is True and "swiglu" not in switches and absent == []
    switches, _ = liger_switches(model_settings(config()), LLAMA)
    assert not any(switches.values()) and not liger_loss(model_settings(config())) and list(model_settings(config()).liger) == []


def test_refused_without_a_gpu_or_without_the_package(config, monkeypatch):
    import importlib.util

    assert liger_problems(model_settings(config()), cuda=False) == []
    cfg = config(liger_rope=True, liger_cross_entropy=True)
    assert liger_problems(model_settings(cfg), cuda=False) == [
        "liger_rope, liger_cross_entropy: Liger Kernel's kernels are Triton kernels for CUDA GPUs, and this machine has "
        "none: remove the liger_* keys here (rlft's losses never build the full logits on any device; "
        "docs/training.md#liger-kernel)"]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "liger_kernel" else real(name, *a))
    assert liger_problems(model_settings(cfg), cuda=True) == ["liger_rope: needs the liger-kernel package: pip install -c constraints.txt "
                                              "'rlft[liger]'"]


def test_train_refuses_liger_keys_on_a_cpu_before_loading(config):
    import torch

    from rlft.train.unbuilt import refuse_unbuilt

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match=r"liger_glu_activation: Liger Kernel's kernels are Triton kernels for CUDA GPUs"):
        refuse_unbuilt(config(liger_glu_activation=True))


@pytest.mark.parametrize("settings, words", [
    ({"liger_swiglu": True, "liger_glu_activation": True}, "liger_swiglu and liger_glu_activation are both set"),
    ({"liger_cross_entropy": True, "liger_fused_linear_cross_entropy": True}, "liger_cross_entropy and "
                                                                             "liger_fused_linear_cross_entropy are both true"),
])
def test_conflicting_liger_keys(config_problems, settings, words):
    assert any(words in text for _, text in config_problems(**settings))


def test_the_liger_plugin_is_accepted_and_its_unwired_switches_are_still_refused(config):
    from rlft.config.axolotl_keys import unsupported_settings

    plugin = ["axolotl.integrations.liger.LigerPlugin"]
    assert unsupported_settings(config(plugins=plugin, liger_rope=True))[0] == []
    refused = unsupported_settings(config(plugins=plugin, liger_rms_norm_gated=True, liger_use_token_scaling=True))[0]
    assert [key for key, _ in refused] == ["liger_rms_norm_gated", "liger_use_token_scaling"]


def test_loading_a_model_checks_the_keys_first_and_nothing_is_patched_without_them(config):
    """`rlft serve` and the reward-model loader reach the check too, not only `rlft train`."""
    from rlft.errors import ModelError
    from rlft.models.liger import apply_liger, check_liger

    check_liger(model_settings(config()), "cpu")
    with pytest.raises(ModelError, match=r"liger_rms_norm: Liger Kernel's kernels are Triton kernels for CUDA GPUs"):
        check_liger(model_settings(config(liger_rms_norm=True)), "cpu")
    apply_liger(None, model_settings(config()))  # no liger_* key: returns before looking at the model (or importing liger)


def test_the_plan_says_the_fused_loss_is_not_used_with_qat(config, monkeypatch):
    """Axolotl's QAT examples set liger_fused_linear_cross_entropy; its kernel would read the output layer's weight
    unrounded, so with qat the loss takes the model's logits and the plan's kernels line says so."""
    from rlft.models import liger

    def apply_liger_to_llama(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False,
                             model=None):  # the signature Liger's Llama function has
        pass

    monkeypatch.setattr(liger, "_apply_function", lambda model_type: apply_liger_to_llama)
    keys = {"liger_rms_norm": True, "liger_fused_linear_cross_entropy": True}
    assert liger.liger_summary(model_settings(config(**keys)), "llama") == "Liger: rms_norm, fused linear cross-entropy"
    qat = {"activation_dtype": "int8", "weight_dtype": "int4", "group_size": 32}
    assert liger.liger_summary(model_settings(config(**keys, qat=qat)), "llama") == (
        "Liger: rms_norm; not the fused linear cross-entropy: qat rounds the output layer in its own forward, so the loss "
        "takes the model's logits")


def test_the_plan_says_the_fused_loss_is_not_used_where_sft_takes_the_models_logits(config, monkeypatch):
    """Under fsdp or ZeRO-3 (and for a LoRA'd output layer) SFT's loss takes the model's logits, so Liger's fused linear
    cross-entropy cannot run: the plan's kernels line says so and why, rather than naming the kernel."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlft.models import liger
    from rlft.models.head import logits_reason

    def apply_liger_to_llama(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False,
                             model=None):
        pass

    monkeypatch.setattr(liger, "_apply_function", lambda model_type: apply_liger_to_llama)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=4096, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    assert logits_reason(model) == ""
    why = logits_reason(model, sharded=True)
    assert "sharded" in why
    keys = {"liger_rms_norm": True, "liger_fused_linear_cross_entropy": True}
    assert liger.liger_summary(model_settings(config(**keys)), "llama", logits_reason(model)) == "Liger: rms_norm, fused linear cross-entropy"
    assert liger.liger_summary(model_settings(config(**keys)), "llama", why) == (
        f"Liger: rms_norm; not the fused linear cross-entropy: the loss takes the model's logits, because {why}")
