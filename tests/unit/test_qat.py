"""`qat:`: quantization-aware training through torchao's fake quantizers (Axolotl's section)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from rlft.config.sections.qat import combination_problem
from rlft.errors import ModelError
from rlft.models.qat import check_qat, describe, fake_quant_schedule, prepare_qat, set_fake_quant

def tiny(seed: int = 0):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(LlamaConfig(
        vocab_size=260, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, tie_word_embeddings=True))


def qat(activation=None, weight="int4", group_size=32, quantize_embedding=False, after=None):
    return SimpleNamespace(activation=activation, weight=weight, group_size=group_size,
                           quantize_embedding=quantize_embedding, fake_quant_after_n_steps=after)


@pytest.mark.parametrize("activation, weight, group, refused", [
    (None, "int4", 32, None), ("int8", "int4", 32, None), ("float8", "int4", 32, None), ("float8", "float8", 32, None),
    ("mxfp4", "mxfp4", 32, None), ("nvfp4", "nvfp4", 16, None),
    (None, "nvfp4", 16, "NVFP4 weights only together with NVFP4 activations"),  # torchao: no weight-only NVFP4 QAT
    (None, "int8", 32, "no QAT for activation_dtype unset with weight_dtype int8"),  # Axolotl's default weight_dtype
    ("int4", "int4", 32, "no QAT for activation_dtype int4 with weight_dtype int4"),
    ("int8", "int8", 32, "no QAT for activation_dtype int8 with weight_dtype int8"),
    (None, "float8", 32, "no QAT for activation_dtype unset with weight_dtype float8"),
    (None, "mxfp4", 32, "MXFP4 weights only together with MXFP4 activations"),
    ("mxfp4", "mxfp4", 16, "mxfp4 quantizes in blocks of 32"), ("nvfp4", "nvfp4", 32, "nvfp4 quantizes in groups of 16"),
    ("int8", "nvfp4", 16, "set activation_dtype: nvfp4, not int8"),
])
def test_which_formats_torchao_can_train(activation, weight, group, refused):
    problem = combination_problem(activation, weight, group)
    assert (problem is None) if refused is None else (refused in problem), problem


def test_config_rules(config, config_problems):
    problems = lambda **settings: "\n".join(what for _, what in config_problems(**settings))  # noqa: E731
    int4 = {"activation_dtype": "int8", "weight_dtype": "int4", "group_size": 32}
    assert config(qat=int4).qat.weight == "int4"
    assert config(qat={**int4, "activation_dtype": "fp8"}).qat.activation == "float8"  # Axolotl's alias
    assert "built for SFT (as Axolotl's QAT examples train), not dpo" in problems(
        qat=int4, rl="dpo", datasets=[{"path": "p.jsonl", "type": "chatml.intel"}])
    assert "qat with adapter: lora" in problems(qat=int4, adapter="lora")
    assert "qat under DeepSpeed is not built" in problems(qat=int4, deepspeed="deepspeed_configs/zero2.json")
    assert "fake_quant_after_n_steps with mxfp4" in problems(
        qat={"activation_dtype": "mxfp4", "weight_dtype": "mxfp4", "fake_quant_after_n_steps": 5})
    assert "'int3' is not allowed: expected 'int4', 'int8'" in problems(qat={"weight_dtype": "int3"})


def test_prepare_swaps_the_layers_and_keeps_names_and_tying():
    model = tiny()
    names = sorted(model.state_dict())
    assert prepare_qat(model, qat("int8", quantize_embedding=True)) == 14 + 1 + 1  # 7 per layer, lm_head, embedding
    assert sorted(model.state_dict()) == names  # checkpoints and the final model load without torchao
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert type(model.model.layers[0].mlp.up_proj).__name__ == "FakeQuantizedLinear"


def test_int4_weights_take_at_most_16_values_per_group_and_int8_activations_256_per_token():
    """The rounding by hand: a 4-bit code has 16 values, so each group of 32 weights becomes at most 16 distinct
    numbers; an 8-bit per-token code gives each token's activations at most 256."""
    model = tiny()
    prepare_qat(model, qat("int8"))
    layer = model.model.layers[0].mlp.up_proj
    rounded = layer.weight_fake_quantizer(layer.weight.detach())
    assert not torch.equal(rounded, layer.weight)
    for group in rounded.reshape(-1, 32):
        assert len(torch.unique(group)) <= 16
    assert max(len(torch.unique(row)) for row in layer.weight.detach().reshape(-1, 32)) == 32  # before: all distinct
    tokens = torch.randn(4, 64) * 3
    assert max(len(torch.unique(row)) for row in layer.activation_fake_quantizer(tokens)) <= 256
    assert (layer.activation_fake_quantizer(tokens) - tokens).abs().max() <= 2 * 6 * 3 / 255  # within a step of its grid


def test_fake_quant_off_is_the_plain_model_and_the_schedule_turns_it_on():
    inputs = torch.randint(0, 260, (2, 12))
    logits = lambda model: model(input_ids=inputs).logits.detach()  # noqa: E731
    plain = logits(tiny())
    model = tiny()
    prepare_qat(model, qat("int8"))
    rounded = logits(model)
    assert (rounded - plain).abs().max() > 1e-3
    follow = fake_quant_schedule(qat("int8", after=3))
    for step, expected in ((0, plain), (2, plain), (3, rounded), (7, rounded)):
        follow(model, step)
        assert torch.allclose(logits(model), expected, atol=1e-6), step
    set_fake_quant(model, False)
    assert torch.allclose(logits(model), plain, atol=1e-6)


def test_the_plan_line():
    assert describe(qat("int8", after=1000)) == ("torchao fake quantization: int4 weights in groups of 32, int8 activations "
                                                 "per token, from step 1001; the saved weights stay float "
                                                 "(docs/training.md#quantization-aware-training-qat)")
    assert describe(qat("mxfp4", "mxfp4")).startswith("torchao fake quantization: MXFP4 weights, MXFP4 activations, from the first")


def test_what_torchao_would_break_is_refused_before_the_first_step():
    # a group size that does not divide a layer's width: torchao would fail in the first forward, naming no layer
    with pytest.raises(ModelError, match=r"qat: model.layers.0.self_attn.q_proj is 64 wide, which groups of 48 do not divide"):
        prepare_qat(tiny(), qat("int8", group_size=48))
    # an embedding with a forward of its own (Gemma 3 scales it): torchao's fake-quantized embedding would drop that
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    gemma = Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=260, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                               num_attention_heads=2, num_key_value_heads=1, head_dim=32))
    with pytest.raises(ModelError, match="embedding is a Gemma3TextScaledWordEmbedding with a forward of its own"):
        prepare_qat(gemma, qat("int8", quantize_embedding=True))
    # a subclass of nn.Linear (an MoE router) keeps its own forward: it is not swapped
    class Router(torch.nn.Linear):
        pass

    model = tiny()
    model.model.layers[0].mlp.up_proj = Router(64, 128, bias=False)
    assert prepare_qat(model, qat("int8")) == 14  # the 15 linear layers but the router
    assert type(model.model.layers[0].mlp.up_proj) is Router


def test_formats_that_need_other_hardware_or_precision():
    cfg = lambda weight, activation, **extra: SimpleNamespace(  # noqa: E731
        qat=qat(activation, weight, 16 if weight == "nvfp4" else 32), fp16=False, bf16=extra.get("bf16", "auto"))
    with pytest.raises(ModelError, match="nvfp4 needs a Blackwell GPU .* on cpu use int4"):
        check_qat(cfg("nvfp4", "nvfp4"), "cpu")
    with pytest.raises(ModelError, match="qat with mxfp4 under bf16/fp16"):
        check_qat(cfg("mxfp4", "mxfp4", bf16=True), "cpu")
    check_qat(cfg("mxfp4", "mxfp4"), "cpu")  # float32 on a CPU: trains


FORMATS = [(None, "int4"), ("int8", "int4"), ("float8", "int4"), ("float8", "float8"), ("mxfp4", "mxfp4")]


@pytest.mark.parametrize("activation, weight, precision", [(a, w, p) for a, w in FORMATS for p in ("fp32", "bf16")
                                                           if not (w == "mxfp4" and p == "bf16")])  # refused: check_qat
def test_each_cpu_format_trains(activation, weight, precision):
    """A forward and backward through every layer the format rounds, in float32 and under bf16 autocast (rlft's mixed
    precision)."""
    model = tiny()
    prepare_qat(model, qat(activation, weight))
    inputs = torch.randint(0, 260, (2, 12))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss = model(input_ids=inputs, labels=inputs).loss
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)
