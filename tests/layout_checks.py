"""Checks shared by the tests of batch layouts (flattened, packed, prompt-sharing): the same model on another layout of
the same rows gives the same values and gradients, to float32 rounding."""

from __future__ import annotations

import torch


def parameter_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def assert_same_grads(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-6, msg=name)


def assert_same_sequence_logps(got, expected) -> None:
    """Two `SequenceLogps`: sequence and per-token log-probs (at the expected completion positions) and mean logits."""
    torch.testing.assert_close(got.logps, expected.logps, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.token_logps[expected.mask], expected.token_logps[expected.mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.mean_logits, expected.mean_logits, rtol=1e-5, atol=1e-5)


def completion_results(model: torch.nn.Module, batch: dict, valid: torch.Tensor) -> tuple:
    """A completion batch's log-probs and entropies at temperature 0.9 (their sum's gradient taken, the entropy's
    included), its sampling log-probs under top-k 20 and a repetition penalty of 1.2, and the parameter gradients;
    the values at the `valid` completion positions."""
    from rlft.models.logprobs import completion_logps, completion_scores, sampled_logps
    from rlft.rollout.types import SamplingParams

    model.zero_grad()
    logps, entropy = completion_logps(model, batch, 0.9, True, grad_entropy=True)
    ((logps + 0.1 * entropy) * valid).sum().backward()
    with torch.no_grad():
        sampling = SamplingParams(max_new_tokens=8, temperature=0.9, top_k=20, repetition_penalty=1.2)
        sampled, _ = sampled_logps(completion_scores(model, batch), batch, sampling, logps)
    return logps[valid].detach(), entropy[valid].detach(), sampled[valid], parameter_grads(model)


def assert_same_completion_results(got: tuple, expected: tuple) -> None:
    for values, wanted in zip(got[:3], expected[:3]):
        torch.testing.assert_close(values, wanted, rtol=1e-5, atol=1e-5)
    assert_same_grads(got[3], expected[3])
