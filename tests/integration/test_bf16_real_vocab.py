"""Every method's shipped example trains in bf16 with a real-size output layer (the path every GPU run takes).

On a CPU rlft's `bf16: auto` stays off, so these paths ran only on GPUs, and two of them stopped at the first trained
step: the DPO family's mean-logit metric and the fused entropy (the GRPO family, structured EBFT) came out bf16 under
autocast and could not be written into float32 tensors (5 of these 8 cases fail before those fixes).
"""

from __future__ import annotations

import json
import math

import pytest

from rlft.train.metrics import read_metrics

EXAMPLES = ["quickstart/sft", "preference/dpo", "preference/kto", "preference/orpo", "preference/reward-model",
            "grpo-arithmetic", "ebft-structured", "ebft-strided"]


@pytest.fixture(autouse=True)
def fp32_after():
    """accelerate keeps one mixed-precision setting per process: the runs after these (in the same test worker) start
    from a fresh one, as a new `rlft train` process would."""
    yield
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    """An XS Llama with an 8,192-entry output layer (a real tokenizer's order of size; the text uses the byte ids)."""
    from rlft.models.tiny import write_tiny_model

    folder = write_tiny_model(tmp_path_factory.mktemp("wide") / "xs-8192", "XS", max_positions=256)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 8192}))
    return folder


@pytest.mark.parametrize("example", EXAMPLES)
def test_each_example_trains_in_bf16_at_a_real_vocabulary(example, wide_model, cli, tmp_path, monkeypatch, repo_root):
    monkeypatch.chdir(repo_root)
    extra = []
    if example == "grpo-arithmetic":  # a random model never answers right: reward length, so the groups' advantages differ
        (tmp_path / "bf16_rewards.py").write_text("def by_length(completions, **kwargs):\n    return [0.1 * len(c) for c in completions]\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        extra = ["--trl.reward_funcs=[bf16_rewards.by_length]"]
    out = tmp_path / "run"
    assert cli("train", f"examples/{example}.yaml", f"--base_model={wide_model}", "--random_init=true", "--bf16=true",
               "--max_steps=2", "--eval_steps=2", "--logging_steps=1", f"--output_dir={out}", *extra) == 0
    steps = [m for m in read_metrics(out / "metrics.jsonl") if "loss" in m]
    assert len(steps) == 2 and all(math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) for m in steps), steps
    assert any(m["grad_norm"] > 0 for m in steps), steps  # a step that trained, not one skipped
