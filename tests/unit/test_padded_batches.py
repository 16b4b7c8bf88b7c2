"""Right-padded batches, written out by hand: SFT rows (pad_batch) and preference pairs (pair_batch)."""

import torch

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
