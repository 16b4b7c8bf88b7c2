"""Checkpoint safety: partial or corrupt checkpoints never break `auto`; named ones are refused clearly; Ctrl-C saves."""

import contextlib
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


@pytest.mark.parametrize("only", [False, True], ids=["full", "save_only_model"])
def test_ctrl_c_saves_a_checkpoint_and_says_where(make_config, tmp_path, only):
    config = make_config(max_steps=100000, logging_steps=1, micro_batch_size=8, save_only_model=only)
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
    if only:
        assert "checkpoint saved to" in err and "its weights only (save_only_model: true): a new run can start" in err
        assert resolve_resume("auto", tmp_path / "out") is None
    else:
        assert "checkpoint saved to" in err and "resume_from_checkpoint=auto" in err
        assert resolve_resume("auto", tmp_path / "out") is not None


@pytest.mark.parametrize("only", [False, True], ids=["full", "save_only_model"])
def test_sigterm_stops_the_run_in_one_line_and_keeps_the_checkpoints(make_config, tmp_path, only):
    """A scheduler's SIGTERM: the run ends through its clean-up (not Python's silent default), says so in one line with
    the way to resume (or, with weights-only checkpoints, that none can), exits 143, and the checkpoints written before
    it are whole."""
    config = make_config(max_steps=100000, logging_steps=1, save_steps=2, micro_batch_size=8, save_only_model=only)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen([sys.executable, "-m", "rlft.cli", "train", str(config)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        deadline = time.time() + 120
        # any checkpoint: checkpoint-2 can be written and pruned by the next save between two looks
        while time.time() < deadline and not list((tmp_path / "out").glob("checkpoint-*")):
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 143, err[-3000:]
    assert "error: stopped by SIGTERM" in err and "Traceback" not in err, err[-3000:]
    if only:
        assert "resume_from_checkpoint" not in err and "weights only (save_only_model: true)" in err, err[-3000:]
        from rlft.train.checkpoint import checkpoint_problem

        kept = list((tmp_path / "out").glob("checkpoint-*"))  # checkpoint-2 may be pruned by a later save
        assert resolve_resume("auto", tmp_path / "out") is None and kept
        assert all("holds the weights only" in checkpoint_problem(folder) for folder in kept)  # whole, weights only
    else:
        assert "resume_from_checkpoint=auto" in err
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
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in records) == 3 and (tmp_path / "out" / "model.safetensors").exists()
    evals = [r["step"] for r in records if "eval/loss" in r]
    assert evals == [0, 1, 2, 3]  # the evaluation that stopped the run is its last, not run and logged again
    # resumed (a requeue script that always passes auto): nothing more is trained; it said why
    assert cli("train", config, "--resume_from_checkpoint=auto") == 0
    assert "is where this run stopped early" in capsys.readouterr().out
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in records) == 3 and not (tmp_path / "out" / "checkpoint-4").exists()


# ------------------------------------------------------------------ never run a stranger's code; fall back past bad state

class _RunsCode:
    """Unpickling this runs a shell command: the marker file appears if anything loads it freely."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant(checkpoint, target, marker):
    """Replace one state file of `checkpoint` with a pickle that would run code."""
    import pickle

    import torch

    payload = _RunsCode(marker)
    if target == "optimizer/.metadata":
        with open(checkpoint / target, "wb") as handle:
            pickle.dump(payload, handle)
    elif target == "optimizer value":  # a learning rate inside the optimizer shard, index made to point at it
        from torch.distributed.checkpoint.filesystem import _StorageInfo

        from rlft.train.state_files import read_index

        index = read_index(checkpoint / "optimizer")
        key = next(k for k in index.storage_data if k.fqn.endswith("param_groups.0.lr"))
        shard = checkpoint / "optimizer" / index.storage_data[key].relative_path
        import io
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        index.storage_data[key] = _StorageInfo(shard.name, shard.stat().st_size, len(buffer.getvalue()))
        with open(shard, "ab") as handle:
            handle.write(buffer.getvalue())
        with open(checkpoint / "optimizer" / ".metadata", "wb") as handle:
            pickle.dump(index, handle)
    else:
        if target == "scheduler.pt":  # an earlier version's name
            (checkpoint / "scheduler.json").unlink()
        if target == "optimizer.pt":
            shutil.rmtree(checkpoint / "optimizer")
        torch.save(payload, checkpoint / target)


@pytest.mark.parametrize("target", ["rng-0.pt", "optimizer/.metadata", "optimizer value", "scheduler.pt", "optimizer.pt"])
def test_a_crafted_pickle_in_a_state_file_never_runs(target, make_config, cli, tmp_path, capsys):
    out, marker = tmp_path / "out", tmp_path / "pwned"
    assert cli("train", make_config(max_steps=2, save_steps=1)) == 0
    _plant(out / "checkpoint-2", target, marker)

    warnings = []
    assert resolve_resume("auto", out, warnings.append) == out / "checkpoint-1"
    assert "checkpoint-2" in warnings[0] and "running code" in warnings[0], warnings
    with pytest.raises(CheckpointError, match="running code"):
        resolve_resume(str(out / "checkpoint-2"), out)
    capsys.readouterr()
    assert cli("train", make_config(max_steps=3, resume_from_checkpoint=str(out / "checkpoint-2"))) == 1
    assert "never runs code" in capsys.readouterr().err
    assert cli("train", make_config(max_steps=3, resume_from_checkpoint="auto")) == 0
    printed = "".join(capsys.readouterr().out.split())  # without the console's line breaks, which may cut a long path
    assert "autoskips" in printed and "checkpoint-1atstep1" in printed
    assert not marker.exists()


def test_the_optimizer_value_check_needs_the_planted_file_to_be_loadable(tmp_path):
    """The planted payload above is a working exploit: loaded freely, it runs (so the test above can fail)."""
    import torch

    marker = tmp_path / "ran"
    torch.save(_RunsCode(marker), tmp_path / "evil.pt")
    torch.load(tmp_path / "evil.pt", weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("damage", ["optimizer shard truncated", "scheduler not JSON", "rng truncated", "state keys"])
def test_auto_falls_back_past_unreadable_state_and_says_why(damage, make_config, cli, tmp_path, capsys):
    import json

    out = tmp_path / "out"
    assert cli("train", make_config(max_steps=2, save_steps=1)) == 0
    broken = out / "checkpoint-2"
    if damage == "optimizer shard truncated":
        shard = next((broken / "optimizer").glob("*.distcp"))
        shard.write_bytes(shard.read_bytes()[:50])
        reason = "truncated"
    elif damage == "scheduler not JSON":
        (broken / "scheduler.json").write_text("{half")
        reason = "scheduler.json is unreadable"
    elif damage == "rng truncated":
        rng = broken / "rng-0.pt"
        rng.write_bytes(rng.read_bytes()[:64])
        reason = "rng-0.pt is unreadable"
    else:
        (broken / "trainer_state.json").write_text(json.dumps({"step": 2}))
        reason = "does not hold a training state"
    warnings = []
    assert resolve_resume("auto", out, warnings.append) == out / "checkpoint-1"
    assert len(warnings) == 1 and reason in warnings[0] and "checkpoint-2" in warnings[0], warnings
    capsys.readouterr()
    assert cli("train", make_config(max_steps=3, resume_from_checkpoint="auto")) == 0
    assert reason in capsys.readouterr().out.replace("\n", "")


def test_old_format_state_files_still_load(make_config, cli, tmp_path):
    """rlft before this version wrote rng.pt with numpy arrays, scheduler.pt and optimizer.pt as torch pickles."""
    import random

    import numpy as np
    import torch

    out = tmp_path / "out"
    assert cli("train", make_config(max_steps=2, save_steps=1)) == 0
    old = out / "checkpoint-2"
    (old / "rng-0.pt").unlink()
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}, old / "rng.pt")
    import json
    torch.save(json.loads((old / "scheduler.json").read_text()), old / "scheduler.pt")
    (old / "scheduler.json").unlink()
    assert resolve_resume("auto", out) == old
    assert cli("train", make_config(max_steps=3, resume_from_checkpoint="auto")) == 0


# ------------------------------------------------------------------ a save that cannot be written

def _checkpoint_files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_write_error_mid_save_removes_the_partial_save_and_names_the_last_checkpoint(make_config, cli, tmp_path):
    """A real write failure: the resumed run may not write files over 300 KB (ulimit -f), and its checkpoint's
    weights are bigger. The run stops with the reason; checkpoint-2 is untouched and still resumes."""
    import resource

    out = tmp_path / "out"
    assert cli("train", make_config(max_steps=2, save_steps=1)) == 0
    before = _checkpoint_files(out / "checkpoint-2")
    limit = 300 * 1024
    assert (out / "checkpoint-2" / "model" / "model.safetensors").stat().st_size > limit

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    config = make_config(max_steps=4, save_steps=1, resume_from_checkpoint="auto")
    process = subprocess.run([sys.executable, "-m", "rlft.cli", "train", str(config)], capture_output=True, text=True,
                             preexec_fn=small_files, timeout=300)
    assert process.returncode == 1, process.stderr
    err = " ".join(process.stderr.split())
    assert "Traceback" not in err
    assert "saving checkpoint-3 failed" in err and "ulimit -f" in err and "checkpoint-2, is untouched" in err, err
    assert not list(out.glob(".tmp-checkpoint-*")) and not (out / "checkpoint-3").exists()
    assert _checkpoint_files(out / "checkpoint-2") == before
    assert cli("train", config) == 0  # without the limit it goes on from checkpoint-2


def test_a_full_disk_is_reported_before_the_save_and_while_it_writes(make_config, cli, tmp_path, capsys, monkeypatch):
    import collections
    import errno

    import rlft.train.checkpoint_save as checkpoint_save

    out = tmp_path / "out"
    assert cli("train", make_config(max_steps=2, save_steps=1)) == 0
    before = _checkpoint_files(out / "checkpoint-2")
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(checkpoint_save.shutil, "disk_usage", lambda path: usage(10 << 30, 10 << 30, 200 << 10))
    capsys.readouterr()
    assert cli("train", make_config(max_steps=4, save_steps=1, resume_from_checkpoint="auto")) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "not enough disk space to save checkpoint-3" in err and "0 MiB are free" in err, err
    assert "the last complete checkpoint is" in err and "checkpoint-2" in err
    monkeypatch.undo()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(out / ".tmp-checkpoint-3" / "optimizer"))

    monkeypatch.setattr(checkpoint_save, "_write_optimizer", full)
    assert cli("train", make_config(max_steps=4, save_steps=1, resume_from_checkpoint="auto")) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "saving checkpoint-3 failed: the disk is full" in err and "checkpoint-2, is untouched" in err, err
    assert not list(out.glob(".tmp-checkpoint-*")) and _checkpoint_files(out / "checkpoint-2") == before


# ------------------------------------------------------------------ non-finite values stop the run, naming the last good checkpoint

@pytest.mark.parametrize("fault", ["gradient", "weights"])
def test_non_finite_gradients_or_weights_stop_the_run_before_a_bad_checkpoint(fault, make_config, cli, tmp_path, capsys,
                                                                              monkeypatch):
    """No config value reaches this any more (learning_rate is at most 10), so the fault is injected: a NaN gradient
    at step 3, or NaN weights after the last step. Neither may reach a checkpoint, and the message names the last good one."""
    import math
    import types

    import torch

    import rlft.train.wrap as wrap

    real = wrap.build_optimizer

    def faulty(optim, model):
        optimizer = real(optim, model)
        first = next(p for p in model.parameters() if p.requires_grad)
        backward_calls = [0]
        if fault == "gradient":
            def poison(grad):
                backward_calls[0] += 1
                return grad * math.nan if backward_calls[0] == 3 else grad
            first.register_hook(poison)
        else:
            step = optimizer.step

            def poisoned_step(self, *args, **kwargs):
                result = step(*args, **kwargs)
                backward_calls[0] += 1
                if backward_calls[0] == 3:
                    with torch.no_grad():
                        first.view(-1)[0] = math.inf
                return result
            optimizer.step = types.MethodType(poisoned_step, optimizer)  # a method, as the schedule's wrapper expects
        return optimizer

    monkeypatch.setattr(wrap, "build_optimizer", faulty)
    out = tmp_path / "out"
    assert cli("train", make_config(max_steps=3, save_steps=1)) == 1
    err = " ".join(capsys.readouterr().err.split())
    expected = "the gradient norm is nan at step 3 (the step was not applied)" if fault == "gradient" else \
        "the weights hold NaN or inf after step 3"
    assert expected in err and f"the last good checkpoint is {out / 'checkpoint-2'}" in err, err
    assert not (out / "checkpoint-3").exists() and not list(out.glob(".tmp-checkpoint-*"))
    assert not (out / "model.safetensors").exists()


def test_the_log_of_an_earlier_run_that_saved_nothing_is_kept_aside(make_config, cli, tmp_path):
    """An output_dir with a metrics.jsonl and no checkpoint (a run stopped before its first save): the new run's log
    starts empty and the earlier one becomes metrics.previous.jsonl."""
    out = tmp_path / "out"
    out.mkdir()
    earlier = '{"step": 1, "loss": 9.0}\n'
    (out / "metrics.jsonl").write_text(earlier)
    assert cli("train", make_config(output_dir=str(out), max_steps=2)) == 0
    assert (out / "metrics.previous.jsonl").read_text() == earlier
    assert [m["step"] for m in read_metrics(out / "metrics.jsonl") if "loss" in m] == [1, 2]
    assert not list(out.glob("previous-run-*"))


def test_a_fresh_run_moves_an_earlier_runs_checkpoints_aside_instead_of_pruning_or_resuming_them(make_config, cli,
                                                                                                tmp_path, capsys):
    """A new run in the output_dir of an earlier one: its save of step 2 would overwrite the earlier checkpoint-2,
    `save_total_limit` would prune the earlier checkpoint-4 (a later step, as an abandoned continuation), and a crash
    then `resume_from_checkpoint: auto` would take the earlier run's checkpoint-4 up as this run's."""
    out = tmp_path / "out"
    assert cli("train", make_config(output_dir=str(out), max_steps=4, save_steps=2)) == 0
    earlier = (out / "checkpoint-4" / "trainer_state.json").read_text()
    capsys.readouterr()
    assert cli("train", make_config(output_dir=str(out), max_steps=2, save_steps=2, save_total_limit=1, seed=4)) == 0
    aside = list(out.glob("previous-run-*"))
    assert len(aside) == 1 and f"moved to {aside[0]}" in capsys.readouterr().out
    assert sorted(p.name for p in aside[0].iterdir()) == ["checkpoint-2", "checkpoint-4", "metrics.jsonl"]
    assert [m["step"] for m in read_metrics(aside[0] / "metrics.jsonl") if "loss" in m] == [1, 2, 3, 4]  # its own log
    assert not (out / "metrics.previous.jsonl").exists()
    assert (aside[0] / "checkpoint-4" / "trainer_state.json").read_text() == earlier  # whole, resumable from there
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    assert resolve_resume("auto", out, None).name == "checkpoint-2"


def test_save_only_model_writes_weights_that_cannot_resume(make_config, cli, addition_files, tmp_path, capsys):
    """`save_only_model: true`: checkpoints of model/ and trainer_state.json, about a third of a full one; the best of
    them still becomes the final model; naming one to resume is refused with the way out, `auto` passes over them."""
    full = make_config(max_steps=4, save_steps=2, output_dir=str(tmp_path / "full"))
    assert cli("train", full) == 0
    # the "best" is the highest eval loss, so step 2's (the loss falls): the final model comes from an earlier checkpoint
    only = make_config(max_steps=4, save_steps=2, eval_steps=2, save_only_model=True, load_best_model_at_end=True,
                       greater_is_better=True, test_datasets=[{"path": str(addition_files["heldout"])}])
    assert cli("train", only) == 0
    out = tmp_path / "out"
    assert sorted(p.name for p in (out / "checkpoint-2").iterdir()) == ["model", "trainer_state.json"]
    size = lambda folder: sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())  # noqa: E731
    assert size(out / "checkpoint-2") < 0.5 * size(tmp_path / "full" / "checkpoint-2")
    import json

    from safetensors.torch import load_file

    assert json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())["best"]["step"] == 2
    final, chosen, last = (load_file(out / name) for name in ("model.safetensors", "checkpoint-2/model/model.safetensors",
                                                               "checkpoint-4/model/model.safetensors"))
    assert final.keys() == chosen.keys() and all(final[k].equal(chosen[k]) for k in final)
    assert not all(final[k].equal(last[k]) for k in final)
    capsys.readouterr()
    assert cli("train", make_config(max_steps=6, resume_from_checkpoint=str(out / "checkpoint-4"))) == 1
    assert "holds the weights only (saved with save_only_model: true)" in capsys.readouterr().err
    assert resolve_resume("auto", out) is None
    with pytest.raises(CheckpointError, match=f"start a new run from them with base_model: {out / 'checkpoint-2' / 'model'}"):
        resolve_resume(str(out / "checkpoint-2"), out)
    assert cli("train", make_config(max_steps=2, resume_from_checkpoint="auto")) == 0  # auto starts afresh, and says why
    printed = capsys.readouterr()
    assert "auto skips" in printed.out + printed.err and "they cannot resume: a new run can start from their weights" in printed.out


def test_a_rolled_back_resume_sets_the_abandoned_checkpoints_aside_with_their_log(make_config, cli, tmp_path, capsys):
    """Resumed from checkpoint-2 while 4 and 6 exist: the log is cut back to step 2 at once, so 4 and 6 go aside (with
    the log as it was) before anything else; a crash before the next save used to leave `auto` to pick checkpoint-6,
    whose log lines were gone."""
    out = tmp_path / "out"
    assert cli("train", make_config(max_steps=6, save_steps=2)) == 0
    capsys.readouterr()
    assert cli("train", make_config(max_steps=6, save_steps=2, resume_from_checkpoint=str(out / "checkpoint-2"))) == 0
    assert "held checkpoints after step 2, the continuation this run replaces: moved to" in " ".join(capsys.readouterr().out.split())
    [aside] = out.glob("rolled-back-*")
    assert sorted(p.name for p in aside.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
    assert [m["step"] for m in read_metrics(aside / "metrics.jsonl") if "loss" in m] == [1, 2, 3, 4, 5, 6]
    assert [m["step"] for m in read_metrics(out / "metrics.jsonl") if "loss" in m] == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]


def test_resuming_a_finished_run_trains_evaluates_and_saves_nothing_again(make_config, cli, tmp_path, capsys):
    out = tmp_path / "out"
    settings = dict(max_steps=4, save_steps=2, val_set_size=8, eval_steps=2)
    assert cli("train", make_config(**settings)) == 0
    log = (out / "metrics.jsonl").read_text()
    written = (out / "checkpoint-4" / "trainer_state.json").stat().st_mtime_ns
    capsys.readouterr()
    assert cli("train", make_config(resume_from_checkpoint="auto", **settings)) == 0
    assert "(step 4) is at or past this run's last step (4): nothing more to train" in " ".join(capsys.readouterr().out.split())
    assert (out / "metrics.jsonl").read_text() == log  # no second final evaluation
    assert (out / "checkpoint-4" / "trainer_state.json").stat().st_mtime_ns == written


def test_a_resume_whose_watched_metric_is_not_reported_stops_before_training(make_config, cli, tmp_path, capsys):
    """A fresh run learns at its step-0 evaluation that metric_for_best_model is not reported; a resumed run has none,
    and used to find out at its first periodic evaluation, after steps it could not keep. The run's log tells."""
    out = tmp_path / "out"
    settings = dict(max_steps=4, save_steps=2, val_set_size=8, eval_steps=2, early_stopping_patience=3)
    assert cli("train", make_config(**settings)) == 0
    log = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert cli("train", make_config(resume_from_checkpoint=str(out / "checkpoint-2"), metric_for_best_model="acuracy",
                                    **{**settings, "max_steps": 6})) == 1
    assert "load_best_model_at_end watches eval/acuracy, which this run's evaluation does not report" in \
        " ".join(capsys.readouterr().err.split())
    # refused before anything moved: the log and the later checkpoint are as they were
    assert (out / "metrics.jsonl").read_text() == log and (out / "checkpoint-4").is_dir() and not list(out.glob("rolled-back-*"))
