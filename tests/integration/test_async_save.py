"""`save_mode: async`, `save_total_limit: -1` and `save_every_n_epochs` through the real CLI on a tiny model.

Checkpoints written on the background thread are those a synchronous save writes (file for file, but the timings in
the run's record and torch.distributed.checkpoint's save id) and resume to the uninterrupted run's weights; a SIGKILL
while one is being written leaves it unpicked, and `resume_from_checkpoint: auto` goes on from the one before."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from rlft.train.checkpoint import resolve_resume
from rlft.train.metrics import read_metrics
from rlft.train.state_files import load_tensors, read_index

pytestmark = pytest.mark.slow

TIMINGS = ("tokens_per_s", "step_time_s", "mfu", "peak_memory_mb")  # the step's speed, which differs run to run


def _files(folder):
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def _same_checkpoint(a, b):
    """Every file of checkpoint `a` equals `b`'s: bytes, or for the record and the optimizer index, what they hold."""
    assert _files(a) == _files(b)
    for name in sorted(_files(a)):
        if name == "trainer_state.json":
            states = [json.loads((folder / name).read_text()) for folder in (a, b)]
            for state in states:
                state["last_metrics"] = {k: v for k, v in state["last_metrics"].items()
                                         if k not in TIMINGS and not k.startswith("time/")}
            assert states[0] == states[1]
        elif name == "optimizer/.metadata":  # its save id and folder differ by run
            first, second = read_index(a / "optimizer"), read_index(b / "optimizer")
            assert first.state_dict_metadata == second.state_dict_metadata and first.storage_data == second.storage_data
        else:
            assert (a / name).read_bytes() == (b / name).read_bytes(), name


def _same_weights(a, b):
    first, second = load_file(a), load_file(b)
    assert first.keys() == second.keys() and first
    assert all(torch.equal(first[name], second[name]) for name in first)


def _losses(folder):
    return [(m["step"], m["loss"]) for m in read_metrics(folder / "metrics.jsonl") if "loss" in m]


def test_async_saves_write_what_sync_saves_write_and_resume_exactly(make_config, cli, tmp_path):
    sync, background = tmp_path / "sync", tmp_path / "async"
    assert cli("train", make_config(max_steps=6, save_steps=2, output_dir=str(sync))) == 0
    assert cli("train", make_config(max_steps=6, save_steps=2, output_dir=str(background), save_mode="async")) == 0
    assert sorted(p.name for p in background.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    for name in ("checkpoint-2", "checkpoint-4", "checkpoint-6"):
        _same_checkpoint(sync / name, background / name)
    assert _losses(sync) == _losses(background)
    # resumed from a checkpoint written in the background: the uninterrupted run's steps and final weights
    assert cli("train", make_config(max_steps=6, save_steps=2, output_dir=str(background), save_mode="async",
                                    resume_from_checkpoint=str(background / "checkpoint-2"))) == 0
    assert _losses(background) == _losses(sync)
    _same_weights(sync / "model.safetensors", background / "model.safetensors")


def test_an_async_write_fails_like_a_sync_one(make_config, cli, tmp_path, capsys, monkeypatch):
    """A write error on the background thread: training stops at the next save (or the end) with the reason, the
    partial save removed and the checkpoint before it named and untouched."""
    import errno

    import rlft.train.checkpoint_save as checkpoint_save

    out = tmp_path / "out"
    real = checkpoint_save._write_optimizer

    def full_at_step_4(snapshot, group):
        if snapshot.final.name == "checkpoint-4":
            raise OSError(errno.ENOSPC, "No space left on device", str(snapshot.staging / "optimizer"))
        real(snapshot, group)

    monkeypatch.setattr(checkpoint_save, "_write_optimizer", full_at_step_4)
    assert cli("train", make_config(max_steps=8, save_steps=2, save_mode="async")) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "saving checkpoint-4 failed: the disk is full" in err and "checkpoint-2, is untouched" in err, err
    assert not list(out.glob(".tmp-checkpoint-*")) and sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    assert max(step for step, _ in _losses(out)) == 6  # it trained on while step 4 was written; the save at 6 stopped it


DRIVER = """\
import sys
import threading
from pathlib import Path

import rlft.train.checkpoint_save as checkpoint_save
from rlft.cli import main

config, notes = sys.argv[1], Path(sys.argv[2])
real, finished = checkpoint_save._write_model, checkpoint_save.CheckpointWriter.finished
released = threading.Event()


def held(snapshot):
    real(snapshot)  # model/ is in the staging folder
    if snapshot.final.name == "checkpoint-4":
        (notes / "held").write_text(str(snapshot.staging))
        released.wait()  # until the run waits for it after the test's signal (never, without one)


def noted(writer):
    # a save, or the run's end, waits for the held write in flight (a wait for an earlier write, slow on a busy
    # machine, is not the one the test looks for)
    if writer.thread is not None and writer.thread.is_alive() and writer.thread.name.endswith("checkpoint-4"):
        (notes / "waiting").write_text(writer.thread.name)
        if (notes / "signalled").exists():
            released.set()
    return finished(writer)


checkpoint_save._write_model = held
checkpoint_save.CheckpointWriter.finished = noted
sys.exit(main(["train", config]))
"""


def _held_run(tmp_path, config, notes):
    """The run of `config` with the write of checkpoint-4 held (a test hook around rlft's own model writer, in the real
    CLI): until the run waits for it after a signal, which the test announces by the file `notes/signalled`."""
    notes.mkdir()
    (tmp_path / "driver.py").write_text(DRIVER)
    return subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(config), str(notes)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))


def _until(process, path):
    deadline = time.time() + 240
    while time.time() < deadline and process.poll() is None and not path.exists():
        time.sleep(0.1)
    assert process.poll() is None and path.exists(), process.communicate()[0][-3000:]


def test_sigkill_during_an_async_write_leaves_the_checkpoint_before_it_to_auto(make_config, cli, tmp_path):
    """The write of checkpoint-4 is held half-done. Steps 5 and 6 train meanwhile; the save at step 6 waits for it (one
    write at a time). SIGKILL then: no checkpoint-4 exists, `auto` takes checkpoint-2, and the resumed run ends with the
    uninterrupted run's losses and weights."""
    straight, out, notes = tmp_path / "straight", tmp_path / "out", tmp_path / "notes"
    assert cli("train", make_config(max_steps=8, save_steps=2, output_dir=str(straight))) == 0
    config = make_config(max_steps=8, save_steps=2, save_mode="async", resume_from_checkpoint="auto")
    process = _held_run(tmp_path, config, notes)
    try:
        _until(process, notes / "waiting")
        # the save at step 6 waits for checkpoint-4's write, which steps 5 and 6 did not
        assert (notes / "waiting").read_text() == "rlft-save-checkpoint-4"
        assert (notes / "held").read_text() == str(out / ".tmp-checkpoint-4")
        assert [step for step, _ in _losses(out)] == [1, 2, 3, 4, 5, 6]
        assert (out / ".tmp-checkpoint-4" / "model").is_dir() and not (out / ".tmp-checkpoint-4" / "trainer_state.json").exists()
        assert sorted(p.name for p in out.glob("*checkpoint-*")) == [".tmp-checkpoint-4", "checkpoint-2"]
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
    assert process.returncode == -signal.SIGKILL
    assert resolve_resume("auto", out) == out / "checkpoint-2"
    assert cli("train", config) == 0
    assert not list(out.glob(".tmp-checkpoint-*"))
    assert _losses(out) == _losses(straight)
    _same_weights(straight / "model.safetensors", out / "model.safetensors")


def test_sigterm_lets_the_async_write_in_flight_finish(make_config, tmp_path):
    """SIGTERM while checkpoint-4 is being written: the run stops (status 143, its one line), and only after the write
    has ended, which the held write does only once the run waits for it: checkpoint-4 is whole and `auto` takes it."""
    out, notes = tmp_path / "out", tmp_path / "notes"
    process = _held_run(tmp_path, make_config(max_steps=1000, save_steps=4, save_mode="async"), notes)
    try:
        _until(process, notes / "held")
        (notes / "signalled").write_text("")
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):  # it has ended, unless the test failed
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 143 and "error: stopped by SIGTERM" in output and "Traceback" not in output, output[-3000:]
    assert resolve_resume("auto", out) == out / "checkpoint-4" and not list(out.glob(".tmp-checkpoint-*"))


@pytest.mark.parametrize(("limit", "kept"), [(-1, [1, 2, 3, 4, 5, 6]), (2, [5, 6])])
def test_save_total_limit_minus_one_keeps_every_checkpoint(limit, kept, make_config, cli, tmp_path):
    """-1 keeps them all (as transformers reads a value below 0); a limit prunes after each background write too."""
    assert cli("train", make_config(max_steps=6, save_steps=1, save_total_limit=limit, save_mode="async")) == 0
    found = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "out").glob("checkpoint-*"))
    assert found == kept
    assert all(load_tensors(tmp_path / "out" / f"checkpoint-{step}" / "rng-0.pt") for step in kept)


def test_save_every_n_epochs_saves_at_every_nth_epochs_end(make_config, cli, tmp_path, addition_files):
    """32 rows in micro-batches of 16: 2 steps an epoch; 4 epochs, a checkpoint every 2nd epoch's end (and the last)."""
    rows = addition_files["train"].read_text().splitlines()[:32]
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(rows) + "\n")
    config = make_config(max_steps=None, num_epochs=4, datasets=[{"path": str(data)}], save_every_n_epochs=2)
    assert cli("train", config) == 0
    assert sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-8"]
    state = json.loads((tmp_path / "out" / "checkpoint-4" / "trainer_state.json").read_text())
    assert (state["epoch"], state["batch_in_epoch"]) == (1, 2)  # the second epoch (from 0) drawn to its end
