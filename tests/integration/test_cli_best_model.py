"""load_best_model_at_end through the real CLI: an SFT run that overfits one row, so its held-out eval loss falls and
then rises again, ends with the weights of the checkpoint with the lowest eval loss, keeps that checkpoint through
rotation and across a resume, and converts a PiSSA adapter from it; Axolotl's save and eval strategies."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from safetensors.torch import load_file

from rlft.config.settings.model import model_settings
from rlft.tasks.addition import write_jsonl


def read_metrics(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def overfit(tmp_path, tiny_model_dir, addition_files):
    """`overfit(**overrides)` -> a config path: 64 copies of "1+1=" -> "2" to train on, held-out sums to evaluate;
    eval/loss at steps 0, 2, 4, 6, 8 is about 5.53, 4.60, 4.17, 4.65, 5.37."""
    write_jsonl([{"prompt": "1+1=", "completion": "2"}] * 64, tmp_path / "one-row.jsonl")

    def make(**overrides):
        config = {"base_model": str(tiny_model_dir), "random_init": True, "datasets": [{"path": str(tmp_path / "one-row.jsonl")}],
                  "test_datasets": [{"path": str(addition_files["heldout"])}], "sequence_len": 32, "micro_batch_size": 16,
                  "max_steps": 8, "learning_rate": 1e-2, "lr_scheduler": "constant", "seed": 3, "eval_steps": 2,
                  "save_steps": 2, "save_total_limit": 1, "output_dir": str(tmp_path / "out"), "load_best_model_at_end": True,
                  **overrides}
        path = tmp_path / f"config-{len(list(tmp_path.glob('config-*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    return make


def _weights(folder):
    return load_file(folder / "model.safetensors")


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _bare(text: str) -> str:
    """Printed tables without their borders and line breaks, which cut long cells anywhere."""
    return "".join(c for c in text if not c.isspace() and c not in "│|")


def _saved_evals(out):
    return {r["step"]: r["eval/loss"] for r in read_metrics(out / "metrics.jsonl") if "eval/loss" in r}


def test_the_final_model_is_the_checkpoint_with_the_lowest_eval_loss(overfit, cli, capsys, tmp_path):
    assert cli("train", overfit()) == 0
    printed = _bare(capsys.readouterr().out)
    out = tmp_path / "out"
    evals = _saved_evals(out)
    assert list(evals) == [0, 2, 4, 6, 8]
    best = min((2, 4, 6, 8), key=evals.get)
    assert best not in (2, 8) and evals[8] > evals[best] + 0.5  # the dip this test is built on
    assert _bare("final model | the checkpoint with the lowest eval/loss, each checkpoint evaluated") in printed  # plan
    assert _bare(f"the weights of checkpoint-{best}: best eval/loss {evals[best]:.4f}") in printed  # summary
    # save_total_limit: 1 keeps the best beside the newest
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{best}", "checkpoint-8"]
    final = _weights(out)
    assert _same(final, _weights(out / f"checkpoint-{best}" / "model"))
    assert not _same(final, _weights(out / "checkpoint-8" / "model"))
    assert json.loads((out / "checkpoint-8" / "trainer_state.json").read_text())["best"] == \
        {"step": best, "value": evals[best], "key": "eval/loss", "higher": False}

    # unset (and no early stopping): off, as Axolotl's default: the last step's weights, and rotation keeps the newest
    off = tmp_path / "off"
    assert cli("train", overfit(load_best_model_at_end=None, output_dir=str(off))) == 0
    assert "load_best_model_at_end" not in capsys.readouterr().out
    assert sorted(p.name for p in off.glob("checkpoint-*")) == ["checkpoint-8"]
    assert _same(_weights(off), _weights(off / "checkpoint-8" / "model"))
    assert _same(_weights(off / "checkpoint-8" / "model"), _weights(out / "checkpoint-8" / "model"))  # same training


def test_a_resumed_run_remembers_the_best_checkpoint(overfit, cli, capsys, tmp_path):
    out = tmp_path / "out"
    assert cli("train", overfit(max_steps=6)) == 0
    best = min((2, 4, 6), key=_saved_evals(out).get)
    assert best != 6
    assert cli("train", overfit(max_steps=8), "--resume_from_checkpoint=auto") == 0  # two more steps, from checkpoint-6
    evals = _saved_evals(out)
    assert min((2, 4, 6, 8), key=evals.get) == best
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{best}", "checkpoint-8"]
    assert _same(_weights(out), _weights(out / f"checkpoint-{best}" / "model"))
    # resumed into another folder: the first folder's best is not one of its checkpoints, the scores start afresh
    other = tmp_path / "other"
    capsys.readouterr()
    assert cli("train", overfit(max_steps=10, output_dir=str(other)), f"--resume_from_checkpoint={out / 'checkpoint-8'}") == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "cannot be read" not in printed and "the weights of checkpoint" not in printed
    assert sorted(p.name for p in other.glob("checkpoint-*")) == ["checkpoint-10"]
    assert _same(_weights(other), _weights(other / "checkpoint-10" / "model"))


def test_every_checkpoint_is_evaluated_when_saves_fall_between_evaluations(overfit, cli, tmp_path):
    """With save_steps 2 and eval_steps 3 (Axolotl would not turn it on here): the saves at steps 2 and
    4 evaluate first, so each checkpoint has its own score."""
    assert cli("train", overfit(load_best_model_at_end=True, eval_steps=3, max_steps=6, save_total_limit=4)) == 0
    evals = _saved_evals(tmp_path / "out")
    assert list(evals) == [0, 2, 3, 4, 6]
    best = min((2, 4, 6), key=evals.get)
    assert _same(_weights(tmp_path / "out"), _weights(tmp_path / "out" / f"checkpoint-{best}" / "model"))


def test_a_pissa_adapter_is_converted_from_the_best_checkpoint(overfit, cli, tmp_path):
    from rlft.config import load_config
    from rlft.models.base_changing import resume_weights
    from rlft.models.loading import load_for_inference, load_model, load_tokenizer
    from rlft.train.checkpoint import load_weights

    config = overfit(adapter="lora", lora_r=4, lora_alpha=8, lora_target_linear=True, peft_init_lora_weights="pissa",
                     learning_rate=3e-2)
    assert cli("train", config) == 0
    out = tmp_path / "out"
    evals = _saved_evals(out)
    best = min((2, 4, 6, 8), key=evals.get)
    assert best != 8
    cfg = load_config(config)
    tokenizer = load_tokenizer(model_settings(cfg))
    trained = load_model(model_settings(cfg), tokenizer, "cpu", init_base_dir=out / "init-base")
    load_weights(trained, resume_weights(out / f"checkpoint-{best}"))  # the adapter on the residual base
    final, _ = load_for_inference(str(out))  # the original base from disk + the converted adapter
    ids = tokenizer("12+7=", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(final(ids).logits, trained.eval()(ids).logits, atol=1e-4, rtol=1e-4)
        load_weights(trained, resume_weights(out / "checkpoint-8"))
        assert not torch.allclose(final(ids).logits, trained(ids).logits, atol=1e-3)
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 8  # converted: the rank doubles


def test_save_strategy_best_and_no_and_eval_strategy_no(overfit, cli, tmp_path):
    """Axolotl's strategies: `best` saves after each evaluation that beats every earlier one (and the last step's
    checkpoint at the end); `no` saves no checkpoint, only the final model; `eval_strategy: no` evaluates nothing."""
    out = tmp_path / "out"
    assert cli("train", overfit(save_steps=None, save_strategy="best", save_total_limit=4, load_best_model_at_end=None)) == 0
    evals = _saved_evals(out)
    improved = [step for i, step in enumerate((2, 4, 6)) if all(evals[step] < evals[s] for s in (2, 4, 6)[:i])]
    assert improved == [2, 4]  # the dip: 6 is worse than 4
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4", "checkpoint-8"]
    assert _same(_weights(out), _weights(out / "checkpoint-8" / "model"))  # load_best_model_at_end is not on here

    bare = tmp_path / "bare"
    assert cli("train", overfit(save_steps=None, eval_steps=None, save_strategy=False, eval_strategy="no",  # YAML's `no`
                                output_dir=str(bare), load_best_model_at_end=None)) == 0
    assert not list(bare.glob("checkpoint-*")) and (bare / "model.safetensors").exists()
    assert not any("eval/loss" in r for r in read_metrics(bare / "metrics.jsonl"))
