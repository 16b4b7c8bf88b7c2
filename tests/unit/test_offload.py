"""activation_offloading (rlft.models.checkpointing): transformers' activation checkpointing with each checkpointed layer's
input offloaded (`save_on_cpu` around each checkpoint). On a CPU nothing moves, and `save_on_cpu` cannot run (it pins
memory), so the mechanism is checked here with a stand-in for it that copies each saved tensor into other CPU memory:
the layer inputs are handed over, the forward's own copies freed, and the gradients bit-identical. The GPU's memory
saving is measured by bench/gpu_check.py (offload)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlft.config import build_config
from rlft.config.settings.model import model_settings
from rlft.models.checkpointing import enable_checkpointing

LAYERS, BATCH, WIDTH, HIDDEN = 3, 4, 48, 64
BASE = {"base_model": "m", "datasets": [{"path": "rows.jsonl"}]}


def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=300)
    return LlamaForCausalLM(config).train()


class CopyingHooks(torch.autograd.graph.saved_tensors_hooks):
    """Stands in for `save_on_cpu` on a CPU: each saved tensor is copied out (a weak reference to the original kept)."""

    made: list["CopyingHooks"] = []

    def __init__(self, pin_memory=False, device_type="cuda"):
        self.originals = []
        CopyingHooks.made.append(self)
        super().__init__(self._pack, lambda packed: packed.clone())

    def _pack(self, tensor):
        self.originals.append(weakref.ref(tensor))
        return tensor.clone()


@pytest.fixture
def copying(monkeypatch):
    CopyingHooks.made = []
    monkeypatch.setattr("transformers.modeling_utils.save_on_cpu", CopyingHooks)
    return CopyingHooks


def config(reentrant: bool, offload) -> object:
    return build_config({**BASE, "gradient_checkpointing": True, "activation_offloading": offload,
                         "gradient_checkpointing_kwargs": {"use_reentrant": reentrant}})


def forward(net) -> torch.Tensor:
    """The loss of one batch, with the forward's garbage collected (what the backward will still find is what is held)."""
    ids = torch.randint(0, 300, (BATCH, WIDTH), generator=torch.Generator().manual_seed(1))
    loss = net(input_ids=ids, labels=ids, use_cache=False).loss
    gc.collect()
    return loss


@pytest.mark.parametrize("reentrant", [False, True])
def test_layer_inputs_are_handed_over_freed_and_the_gradients_unchanged(copying, reentrant):
    grads = {}
    for offload in (False, True):
        net = model()
        enable_checkpointing(net, model_settings(config(reentrant, offload)), "cuda")
        loss = forward(net)
        if offload:
            # one hook per checkpointed layer, each handed that layer's input, which the forward no longer holds
            inputs = [ref for hooks in copying.made for ref in hooks.originals]
            assert len(copying.made) == LAYERS and len(inputs) >= LAYERS
            assert sum(ref() is None for ref in inputs) >= LAYERS
        else:
            assert not copying.made
        loss.backward()
        grads[offload] = (float(loss), {name: p.grad.clone() for name, p in net.named_parameters()})
    assert grads[True][0] == grads[False][0]
    assert all(torch.equal(grads[True][1][name], grads[False][1][name]) for name in grads[False][1])


def test_without_offloading_the_layer_inputs_stay_until_the_backward():
    """The control for the test above: checkpointing alone holds each layer's input (the saved-tensor hooks see it)."""
    net = model()
    enable_checkpointing(net, model_settings(config(False, False)), "cuda")
    seen = []

    def keep(tensor):
        seen.append(weakref.ref(tensor))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        loss = forward(net)
    alive = [ref for ref in seen if ref() is not None and ref().shape == (BATCH, WIDTH, HIDDEN)]
    assert len(alive) >= LAYERS
    loss.backward()


def test_nothing_moves_on_a_cpu(copying):
    net = model()
    enable_checkpointing(net, model_settings(config(False, True)), "cpu")
    loss = forward(net)
    loss.backward()
    assert not copying.made


def test_checkpointing_settings_reach_transformers(monkeypatch):
    calls = []
    monkeypatch.setattr(LlamaForCausalLM, "activation_checkpointing_enable", lambda self, **kwargs: calls.append(kwargs))
    net = model()
    enable_checkpointing(net, model_settings(build_config({**BASE, "gradient_checkpointing": True})), "cuda")
    enable_checkpointing(net, model_settings(config(True, "legacy")), "cuda")
    enable_checkpointing(net, model_settings(build_config({**BASE, "gradient_checkpointing": "offload"})), "cuda")
    enable_checkpointing(net, model_settings(config(False, True)), "cpu")
    assert calls == [{"activation_checkpointing_kwargs": {"use_reentrant": False}, "offload": False},
                     {"activation_checkpointing_kwargs": {"use_reentrant": True}, "offload": True},
                     {"activation_checkpointing_kwargs": {"use_reentrant": False}, "offload": True},
                     {"activation_checkpointing_kwargs": {"use_reentrant": False}, "offload": False}]


def test_axolotl_settings_of_activation_offloading():
    from rlft.config.axolotl_keys import unsupported_settings
    from rlft.errors import ConfigError

    with pytest.raises(ConfigError, match="activation_offloading .* needs gradient_checkpointing: true"):
        build_config({**BASE, "activation_offloading": True})
    for value in (True, "legacy", "hidden_states"):
        cfg = build_config({**BASE, "activation_offloading": value, "gradient_checkpointing": True})
        assert model_settings(cfg).offload_activations and not unsupported_settings(cfg)[0]
    assert not model_settings(build_config({**BASE, "gradient_checkpointing": True})).offload_activations
    legacy_alias = build_config({**BASE, "gradient_checkpointing": "offload"})  # Axolotl: checkpointing + offloading
    assert model_settings(legacy_alias).offload_activations and not unsupported_settings(legacy_alias)[0]
    for settings, named in (({"activation_offloading": "disk", "gradient_checkpointing": True}, "activation_offloading: disk"),
                            ({"gradient_checkpointing": "offload_disk"}, "gradient_checkpointing: offload_disk")):
        refused = unsupported_settings(build_config({**BASE, **settings}))[0]
        assert [key for key, _ in refused] == [named]


def test_a_model_with_its_own_checkpointing_code_keeps_it_and_refuses_offloading():
    """A model class that overrides gradient_checkpointing_enable (remote code) is called as it expects; transformers'
    offloading cannot wrap what it sets up, so asking for offloading is refused, not ignored."""
    from rlft.errors import ModelError

    calls = []

    class OwnCheckpointing(LlamaForCausalLM):
        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):  # the old signature
            calls.append(gradient_checkpointing_kwargs)

    torch.manual_seed(0)
    net = OwnCheckpointing(LlamaConfig(hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                                       num_key_value_heads=2, vocab_size=300))
    enable_checkpointing(net, model_settings(config(True, False)), "cuda")
    assert calls == [{"use_reentrant": True}]
    with pytest.raises(ModelError, match="activation_offloading: OwnCheckpointing sets up gradient checkpointing"):
        enable_checkpointing(net, model_settings(config(False, True)), "cuda")


def test_fsdp_activation_checkpointing_is_checkpointing():
    """fsdp_config.activation_checkpointing means gradient_checkpointing (docs/distributed.md): the model is
    checkpointed when it loads (also on one process), and activation_offloading may go with it."""
    from rlft.config.activation_checkpointing import checkpoints

    fsdp = {"fsdp_version": 2, "fsdp_config": {"activation_checkpointing": True}}
    cfg = build_config({**BASE, **fsdp, "activation_offloading": True})
    assert checkpoints(cfg) and model_settings(cfg).offload_activations
    assert not checkpoints(build_config(BASE))


def test_a_quantized_base_keeps_the_checkpointing_rlft_set_up(monkeypatch):
    """PEFT's prepare_model_for_kbit_training would enable checkpointing again, its own way (no offload, no
    gradient_checkpointing_kwargs): rlft asks it not to."""
    import peft

    from rlft.models.loading import attach_adapter

    asked = []
    monkeypatch.setattr(peft, "prepare_model_for_kbit_training",
                        lambda model, use_gradient_checkpointing=True, **kwargs: asked.append(use_gradient_checkpointing) or model)
    cfg = build_config({**BASE, "adapter": "qlora", "load_in_4bit": True, "lora_target_modules": ["q_proj"],
                        "gradient_checkpointing": True, "activation_offloading": True})
    attach_adapter(model(), model_settings(cfg))
    assert asked == [False]
