"""The chunked, fused output-layer cross-entropy equals the plain one, in value and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from rlft.losses.linear_ce import linear_cross_entropy_sum
from rlft.models.head import final_hidden, output_layer


def tensors(dtype=torch.float32, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(13, 8, generator=g).to(dtype).requires_grad_()
    weight = torch.randn(11, 8, generator=g).to(dtype).requires_grad_()
    b = torch.randn(11, generator=g).to(dtype).requires_grad_() if bias else None
    targets = torch.randint(0, 11, (13,), generator=g)
    return hidden, weight, b, targets


def plain(hidden, weight, bias, targets):
    return F.cross_entropy(F.linear(hidden, weight, bias).float(), targets, reduction="sum")


@pytest.mark.parametrize("chunk", [1, 4, 13, 100])
@pytest.mark.parametrize("bias", [True, False])
def test_value_and_gradients_equal_the_plain_cross_entropy(chunk, bias):
    h1, w1, b1, t = tensors(bias=bias)
    h2, w2, b2 = (x.detach().clone().requires_grad_() if x is not None else None for x in tensors(bias=bias)[:3])
    fused = linear_cross_entropy_sum(h1, w1, b1, t, chunk)
    reference = plain(h2, w2, b2, t)
    torch.testing.assert_close(fused, reference, rtol=1e-6, atol=1e-5)
    (3.0 * fused).backward()  # the loop scales the loss sum before backward
    (3.0 * reference).backward()
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-4, atol=1e-5)
    if bias:
        torch.testing.assert_close(b1.grad, b2.grad, rtol=1e-4, atol=1e-5)


def test_by_hand_on_two_tokens():
    """loss = sum_i logsumexp(z_i) - z_i[y_i]; d loss / d h_i = (softmax(z_i) - onehot(y_i)) W."""
    hidden = torch.tensor([[1.0, 0.0], [0.0, 2.0]], requires_grad=True)
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    targets = torch.tensor([0, 2])
    loss = linear_cross_entropy_sum(hidden, weight, None, targets, 1)
    z = [[1.0, 0.0, 1.0], [0.0, 2.0, 2.0]]
    lse = [torch.tensor(row).exp().sum().log() for row in z]
    torch.testing.assert_close(loss, (lse[0] - 1.0) + (lse[1] - 2.0))
    loss.backward()
    p0 = torch.tensor(z[0]).softmax(0) - torch.tensor([1.0, 0, 0])
    torch.testing.assert_close(hidden.grad[0], p0 @ weight)


def test_frozen_weight_bf16_and_no_grad():
    h1, w1, _, t = tensors(torch.bfloat16, bias=False)
    w1.requires_grad_(False)
    h2 = h1.detach().clone().requires_grad_()
    linear_cross_entropy_sum(h1, w1, None, t, 5).backward()
    plain(h2, w1, None, t).backward()
    assert w1.grad is None
    torch.testing.assert_close(h1.grad, h2.grad, rtol=2e-2, atol=2e-2)
    with torch.no_grad():
        value = linear_cross_entropy_sum(h1, w1, None, t, 5)
    assert value.grad_fn is None
    torch.testing.assert_close(value, plain(h1, w1, None, t).detach())


def test_no_target_positions_give_zero_and_zero_gradients():
    h, w, _, _ = tensors(bias=False)
    loss = linear_cross_entropy_sum(h[:0], w, None, torch.zeros(0, dtype=torch.long))
    loss.backward()
    assert float(loss.detach()) == 0.0 and float(w.grad.abs().sum()) == 0.0


VOCAB = 4096  # rlft.models.head.MIN_VOCAB: smaller output layers keep the model's own logits


def tiny_model(**extra):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=32, tie_word_embeddings=True, **extra)
    return LlamaForCausalLM(config)


def test_final_hidden_is_what_the_model_projects():
    model = tiny_model()
    ids = torch.randint(0, VOCAB, (2, 6))
    head = output_layer(model)
    hidden = final_hidden(model, {"input_ids": ids}, head)
    torch.testing.assert_close(head(hidden), model(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_a_model_whose_logits_are_not_its_output_layer_is_detected():
    model = tiny_model()
    original = type(model).forward

    def scaled(self, *args, **kwargs):  # Cohere-style logit_scale after the output layer
        out = original(self, *args, **kwargs)
        out.logits = 0.5 * out.logits
        return out

    model.forward = scaled.__get__(model)
    assert final_hidden(model, {"input_ids": torch.randint(0, VOCAB, (2, 6))}, output_layer(model)) is None
    assert output_layer(model) is None  # remembered: later steps do not pay for a second forward


@pytest.mark.parametrize("packed", [False, True])
def test_the_sft_loss_through_the_output_layer_equals_the_models_logits(packed, monkeypatch):
    """SFT's loss sum and gradients: fused head (target positions only, chunked) == the model's (B, T, V) logits."""
    from rlft.train.recipes.sft import SFTRecipe

    ids = torch.randint(0, VOCAB, (3, 9), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, :4] = -100  # a prompt
    labels[2, 7:] = -100  # padding
    batch = {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}
    if packed:
        batch["position_ids"] = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4]] * 3)
    values, grads = [], []
    from rlft.models import head
    from rlft.train.recipes import sft

    calls = []
    monkeypatch.setattr(sft, "final_hidden", lambda *a, _f=head.final_hidden: calls.append(1) or _f(*a))
    for fused in (True, False):
        monkeypatch.setattr(head, "MIN_VOCAB", VOCAB if fused else 10**9)
        model = tiny_model()
        loss = SFTRecipe.__new__(SFTRecipe)._loss_sum(model, batch)
        loss.backward()
        assert bool(calls) is fused
        calls.clear()
        values.append(loss.detach())
        grads.append({n: p.grad for n, p in model.named_parameters()})
    torch.testing.assert_close(values[0], values[1], rtol=1e-6, atol=1e-5)
    for name in grads[1]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_small_vocabulary_keeps_the_models_logits():
    torch.manual_seed(0)
    small = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=32))
    assert output_layer(small) is None
    model = tiny_model()
    assert output_layer(model) is model.lm_head


@pytest.mark.parametrize("chunk", [1, 5, 100])
def test_per_row_nll_and_its_gradients_equal_the_plain_ones(chunk):
    from rlft.losses.linear_ce import linear_token_nll

    h1, w1, b1, t = tensors()
    h2, w2, b2 = (x.detach().clone().requires_grad_() for x in tensors()[:3])
    fused = linear_token_nll(h1, w1, b1, t, chunk)
    reference = F.cross_entropy(F.linear(h2, w2, b2).float(), t, reduction="none")
    torch.testing.assert_close(fused, reference, rtol=1e-6, atol=1e-5)
    row_weights = torch.linspace(-2.0, 3.0, t.numel())  # a loss that weighs rows differently
    (fused * row_weights).sum().backward()
    (reference * row_weights).sum().backward()
    for a, b in ((h1, h2), (w1, w2), (b1, b2)):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


def test_preference_sequence_logps_through_the_output_layer_equal_the_models_logits(monkeypatch):
    """Pairs' completion log-prob sums, per-token log-probs, the mean-logit metric and the gradients: fused (completion
    positions only, chunked) == the model's (B, T, V) logits."""
    from rlft.models import head
    from rlft.train.recipes import preference
    from rlft.train.recipes.preference import sequence_logps

    calls = []
    monkeypatch.setattr(preference, "final_hidden", lambda *a, _f=head.final_hidden: calls.append(1) or _f(*a))

    ids = torch.randint(0, VOCAB, (4, 8), generator=torch.Generator().manual_seed(2))
    labels = ids.clone()
    labels[:, :3] = -100
    labels[3, 6:] = -100
    attention = torch.ones_like(ids)
    attention[3, 6:] = 0
    batch = {"input_ids": ids, "attention_mask": attention, "labels": labels}
    results = []
    for min_vocab in (VOCAB, 10**9):
        monkeypatch.setattr(head, "MIN_VOCAB", min_vocab)
        model = tiny_model()
        out = sequence_logps(model, batch)
        (out.logps * torch.tensor([1.0, -2.0, 0.5, 3.0])).sum().backward()
        results.append((out, {n: p.grad for n, p in model.named_parameters()}))
        assert bool(calls) is (min_vocab == VOCAB)  # the first run went through the output layer, the second did not
        calls.clear()
    (fused, fused_grads), (plain, plain_grads) = results
    for name in ("logps", "token_logps", "mean_logits"):
        torch.testing.assert_close(getattr(fused, name), getattr(plain, name), rtol=1e-5, atol=1e-5, msg=name)
    assert torch.equal(fused.lengths, plain.lengths) and torch.equal(fused.mask, plain.mask)
    for name in plain_grads:
        torch.testing.assert_close(fused_grads[name], plain_grads[name], rtol=1e-4, atol=1e-6, msg=name)
