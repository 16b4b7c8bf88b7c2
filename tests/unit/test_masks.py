"""Masks for left-padded rows (rlft.models.masks): a padding query attends to itself, so no attention kernel sees an
empty row; the real positions' results do not change. The guard is on only for SDPA on CUDA; here it is forced on a
CPU and every left-padded forward (training log-probs, the engine's prefill, the static-cache prefill, features) is
checked against the plain 2-D mask."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import rlft.models.masks as masks
from layout_checks import tiny_of_type
from rlft.models.masks import guarded_mask, needs_guard


def _model():
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=260, max_position_embeddings=128, initializer_range=0.2)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(config).float().eval()


@pytest.fixture
def forced(monkeypatch):
    """The guard on, as on a CUDA device with SDPA."""
    monkeypatch.setattr(masks, "needs_guard", lambda model, mask: mask is not None and mask.dim() == 2 and not bool(mask[:, 0].all()))


def test_a_padding_query_attends_to_itself_and_real_queries_keep_their_keys():
    mask = guarded_mask(torch.tensor([[0, 1, 1], [1, 1, 1]]), kv_length=5)
    assert mask.shape == (2, 1, 3, 5)
    assert mask[0, 0].int().tolist() == [[1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [0, 1, 1, 0, 0]]
    assert mask[1, 0].int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]
    left = torch.tensor([[0, 1], [1, 1]])
    assert not needs_guard(_model(), left)  # a CPU tensor: CPU kernels return zeros for an empty row
    assert not needs_guard(_model(), None)


@pytest.mark.parametrize("kind", ["llama", "gemma3_text"])  # Gemma 3: a 3-token window on its first layer
def test_training_log_probs_engine_prefill_and_features_are_unchanged(forced, monkeypatch, kind):
    from rlft.models.features import hidden_features
    from rlft.data.collate import completion_batch
    from rlft.models.logprobs import completion_logps
    from rlft.rollout.compiled import CompiledDecoder
    from rlft.rollout.local import LocalEngine
    from rlft.rollout.types import SamplingParams

    calls = []
    real_guard = masks.guarded_mask
    monkeypatch.setattr(masks, "guarded_mask", lambda *a, **k: calls.append(1) or real_guard(*a, **k))
    model = _model() if kind == "llama" else tiny_of_type(kind, vocab=260, window=3)
    rows = [{"prompt_ids": [5, 6, 7, 8], "completion_ids": [9, 10], "loss_mask": [1, 1], "advantage": 1.0},
            {"prompt_ids": [11], "completion_ids": [12, 13, 14], "loss_mask": [1, 1, 1], "advantage": -1.0}]
    batch = completion_batch(rows, pad_id=0)
    guard = masks.safe_attention(model, batch["attention_mask"])  # on: 4-D, one per layer type for Gemma 3
    assert (guard["sliding_attention"] if kind == "gemma3_text" else guard).dim() == 4
    with torch.no_grad():
        guarded, _ = completion_logps(model, batch, 0.7, False)
        plain_mask = batch["attention_mask"]
        features = hidden_features(model, batch["input_ids"], plain_mask, [1, 2], position_ids=batch["position_ids"])
    engine = LocalEngine(model, pad_id=0)
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    guarded_rollout = engine.generate([[5, 6, 7, 8], [11]], params, 2)
    decoder = CompiledDecoder(model, "past_key_values", 0)
    ids, attention = batch["input_ids"][:, :4], batch["attention_mask"][:, :4]
    positions = (attention.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        guarded_prefill = decoder.prefill(ids, attention, positions, 3)
    monkeypatch.setattr(masks, "guarded_mask", real_guard)
    assert len(calls) == (5 if kind == "llama" else 10)  # (per layer type) the check above, the log-probs, the features, the engine's prefill, the static-cache prefill
    monkeypatch.setattr(masks, "needs_guard", lambda model, mask: False)  # now the plain 2-D mask
    with torch.no_grad():
        plain, _ = completion_logps(model, batch, 0.7, False)
        plain_features = hidden_features(model, batch["input_ids"], plain_mask, [1, 2], position_ids=batch["position_ids"])
        plain_prefill = decoder.prefill(ids, attention, positions, 3)
    plain_rollout = engine.generate([[5, 6, 7, 8], [11]], params, 2)
    torch.testing.assert_close(guarded, plain, atol=1e-5, rtol=0)
    real = plain_mask.bool()
    torch.testing.assert_close(features[real], plain_features[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(guarded_prefill, plain_prefill, atol=1e-5, rtol=0)
    assert guarded_rollout.completion_ids == plain_rollout.completion_ids
    for a, b in zip(guarded_rollout.logprobs, plain_rollout.logprobs):
        assert a == pytest.approx(b, abs=1e-5)
