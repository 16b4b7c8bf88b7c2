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


def test_a_resume_trains_with_todays_learning_rate(make_config, cli, tmp_path, capsys):
    """The advice after a divergence is "lower learning_rate, resume from the checkpoint": the resumed run must train
    with the new rate (the optimizer and schedule states carry the old one) and say that it changed."""
    settings = dict(max_steps=4, save_steps=2, lr_scheduler="cosine", warmup_steps=0, weight_decay=0.01)
    first = tmp_path / "first"
    assert cli("train", make_config(output_dir=str(first), learning_rate=1e-3, **settings)) == 0
    rates = {m["step"]: m["learning_rate"] for m in read_metrics(first / "metrics.jsonl") if "loss" in m}
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(first / "checkpoint-2", resumed / "checkpoint-2")
    capsys.readouterr()
    assert cli("train", make_config(output_dir=str(resumed), resume_from_checkpoint="auto", learning_rate=1e-4,
                                    **settings)) == 0
    assert "learning_rate 0.001 in the checkpoint, 0.0001 now" in capsys.readouterr().out
    later = {m["step"]: m["learning_rate"] for m in read_metrics(resumed / "metrics.jsonl") if "loss" in m}
    assert sorted(later) == [3, 4] and all(later[s] == pytest.approx(rates[s] / 10) for s in (3, 4))  # the same cosine
    from rlft.train.state_files import SCHEDULER_FILE
    import json
    assert json.loads((resumed / "checkpoint-4" / SCHEDULER_FILE).read_text())["base_lrs"] == [1e-4] * len(
        json.loads((first / "checkpoint-4" / SCHEDULER_FILE).read_text())["base_lrs"])


def test_schedule_free_adamw_trains_and_resumes_exactly(make_config, cli, tmp_path, addition_files):
    """transformers' schedule_free_adamw (schedulefree's AdamWScheduleFree) steps only in train mode and keeps its own
    state in the parameter groups (train_mode, k, weight_sum, lr_max): the loop switches it to train before steps and
    to eval (the averaged weights) for evaluations and saves, and a resume keeps the groups' state."""
    settings = dict(datasets=[{"path": str(addition_files["train"]), "split": "train[:40]"}], micro_batch_size=4,
                    max_steps=6, save_steps=3, eval_steps=3, val_set_size=8, optimizer="schedule_free_adamw",
                    lr_scheduler="constant", warmup_steps=0)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert cli("train", make_config(output_dir=str(straight), **settings)) == 0
    resumed.mkdir()
    shutil.copytree(straight / "checkpoint-3", resumed / "checkpoint-3")
    assert cli("train", make_config(output_dir=str(resumed), resume_from_checkpoint="auto", **settings)) == 0

    first = read_metrics(straight / "metrics.jsonl")
    second = read_metrics(resumed / "metrics.jsonl")
    losses = {m["step"]: m["loss"] for m in first if "loss" in m}
    assert [m["loss"] for m in second if "loss" in m] == [losses[s] for s in (4, 5, 6)]
    evals = [m["eval/loss"] for m in first if "eval/loss" in m]
    assert evals[-1] < evals[0]  # learning happened, measured at the averaged weights
    a, b = _weights(straight / "checkpoint-6" / "model"), _weights(resumed / "checkpoint-6" / "model")
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
    final = _weights(straight)  # the final model, in output_dir: the averaged weights, as the last checkpoint holds them
    assert final.keys() == a.keys() and all(torch.equal(final[name], a[name]) for name in a)


def test_a_resume_with_another_micro_batch_size_trains_the_rest_of_the_epoch(make_config, cli, tmp_path, addition_files,
                                                                               capsys):
    """Until 2026-11-28 the checkpoint's position counted micro-batches of the old size: 5 of 10 became 5 of 5, the
    epoch's second half was never trained and the run ended at once."""
    data = dict(datasets=[{"path": str(addition_files["train"]), "split": "train[:40]"}], num_epochs=1, max_steps=None, save_steps=5,
                gradient_accumulation_steps=1)
    first, resumed = tmp_path / "first", tmp_path / "resumed"
    assert cli("train", make_config(output_dir=str(first), micro_batch_size=4, **data)) == 0
    resumed.mkdir()
    shutil.copytree(first / "checkpoint-5", resumed / "checkpoint-5")
    capsys.readouterr()
    assert cli("train", make_config(output_dir=str(resumed), micro_batch_size=8, resume_from_checkpoint="auto", **data)) == 0
    out = capsys.readouterr().out
    assert "the checkpoint's data made 10 micro-batches an epoch, this run's makes 5" in " ".join(out.split())
    assert [m["step"] for m in read_metrics(resumed / "metrics.jsonl") if "loss" in m] == [6, 7]
