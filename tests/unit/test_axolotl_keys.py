"""Axolotl's config idioms and keys (issue 12, point 3): empty values, per-epoch cadences, padding and packing switches."""

from __future__ import annotations

import pytest

from rlft.data.batches import BatchPlan
from rlft.data.collate import pad_batch
from rlft.train.loop import every


def test_an_empty_key_means_unset(config):
    cfg = config(fp16=None, lora_r=None, wandb_project=None, trl={"beta": None})
    assert cfg.fp16 is False and cfg.lora_r == 8 and cfg.trl.beta == config().trl.beta


def test_an_empty_key_inside_a_dataset_means_unset(config):
    assert config(datasets=[{"path": "train.jsonl", "split": None}]).datasets[0].split == "train"


def test_null_keeps_its_own_meaning_where_it_has_one(config):
    assert config(trl={"reward_timeout": None}).trl.reward_timeout is None  # no limit, documented


def test_an_empty_unknown_key_is_still_reported(config_problems):
    assert config_problems(fp61=None) == [("fp61", "unknown key 'fp61': did you mean 'fp16'?")]


@pytest.mark.parametrize("steps, per_epoch, epoch_steps, expected", [
    (None, None, 10, None),  # neither: at the end only
    (3, None, 10, 3),
    (None, 2, 10, 5),
    (None, 4, 10, 2),  # 10 // 4
    (None, 4, 2, 1),  # more evals than steps: every step
])
def test_every_from_steps_or_per_epoch(steps, per_epoch, epoch_steps, expected):
    assert every(steps, per_epoch, epoch_steps) == expected


def test_steps_and_per_epoch_together_refused(config_problems):
    assert config_problems(save_steps=5, saves_per_epoch=2) == [("combination", "save_steps and saves_per_epoch are both set: keep one")]
    assert ("evals_per_epoch", "Input should be greater than or equal to 1") in config_problems(evals_per_epoch=0)


def test_pad_to_a_width():
    batch = pad_batch([{"input_ids": [5, 6], "labels": [5, 6]}], pad_id=0, width=4)
    assert batch["input_ids"].tolist() == [[5, 6, 0, 0]] and batch["labels"].tolist() == [[5, 6, -100, -100]]
    assert batch["num_tokens"] == 2


def test_plan_width_pads_packed_rows_too():
    rows = [{"input_ids": [1, 2], "labels": [1, 2]}, {"input_ids": [3], "labels": [3]}]
    packed = BatchPlan(rows, 1, 0, 0, pack_capacity=8, width=8).sequential()
    assert [b["input_ids"].shape[1] for b in packed] == [8]


@pytest.mark.parametrize("key", ["pad_to_sequence_len", "eval_sample_packing"])
def test_sft_only_switches_refused_for_preference(config_problems, key):
    assert config_problems(rl="dpo", **{key: True}) == [("combination", f"{key} applies to SFT only, not dpo")]


@pytest.mark.parametrize("packing, eval_packing, packed", [(True, None, True), (True, False, False), (False, True, True)])
def test_eval_sample_packing_follows_sample_packing_unless_set(config, packing, eval_packing, packed):
    from rlft.data.prepare import PreparedData
    from rlft.train.recipes.sft import SFTRecipe

    rows = [{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}] * 4
    cfg = config(sample_packing=packing, eval_sample_packing=eval_packing, sequence_len=16, micro_batch_size=4)
    batches = SFTRecipe(cfg, PreparedData(rows, rows, []), pad_id=0).eval_batches
    assert ("position_ids" in batches[0]) is packed
