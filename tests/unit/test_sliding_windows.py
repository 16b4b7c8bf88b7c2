"""Sliding-window models (Mistral, Gemma 2 and 3, gpt-oss, ...) under the masks rlft builds itself: packed SFT rows,
flattened rows (batch_flattening, dpo_padding_free), prompts shared by their answers (share_prompts) and strided EBFT.

transformers applies a 4-D mask as given, without the window it adds to the masks it builds, so rlft adds it
(`rlft.models.masks.per_layer_type`). Each layout is checked against the padded rows, which transformers windows itself,
with a window of 3 tokens and sequences longer than that; and each check is shown to fail without the window."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

import rlft.models.masks as masks
import rlft.models.varlen as varlen
from layout_checks import (assert_same_completion_results, assert_same_grads, assert_same_sequence_logps, completion_results,
                           parameter_grads, sft_documents, sft_results, tiny_of_type)
from rlft.config.settings.model import model_settings
from rlft.data.collate import flatten_rows, pad_batch, packed_batch
from rlft.errors import ModelError
from rlft.models.attention import sliding_window, unmaskable_layers
from rlft.models.shared_prompts import SHARED_PROMPT_MODELS

# the checked decoders that can have a sliding window: all layers windowed, or windowed and full layers mixed
WINDOWED = tuple(kind for kind in SHARED_PROMPT_MODELS if "sliding_window" in AutoConfig.for_model(kind).to_dict())
WINDOW = 3


@pytest.fixture
def no_window(monkeypatch):
    """rlft's masks with the window left out (what a mask that ignores sliding windows gives)."""
    def without():
        monkeypatch.setattr(masks, "sliding_window", lambda model: (None, False))
        monkeypatch.setattr(varlen, "layer_window", lambda module, kwargs: None)
    return without


def documents():
    return sft_documents((7, 9, 4), 128)


def test_the_window_by_model_type():
    assert sliding_window(tiny_of_type("llama")) == (None, False)
    assert sliding_window(tiny_of_type("mistral", window=WINDOW)) == (WINDOW, True)
    assert sliding_window(tiny_of_type("gemma3_text", window=WINDOW)) == (WINDOW, False)  # mixed with full layers
    assert sliding_window(tiny_of_type("qwen2")) == (None, False)  # use_sliding_window: false
    assert set(WINDOWED) >= {"gemma2", "gemma3_text", "gpt_oss", "mistral", "mixtral", "qwen2", "qwen3", "phi3"}


@pytest.mark.parametrize("kind", WINDOWED)
def test_packed_documents_keep_the_window(kind, no_window):
    """sample_packing on every checked windowed model type: the summed NLL and gradients of the padded documents."""
    model = tiny_of_type(kind, window=WINDOW).train()
    padded = sft_results(model, pad_batch(documents(), pad_id=0))
    packed = sft_results(model, packed_batch([documents()], pad_id=0))
    torch.testing.assert_close(packed[0], padded[0], rtol=1e-5, atol=1e-5)
    assert_same_grads(packed[1], padded[1], atol=1e-5)  # gradients up to about 7 here (Gemma scales its embeddings)
    no_window()
    assert abs(float(sft_results(model, packed_batch([documents()], pad_id=0))[0] - padded[0])) > 1e-3


@pytest.mark.parametrize("kind", WINDOWED)
def test_pairs_sharing_their_prompt_keep_the_window(kind, no_window):
    """share_prompts on every checked windowed model type: the padded pairs' log-probs, and sharing is allowed."""
    from rlft.models.shared_prompts import shared_prompt_problem
    from rlft.train.recipes.preference import pair_collate, sequence_logps

    g = torch.Generator().manual_seed(5)
    ids = lambda n: torch.randint(3, 128, (n,), generator=g).tolist()  # noqa: E731
    examples = [{"prompt_ids": ids(p), "chosen_ids": ids(c), "rejected_ids": ids(r)} for p, c, r in ((6, 3, 5), (2, 5, 1))]
    model = tiny_of_type(kind, window=WINDOW)
    assert shared_prompt_problem(model) is None
    with torch.no_grad():
        plain = sequence_logps(model, pair_collate(0, False)(examples))
        shared = sequence_logps(model, pair_collate(0, True)(examples))
        assert_same_sequence_logps(shared, plain)
        no_window()
        assert (sequence_logps(model, pair_collate(0, True)(examples)).logps - plain.logps).abs().max() > 1e-3


@pytest.mark.parametrize("vocab", [128, 4096])
@pytest.mark.parametrize("kind", ["mistral", "gemma3_text", "gpt_oss"])  # all windowed; mixed; mixed under eager
def test_flattened_and_shared_completions_keep_the_window(kind, vocab, no_window):
    """batch_flattening and GRPO groups sharing their prompt: the padded rows' log-probs, entropies, sampling log-probs
    and gradients. At 4,096 entries the log-probs go through the output layer (`completion_scores`), which crashed on
    the masks of a model mixing windowed and full layers (one per layer type) until 2026-11-26."""
    from rlft.data.collate import completion_batch
    from rlft.models.logprobs import shared_completion_inputs

    g = torch.Generator().manual_seed(7)
    ids = lambda n: torch.randint(3, 128, (n,), generator=g).tolist()  # noqa: E731
    first, second = ids(5), ids(2)
    rows = [{"prompt_ids": prompt, "completion_ids": ids(n), "advantage": 1.0, "loss_mask": [1] * n}
            for prompt, n in ((first, 4), (second, 6), (first, 7), (second, 3))]
    model = tiny_of_type(kind, vocab=vocab, window=WINDOW).train()
    batch = completion_batch(rows, pad_id=0)
    valid = batch["loss_mask"].bool()
    padded = completion_results(model, batch, valid)
    flat = {**batch, **flatten_rows(batch["input_ids"], batch["attention_mask"], True)}
    shared = {**batch, **shared_completion_inputs(rows, batch, 0)}
    for layout in (flat, shared):
        assert_same_completion_results(completion_results(model, layout, valid), padded)
    no_window()
    assert (completion_results(model, shared, valid)[0] - padded[0]).abs().max() > 1e-3


def test_flattened_preference_rows_keep_the_window():
    """dpo_padding_free: chosen and rejected rows as one sequence, on a model mixing windowed and full layers."""
    from rlft.data.preference import pair_batch
    from rlft.train.recipes.preference import sequence_logps

    g = torch.Generator().manual_seed(5)
    ids = lambda n: torch.randint(1, 128, (n,), generator=g).tolist()  # noqa: E731
    batch = pair_batch([{"prompt_ids": ids(4), "chosen_ids": ids(3), "rejected_ids": ids(6)},
                        {"prompt_ids": ids(2), "chosen_ids": ids(5), "rejected_ids": ids(1)}], pad_id=0)
    model = tiny_of_type("gemma3_text", window=WINDOW).train()
    results = []
    for inputs in (batch, {**batch, **flatten_rows(batch["input_ids"], batch["attention_mask"], True)}):
        model.zero_grad()
        out = sequence_logps(model, inputs)
        (out.logps * torch.tensor([1.0, -2.0, 0.5, 3.0])).sum().backward()
        results.append((out, parameter_grads(model)))
    assert_same_sequence_logps(results[1][0], results[0][0])
    assert_same_grads(results[1][1], results[0][1])


def test_layer_types_rlft_cannot_mask_are_refused_before_training():
    """Chunked, recurrent or convolutional layers (Llama 4, Qwen3-Next, LFM2): packed or flattened batches would be
    wrong, so loading refuses them there and lets padded rows through."""
    from rlft.config.loading import build_config
    from rlft.models.loading import check_own_masks

    holder = torch.nn.Module()
    holder.config = AutoConfig.for_model("qwen3_next")
    assert unmaskable_layers(holder) == ["linear_attention"]
    assert sliding_window(holder) == (None, False)  # padded rows (the left-padding guard on a GPU) go on as before
    config = lambda **keys: build_config({"base_model": "m", "datasets": [{"path": "d.jsonl"}], **keys})  # noqa: E731
    with pytest.raises(ModelError, match=r"train this model on padded rows \(sample_packing, batch_flattening"):
        check_own_masks(model_settings(config(sample_packing=True)), holder)
    with pytest.raises(ModelError, match="model type qwen3_next has linear_attention layers"):
        check_own_masks(model_settings(config(batch_flattening=True, micro_batch_size=2)), holder)
    check_own_masks(model_settings(config()), holder)  # padded rows: transformers builds the masks
    check_own_masks(model_settings(config(sample_packing=True)), tiny_of_type("gemma3_text", window=WINDOW))
