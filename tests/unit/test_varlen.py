"""SDPA per document (rlft.models.varlen): packed and flattened batches attend within each document on its own, for
the results of the padded rows, and only where a forward asks for it."""

from __future__ import annotations

import pytest
import torch
from transformers import AttentionInterface  # builds the registry with transformers' own SDPA before `calls` patches it
from transformers.integrations import sdpa_attention

from layout_checks import (EAGER_ONLY, assert_same_completion_results, assert_same_grads, completion_results,
                           sft_documents, sft_results, tiny_of_type)
from rlft.data.collate import document_bounds, flatten_rows, pad_batch, packed_batch
from rlft.models.masks import with_model_mask
from rlft.models.shared_prompts import SHARED_PROMPT_MODELS
from rlft.models.varlen import DOCUMENTS, KEYWORDS_DROPPED, is_unread


@pytest.fixture
def calls(monkeypatch):
    """The query length of every SDPA call the model makes."""
    seen = []
    real = sdpa_attention.sdpa_attention_forward
    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward",
                        lambda module, query, *a, **k: seen.append(query.shape[2]) or real(module, query, *a, **k))
    return seen


def test_document_bounds_by_hand():
    document = torch.tensor([[0, 0, 1, 1, 1, -1], [0, 0, 0, 0, 1, 1]])
    assert document_bounds(document).tolist() == [0, 2, 5, 6, 10, 12]  # a run of padding is one; rows never merge
    assert document_bounds(torch.tensor([[0, 0, 0], [0, 0, 0]])).tolist() == [0, 3, 6]


def _rows(vocab=128):
    g = torch.Generator().manual_seed(4)
    out = []
    for prompt, completion in ((5, 4), (2, 7), (5, 0), (3, 1)):
        ids = torch.randint(1, vocab, (prompt + completion,), generator=g).tolist()
        out.append({"prompt_ids": ids[:prompt], "completion_ids": ids[prompt:], "mask": [1] * completion, "advantage": 1.0})
    return out


@pytest.mark.parametrize("kind", [kind for kind in SHARED_PROMPT_MODELS if kind not in EAGER_ONLY])
def test_every_checked_model_type_attends_per_document_and_gets_the_padded_results(kind, calls):
    """batch_flattening: the flattened rows reach SDPA one document at a time (9, 9, 5, 4 tokens, per layer), with the
    padded rows' log-probs, entropies, sampling log-probs and gradients."""
    from rlft.models.logprobs import completion_batch

    model = tiny_of_type(kind)  # eval mode: GPT-2's and Seed-OSS's attention dropout would draw differently
    batch = completion_batch(_rows(), pad_id=0)
    valid = batch["attention_mask"][:, -batch["completion_width"]:].bool()
    padded = completion_results(model, batch, valid)
    del calls[:]
    flat = completion_results(model, {**batch, **flatten_rows(batch["input_ids"], batch["attention_mask"], True)}, valid)
    if kind in KEYWORDS_DROPPED:  # its layers do not pass the forward's keywords on: the whole sequence, masked
        assert set(calls) == {27}
    else:
        assert sorted(set(calls)) == [4, 5, 9], calls  # never the whole 27-token sequence
    assert_same_completion_results(flat, padded, grad_atol=1e-5)  # these models' gradients reach about 7


@pytest.mark.parametrize("kind", ["llama", "gemma3_text"])  # Gemma 3 with a 3-token window: each document's mask block
def test_packed_rows_attend_per_document_and_give_the_padded_loss(kind, calls):
    """sample_packing: rows of several documents, one ending in padding; the summed NLL and gradients of the
    documents padded one per row."""
    model = tiny_of_type(kind, window=3 if kind == "gemma3_text" else None).train()
    documents = sft_documents((5, 8, 3, 6), 128)
    results = [sft_results(model, batch)
               for batch in (pad_batch(documents, pad_id=0), packed_batch([documents[:3], documents[3:]], pad_id=0))]
    assert {5, 8, 3, 6} <= set(calls) and 16 not in calls  # the packed rows are 16 tokens wide
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-5)
    assert_same_grads(results[1][1], results[0][1], atol=1e-5)


def test_packed_rows_under_flash_attention_come_as_one_row_whose_position_ids_give_each_document(config, calls):
    """sample_packing with flash-attention and micro_batch_size 2: transformers finds packed documents from the position
    ids only in a batch of one row, so the recipe's micro-batch is its packed rows in one row. Flash-attention is not
    installed here: its documents are taken as transformers derives them from the position ids
    (`prepare_fa_kwargs_from_position_ids`), and attending within them gives the padded rows' loss."""
    from transformers.modeling_flash_attention_utils import _is_packed_sequence, prepare_fa_kwargs_from_position_ids

    from rlft.data.prepare import PreparedData
    from rlft.train.recipes.sft import SFTRecipe

    documents = sft_documents((5, 8, 3, 6, 9), 128)
    cfg = config(flash_attention=True, sample_packing=True, sequence_len=16, micro_batch_size=2, eval_batch_size=2)
    recipe = SFTRecipe(cfg, PreparedData(documents, documents, []), pad_id=0)
    batches = [recipe.train_plan.batch(indices) for indices in recipe.train_plan.epoch_order(0)] + recipe.eval_batches
    assert all(b["input_ids"].shape[0] == 1 and "documents" not in b for b in batches)
    assert any(b["input_ids"].shape[1] == 32 for b in batches)  # two packed rows of 16
    model = tiny_of_type("llama").train()
    padded = sft_results(model, pad_batch(documents, pad_id=0))
    flash_documents = []
    for batch in batches[:len(recipe.train_plan.epoch_order(0))]:
        assert _is_packed_sequence(batch["position_ids"], 1)
        (bounds, _), _ = prepare_fa_kwargs_from_position_ids(batch["position_ids"])
        flash_documents.append(sft_results(model, {**batch, "documents": bounds.long()}))
    torch.testing.assert_close(sum(loss for loss, _ in flash_documents), padded[0], rtol=1e-5, atol=1e-5)
    assert_same_grads({k: sum(g[k] for _, g in flash_documents) for k in padded[1]}, padded[1], atol=1e-5)
    assert 16 not in calls and 32 not in calls  # attention within each document, never over a whole row
    flash = tiny_of_type("llama")
    flash.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="one row"):  # two packed rows would each attend across their documents
        with_model_mask(flash, {**batches[0], "input_ids": batches[0]["input_ids"].view(2, 16), "documents": bounds})


def _flat_inputs():
    batch = flatten_rows(torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([[1, 1, 1], [1, 1, 0]]), True)
    return {"input_ids": batch["flat_input_ids"], "position_ids": batch["flat_position_ids"],
            "documents": batch["flat_documents"]}


def test_only_sdpa_uncompiled_checked_models_get_the_documents_and_others_the_block_mask():
    """SDPA on a checked model type: the boundaries and a 2-D mask without padding, no (T, T) mask. Eager attention,
    a compiled forward, a model type whose layers drop the keywords, or a checkpoint's own modeling code of a checked
    type (trust_remote_code): the block-causal mask, as the model reads it."""
    from transformers import LlamaForCausalLM

    from rlft.data.collate import documents_mask

    inputs = with_model_mask(tiny_of_type("llama"), _flat_inputs())
    assert inputs[DOCUMENTS].tolist() == [0, 3, 5] and is_unread(inputs["attention_mask"])
    assert inputs["attention_mask"].shape == (1, 1, 5, 5) and inputs["attention_mask"].untyped_storage().nbytes() == 1
    block = documents_mask(torch.tensor([0, 3, 5]), 1, 5)
    eager = tiny_of_type("llama")
    eager.set_attn_implementation("eager")
    remote = type("Llama", (LlamaForCausalLM,), {"__module__": "transformers_modules.someone.modeling_llama"})
    for model in (eager, torch.compile(tiny_of_type("llama")), tiny_of_type("stablelm"), remote(tiny_of_type("llama").config)):
        inputs = with_model_mask(model, _flat_inputs())
        assert DOCUMENTS not in inputs and "documents" not in inputs
        assert torch.equal(inputs["attention_mask"] == 0 if model is eager else inputs["attention_mask"], block)
    flash = tiny_of_type("llama")
    flash.config._attn_implementation = "flash_attention_2"  # (not run: no flash-attn here) packed rows, position ids only
    inputs = with_model_mask(flash, _flat_inputs())
    assert sorted(inputs) == ["input_ids", "position_ids"] and inputs["position_ids"].tolist() == [[0, 1, 2, 0, 1]]


def test_no_mask_is_built_for_sliding_window_layers(monkeypatch):
    """transformers builds a (T, T) mask for sliding-window layers from a 2-D mask (half of a tiny Gemma 3's forward at
    5,000 tokens, and 1 GiB at 32k); the per-row path gives it none to build."""
    from transformers import masking_utils

    def built(*args, **kwargs):
        raise AssertionError("a mask was built")

    for kind in ("gemma3_text", "mistral"):
        model = tiny_of_type(kind, window=3)
        monkeypatch.setitem(masking_utils.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping, "sdpa", built)
        with torch.no_grad():
            model(**with_model_mask(model, _flat_inputs()))
        monkeypatch.undo()
        with pytest.raises(AssertionError, match="built"), torch.no_grad():  # a 2-D mask has one built
            monkeypatch.setitem(masking_utils.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping, "sdpa", built)
            model(input_ids=torch.tensor([[1, 2, 3, 4, 5]]), attention_mask=torch.ones(1, 5, dtype=torch.long))
        monkeypatch.undo()


def test_a_layer_that_drops_the_boundaries_stops_the_forward():
    """A model whose layers do not hand the forward's keywords on to attention (remote code, a patched forward): the
    layer gets the stand-in mask without the boundaries, and the run stops with the fix rather than attending across
    documents."""
    model = tiny_of_type("llama")
    attention = model.model.layers[1].self_attn
    forward = attention.forward
    attention.forward = lambda *args, **kwargs: forward(*args, **{k: v for k, v in kwargs.items() if k != DOCUMENTS})
    from rlft.errors import ModelError

    with pytest.raises(ModelError, match="without its document boundaries.*KEYWORDS_DROPPED"), torch.no_grad():
        model(**with_model_mask(model, _flat_inputs()))


def test_forwards_without_documents_get_transformers_sdpa(calls):
    """With the wrapper installed, padded rows and a KV-cache decode: one SDPA call per layer over the whole rows, as
    without rlft."""
    from rlft.models.varlen import install

    assert install()
    model = tiny_of_type("llama")
    with torch.no_grad():
        model(input_ids=torch.tensor([[1, 2, 3, 4]]))
        model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=2, do_sample=False)
    assert calls == [4, 4, 3, 3, 1, 1]


def test_another_librarys_sdpa_is_left_in_place(monkeypatch):
    """If something else (a kernel library) has replaced transformers' "sdpa" entry, rlft does not wrap it: the batch
    runs under its block mask."""
    from rlft.models.varlen import documents_attention

    foreign = lambda *a, **k: None  # noqa: E731
    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", foreign)
    inputs = with_model_mask(tiny_of_type("llama"), _flat_inputs())
    assert DOCUMENTS not in inputs and inputs["attention_mask"].shape == (1, 1, 5, 5)
    assert AttentionInterface._global_mapping["sdpa"] is foreign is not documents_attention


def test_a_lora_model_attends_per_document_too(calls):
    """rlft's adapters go through PEFT, whose forward must hand the boundaries on: the per-row path is taken and the
    gradients of the LoRA weights are the padded rows'."""
    from peft import LoraConfig, get_peft_model

    from rlft.models.logprobs import completion_batch

    model = get_peft_model(tiny_of_type("llama"), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                              init_lora_weights=False))
    batch = completion_batch(_rows(), pad_id=0)
    valid = batch["attention_mask"][:, -batch["completion_width"]:].bool()
    padded = completion_results(model, batch, valid)
    del calls[:]
    flat = completion_results(model, {**batch, **flatten_rows(batch["input_ids"], batch["attention_mask"], True)}, valid)
    assert sorted(set(calls)) == [4, 5, 9], calls
    assert_same_completion_results(flat, padded, grad_atol=1e-5)
