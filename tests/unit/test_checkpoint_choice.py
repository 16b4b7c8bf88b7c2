"""What a save asks of the disk (rlft.train.checkpoint_save), and which checkpoint every process resumes from
(rlft.train.checkpoint)."""

import collections
import json

import pytest
import torch

import rlft.train.checkpoint as checkpoint
import rlft.train.checkpoint_save as checkpoint_save
from rlft.errors import CheckpointError


def test_the_room_needed_before_a_first_save_counts_the_recipes_files(tmp_path, monkeypatch):
    """With no earlier checkpoint to measure, the room asked for is the weights, the optimizer state and what the
    recipe writes besides (a moving reference's file), plus a tenth."""
    model = torch.nn.Linear(256, 256)  # 257 KiB of weights, no optimizer state before its first step
    optimizer = torch.optim.AdamW(model.parameters())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    usage = collections.namedtuple("usage", "total used free")
    free = int(weights * 1.1) + (1 << 20) + 100  # room for the weights alone
    monkeypatch.setattr(checkpoint_save.shutil, "disk_usage", lambda path: usage(1 << 40, 0, free))
    checkpoint_save.check_room(tmp_path, tmp_path / "checkpoint-1", model, optimizer)
    with pytest.raises(CheckpointError, match="not enough disk space to save checkpoint-1.*then resume with"):
        checkpoint_save.check_room(tmp_path, tmp_path / "checkpoint-1", model, optimizer, extra_bytes=weights)
    with pytest.raises(CheckpointError, match="then start a new run from a checkpoint's model/ folder$"):  # save_only_model
        checkpoint_save.check_room(tmp_path, tmp_path / "checkpoint-1", model, optimizer, extra_bytes=weights, model_only=True)
    assert "then start a new run" in checkpoint_save._write_failure(OSError(28, "No space left"), tmp_path / "checkpoint-1",
                                                                    tmp_path, model_only=True)


def _complete(folder):
    folder.mkdir(parents=True)
    (folder / checkpoint.STATE_FILE).write_text(json.dumps({"global_step": int(folder.name.split("-")[1])}))
    return folder


def test_every_process_resumes_from_the_main_process_choice(tmp_path, monkeypatch):
    """`auto` is resolved on the main process only; another process takes its choice even where its own view of the
    folder differs, refuses one it cannot see, and raises the main process's refusal instead of waiting for it."""

    shared, mine = tmp_path / "shared", tmp_path / "mine"
    chosen = _complete(shared / "checkpoint-4")
    _complete(mine / "checkpoint-2")  # this process sees only an older checkpoint
    # complete here means holding the state file (what a complete checkpoint holds is tested in test_checkpoints.py)
    monkeypatch.setattr(checkpoint, "checkpoint_problem",
                        lambda folder: None if (folder / checkpoint.STATE_FILE).is_file() else "it does not exist")
    monkeypatch.setattr(checkpoint, "launched", lambda: (1, 2))
    monkeypatch.setattr(checkpoint, "broadcast_object", lambda value: (chosen, None))  # rank 0's pick
    assert checkpoint.agreed_resume("auto", mine) == chosen
    monkeypatch.setattr(checkpoint, "broadcast_object", lambda value: (mine / "checkpoint-9", None))
    with pytest.raises(CheckpointError, match="process 1 cannot see .*checkpoint-9.*every node sees"):
        checkpoint.agreed_resume("auto", mine)
    monkeypatch.setattr(checkpoint, "broadcast_object", lambda value: (None, "resume_from_checkpoint: x is not usable"))
    with pytest.raises(CheckpointError, match="x is not usable"):
        checkpoint.agreed_resume("auto", mine)
    monkeypatch.setattr(checkpoint, "launched", lambda: (0, 1))  # one process: resolves for itself
    monkeypatch.setattr(checkpoint, "broadcast_object", lambda value: value)
    assert checkpoint.agreed_resume("auto", shared) == chosen
    with pytest.raises(CheckpointError, match="is not a usable checkpoint"):
        checkpoint.agreed_resume(str(tmp_path / "missing"), shared)


def test_weights_of_another_shape_are_a_message_not_a_traceback(tmp_path):
    """torch's load_state_dict(strict=False) still raises on a size mismatch (another base model's widths, another
    lora_r): the resume names the tensor and the likely cause."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlft.errors import CheckpointError
    from rlft.train.checkpoint import load_weights

    def model(hidden=16):
        return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=hidden, intermediate_size=32, num_hidden_layers=1,
                                            num_attention_heads=2, num_key_value_heads=1))

    full = tmp_path / "full"
    full.mkdir()
    save_file({k: v.contiguous() for k, v in model(hidden=32).state_dict().items() if k != "lm_head.weight"},
              str(full / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"full: weights do not fit the configured model \(size mismatch for "
                                              r"model\..*\): was it saved from a different base_model\?"):
        load_weights(model(), full)

    adapter = tmp_path / "adapter"
    get_peft_model(model(), LoraConfig(r=8, target_modules=["q_proj"])).save_pretrained(adapter)
    with pytest.raises(CheckpointError, match=r"adapter weights do not fit the configured adapter \(size mismatch .*\): "
                                              r"was it saved with another lora_r"):
        load_weights(get_peft_model(model(), LoraConfig(r=4, target_modules=["q_proj"])), adapter)
