"""neftune_noise_alpha through the real CLI: noisy embeddings while training (transformers' NEFTune hook), none
while evaluating."""

from __future__ import annotations

import json

import pytest


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_neftune_noises_training_and_not_evaluation(make_config, cli, tmp_path, addition_files):
    runs = {}
    for alpha in (None, 5.0):
        out = tmp_path / f"alpha-{alpha}"
        config = make_config(output_dir=str(out), neftune_noise_alpha=alpha, max_steps=8, eval_steps=4,
                             test_datasets=[{"path": str(addition_files["heldout"])}])
        assert cli("train", config) == 0
        runs[alpha] = _records(out)
    evals = {alpha: [r["eval/loss"] for r in records if "eval/loss" in r] for alpha, records in runs.items()}
    losses = {alpha: [r["loss"] for r in records if "loss" in r] for alpha, records in runs.items()}
    assert evals[None][0] == evals[5.0][0]  # the untrained baseline: no noise while evaluating
    assert losses[None][0] != losses[5.0][0]  # the first step's forward already sees the noise
    # at the XS size the noise (5 / sqrt(L * 64), about 0.2) dwarfs freshly initialised embeddings (std 0.02): the
    # noised training loss stays high, while the clean held-out loss still falls, so the model learns under it
    assert losses[5.0][-1] > losses[None][-1] + 0.5
    assert evals[5.0][-1] < evals[5.0][0] - 0.5


def test_neftune_is_refused_where_axolotl_does_not_pass_it():
    from rlft.config import build_config
    from rlft.errors import ConfigError

    with pytest.raises(ConfigError, match="neftune_noise_alpha noises the embeddings of SFT and reward-model training"):
        build_config({"base_model": "m", "rl": "dpo", "neftune_noise_alpha": 5,
                      "datasets": [{"path": "pairs.jsonl", "type": "chatml.intel"}]})
