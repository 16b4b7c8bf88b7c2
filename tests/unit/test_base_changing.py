"""PiSSA and OLoRA adapters converted to plain LoRAs on the original base (rlft.models.base_changing): the same tensors
and scale as PEFT's own conversion, and, unlike PEFT's, the other trained tensors kept (modules_to_save, DoRA's
magnitudes), so the converted adapter on the untouched base gives the trained model's logits."""

from __future__ import annotations

import json

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from rlft.config.settings.model import model_settings
from rlft.models.base_changing import (CONFIG, RESUME_FOLDER, WEIGHTS, as_plain_lora, changes_base, convert_folder,
                                       plain_lora_config, resume_weights, save_initial_adapter)

CONFIG_KW = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 vocab_size=120)


def base() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**CONFIG_KW)).eval()


def trained(init: str, **extra) -> PeftModel:
    """A PEFT model with the init, its trainable tensors then moved (as training would) with a fixed seed."""
    model = get_peft_model(base(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                              init_lora_weights=init, **extra))
    return model


def move(model: PeftModel) -> None:
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)


def logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("init, extra", [
    ("pissa", {}),
    ("pissa_niter_2", {}),  # a randomised SVD: loading it unconverted would rebuild another residual
    ("olora", {}),
    ("pissa_niter_2", {"modules_to_save": ["lm_head"]}),
    ("pissa_niter_2", {"use_dora": True}),
    ("pissa", {"use_rslora": True}),
])
def test_the_converted_adapter_on_the_original_base_is_the_trained_model(tmp_path, init, extra):
    torch.manual_seed(2)
    model = trained(init, **extra)
    assert changes_base(model)
    initial = save_initial_adapter(model, tmp_path)
    move(model)
    model.save_pretrained(tmp_path / "final")
    convert_folder(tmp_path / "final", initial)
    saved = json.loads((tmp_path / "final" / CONFIG).read_text())
    assert saved["r"] == 8 and saved["init_lora_weights"] is True
    assert saved["lora_alpha"] == pytest.approx(8 * (2 ** 0.5 if extra.get("use_rslora") else 2))
    loaded = PeftModel.from_pretrained(base(), tmp_path / "final").eval()  # the untouched base: no init runs
    ids = torch.randint(0, 120, (2, 12), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(logits(loaded, ids), logits(model.eval(), ids), atol=1e-5, rtol=1e-5)
    kept = [name for name in load_file(tmp_path / "final" / WEIGHTS) if "lora_A" not in name and "lora_B" not in name]
    assert bool(kept) == bool(extra.get("modules_to_save") or extra.get("use_dora"))


def test_the_lora_factors_and_config_are_those_of_peft_s_own_conversion(tmp_path):
    torch.manual_seed(2)
    model = trained("pissa_niter_2")
    initial = save_initial_adapter(model, tmp_path)
    move(model)
    model.save_pretrained(tmp_path / "ours")
    convert_folder(tmp_path / "ours", initial)
    model.save_pretrained(tmp_path / "peft", path_initial_model_for_weight_conversion=str(initial))
    ours, theirs = load_file(tmp_path / "ours" / WEIGHTS), load_file(tmp_path / "peft" / WEIGHTS)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    ours_config, theirs_config = (json.loads((tmp_path / side / CONFIG).read_text()) for side in ("ours", "peft"))
    assert {key: ours_config[key] for key in ("r", "lora_alpha", "init_lora_weights")} == \
           {key: theirs_config[key] for key in ("r", "lora_alpha", "init_lora_weights")}


def test_plain_conversion_rules():
    initial = {"x.lora_A.weight": torch.ones(2, 3), "x.lora_B.weight": torch.ones(5, 2)}
    trained_ = {"x.lora_A.weight": torch.zeros(2, 3), "x.lora_B.weight": torch.full((5, 2), 2.0), "lm_head.weight": torch.eye(2)}
    converted = as_plain_lora(trained_, initial)
    assert converted["x.lora_A.weight"].shape == (4, 3) and converted["x.lora_B.weight"].shape == (5, 4)
    assert torch.equal(converted["x.lora_B.weight"][:, 2:], -torch.ones(5, 2))
    assert converted["lm_head.weight"] is trained_["lm_head.weight"]
    with pytest.raises(ValueError, match="the initial adapter has no y.lora_A.weight"):
        as_plain_lora({"y.lora_A.weight": torch.zeros(2, 3)}, initial)
    with pytest.raises(ValueError, match="rank_pattern"):
        plain_lora_config({"r": 4, "lora_alpha": 8, "rank_pattern": {"q_proj": 8}})


def test_a_resume_loads_the_adapter_as_trained_where_the_checkpoint_kept_one(tmp_path):
    (tmp_path / "model").mkdir()
    assert resume_weights(tmp_path) == tmp_path / "model"  # checkpoints of plain LoRA, and those written before
    (tmp_path / RESUME_FOLDER).mkdir()
    (tmp_path / RESUME_FOLDER / WEIGHTS).write_bytes(b"")
    assert resume_weights(tmp_path) == tmp_path / RESUME_FOLDER


def test_each_run_writes_the_initial_adapter_afresh(tmp_path):
    """A new run in an output_dir that holds an older run's init-adapter must convert against its own B0 A0."""
    from rlft.models.base_changing import is_converted

    for seed in (2, 5):
        torch.manual_seed(seed)
        model = trained("pissa_niter_2")
        folder = save_initial_adapter(model, tmp_path)
    saved = load_file(folder / WEIGHTS)
    own = {name: p for name, p in model.named_parameters() if "lora_A" in name}
    assert own and all(torch.equal(saved[name.replace(".default", "")], p.detach()) for name, p in own.items())
    assert is_converted(folder)  # its config names no init to run again
    assert not list(tmp_path.glob(".tmp-*"))


def test_an_adapter_as_trained_on_a_residual_base_is_refused_as_lora_model_dir(tmp_path):
    from rlft.config import build_config
    from rlft.errors import ModelError
    from rlft.models.loading import attach_adapter

    torch.manual_seed(2)
    trained("pissa").save_pretrained(tmp_path / "raw")  # its config still names the init
    cfg = build_config({"base_model": "m", "datasets": [{"path": "rows.jsonl"}], "adapter": "lora",
                        "lora_model_dir": str(tmp_path / "raw")})
    with pytest.raises(ModelError, match="holds a PiSSA or OLoRA adapter as trained"):
        attach_adapter(base(), model_settings(cfg))


def test_the_reference_of_a_base_rewriting_init_is_the_base_itself(tmp_path):
    """With PiSSA or OLoRA, the policy with its adapter disabled is the residual W - s B0 A0, not the starting model:
    the reference (DPO family, GRPO's KL, EBFT's frozen network) is the policy with its initial adapter instead,
    which is the starting model however far the adapter has trained (no copy of the model)."""
    from accelerate import Accelerator

    from rlft.config import build_config
    from rlft.models.tiny import write_tiny_model
    from rlft.data.tokenizer import byte_tokenizer
    from rlft.train.policy import policy_and_frozen

    folder = write_tiny_model(tmp_path / "m", "XS")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig.from_pretrained(folder)).save_pretrained(folder)  # seeded weights to load
    ids = torch.tensor([[49, 43, 50, 61]])
    original = logits(LlamaForCausalLM.from_pretrained(folder).eval(), ids)
    for init, initial in (("pissa", True), ("olora", True), (True, False)):
        cfg = build_config({"base_model": str(folder), "datasets": [{"path": "rows.jsonl"}], "adapter": "lora", "lora_r": 4,
                            "lora_alpha": 8, "lora_target_modules": ["q_proj", "v_proj"], "peft_init_lora_weights": init})
        policy, frozen = policy_and_frozen(cfg, model_settings(cfg), byte_tokenizer(), Accelerator(cpu=True), None, need_frozen=True)
        assert not frozen.is_copy and bool(frozen.initial) is initial
        move(policy)
        with frozen.view(policy) as reference:
            torch.testing.assert_close(logits(reference.eval(), ids), original)


def test_base_rewriting_inits_that_cannot_work_are_refused():
    from rlft.config import build_config
    from rlft.errors import ConfigError

    base_keys = {"base_model": "m", "datasets": [{"path": "rows.jsonl"}], "adapter": "lora"}
    with pytest.raises(ConfigError, match="pissa with lora_target_parameters: PEFT 0.21 cannot build it"):
        build_config({**base_keys, "peft_init_lora_weights": "pissa", "lora_target_parameters": ["experts.down_proj"]})
    with pytest.raises(ConfigError, match="olora with a quantized base and trl.use_vllm"):
        build_config({**base_keys, "rl": "grpo", "adapter": "qlora", "load_in_4bit": True, "peft_init_lora_weights": "olora",
                      "trl": {"use_vllm": True, "vllm_lora_sync": True, "reward_funcs": ["r.f"]}})


@pytest.mark.parametrize("init, extra", [("pissa", {}), ("olora", {}), ("pissa_niter_2", {"modules_to_save": ["lm_head"]}),
                                         ("pissa", {"use_dora": True, "lora_dropout": 0.5})])
def test_the_initial_adapter_view_is_the_original_model_and_leaves_training_alone(init, extra):
    """The reference of a PiSSA/OLoRA run (FrozenPolicy.initial_trainables): the residual base with the initial adapter
    is the original model, whatever the adapter has trained since; the trained tensors, a backward pending on them and
    the training mode are as they were (lora_dropout is off inside the view, as in a frozen copy)."""
    from rlft.models.frozen import FrozenPolicy

    model = trained(init, **extra).train()
    frozen = FrozenPolicy.initial_trainables(model)
    ids = torch.randint(0, 120, (2, 12), generator=torch.Generator().manual_seed(3))
    move(model)  # training moved the adapter
    trained_values = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    torch.manual_seed(4)
    loss = model(ids).logits.logsumexp(-1).mean()  # a forward whose backward waits until after the view
    with torch.no_grad(), frozen.view(model) as network:
        assert not network.training
        reference = network(ids).logits
    assert model.training
    torch.testing.assert_close(reference, logits(base(), ids), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(reference, logits(model.eval(), ids), atol=1e-3)  # the trained adapter differs
    model.train()
    loss.backward()
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert torch.equal(p.detach(), trained_values[name]) and p.grad is not None, name
    expected = trained(init, **extra).train()
    move(expected)
    torch.manual_seed(4)
    expected(ids).logits.logsumexp(-1).mean().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), expected.named_parameters()):
        if p.requires_grad:
            torch.testing.assert_close(p.grad, q.grad, msg=name)
