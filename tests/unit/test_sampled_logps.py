"""The trainer evaluates the distribution the engine sampled from (temperature, top-k, top-p, min-p, repetition
penalty), so importance ratios measure only a difference of weights: at zero staleness they are 1."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlft.losses.importance import importance_weights
from rlft.data.collate import completion_batch
from rlft.models.logprobs import completion_forward, filters_active, logps_from_logits, sampled_logps, tokens_seen
from rlft.models.logprobs import process_logits
from rlft.rollout.local import LocalEngine
from rlft.rollout.types import SamplingParams

FILTERED = [
    SamplingParams(max_new_tokens=12, temperature=0.7, top_k=5),
    SamplingParams(max_new_tokens=12, temperature=1.3, top_p=0.8),
    SamplingParams(max_new_tokens=12, temperature=1.0, min_p=0.8),  # a random model is nearly uniform
    SamplingParams(max_new_tokens=12, temperature=0.9, repetition_penalty=1.5),
    SamplingParams(max_new_tokens=12, temperature=0.8, top_k=8, top_p=0.9, min_p=0.05, repetition_penalty=1.2),
]


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=48, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=64, max_position_embeddings=64, pad_token_id=0, eos_token_id=1)
    return LlamaForCausalLM(config).eval()


def _sample(model, params):
    torch.manual_seed(3)
    prompts = [[5, 6, 7], [9, 9], [2, 3, 4, 5, 6]]  # different lengths: left padding in the engine and the trainer
    rollout = LocalEngine(model, pad_id=0).generate(prompts, params, 2)
    rows = [{"prompt_ids": p, "completion_ids": c, "loss_mask": [1] * len(c), "advantage": 1.0}
            for p, c in zip(rollout.prompt_ids, rollout.completion_ids)]
    batch = completion_batch(rows, pad_id=0)
    engine = torch.zeros_like(batch["loss_mask"])
    for row, values in enumerate(rollout.logprobs):
        engine[row, : len(values)] = torch.tensor(values)
    return batch, engine


@pytest.mark.parametrize("params", FILTERED, ids=["top_k", "top_p", "min_p", "repetition_penalty", "all"])
def test_sampled_logps_are_the_engines_and_is_ratios_are_one(model, params):
    batch, engine = _sample(model, params)
    mask = batch["loss_mask"]
    with torch.no_grad():
        logits, _ = completion_forward(model, batch)
        plain, _ = logps_from_logits(logits, batch, params.temperature, False)
    sampled, dropped = sampled_logps(logits, batch, params, plain)
    assert not (dropped * mask).any()
    assert torch.allclose(sampled * mask, engine * mask, atol=2e-5)
    # the temperature-only log-probs are not the sampled distribution's: comparing those would bias the ratios
    assert (((plain - engine) * mask).abs().max()) > 1e-3
    weights, metrics = importance_weights(sampled, engine, mask, level="token", mode="mask", cap=1.0001)
    assert metrics["sampling/is_masked_fraction"] == 0.0
    assert torch.allclose(weights * mask, mask, atol=1e-4)


def test_filters_active_only_beyond_temperature():
    assert not filters_active(SamplingParams(max_new_tokens=4, temperature=0.5))
    assert not filters_active(SamplingParams(max_new_tokens=4, top_k=-1))
    assert all(filters_active(params) for params in FILTERED)


def test_tokens_seen_is_the_prompt_and_the_completion_so_far():
    # row 0: prompt [3, 4] (left-padded with 0), completion [4, 5, 2]; row 1: prompt [0, 6, 7] (0 is a real token here)
    input_ids = torch.tensor([[0, 3, 4, 4, 5, 2], [0, 6, 7, 6, 2, 0]])
    attention = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    seen = tokens_seen(input_ids, attention, width=3, vocab=8)
    expected = torch.zeros(2, 3, 8, dtype=torch.bool)
    for row in range(2):
        for t in range(3):
            for position in range(3 + t):
                if attention[row, position]:
                    expected[row, t, input_ids[row, position]] = True
    assert torch.equal(seen, expected)
    assert not seen[0, 0, 0] and seen[1, 0, 0]  # padding is never seen; a real token 0 is


def test_a_token_outside_the_kept_set_falls_back_to_the_temperature_log_prob_and_is_flagged():
    logits = torch.tensor([[[5.0, 4.0, -3.0, -4.0], [1.0, 2.0, 3.0, 4.0]]])
    batch = {"input_ids": torch.tensor([[1, 3, 3]]), "attention_mask": torch.ones(1, 3, dtype=torch.long), "completion_width": 2}
    plain = torch.log_softmax(logits, -1)[0, [0, 1], [3, 3]][None]
    value, dropped = sampled_logps(logits, batch, SamplingParams(max_new_tokens=1, top_k=2), plain)
    assert dropped.tolist() == [[True, False]]
    assert value[0, 0] == plain[0, 0]  # not log 0: one boundary token must not zero a ratio
    assert value[0, 1] == pytest.approx(float(torch.log_softmax(torch.tensor([3.0, 4.0]), -1)[1]))


def test_chunks_give_the_same_values_as_one_pass(monkeypatch):
    import rlft.models.logprobs as logprobs

    torch.manual_seed(0)
    logits = torch.randn(3, 7, 40)
    ids = torch.randint(2, 40, (3, 12))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "completion_width": 7}
    params = SamplingParams(max_new_tokens=7, temperature=0.8, top_p=0.7, repetition_penalty=1.3)
    plain = torch.zeros(3, 7)
    whole = sampled_logps(logits, batch, params, plain)[0]
    monkeypatch.setattr(logprobs, "SAMPLED_CHUNK", 4)  # chunks that cut rows apart
    assert torch.equal(sampled_logps(logits, batch, params, plain)[0], whole)


def test_min_p_comes_before_top_p_as_in_vllm():
    """min-p first, then the nucleus of what is left (vLLM's order); min-p last (HF's) would keep the third token."""
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.2, 0.1]]))
    params = SamplingParams(max_new_tokens=1, top_p=0.75, min_p=0.3)
    kept = torch.isfinite(process_logits(logits, None, params))[0].tolist()
    assert kept == [True, True, False, False]


@pytest.mark.parametrize("vocab", [5, 265, 4196])
def test_draw_tokens_by_inverse_cdf_follows_the_distribution_and_never_draws_a_filtered_token(vocab):
    """One uniform per row picks the first token whose cumulative probability exceeds it: the drawn frequencies match
    the probabilities (a chi-square test far from its 0.1 % tail), and -inf never comes, from a vocabulary of 5
    entries to one of thousands."""
    from rlft.models.logprobs import draw_tokens

    rows = 20_000
    logits = torch.full((vocab,), float("-inf"))
    support = torch.tensor(sorted({0, 1, vocab // 2, vocab - 2, vocab - 1}))  # the first and the last entries
    probs = torch.tensor([0.1, 0.25, 0.05, 0.4, 0.2])[: len(support)]
    probs = probs / probs.sum()
    logits[support] = probs.log()
    counts = torch.bincount(draw_tokens(logits.expand(rows, vocab), torch.Generator().manual_seed(0)), minlength=vocab)
    assert int(counts.sum()) == rows and set(counts.nonzero().flatten().tolist()) <= set(support.tolist())
    expected = probs * rows
    chi_square = float(((counts[support] - expected) ** 2 / expected).sum())
    assert chi_square < 18.5  # at most 4 degrees of freedom: P(chi2 > 18.5) <= 0.001
    # the same generator state gives the same tokens
    again = draw_tokens(logits.expand(rows, vocab), torch.Generator().manual_seed(0))
    assert torch.equal(torch.bincount(again, minlength=vocab), counts)


def test_next_tokens_draws_by_the_uniform_pads_finished_rows_and_flags_stops_by_hand():
    """Probabilities (0.1, 0.2, 0.7): cumulative 0.1, 0.3, 1.0, so u = 0.05, 0.25, 0.95 draw tokens 0, 1, 2; the most
    likely token is 2. A finished row gets the pad token, a stop token ends only a row that was still running, and the
    log-probs are the drawn tokens' log-softmax."""
    from rlft.models.logprobs import next_tokens

    scores = torch.log(torch.tensor([[0.1, 0.2, 0.7]])).expand(4, 3).contiguous() + 5.0  # a shift: log-softmax undoes it
    u = torch.tensor([[0.05], [0.25], [0.95], [0.25]], dtype=torch.float64)
    finished = torch.tensor([False, False, False, True])
    stop = torch.tensor([1])
    chosen, logps, ended, distribution = next_tokens(scores, u, finished, stop, pad_id=-7)
    assert chosen.tolist() == [0, 1, 2, -7]
    assert logps[:3].tolist() == pytest.approx([math.log(0.1), math.log(0.2), math.log(0.7)], abs=1e-6)
    assert ended.tolist() == [False, True, False, False]  # the finished row's pad is no stop
    assert torch.allclose(distribution, torch.log(torch.tensor([0.1, 0.2, 0.7])).expand(4, 3), atol=1e-6)
    greedy, greedy_logps, _, _ = next_tokens(scores, None, finished, stop, pad_id=-7, greedy=True)
    assert greedy.tolist() == [2, 2, 2, -7] and greedy_logps[0].item() == pytest.approx(math.log(0.7), abs=1e-6)
    # as a compiled decoder runs it: both computed, the flag keeps one
    for flag, expected in ((True, greedy), (False, chosen)):
        tokens = next_tokens(scores, u, finished, stop, pad_id=-7, greedy=torch.tensor(flag))[0]
        assert torch.equal(tokens, expected)
