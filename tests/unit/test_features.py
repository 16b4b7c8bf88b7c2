"""EBFT feature network: layer indices, pooling on either padding side, hidden-state features of a tiny Llama."""

from __future__ import annotations


import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlft.models.features import (
    feature_layer_indices,
    hidden_features,
    pool,
)

# --------------------------------------------------------------------------------------------------- layer indices


@pytest.mark.parametrize(
    ("layers", "expected"), [(32, [8, 16, 24]), (16, [4, 8, 12]), (28, [7, 14, 21])]
)
def test_layer_indices_for_quarter_depths(layers, expected):
    assert feature_layer_indices(layers, [0.25, 0.5, 0.75]) == expected


def test_layer_indices_clamp_to_one_and_depth():
    assert feature_layer_indices(2, [0.1, 1.0]) == [1, 2]


@pytest.mark.parametrize("fraction", [0.0, 1.5, -0.25])
def test_layer_fraction_outside_unit_interval_raises(fraction):
    with pytest.raises(ValueError, match="ebft.feature_layers"):
        feature_layer_indices(32, [0.25, fraction])


def test_layer_indices_need_a_fraction():
    with pytest.raises(ValueError, match="ebft.feature_layers"):
        feature_layer_indices(32, [])


# ---------------------------------------------------------------------------------------------------------- pooling

LENGTHS = [5, 3, 7]
PROMPT_LENGTHS = [2, 1, 4]
WIDTH, DIM = 8, 4


def padded_pair(seed: int = 0):
    """The same rows right- and left-padded, pads filled with garbage; completion starts in each row's coordinates."""
    generator = torch.Generator().manual_seed(seed)
    right = torch.randn(len(LENGTHS), WIDTH, DIM, generator=generator) * 100  # garbage everywhere
    left = torch.randn(len(LENGTHS), WIDTH, DIM, generator=generator) * 100
    right_mask = torch.zeros(len(LENGTHS), WIDTH, dtype=torch.long)
    left_mask = torch.zeros_like(right_mask)
    for row, length in enumerate(LENGTHS):
        tokens = torch.randn(length, DIM, generator=generator)
        right[row, :length] = tokens
        right_mask[row, :length] = 1
        left[row, WIDTH - length :] = tokens
        left_mask[row, WIDTH - length :] = 1
    right_start = torch.tensor(PROMPT_LENGTHS)
    left_start = torch.tensor([WIDTH - length + prompt for length, prompt in zip(LENGTHS, PROMPT_LENGTHS)])
    return (right, right_mask, right_start), (left, left_mask, left_start)


@pytest.mark.parametrize("method", ["last_token", "mean_pooling", "completion_mean", "concat"])
def test_pooling_is_padding_side_invariant(method):
    (right, right_mask, right_start), (left, left_mask, left_start) = padded_pair()
    pooled_right = pool(right, right_mask, method, right_start)
    pooled_left = pool(left, left_mask, method, left_start)
    assert pooled_right.shape == (len(LENGTHS), 3 * DIM if method == "concat" else DIM)
    assert torch.allclose(pooled_right, pooled_left, atol=1e-6)


def test_pooling_values_by_hand():
    (right, mask, start), _ = padded_pair()
    for row, (length, prompt) in enumerate(zip(LENGTHS, PROMPT_LENGTHS)):
        tokens = right[row, :length]
        assert torch.allclose(pool(right, mask, "last_token")[row], tokens[length - 1])
        assert torch.allclose(pool(right, mask, "mean_pooling")[row], tokens.mean(dim=0), atol=1e-6)
        assert torch.allclose(pool(right, mask, "completion_mean", start)[row], tokens[prompt:].mean(dim=0), atol=1e-6)
        expected = torch.cat([tokens[length // 4], tokens[length // 2], tokens[3 * length // 4]])
        assert torch.allclose(pool(right, mask, "concat")[row], expected)


def test_last_token_under_left_padding_is_the_last_column():
    # Axolotl read index mask.sum() - 1, a pad under left padding
    _, (left, mask, _) = padded_pair()
    assert torch.equal(pool(left, mask, "last_token"), left[:, -1])


def test_completion_mean_without_completion_tokens_is_zero():
    hidden = torch.ones(1, 4, 2)
    assert torch.equal(pool(hidden, torch.ones(1, 4), "completion_mean", torch.tensor([4])), torch.zeros(1, 2))


def test_pooling_refuses_bad_input():
    hidden, mask = torch.ones(2, 3, 2), torch.ones(2, 3)
    with pytest.raises(ValueError, match="embed_method"):
        pool(hidden, mask, "max_pooling")
    with pytest.raises(ValueError, match="completion_start"):
        pool(hidden, mask, "completion_mean")
    with pytest.raises(ValueError, match="no valid token"):
        pool(hidden, torch.tensor([[1, 1, 0], [0, 0, 0]]), "last_token")


# -------------------------------------------------------------------------------------------------- hidden states


@pytest.fixture(scope="module")
def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


def right_and_left(lengths: list[int], width: int, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    right_ids = torch.zeros(len(lengths), width, dtype=torch.long)
    left_ids = torch.zeros_like(right_ids)
    right_mask, left_mask = torch.zeros_like(right_ids), torch.zeros_like(right_ids)
    for row, length in enumerate(lengths):
        tokens = torch.randint(1, 96, (length,), generator=generator)
        right_ids[row, :length], right_mask[row, :length] = tokens, 1
        left_ids[row, width - length :], left_mask[row, width - length :] = tokens, 1
    return (right_ids, right_mask), (left_ids, left_mask)


def positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(dim=1) - 1).clamp_min(0)


def test_hidden_features_shape_and_values(tiny_llama):
    (ids, mask), _ = right_and_left([6, 4], 6)
    features = hidden_features(tiny_llama, ids, mask, [1, 2])
    assert features.shape == (2, 6, 2 * 64)
    with torch.no_grad():
        reference = tiny_llama(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert torch.allclose(features[..., :64], reference[1], atol=1e-6)
    assert torch.allclose(features[..., 64:], reference[2], atol=1e-6)
    assert torch.equal(hidden_features(tiny_llama, ids, mask, [0]), reference[0])
    with pytest.raises(ValueError, match="outside"):
        hidden_features(tiny_llama, ids, mask, [3])


def test_hidden_features_restore_training_mode_and_take_no_grad(tiny_llama):
    (ids, mask), _ = right_and_left([3], 3)
    tiny_llama.train()
    try:
        features = hidden_features(tiny_llama, ids, mask, [1])
        assert tiny_llama.training
        assert not features.requires_grad
    finally:
        tiny_llama.eval()
    assert not tiny_llama.training


def test_last_token_features_are_padding_side_invariant(tiny_llama):
    (right_ids, right_mask), (left_ids, left_mask) = right_and_left([7, 3, 5], 7)
    right = hidden_features(tiny_llama, right_ids, right_mask, [1, 2], position_ids=positions(right_mask))
    left = hidden_features(tiny_llama, left_ids, left_mask, [1, 2], position_ids=positions(left_mask))
    assert torch.allclose(pool(right, right_mask, "last_token"), pool(left, left_mask, "last_token"), atol=1e-5)
    assert torch.allclose(pool(right, right_mask, "mean_pooling"), pool(left, left_mask, "mean_pooling"), atol=1e-5)


def test_attention_4d_replaces_the_padding_mask(tiny_llama):
    (ids, mask), _ = right_and_left([5, 3], 5)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    block = (causal.unsqueeze(0) & mask.bool().unsqueeze(1)).unsqueeze(1)  # (B, 1, S, S): causal and not a pad key
    block = block | torch.eye(5, dtype=torch.bool)  # pad queries see themselves
    with_4d = hidden_features(tiny_llama, ids, None, [1, 2], position_ids=positions(mask), attention_4d=block)
    with_2d = hidden_features(tiny_llama, ids, mask, [1, 2], position_ids=positions(mask))
    valid = mask.bool()
    assert torch.allclose(with_4d[valid], with_2d[valid], atol=1e-5)


def test_attention_4d_is_obeyed(tiny_llama):
    # two documents in one row: tokens 3..5 see only 3..5 and restart at position 0, so they must equal the features
    # of tokens 3..5 run alone (the plain 2-D mask would let them see 0..2)
    ids = torch.randint(1, 96, (1, 6), generator=torch.Generator().manual_seed(2))
    document = torch.tensor([0, 0, 0, 1, 1, 1])
    same = document.unsqueeze(0) == document.unsqueeze(1)
    block = (torch.ones(6, 6, dtype=torch.bool).tril() & same).view(1, 1, 6, 6)
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 2]])
    packed = hidden_features(tiny_llama, ids, None, [1, 2], position_ids=position_ids, attention_4d=block)
    alone = hidden_features(tiny_llama, ids[:, 3:], torch.ones(1, 3, dtype=torch.long), [1, 2])
    assert torch.allclose(packed[:, 3:], alone, atol=1e-5)
    plain = hidden_features(tiny_llama, ids, torch.ones(1, 6, dtype=torch.long), [1, 2], position_ids=position_ids)
    assert not torch.allclose(plain[:, 3:], alone, atol=1e-3)
