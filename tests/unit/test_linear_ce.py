"""The chunked, fused output-layer cross-entropy equals the plain one, in value and gradients."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from rlft.losses.linear_ce import linear_cross_entropy_sum
from rlft.models.head import forward_hidden, output_layer


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


def test_the_hidden_state_is_what_the_model_projects():
    model = tiny_model()
    ids = torch.randint(0, VOCAB, (2, 6))
    head = output_layer(model)
    hidden, _ = forward_hidden(model, {"input_ids": ids}, head)
    torch.testing.assert_close(head(hidden), model(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_a_model_whose_logits_are_not_its_output_layer_is_detected():
    model = tiny_model()
    original = type(model).forward

    def scaled(self, *args, **kwargs):  # Cohere-style logit_scale after the output layer
        out = original(self, *args, **kwargs)
        out.logits = 0.5 * out.logits
        return out

    model.forward = scaled.__get__(model)
    assert forward_hidden(model, {"input_ids": torch.randint(0, VOCAB, (2, 6))}, output_layer(model))[0] is None
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
    monkeypatch.setattr(sft, "forward_hidden", lambda *a, _f=head.forward_hidden: calls.append(1) or _f(*a))
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
    monkeypatch.setattr(preference, "forward_hidden", lambda *a, _f=head.forward_hidden: calls.append(1) or _f(*a))

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


def plain_logps(hidden, weight, bias, targets, temperature):
    logp = torch.log_softmax(F.linear(hidden, weight, bias).float() / temperature, dim=-1)
    return logp.gather(-1, targets[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("chunk", [1, 5, 100])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("grad_entropy", [False, True])
def test_token_logps_entropy_and_their_gradients_equal_the_plain_ones(chunk, temperature, grad_entropy):
    from rlft.losses.linear_ce import linear_token_logps

    h1, w1, b1, t = tensors()
    h2, w2, b2 = (x.detach().clone().requires_grad_() for x in tensors()[:3])
    logps, entropy = linear_token_logps(h1, w1, b1, t, temperature, True, grad_entropy, chunk)
    ref_logps, ref_entropy = plain_logps(h2, w2, b2, t, temperature)
    torch.testing.assert_close(logps, ref_logps, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, rtol=1e-6, atol=1e-5)
    assert entropy.requires_grad is grad_entropy
    # a policy-gradient-like loss: per-token weights on the log-probs, minus an entropy bonus
    row_weights = torch.linspace(-2.0, 3.0, t.numel())
    loss = (logps * row_weights).sum() - (0.3 * entropy.sum() if grad_entropy else 0.0)
    ref_loss = (ref_logps * row_weights).sum() - (0.3 * ref_entropy.sum() if grad_entropy else 0.0)
    loss.backward()
    ref_loss.backward()
    for a, b in ((h1, h2), (w1, w2), (b1, b2)):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


def test_token_logps_by_hand_on_one_token():
    """z = W h / T; log p_y = z_y - logsumexp(z); H = -sum p log p; d H / d z_j = -p_j (log p_j + H)."""
    from rlft.losses.linear_ce import linear_token_logps

    hidden = torch.tensor([[2.0, 0.0]], requires_grad=True)
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    logps, entropy = linear_token_logps(hidden, weight, None, torch.tensor([1]), temperature=2.0, grad_entropy=True)
    assert linear_token_logps(hidden, weight, None, torch.tensor([1]), with_entropy=False)[1] is None
    z = torch.tensor([1.0, 0.0, 1.0])  # [2, 0, 2] / 2
    lse = math.log(2 * math.e + 1)
    p = (z - lse).exp()
    torch.testing.assert_close(logps, torch.tensor([0.0 - lse]))
    torch.testing.assert_close(entropy, (-(p * (z - lse)).sum())[None])
    entropy.sum().backward()
    expected = (-p * ((z - lse) + entropy.detach())) / 2.0 @ weight
    torch.testing.assert_close(hidden.grad[0], expected)


def test_token_logps_with_no_rows_and_without_grad():
    from rlft.losses.linear_ce import linear_token_logps

    h, w, b, t = tensors()
    logps, entropy = linear_token_logps(h[:0], w, b, t[:0])
    assert logps.shape == entropy.shape == (0,)
    (logps.sum() + 1.0).backward()
    assert float(w.grad.abs().sum()) == 0.0
    with torch.no_grad():
        logps, entropy = linear_token_logps(h, w, b, t)
    assert logps.grad_fn is None
    torch.testing.assert_close(logps, plain_logps(h, w, b, t, 1.0)[0].detach())


def grpo_batch(filters: bool):
    from rlft.data.collate import completion_batch

    g = torch.Generator().manual_seed(3)
    rows = []
    for prompt, completion, advantage in ((5, 4, 1.0), (3, 2, -0.5), (5, 6, 0.25), (4, 0, -1.0)):
        ids = torch.randint(0, VOCAB, (prompt + completion,), generator=g).tolist()
        rows.append({"prompt_ids": ids[:prompt], "completion_ids": ids[prompt:], "loss_mask": [1] * completion,
                     "advantage": advantage, "old_logps": [-1.5] * completion,
                     "sampling_logps": [-1.4] * completion})
    return completion_batch(rows, pad_id=0, values=("old_logps", "sampling_logps"))


@pytest.mark.parametrize("case", ["entropy_bonus", "filters_and_is", "reference"])
def test_the_grpo_loss_through_the_output_layer_equals_the_models_logits(case, monkeypatch):
    """The GRPO recipe's loss, metrics and gradients, and the cached log-probs: through the output layer (completion
    positions only, chunked) == the model's (B, C, V) logits."""
    from types import SimpleNamespace

    from rlft.models import head, logprobs
    from rlft.models.logprobs import completion_logps
    from rlft.rollout.types import SamplingParams
    from rlft.train.recipes.grpo import GRPORecipe

    filters = case == "filters_and_is"
    settings = SimpleNamespace(
        temperature=0.8, entropy_coeff=0.01 if case == "entropy_bonus" else 0.0, off_policy_mask_threshold=0.5 if filters else None,
        needs_sampling_correction=filters, decoupled_loss=False, is_level="token", is_mode="truncate", is_cap=2.0,
        loss_type="dapo", epsilon=0.2, epsilon_high=0.28, delta=None, lower_bound_ratio=None, aipo_rho=None,
        importance_sampling_level="token", beta=0.0, positive_nll_coef=None, unbiased_loss_max_tokens=None,
        bias_correction_kl=False)
    recipe = GRPORecipe.__new__(GRPORecipe)
    recipe.settings = settings
    recipe.sampling = SamplingParams(max_new_tokens=8, temperature=0.8, top_k=50 if filters else 0, top_p=0.9 if filters else 1.0)
    recipe.compares_sampled = filters
    batch = grpo_batch(filters)
    calls = []
    monkeypatch.setattr(logprobs, "forward_hidden", lambda *a, _f=head.forward_hidden: calls.append(1) or _f(*a))
    results = []
    for fused in (True, False):
        monkeypatch.setattr(head, "MIN_VOCAB", VOCAB if fused else 10**9)
        model = tiny_model()
        if case == "reference":
            with torch.no_grad():
                logps, entropy = completion_logps(model, batch, 0.8, with_entropy=True)
            results.append((logps * batch["loss_mask"], entropy * batch["loss_mask"], {}))
        else:
            out = recipe.loss(model, batch)
            out.loss_sum.backward()
            results.append((out.loss_sum.detach(), out.metrics, {n: p.grad for n, p in model.named_parameters()}))
        assert bool(calls) is fused  # the first run went through the output layer, the second did not
        calls.clear()
    if filters:
        assert "sampling/outside_filters_fraction" in results[0][1]
    (fused_value, fused_extra, fused_grads), (plain_value, plain_extra, plain_grads) = results
    torch.testing.assert_close(fused_value, plain_value, rtol=1e-5, atol=1e-6)
    if isinstance(plain_extra, dict):
        assert fused_extra.keys() == plain_extra.keys()
        for key, value in plain_extra.items():
            assert fused_extra[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    else:
        torch.testing.assert_close(fused_extra, plain_extra, rtol=1e-5, atol=1e-6)
    for name in plain_grads:
        torch.testing.assert_close(fused_grads[name], plain_grads[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("function", ["cross_entropy_sum", "token_nll", "token_logps"])
@pytest.mark.parametrize("chunk", [7, 100])
def test_under_bf16_autocast_the_gradients_are_the_plain_paths(function, chunk):
    """A bf16 training step (autocast over float32 weights) with logits of a trained model's scale (std ~16): the
    fused functions give autograd's own bf16 gradients. Their backward runs outside the loop's autocast block; before
    it re-entered the forward's autocast state, token_logps met the bf16 forward's log-normaliser with float32 logits
    (a softmax that did not sum to one) and its gradients were 10% off."""
    from rlft.losses.linear_ce import linear_token_logps, linear_token_nll

    g = torch.Generator().manual_seed(3)
    hidden0, weight0 = torch.randn(24, 64, generator=g), torch.randn(4096, 64, generator=g) * 2.0
    targets, row_weights = torch.randint(0, 4096, (24,), generator=g), torch.randn(24, generator=g)
    fused = {"cross_entropy_sum": lambda h, w: linear_cross_entropy_sum(h, w, None, targets, chunk),
             "token_nll": lambda h, w: (linear_token_nll(h, w, None, targets, chunk) * row_weights).sum(),
             "token_logps": lambda h, w: (linear_token_logps(h, w, None, targets, with_entropy=False, chunk=chunk)[0]
                                          * row_weights).sum()}[function]

    def plain(h, w):
        logp = F.linear(h, w).float().log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
        return {"cross_entropy_sum": -logp.sum(), "token_nll": (-logp * row_weights).sum(),
                "token_logps": (logp * row_weights).sum()}[function]

    grads = []
    for loss_of in (fused, plain):
        h, w = hidden0.clone().requires_grad_(), weight0.clone().requires_grad_()
        with torch.autocast("cpu", torch.bfloat16):
            loss = loss_of(h, w)
        (0.5 * loss).backward()  # outside autocast, as the training loop does
        grads.append((loss.detach(), h.grad, w.grad))
    (value, grad_h, grad_w), (ref_value, ref_h, ref_w) = grads
    torch.testing.assert_close(value, ref_value, rtol=1e-5, atol=1e-4)
    for got, want in ((grad_h, ref_h), (grad_w, ref_w)):
        assert float((got - want).norm() / want.norm()) < 1e-3


@pytest.mark.parametrize("grad_entropy", [False, True])
def test_under_bf16_autocast_the_entropy_is_summed_in_float32(grad_entropy):
    """The entropy of each row, -sum_v p_v log p_v over a 4096-entry vocabulary, under bf16 autocast: a float32 tensor
    (it came out bf16, from vecdot's autocast, and stopped structured EBFT's bf16 runs when written into float32
    metrics) equal to autograd's float32 entropy of the same bf16 logits, with the same entropy gradient."""
    from rlft.losses.linear_ce import linear_token_logps

    g = torch.Generator().manual_seed(4)
    hidden0, weight0 = torch.randn(24, 64, generator=g), torch.randn(4096, 64, generator=g) * 2.0
    targets = torch.randint(0, 4096, (24,), generator=g)
    results = []
    for fused in (True, False):
        h = hidden0.clone().requires_grad_()
        with torch.autocast("cpu", torch.bfloat16):
            if fused:
                entropy = linear_token_logps(h, weight0, None, targets, with_entropy=True, grad_entropy=grad_entropy, chunk=7)[1]
            else:
                logp = F.linear(h, weight0).float().log_softmax(-1)
                entropy = -(logp.exp() * logp).sum(-1)
        assert entropy.dtype == torch.float32
        if grad_entropy:
            entropy.sum().backward()
        results.append((entropy.detach(), h.grad))
    (fused_entropy, fused_grad), (plain_entropy, plain_grad) = results
    torch.testing.assert_close(fused_entropy, plain_entropy, rtol=1e-5, atol=1e-5)
    if grad_entropy:
        assert float((fused_grad - plain_grad).norm() / plain_grad.norm()) < 1e-3
