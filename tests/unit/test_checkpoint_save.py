"""A checkpoint's snapshot (rlft.train.checkpoint_save): taken with copies, it is the state of the moment it was taken,
whatever training does before it is written; the copies are only of what training changes."""

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlft.train.checkpoint import TrainState
from rlft.train.checkpoint_save import CheckpointWriter, detached_weights, save_checkpoint, take_snapshot, write_snapshot
from rlft.train.state_files import read_index


def _model(tied: bool = False):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=16, tie_word_embeddings=tied)
    return LlamaForCausalLM(config)


def _train_step(model, optimizer, scheduler):
    loss = model(input_ids=torch.randint(0, 300, (2, 6)), labels=torch.randint(0, 300, (2, 6))).loss
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def _files(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _same(a, b) -> bool:
    first, second = _files(a), _files(b)
    first.pop("optimizer/.metadata"), second.pop("optimizer/.metadata")  # its save id differs by save
    return first == second and read_index(a / "optimizer").storage_data == read_index(b / "optimizer").storage_data


@pytest.mark.parametrize("copied", [True, False])
def test_a_copied_snapshot_is_the_state_it_was_taken_from(copied, tmp_path, tok):
    """A snapshot taken with copies, written after two more steps, equals the checkpoint written when it was taken;
    without copies (what a synchronous save takes) it does not: the test can tell."""
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    _train_step(model, optimizer, scheduler)
    state = TrainState(global_step=1)
    (tmp_path / "now").mkdir()
    (tmp_path / "later").mkdir()
    written = save_checkpoint(tmp_path / "now", state, model, tok, optimizer, scheduler, None)
    snapshot = take_snapshot(tmp_path / "later", state, model, tok, optimizer, scheduler, None, None, None, 0, None, False,
                             None, copied=copied)
    for _ in range(2):  # weights, optimizer state, schedule and RNG all move on
        _train_step(model, optimizer, scheduler)
    write_snapshot(snapshot)
    assert _same(written, snapshot.final) == copied
    assert json.loads((snapshot.final / "scheduler.json").read_text()) == json.loads((written / "scheduler.json").read_text())


def test_only_what_training_changes_is_copied(tok):
    """Trained parameters and buffers are copied, once each where they are tied; frozen ones are the model's own."""
    model = _model(tied=True)
    for name, param in model.named_parameters():
        param.requires_grad = "layers.0.mlp" in name or "embed_tokens" in name
    weights = detached_weights(model, None)
    live = model.state_dict()
    assert weights.keys() == live.keys()
    for name, tensor in weights.items():
        shared = tensor.data_ptr() == live[name].data_ptr()
        assert shared == ("mlp" not in name and "embed_tokens" not in name and "lm_head" not in name
                          and "rotary" not in name), name
        assert torch.equal(tensor, live[name])
    assert weights["lm_head.weight"].data_ptr() == weights["model.embed_tokens.weight"].data_ptr()  # still tied


def test_a_failed_background_write_is_raised_where_the_run_waits(tmp_path, tok, monkeypatch):
    """The error of a write on the background thread reaches the main thread at its next wait, as the CheckpointError
    a synchronous save raises; the staging folder is gone and the checkpoint before it stays."""
    import errno

    import rlft.train.checkpoint_save as checkpoint_save
    from rlft.errors import CheckpointError

    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    writer = CheckpointWriter("async", 60)
    first = writer.save(tmp_path, TrainState(global_step=1), model, tok, optimizer, scheduler, 4, None, None, 0, None,
                        model_only=False, initial_adapter=None)
    writer.wait()
    assert writer.completed == first and (first / "trainer_state.json").is_file()

    def full(snapshot, group):
        raise OSError(errno.ENOSPC, "No space left on device", str(snapshot.staging / "optimizer"))

    monkeypatch.setattr(checkpoint_save, "_write_optimizer", full)
    writer.save(tmp_path, TrainState(global_step=2), model, tok, optimizer, scheduler, 4, None, None, 0, None,
                model_only=False, initial_adapter=None)
    assert writer.finished() == first  # ended, whole or not: the newest whole one is still the first
    with pytest.raises(CheckpointError, match="saving checkpoint-2 failed: the disk is full.*checkpoint-1, is untouched"):
        writer.wait()
    writer.wait()  # said once
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]


def test_a_wait_that_a_signal_interrupts_leaves_the_write_in_flight_to_the_next_wait(tmp_path, tok, monkeypatch):
    """Ctrl-C or SIGTERM raises in the main thread while it waits for a background write: the run's way out waits
    again, and that wait lasts until the write has ended (an interrupted Thread.join marks a running thread ended)."""
    import signal
    import threading

    import rlft.train.checkpoint_save as checkpoint_save

    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    release, real = threading.Event(), checkpoint_save._write_model

    def held(snapshot):
        real(snapshot)
        release.wait(30)

    monkeypatch.setattr(checkpoint_save, "_write_model", held)
    writer = CheckpointWriter("async", 60)
    saved = writer.save(tmp_path, TrainState(global_step=1), model, tok, optimizer, scheduler, 4, None, None, 0, None,
                        model_only=False, initial_adapter=None)

    def interrupt(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt):
            writer.wait()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    threading.Timer(0.3, release.set).start()
    writer.wait()  # the way out of the run: until the write has ended
    assert writer.completed == saved and (saved / "trainer_state.json").is_file()


def test_the_schedule_is_written_as_json_and_read_back_as_its_state(tmp_path):
    from rlft.train.state_files import SCHEDULER_FILE, scheduler_json, scheduler_state, write_scheduler

    optimizer = torch.optim.AdamW(_model().parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.5, total_iters=4)
    optimizer.step()
    scheduler.step()
    write_scheduler(scheduler_json(scheduler), tmp_path)
    assert scheduler_state(tmp_path) == scheduler.state_dict() == json.loads((tmp_path / SCHEDULER_FILE).read_text())
    assert scheduler_state(tmp_path)["last_epoch"] == 1


def test_a_snapshot_carries_its_step_and_prunes_by_it(tmp_path, tok):
    """save_total_limit prunes around the snapshot's own step, whatever its folder is called."""
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    save_checkpoint(tmp_path, TrainState(global_step=1), model, tok, optimizer, scheduler, None)
    snapshot = take_snapshot(tmp_path, TrainState(global_step=3), model, tok, optimizer, scheduler, 1, None, None, 0, None,
                             False, None, copied=False)
    assert snapshot.step == 3 and snapshot.final.name == "checkpoint-3"
    write_snapshot(snapshot)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-3"]


def test_the_deepspeed_optimizer_shard_keeps_the_gathered_buffers_without_copying_them(monkeypatch):
    """DeepSpeed's safe_get_full_* gather each state into a new buffer: an fp32 one on the CPU is kept as it is (no
    second host copy, on a synchronous save as on an asynchronous one), any other goes to the CPU in fp32."""
    import sys
    from types import ModuleType, SimpleNamespace

    from rlft.train import zero

    model = torch.nn.Linear(2, 3)
    gathered = {}

    def full_state(param, key):  # as DeepSpeed's: a new buffer per call
        gathered[(param.shape, key)] = torch.full(param.shape, 1.5, dtype=torch.float32 if key == "exp_avg" else torch.bfloat16)
        return gathered[(param.shape, key)]

    utils = ModuleType("deepspeed.utils")
    utils.safe_get_full_optimizer_state, utils.safe_get_full_fp32_param = full_state, None
    monkeypatch.setitem(sys.modules, "deepspeed", ModuleType("deepspeed"))
    monkeypatch.setitem(sys.modules, "deepspeed.utils", utils)
    monkeypatch.setattr(zero.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(zero.dist, "get_world_size", lambda: 1)
    monkeypatch.setattr(zero, "_state_keys", lambda engine: (["exp_avg", "exp_avg_sq"], {"step": 1.0}))
    monkeypatch.setattr(zero, "_link", lambda engine: None)
    shard = zero.optimizer_shard(SimpleNamespace(module=model))
    assert sorted(shard.values) == ["bias::exp_avg", "bias::exp_avg_sq", "weight::exp_avg", "weight::exp_avg_sq"]
    for name, param in model.named_parameters():
        kept, moved = shard.values[f"{name}::exp_avg"], shard.values[f"{name}::exp_avg_sq"]
        assert kept.data_ptr() == gathered[(param.shape, "exp_avg")].data_ptr()
        assert moved.dtype == torch.float32 and torch.equal(moved, torch.full(param.shape, 1.5))
    assert shard.index["keys"] == ["exp_avg", "exp_avg_sq"] and shard.index["owners"] == {"weight": 0, "bias": 0}
