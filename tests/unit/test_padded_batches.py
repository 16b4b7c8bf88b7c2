"""Right-padded batches, written out by hand: SFT rows (pad_batch) and preference pairs (pair_batch)."""

import pytest
import torch

from rlft.config.settings import resolve
from rlft.data.collate import pad_batch
from rlft.data.preference import pair_batch


def test_sft_rows_are_right_padded_with_ignored_labels_and_a_mask():
    examples = [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": (9,), "labels": (9,)}]  # tuples too
    batch = pad_batch(examples, pad_id=0, width=4)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 0], [9, 0, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100], [9, -100, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    assert batch["num_tokens"] == 4
    assert all(batch[key].dtype == torch.long for key in ("input_ids", "labels", "attention_mask"))
    assert pad_batch(examples, pad_id=0)["input_ids"].shape == (2, 3)  # no width: the longest row


def test_preference_pairs_put_chosen_rows_first_and_train_only_the_completions():
    examples = [{"prompt_ids": [1, 2], "chosen_ids": [3], "rejected_ids": [4, 5, 6]},
                {"prompt_ids": [7], "chosen_ids": [8, 9], "rejected_ids": []}]
    batch = pair_batch(examples, pad_id=0)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 0, 0], [7, 8, 9, 0, 0], [1, 2, 4, 5, 6], [7, 0, 0, 0, 0]]
    assert batch["labels"].tolist() == [[-100, -100, 3, -100, -100], [-100, 8, 9, -100, -100], [-100, -100, 4, 5, 6],
                                        [-100, -100, -100, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert batch["num_tokens"] == 12


def test_pad_to_multiple_of_rounds_each_batch_width_up(config, monkeypatch):
    """pad_to_multiple_of (Axolotl's key): widths rounded up, so a GPU sees a few batch shapes; unset, 64 on a GPU
    (as Axolotl pads) and 1 on a CPU. Padding is masked and ignored: the real tokens and the targets are unchanged."""
    from rlft.data.collate import pad_multiple, packed_batch, padded_to
    from rlft.data.preference import kto_batch

    assert [padded_to(n, 0, 64) for n in (1, 64, 65, 128)] == [64, 64, 128, 128]
    assert padded_to(5, 10, 4) == 12 and padded_to(7) == 7  # at least `width`, then rounded
    examples = [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [9], "labels": [9]}]
    batch = pad_batch(examples, pad_id=0, multiple=4)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 0], [9, 0, 0, 0]] and batch["num_tokens"] == 4
    assert batch["labels"].tolist() == [[-100, 6, 7, -100], [9, -100, -100, -100]]
    assert packed_batch([examples], pad_id=0, multiple=8)["input_ids"].shape == (1, 8)
    pairs = [{"prompt_ids": [1, 2], "chosen_ids": [3], "rejected_ids": [4, 5, 6]}]
    assert pair_batch(pairs, pad_id=0, multiple=8)["input_ids"].tolist() == [[1, 2, 3, 0, 0, 0, 0, 0], [1, 2, 4, 5, 6, 0, 0, 0]]
    kto = kto_batch([{"prompt_ids": [1], "completion_ids": [2, 3], "kl_completion_ids": [4], "label": True}], 0, 0, 8)
    assert kto["input_ids"].shape == kto["kl_input_ids"].shape == (1, 8)
    assert pad_multiple(config()) == (64 if torch.cuda.is_available() else 1) and pad_multiple(config(pad_to_multiple_of=8)) == 8
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pad_multiple(config()) == 64


def test_the_sft_and_dpo_recipes_pad_their_batches_to_the_multiple(config):
    from rlft.data.prepared import PreparedData
    from rlft.train.recipes.preference import PairRecipe
    from rlft.train.recipes.sft import SFTRecipe

    rows = [{"input_ids": [5] * n, "labels": [5] * n} for n in (3, 9, 17, 4)]
    cfg = config(pad_to_multiple_of=16, micro_batch_size=2)
    sft = SFTRecipe(cfg, resolve(cfg), PreparedData(rows, rows[:2], []), pad_id=0)
    widths = {sft.train_plan.batch(indices)["input_ids"].shape[1] for indices in sft.train_plan.epoch_order(0)}
    assert widths <= {16, 32} and sft.eval_batches[0]["input_ids"].shape[1] == 16
    pairs = [{"prompt_ids": [1] * n, "chosen_ids": [2], "rejected_ids": [3, 3]} for n in (2, 31)]
    cfg = config(rl="dpo", pad_to_multiple_of=16, micro_batch_size=2)
    dpo = PairRecipe(cfg, resolve(cfg), PreparedData(pairs, [], []), 0, None)
    assert dpo.train_plan.batch([0, 1])["input_ids"].shape[1] == 48  # the longest row, 33 tokens, rounded up to 48


def test_tensor_of_is_torch_tensor_of_the_same_values():
    """Numbers and rows of one length, long and float32 (a float rounds to float32 as torch.tensor rounds it); rows of
    differing lengths and empty lists get torch.tensor's own answer."""
    from rlft.data.collate import tensor_of

    rows = [[5, -1, 2**40], [0, 7, 3]]
    for values, dtype in ((rows, torch.long), ([3, 1, 4], torch.long), ([[0.1, 1e-8, -2.5]], torch.float32),
                          ([0.3, 1, True], torch.float32), ([[True, False]], torch.long)):
        got, want = tensor_of(values, dtype), torch.tensor(values, dtype=dtype)
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    got = tensor_of(rows)
    got[0, 0] = 9  # its own memory: writable, the rows' lists unchanged
    assert rows[0][0] == 5
    assert tensor_of([], torch.float32).shape == (0,) and tensor_of([[], []]).shape == (2, 0)
    with pytest.raises(ValueError):
        tensor_of([[1, 2], [3]])
