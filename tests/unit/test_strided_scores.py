"""Strided EBFT's loss through the output layer (rlft.rollout.strided_scores): the same log-probs, document NLL and
gradients as the model's (B, T, V) logits, without ever building a tensor of that size."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import LlamaConfig, LlamaForCausalLM

from rlft.losses import linear_ce
from rlft.models import head
from rlft.rollout.strided import generate_blocks, model_attention, strided_layout
from rlft.rollout.strided_scores import strided_scores

VOCAB = 4096  # rlft.models.head.MIN_VOCAB: smaller output layers keep the model's own logits
SAMPLES = 2


class LargestTensor(TorchDispatchMode):
    """The most elements of any new tensor with a vocabulary axis (logits, log-probs) that an operator creates inside
    the mode; views (the output layer's weight transposed) are not new."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor) and not func.is_view and tensor.dim() and tensor.size(-1) == VOCAB:
                self.largest = max(self.largest, tensor.numel())
        return out


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2)
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config).float()


@pytest.fixture(scope="module")
def rollout():
    """Two right-padded documents (the second with 5 pads), L = 24, stride 3, context 4, G = 3, two samples each."""
    model = _model()
    doc_ids = torch.randint(3, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))
    doc_attention = torch.ones(2, 24, dtype=torch.long)
    doc_attention[1, 19:] = 0
    doc_ids[1, 19:] = 0
    layout = strided_layout(doc_attention.sum(-1), 24, stride=3, context_length=4, generate_max_len=3)
    out = generate_blocks(model, doc_ids, doc_attention, layout, num_samples=SAMPLES, temperature=0.7,
                          generator=torch.Generator().manual_seed(2))
    return doc_ids.repeat_interleave(SAMPLES, 0), out


def _loss_and_grads(rollout, fused: bool, top_p: float, monkeypatch):
    """Log-probs, NLL, mask and parameter gradients of a weighted sum of both, through one path."""
    doc_ids, out = rollout
    monkeypatch.setattr(head, "MIN_VOCAB", VOCAB if fused else 10**9)
    monkeypatch.setattr(linear_ce, "LOGIT_BYTES", 4 * VOCAB * 8)  # 8 positions per chunk: several chunks
    model = _model()
    attention = model_attention(model, out.layout, out.doc_attention[::SAMPLES], out.mask, SAMPLES)
    inputs = {"input_ids": out.sequences, "attention_mask": attention, "position_ids": out.position_ids}
    keep = torch.arange(1, doc_ids.size(1))[None, :] >= torch.tensor([0, 0, 6, 6])[:, None]  # a prompt on document 2
    counter = LargestTensor()
    with counter:
        scores = strided_scores(model, inputs)
        logps = scores.generated_logps(out.sequences, out.layout, 0.7, top_p=top_p)
        nll, mask = scores.document_nll(doc_ids, out.doc_attention, keep=keep)
        weights = torch.linspace(-1.0, 1.0, logps.numel()).view_as(logps)
        ((logps * weights).sum() + 0.3 * nll.sum()).backward()
    assert (scores.hidden is not None) is fused
    grads = {name: p.grad for name, p in model.named_parameters()}
    return logps.detach(), nll.detach(), mask, grads, counter.largest


@pytest.mark.parametrize("top_p", [1.0, 0.3])
def test_the_output_layer_path_equals_the_logits_path(rollout, top_p, monkeypatch):
    fused = _loss_and_grads(rollout, True, top_p, monkeypatch)
    plain = _loss_and_grads(rollout, False, top_p, monkeypatch)
    for a, b in zip(fused[:3], plain[:3]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for name, grad in plain[3].items():
        torch.testing.assert_close(fused[3][name], grad, rtol=1e-4, atol=1e-4, msg=name)  # gradients up to ~20
    doc_ids, out = rollout
    whole = out.sequences.numel() * VOCAB  # the (B·n, T, V) logits
    assert plain[4] >= whole > 8 * fused[4]
    mask = fused[2]  # document 1 whole; document 2 without its prompt (targets 1..5) and its pads (targets 19..23)
    assert bool(mask[:2].all()) and not bool(mask[2:, :5].any()) and not bool(mask[2:, 18:].any()) and bool(mask[2:, 5:18].all())
    if top_p < 1.0:  # sampled at top_p 1: some tokens fall outside the 0.3 nucleus and take their temperature log-prob
        everything = _loss_and_grads(rollout, True, 1.0, monkeypatch)[0]
        assert bool((fused[0] == everything).any()) and bool((fused[0] > everything).any())


def test_evaluation_reads_the_nll_without_gradient(rollout, monkeypatch):
    monkeypatch.setattr(head, "MIN_VOCAB", VOCAB)
    model = _model()
    doc_ids = rollout[0][::SAMPLES]
    attention = torch.ones_like(doc_ids)
    with torch.no_grad():
        scores = strided_scores(model, {"input_ids": doc_ids, "attention_mask": attention})
        nll, mask = scores.document_nll(doc_ids, attention)
        logits = model(input_ids=doc_ids, attention_mask=attention).logits
    assert scores.hidden is not None
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), doc_ids[:, 1:].reshape(-1), reduction="none")
    torch.testing.assert_close(nll[mask], expected, rtol=1e-5, atol=1e-5)
