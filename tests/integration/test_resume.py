"""Resume is exact: 6 straight steps == 3 steps + resume from checkpoint-3 + 3 steps (losses and weights)."""

import shutil

import pytest
import torch
from safetensors.torch import load_file

from rlft.train.metrics import read_metrics

pytestmark = pytest.mark.slow


def _weights(folder):
    state = {}
    for file in sorted(folder.glob("*.safetensors")):
        state.update(load_file(file))
    return state


@pytest.mark.parametrize("adapter", [None, "lora"], ids=["full", "lora"])
def test_three_plus_three_steps_equal_six(make_config, cli, tmp_path, addition_files, adapter):
    lora = {"adapter": "lora", "lora_r": 4, "lora_alpha": 8, "lora_target_linear": True, "lora_dropout": 0.1} if adapter else {}
    # 10 rows, 2 per micro-batch x 2 accumulation: an epoch is 2.5 steps, so both runs cross epoch boundaries
    settings = dict(datasets=[{"path": str(addition_files["train"]), "split": "train[:10]"}], micro_batch_size=2,
                    gradient_accumulation_steps=2, max_steps=6, save_steps=3, weight_decay=0.01, **lora)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert cli("train", make_config(output_dir=str(straight), **settings)) == 0

    # the interrupted run: only what existed after step 3 (checkpoint-3 and, for LoRA, the random base)
    resumed.mkdir()
    shutil.copytree(straight / "checkpoint-3", resumed / "checkpoint-3")
    if adapter:
        shutil.copytree(straight / "init-base", resumed / "init-base")
    assert cli("train", make_config(output_dir=str(resumed), resume_from_checkpoint="auto", **settings)) == 0

    first = {m["step"]: m["loss"] for m in read_metrics(straight / "metrics.jsonl") if "loss" in m}
    second = {m["step"]: m["loss"] for m in read_metrics(resumed / "metrics.jsonl") if "loss" in m}
    assert sorted(second) == [4, 5, 6]
    assert [first[s] for s in (4, 5, 6)] == [second[s] for s in (4, 5, 6)]
    assert len(set(first.values())) == 6  # the losses really change from step to step

    a, b = _weights(straight / "checkpoint-6" / "model"), _weights(resumed / "checkpoint-6" / "model")
    assert a.keys() == b.keys() and a
    for name in a:
        assert torch.equal(a[name], b[name]), name
    start = _weights(straight / "checkpoint-3" / "model")
    assert any(not torch.equal(start[name], a[name]) for name in a)  # training moved the weights
