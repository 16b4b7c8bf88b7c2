"""Packed rows (several documents, block-diagonal attention) give the same per-token losses as unpacked rows."""

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlft.data.collate import pack_examples, packed_batch, pad_batch
from rlft.models.masks import with_model_mask
from rlft.losses.sft import token_nll


def _examples(count: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    examples = []
    for _ in range(count):
        length = int(torch.randint(4, 20, (1,), generator=generator))
        ids = torch.randint(0, 256, (length,), generator=generator).tolist()
        labels = [-100] * (length // 3) + ids[length // 3 :]
        examples.append({"input_ids": ids, "labels": labels})
    return examples


def _model(tiny_model_dir):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model_dir), attn_implementation="sdpa").eval()


def _per_document_losses_unpacked(model, examples, pad_id):
    batch = pad_batch(examples, pad_id)
    nll, mask = token_nll(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, batch["labels"])
    return [nll[row][mask[row]] for row in range(len(examples))]


def _per_document_losses_packed(model, examples, pad_id, capacity):
    packs = pack_examples(examples, capacity)
    batch = packed_batch([[examples[i] for i in pack] for pack in packs], pad_id)
    assert batch["input_ids"].shape[-1] <= capacity
    logits = model(**with_model_mask(model, {k: batch[k] for k in ("input_ids", "position_ids", "documents")})).logits
    nll, mask = token_nll(logits, batch["labels"])
    losses = {}
    for row, pack in enumerate(packs):
        offset = 0
        for index in pack:
            n = len(examples[index]["input_ids"])
            # targets of document tokens 1..n-1 sit at shifted positions offset..offset+n-2
            span = slice(offset, offset + n - 1)
            losses[index] = nll[row, span][mask[row, span]]
            offset += n
    return [losses[i] for i in range(len(examples))]


def test_packing_groups_documents_without_overflow():
    examples = _examples(12)
    packs = pack_examples(examples, 48)
    assert sorted(i for pack in packs for i in pack) == list(range(12))
    assert all(sum(len(examples[i]["input_ids"]) for i in pack) <= 48 for pack in packs)
    assert len(packs) < 12  # something was actually packed


def test_packed_and_unpacked_per_token_losses_match(tiny_model_dir):
    model = _model(tiny_model_dir)
    examples = _examples(10)
    with torch.no_grad():
        unpacked = _per_document_losses_unpacked(model, examples, pad_id=256)
        packed = _per_document_losses_packed(model, examples, pad_id=256, capacity=48)
    for doc, (a, b) in enumerate(zip(unpacked, packed)):
        assert a.shape == b.shape and a.numel() > 0, doc
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_packing_without_document_mask_would_differ(tiny_model_dir):
    """Guard against a vacuous pass: causal attention across documents changes the losses."""
    model = _model(tiny_model_dir)
    examples = _examples(10)
    packs = pack_examples(examples, 48)
    batch = packed_batch([[examples[i] for i in pack] for pack in packs], 256)
    with torch.no_grad():
        proper = model(**with_model_mask(model, {k: batch[k] for k in ("input_ids", "position_ids", "documents")})).logits
        leaky = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    assert not torch.allclose(proper, leaky, atol=1e-3)


def test_first_token_of_each_packed_document_is_not_a_target():
    examples = [{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}, {"input_ids": [4, 5], "labels": [4, 5]}]
    batch = packed_batch([examples], pad_id=0)
    assert batch["labels"].tolist() == [[-100, 2, 3, -100, 5]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert batch["num_tokens"] == 5
