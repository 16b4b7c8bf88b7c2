"""Learning-rate schedules (values by hand) and the optimizer's parameter groups."""

from __future__ import annotations

import math
from typing import get_args

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlft.config.schema import Optimizer
from rlft.train.optim import build_optimizer, build_scheduler, lr_multiplier, warmup_steps

# total 14 steps, 4 warm-up steps: warm-up factors (s+1)/(w+1) = 0.2, 0.4, 0.6, 0.8; decay over steps 4..14
TOTAL, WARMUP = 14, 4
MIDPOINT = WARMUP + (TOTAL - WARMUP) // 2  # step 9, progress 0.5


@pytest.mark.parametrize("kind", ["cosine", "linear", "constant_with_warmup"])
def test_warmup_is_linear_for_every_schedule(kind):
    assert [lr_multiplier(step, TOTAL, WARMUP, kind) for step in range(WARMUP)] == pytest.approx([0.2, 0.4, 0.6, 0.8])


def test_constant_ignores_warmup_like_transformers():
    assert [lr_multiplier(step, TOTAL, WARMUP, "constant") for step in range(WARMUP)] == [1.0] * WARMUP


@pytest.mark.parametrize("kind", ["cosine", "linear", "constant", "constant_with_warmup"])
def test_peak_right_after_warmup(kind):
    assert lr_multiplier(WARMUP, TOTAL, WARMUP, kind) == pytest.approx(1.0)


def test_cosine_midpoint_and_end():
    assert lr_multiplier(MIDPOINT, TOTAL, WARMUP, "cosine") == pytest.approx(0.5)
    assert lr_multiplier(TOTAL, TOTAL, WARMUP, "cosine") == pytest.approx(0.0)


def test_cosine_quarter():
    # progress 0.3 at step 7: 0.5 * (1 + cos(0.3 pi))
    assert lr_multiplier(7, TOTAL, WARMUP, "cosine") == pytest.approx(0.5 * (1 + math.cos(0.3 * math.pi)))


def test_cosine_min_lr_ratio():
    assert lr_multiplier(MIDPOINT, TOTAL, WARMUP, "cosine", 0.1) == pytest.approx(0.1 + 0.9 * 0.5)  # 0.55
    assert lr_multiplier(TOTAL, TOTAL, WARMUP, "cosine", 0.1) == pytest.approx(0.1)
    assert lr_multiplier(WARMUP, TOTAL, WARMUP, "cosine", 0.1) == pytest.approx(1.0)


def test_cosine_stays_at_min_past_the_end():
    assert lr_multiplier(TOTAL + 5, TOTAL, WARMUP, "cosine", 0.1) == pytest.approx(0.1)


def test_linear_midpoint_and_end():
    assert lr_multiplier(MIDPOINT, TOTAL, WARMUP, "linear") == pytest.approx(0.5)
    assert lr_multiplier(TOTAL - 1, TOTAL, WARMUP, "linear") == pytest.approx(0.1)
    assert lr_multiplier(TOTAL, TOTAL, WARMUP, "linear") == pytest.approx(0.0)


@pytest.mark.parametrize("kind", ["constant", "constant_with_warmup"])
def test_constant_after_warmup(kind):
    assert [lr_multiplier(step, TOTAL, WARMUP, kind) for step in (MIDPOINT, TOTAL)] == [1.0, 1.0]


def test_no_warmup_starts_at_peak():
    assert lr_multiplier(0, 10, 0, "cosine") == pytest.approx(1.0)
    assert lr_multiplier(5, 10, 0, "linear") == pytest.approx(0.5)


def test_warmup_steps_from_ratio_rounds_up(config):
    assert warmup_steps(config(warmup_ratio=0.1), 25) == 3
    assert warmup_steps(config(warmup_steps=7), 25) == 7
    assert warmup_steps(config(), 25) == 0


# ---------------------------------------------------------------- optimizer


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=260, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, max_position_embeddings=64, attention_bias=True, tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def group_names(model, optimizer) -> list[set[str]]:
    names = {id(param): name for name, param in model.named_parameters()}
    return [{names[id(p)] for p in group["params"]} for group in optimizer.param_groups]


def test_biases_and_norms_get_no_weight_decay(config, tiny_model):
    optimizer = build_optimizer(config(weight_decay=0.01), tiny_model)
    decay, no_decay = group_names(tiny_model, optimizer)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.01, 0.0]
    assert no_decay == {n for n, _ in tiny_model.named_parameters() if n.endswith("bias") or "norm" in n}
    assert "model.layers.0.self_attn.q_proj.bias" in no_decay
    assert "model.layers.1.post_attention_layernorm.weight" in no_decay
    assert "model.norm.weight" in no_decay
    assert "model.layers.0.self_attn.q_proj.weight" in decay
    assert "model.embed_tokens.weight" in decay
    assert len(decay) + len(no_decay) == len(list(tiny_model.parameters()))


def test_frozen_parameters_are_left_out(config, tiny_model):
    tiny_model.model.embed_tokens.weight.requires_grad_(False)
    try:
        decay, no_decay = group_names(tiny_model, build_optimizer(config(), tiny_model))
    finally:
        tiny_model.model.embed_tokens.weight.requires_grad_(True)
    assert "model.embed_tokens.weight" not in decay | no_decay


EXPECTED_CLASS = {
    "adamw_torch": torch.optim.AdamW,
    "adamw_torch_fused": torch.optim.AdamW,
    "adamw": torch.optim.AdamW,
    "adam": torch.optim.Adam,
    "sgd": torch.optim.SGD,
    "rmsprop": torch.optim.RMSprop,
    "adagrad": torch.optim.Adagrad,
}


def test_every_schema_optimizer_has_an_expected_class():
    assert set(get_args(Optimizer)) == set(EXPECTED_CLASS)


@pytest.mark.parametrize("name", get_args(Optimizer))
def test_every_optimizer_builds_and_steps(config, tiny_model, name):
    optimizer = build_optimizer(config(optimizer=name, learning_rate=1e-3), tiny_model)
    assert type(optimizer) is EXPECTED_CLASS[name]
    assert all(group["lr"] == 1e-3 for group in optimizer.param_groups)
    before = tiny_model.lm_head.weight.detach().clone()
    ids = torch.tensor([[1, 2, 3, 4]])
    tiny_model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    assert not torch.equal(before, tiny_model.lm_head.weight)


def test_adam_hyperparameters_from_config(config, tiny_model):
    optimizer = build_optimizer(config(adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-6), tiny_model)
    assert optimizer.defaults["betas"] == (0.8, 0.95)
    assert optimizer.defaults["eps"] == 1e-6


def test_fused_flag_only_for_fused_adamw(config, tiny_model):
    assert build_optimizer(config(optimizer="adamw_torch_fused"), tiny_model).defaults["fused"] is True
    assert not build_optimizer(config(optimizer="adamw_torch"), tiny_model).defaults["fused"]


def test_scheduler_follows_multiplier(config, tiny_model):
    cfg = config(learning_rate=1.0, warmup_steps=WARMUP, lr_scheduler="linear")
    optimizer = build_optimizer(cfg, tiny_model)
    scheduler = build_scheduler(cfg, optimizer, TOTAL)
    seen = []
    for _ in range(TOTAL + 1):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([lr_multiplier(step, TOTAL, WARMUP, "linear") for step in range(TOTAL + 1)])
