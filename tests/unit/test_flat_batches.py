"""batch_flattening: a micro-batch's rows as one sequence without padding give the padded batch's log-probs."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlft.config.loading import build_config
from rlft.data.collate import completion_batch, documents_mask, flatten_rows
from rlft.models import head
from layout_checks import (assert_same_completion_results, assert_same_grads, assert_same_sequence_logps, completion_results,
                           parameter_grads, sft_documents, sft_results)


def flatten_completion_batch(batch, block_mask):
    return {**batch, **flatten_rows(batch["input_ids"], batch["attention_mask"], block_mask)}


def rows(vocab: int):
    g = torch.Generator().manual_seed(4)
    shapes = ((5, 4), (2, 7), (5, 0), (3, 1))  # prompt, completion lengths: left and right padding, an empty completion
    out = []
    for prompt, completion in shapes:
        ids = torch.randint(1, vocab, (prompt + completion,), generator=g).tolist()
        out.append({"prompt_ids": ids[:prompt], "completion_ids": ids[prompt:], "loss_mask": [1] * completion, "advantage": 1.0})
    return out


def test_the_padded_completion_layout_by_hand():
    """Prompts left-padded, completions right-padded; per-token values (loss mask, old log-probs) padded with zeros."""
    batch = completion_batch([{"prompt_ids": [7, 8], "completion_ids": [9], "loss_mask": [1], "advantage": 0.5,
                               "old_logps": [-1.5]},
                              {"prompt_ids": [5], "completion_ids": [6, 4, 3], "loss_mask": [1, 0, 1], "advantage": -1.0,
                               "old_logps": [-0.5, -2.0, -3.0]},
                              {"prompt_ids": [2, 2], "completion_ids": [], "loss_mask": [], "advantage": 0.0,
                               "old_logps": []}], pad_id=0, values=("old_logps", "ref_logps"))
    assert batch["input_ids"].tolist() == [[7, 8, 9, 0, 0], [0, 5, 6, 4, 3], [2, 2, 0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [0, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 2, 2], [0, 0, 1, 2, 3], [0, 1, 1, 1, 1]]
    assert batch["loss_mask"].tolist() == [[1.0, 0.0, 0.0], [1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
    assert batch["old_logps"].tolist() == [[-1.5, 0.0, 0.0], [-0.5, -2.0, -3.0], [0.0, 0.0, 0.0]]
    assert batch["advantage"].tolist() == [0.5, -1.0, 0.0] and batch["loss_mask"].dtype == torch.float32
    assert batch["completion_width"] == 3 and batch["num_tokens"] == 9 and "ref_logps" not in batch
    with pytest.raises(ValueError, match="2 per-token values for a completion of 1 tokens"):
        completion_batch([{"prompt_ids": [7], "completion_ids": [9], "loss_mask": [1, 1], "advantage": 0.0}], pad_id=0)


def test_the_flat_layout_by_hand():
    batch = completion_batch([{"prompt_ids": [7, 8], "completion_ids": [9], "loss_mask": [1], "advantage": 0.0},
                              {"prompt_ids": [5], "completion_ids": [6, 4], "loss_mask": [1, 1], "advantage": 0.0}], pad_id=0)
    # padded: [7 8 | 9 0] and [0 5 | 6 4]
    flat = flatten_completion_batch(batch, block_mask=True)
    assert flat["flat_input_ids"].tolist() == [[7, 8, 9, 5, 6, 4]]
    assert flat["flat_position_ids"].tolist() == [[0, 1, 2, 0, 1, 2]]
    # every padded slot's flat position; a padding slot points at the real token before it (row 1's leading one at 9)
    assert flat["flat_index"].tolist() == [[0, 1, 2, 2], [2, 3, 4, 5]]
    assert flat["flat_documents"].tolist() == [0, 3, 6]
    mask = documents_mask(flat["flat_documents"], 1, 6)[0, 0].int().tolist()
    assert mask == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                    [0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 1]]
    assert "flat_documents" not in flatten_completion_batch(batch, block_mask=False)
    assert torch.equal(flat["input_ids"], batch["input_ids"])  # targets are still read from the padded rows


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("vocab", [300, 4096], ids=["model-logits", "output-layer"])
def test_flattened_rows_give_the_padded_log_probs_entropy_and_gradients(vocab, attention, monkeypatch):
    """Eager attention adds a 4-D mask to the scores: the block mask must reach it as 0 / -inf, not as booleans."""
    monkeypatch.setattr(head, "MIN_VOCAB", 4096)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=32, attn_implementation=attention))
    batch = completion_batch(rows(vocab), pad_id=0)
    valid = batch["attention_mask"][:, -batch["completion_width"]:].bool()
    assert_same_completion_results(completion_results(model, flatten_completion_batch(batch, block_mask=True), valid),
                                   completion_results(model, batch, valid))


def config(**keys):
    return build_config({"base_model": "m", "datasets": [{"path": "d.jsonl"}], "micro_batch_size": 4, **keys})


def test_batch_flattening_auto_is_on_with_flash_attention_only_and_true_uses_a_mask_elsewhere():
    assert config().flat_batches is None
    assert config(batch_flattening="auto").flat_batches is None  # SDPA: padding costs less than a dense block mask
    assert config(batch_flattening="auto", flash_attention=True).flat_batches == "varlen"
    assert config(batch_flattening="auto", flash_attention=True, micro_batch_size=1).flat_batches is None
    assert config(batch_flattening="auto", flash_attention=True, sample_packing=True).flat_batches is None
    assert config(batch_flattening=True).flat_batches == "mask"
    assert config(batch_flattening=True, flash_attention=True).flat_batches == "varlen"
    # auto where nothing is flattened (reward models, strided EBFT): off, not reported on
    assert config(batch_flattening="auto", flash_attention=True, reward_model=True).flat_batches is None


@pytest.mark.parametrize("keys, message", [
    ({"batch_flattening": True, "sample_packing": True}, "batch_flattening and sample_packing both remove padding"),
    ({"batch_flattening": True, "rl": "dpo"}, "batch_flattening applies to SFT and to the GRPO family"),
])
def test_batch_flattening_combinations_that_are_refused(keys, message):
    from rlft.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        config(**keys)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("vocab", [300, 4096], ids=["model-logits", "output-layer"])
def test_flattened_preference_rows_give_the_padded_sequence_log_probs_and_gradients(vocab, attention, monkeypatch):
    """dpo_padding_free: pairs (chosen rows, then rejected rows, right-padded) as one sequence: the same sequence
    log-probs, per-token log-probs, mean-logit metric and gradients, through the model's logits and the output layer,
    with SDPA and with eager attention."""
    from rlft.data.preference import pair_batch
    from rlft.train.recipes.preference import sequence_logps

    monkeypatch.setattr(head, "MIN_VOCAB", 4096)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=32, attn_implementation=attention))
    g = torch.Generator().manual_seed(5)
    ids = lambda n: torch.randint(1, vocab, (n,), generator=g).tolist()  # noqa: E731
    examples = [{"prompt_ids": ids(4), "chosen_ids": ids(3), "rejected_ids": ids(6)},
                {"prompt_ids": ids(2), "chosen_ids": ids(5), "rejected_ids": ids(1)}]
    batch = pair_batch(examples, pad_id=0)
    results = []
    for flat in (False, True):
        model.zero_grad()
        inputs = {**batch, **flatten_rows(batch["input_ids"], batch["attention_mask"], True)} if flat else batch
        out = sequence_logps(model, inputs)
        (out.logps * torch.tensor([1.0, -2.0, 0.5, 3.0])).sum().backward()
        results.append((out, parameter_grads(model)))
    (plain, grads), (flat, flat_grads) = results
    assert_same_sequence_logps(flat, plain)
    assert_same_grads(flat_grads, grads)


def test_dpo_padding_free_is_for_preference_methods():
    from rlft.errors import ConfigError

    assert config(rl="dpo", dpo_padding_free=True).flat_batches == "mask"
    assert config(rl="kto", dpo_padding_free=True, flash_attention=True).flat_batches == "varlen"
    assert config(rl="dpo", batch_flattening="auto", flash_attention=True).flat_batches is None
    with pytest.raises(ConfigError, match="dpo_padding_free applies to the preference methods.*use batch_flattening: true"):
        config(dpo_padding_free=True)
    with pytest.raises(ConfigError, match="not dpo: use dpo_padding_free: true"):
        config(rl="dpo", batch_flattening=True)


def test_group_by_length_puts_rows_of_similar_length_together_and_keeps_every_row():
    """SFT's group_by_length (transformers' name): the same rows every epoch, far less padding than random batches."""
    from rlft.data.batches import BatchPlan
    from rlft.errors import ConfigError

    g = torch.Generator().manual_seed(0)
    examples = [{"input_ids": [1] * int(n), "labels": [1] * int(n)} for n in torch.randint(4, 200, (640,), generator=g)]
    lengths = [len(e["input_ids"]) for e in examples]

    def padding(plan):
        batches = plan.epoch_order(0)
        assert sorted(i for batch in batches for i in batch) == list(range(640))
        return sum(len(b) * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in batches) / sum(lengths)

    grouped, plain = BatchPlan(examples, 8, 0, 0, lengths=lengths), BatchPlan(examples, 8, 0, 0)
    assert padding(grouped) < 0.1 < 0.5 < padding(plain)
    assert config(group_by_length=True).group_by_length and config(rl="dpo", group_by_length=True)
    with pytest.raises(ConfigError, match="group_by_length and sample_packing"):
        config(group_by_length=True, sample_packing=True)
    with pytest.raises(ConfigError, match="not grpo"):
        config(rl="grpo", group_by_length=True, micro_batch_size=8)


def test_evaluation_batches_go_shortest_first_when_lengths_are_known():
    """Eval losses are sums over every row, so their batches can hold rows of similar lengths: every row once,
    far less padding than data order. Without lengths (packed eval, online RL prompts, KTO) the order is the data's."""
    from rlft.data.batches import BatchPlan

    g = torch.Generator().manual_seed(1)
    examples = [{"input_ids": [1] * int(n), "labels": [1] * int(n)} for n in torch.randint(4, 200, (100,), generator=g)]
    lengths = [len(e["input_ids"]) for e in examples]
    sorted_batches = BatchPlan(examples, 8, 0, 0, lengths=lengths).sequential()
    plain_batches = BatchPlan(examples, 8, 0, 0).sequential()

    def padding(batches):
        return sum(int((b["attention_mask"] == 0).sum()) for b in batches) / sum(lengths)

    assert sorted(int(b["attention_mask"][r].sum()) for b in sorted_batches for r in range(len(b["input_ids"]))) == sorted(lengths)
    assert [int(b["attention_mask"][r].sum()) for b in plain_batches for r in range(len(b["input_ids"]))] == lengths
    assert padding(sorted_batches) < 0.1 < 0.5 < padding(plain_batches)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_sft_rows_give_each_documents_own_loss(attention):
    """sample_packing: documents packed into one row under the block-diagonal mask have the summed NLL and gradients
    of the same documents in padded rows, with SDPA and with eager attention (which adds the mask to its scores)."""
    from rlft.data.collate import pad_batch, packed_batch

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=32, attn_implementation=attention))
    documents = sft_documents((5, 8, 3), 300)
    (padded_loss, grads), (packed_loss, packed_grads) = [
        sft_results(model, batch) for batch in (pad_batch(documents, pad_id=0), packed_batch([documents], pad_id=0))]
    torch.testing.assert_close(packed_loss, padded_loss, rtol=1e-5, atol=1e-5)
    assert_same_grads(packed_grads, grads)
