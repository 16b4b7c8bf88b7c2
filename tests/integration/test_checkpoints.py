"""Checkpoint safety: partial or corrupt checkpoints never break `auto`; named ones are refused clearly; Ctrl-C saves."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from rlft.errors import CheckpointError
from rlft.train.checkpoint import resolve_resume
from rlft.train.metrics import read_metrics

pytestmark = pytest.mark.slow


def test_auto_skips_partial_checkpoint_and_resumes(make_config, cli, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli("train", make_config(max_steps=4, save_steps=2)) == 0
    # a run killed mid-save: a staging folder, and a checkpoint-5 missing its state and optimizer
    (out / ".tmp-checkpoint-5-999").mkdir()
    shutil.copytree(out / "checkpoint-4", out / "checkpoint-5")
    (out / "checkpoint-5" / "trainer_state.json").unlink()
    shutil.rmtree(out / "checkpoint-5" / "optimizer")
    assert resolve_resume("auto", out) == out / "checkpoint-4"

    capsys.readouterr()
    assert cli("train", make_config(max_steps=6, resume_from_checkpoint="auto")) == 0
    assert "Resumed from" in capsys.readouterr().out
    steps = [m["step"] for m in read_metrics(out / "metrics.jsonl") if "loss" in m]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert not list(out.glob(".tmp-checkpoint-*"))  # leftovers cleaned


def test_named_partial_or_corrupt_checkpoint_is_refused(make_config, cli, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli("train", make_config(max_steps=2, save_steps=1)) == 0
    broken = out / "checkpoint-2"
    (broken / "trainer_state.json").unlink()
    with pytest.raises(CheckpointError, match=r"lacks trainer_state.json .*checkpoint-1"):
        resolve_resume(str(broken), out)
    (out / "checkpoint-1" / "trainer_state.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        resolve_resume(str(out / "checkpoint-1"), out)
    capsys.readouterr()
    assert cli("train", make_config(resume_from_checkpoint=str(broken))) == 1
    assert "is not a usable checkpoint" in capsys.readouterr().err


def test_ctrl_c_saves_a_checkpoint_and_says_where(make_config, tmp_path):
    config = make_config(max_steps=100000, logging_steps=1, micro_batch_size=8)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen([sys.executable, "-m", "rlft.cli", "train", str(config)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    metrics = tmp_path / "out" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 3):
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert "checkpoint saved to" in err and "resume_from_checkpoint=auto" in err
    assert resolve_resume("auto", tmp_path / "out") is not None


def test_truncated_weights_are_a_partial_checkpoint(make_config, cli, tmp_path):
    out = tmp_path / "out"
    assert cli("train", make_config(max_steps=2, save_steps=1)) == 0
    weights = next((out / "checkpoint-2" / "model").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])
    assert resolve_resume("auto", out) == out / "checkpoint-1"
    with pytest.raises(CheckpointError, match="unreadable"):
        resolve_resume(str(out / "checkpoint-2"), out)


def test_resume_with_more_steps_follows_the_new_schedule(make_config, cli, tmp_path):
    out = tmp_path / "out"
    assert cli("train", make_config(max_steps=4, lr_scheduler="linear", warmup_steps=0)) == 0
    assert cli("train", make_config(max_steps=8, lr_scheduler="linear", warmup_steps=0, resume_from_checkpoint="auto")) == 0
    lrs = {m["step"]: m["learning_rate"] for m in read_metrics(out / "metrics.jsonl") if "loss" in m}
    # the first run decays to 0 over 4 steps; resumed at step 4 of 8 the linear schedule gives 3e-3 * (1 - 4/8)
    assert lrs[5] == pytest.approx(3e-3 * 0.5)
    assert lrs[8] == pytest.approx(3e-3 * (1 - 7 / 8))


def test_loss_watchdog_stops_a_broken_run_with_its_reason(cli, make_config, capsys):
    assert cli("train", make_config(loss_watchdog_threshold=0.01, loss_watchdog_patience=2, save_steps=1)) == 1
    err = capsys.readouterr().err
    assert "stayed above loss_watchdog_threshold=0.01 for 2 steps in a row" in err and "(step 2)" in err
    assert "the last good checkpoint is" in err


def test_early_stopping_ends_training_and_saves_the_model(cli, make_config, capsys, tmp_path):
    import json

    # a learning rate too small to move eval/loss (rounded to 6 digits): no evaluation improves on the first
    config = make_config(val_set_size=32, eval_steps=1, early_stopping_patience=2, learning_rate=1e-12, max_steps=20)
    assert cli("train", config) == 0
    assert "early stopping at step 3" in capsys.readouterr().out
    steps = [json.loads(line)["step"] for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 3 and (tmp_path / "out" / "model.safetensors").exists()
