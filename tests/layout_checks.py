"""Checks shared by the tests of batch layouts (flattened, packed, prompt-sharing): the same model on another layout of
the same rows gives the same values and gradients, to float32 rounding."""

from __future__ import annotations

import torch


def parameter_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}  # (a LoRA model's base is frozen)


def assert_same_grads(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=atol, msg=name)


def sft_documents(lengths, vocab: int, seed: int = 6) -> list[dict]:
    """SFT documents of these lengths (random ids, every token but the first a target)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for length in lengths:
        ids = torch.randint(1, vocab, (length,), generator=g).tolist()
        out.append({"input_ids": ids, "labels": [-100] + ids[1:]})
    return out


def sft_results(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """An SFT batch's summed target NLL (rlft's SFT loss) and the parameter gradients of that sum."""
    from rlft.train.recipes.sft import SFTRecipe

    model.zero_grad()
    loss = SFTRecipe.__new__(SFTRecipe)._loss_sum(model, batch)
    loss.backward()
    return loss.detach(), parameter_grads(model)


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


def assert_same_completion_results(got: tuple, expected: tuple, grad_atol: float = 1e-6) -> None:
    for values, wanted in zip(got[:3], expected[:3]):
        torch.testing.assert_close(values, wanted, rtol=1e-5, atol=1e-5)
    assert_same_grads(got[3], expected[3], grad_atol)


EAGER_ONLY = ("gemma2", "gpt_oss")  # transformers gives these no SDPA


def tiny_of_type(kind: str, vocab: int = 128, window: int | None = None):
    """A tiny random decoder of transformers' model type `kind` (2 layers, hidden 32), eval mode. With `window`, its
    sliding window is `window` tokens, on both layers, or on the first only where the type mixes windowed and full
    layers (`layer_types`)."""
    import warnings

    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(kind, vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=64, head_dim=8)
    for key, value in dict(moe_intermediate_size=16, num_experts=4, num_local_experts=4, num_experts_per_tok=2).items():
        if hasattr(config, key):
            setattr(config, key, value)
    config.pad_token_id = config.bos_token_id = config.eos_token_id = None
    if window is not None:
        config.sliding_window = window
        for key, value in (("use_sliding_window", True), ("max_window_layers", 0)):
            if hasattr(config, key):
                setattr(config, key, value)
        if getattr(config, "layer_types", None):
            config.layer_types = ["sliding_attention", "full_attention"]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_config(config, attn_implementation="eager" if kind in EAGER_ONLY else "sdpa").eval()
