"""EBFT through the real CLI: feature matching without reward functions, and its bad input."""

import json

import pytest
import yaml

from rlft.train.metrics import read_metrics

pytestmark = pytest.mark.slow


def _metrics(out):
    return read_metrics(out / "metrics.jsonl")


def test_structured_example_trains_on_feature_matching_alone(warm_model, cli, tmp_path, monkeypatch, repo_root):
    """The shipped example (no reward function) on a weak model: the feature-matching reward carries signal,
    the ground-truth CE term is in the loss, and held-out CE / exact match are evaluated. Learning itself is
    measured on the real starting checkpoint in docs/ebft.md (a weak XS model moves too little in 12 steps)."""
    monkeypatch.chdir(repo_root)
    out = tmp_path / "ebft"
    assert cli("train", "examples/ebft-structured.yaml", f"--base_model={warm_model}", f"--output_dir={out}",
               "--max_steps=12", "--eval_steps=12", "--logging_steps=1", "--micro_batch_size=32", "--learning_rate=1e-4") == 0
    evals = [m for m in _metrics(out) if "eval/ce_loss" in m]
    assert [e["step"] for e in evals] == [0, 12] and all(0 <= e["eval/exact_match"] <= 1 for e in evals)
    steps = [m for m in _metrics(out) if "loss" in m]
    names = {"ebft/alignment", "ebft/diversity", "ebft/cfm_loss", "ebft/reward", "ebft/ce_loss", "reward", "reward_std",
             "rewards/feature_matching/mean", "frac_reward_zero_std", "completions/mean_length", "entropy", "time/generate"}
    assert names <= set(steps[-1]), names - set(steps[-1])
    assert sum(s["reward_std"] > 0 for s in steps) >= 10  # feature matching separates the samples of a group
    assert all(s["grad_norm"] > 0 for s in steps)  # updates happen (the CE term alone would keep them non-zero)


def _config(tmp_path, model, rows, **settings):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {"base_model": str(model), "rl": "ebft", "ebft": {"mode": "structured", "feature_layers": [0.5, 1.0]},
              "trl": {"num_generations": 4, "max_completion_length": 4}, "datasets": [{"path": str(data)}],
              "sequence_len": 32, "micro_batch_size": 8, "max_steps": 1, "output_dir": str(tmp_path / "out")}
    config.update(settings)
    path = tmp_path / "ebft.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_rows_without_ground_truth_are_explained(warm_model, cli, tmp_path, capsys):
    assert cli("train", _config(tmp_path, warm_model, [{"prompt": "1+1="}] * 4)) == 1
    err = capsys.readouterr().err
    assert "datasets[0]" in err and "line 1: no ground truth" in err


def test_opencode_transform_and_lora_feature_network(warm_model, cli, tmp_path):
    rows = [{"input": f"{a}+{a}=", "output": str(2 * a)} for a in range(8)]
    config = _config(tmp_path, warm_model, rows, datasets=[{"path": str(tmp_path / "rows.jsonl"), "type": "ebft_opencode.transform"}],
                     adapter="lora", lora_r=4, lora_alpha=8, lora_target_linear=True, max_steps=2,
                     ebft={"mode": "structured", "feature_layers": [0.5, 1.0], "use_whitening": True, "ce_coef": 0.1,
                           "embed_method": "last_token"})
    assert cli("train", config) == 0
    last = [m for m in _metrics(tmp_path / "out") if "loss" in m][-1]
    assert "ebft/ce_loss" in last


def test_async_structured_ebft_scores_with_the_adapter_disabled_policy_on_the_main_thread(warm_model, cli, tmp_path):
    """AxolotlAsyncEBFTConfig: rollouts prefetched in the background; the feature network (the policy with its adapter
    disabled) runs where training runs, between steps, never on the sampling thread."""
    rows = [{"input": f"{a}+{a}=", "output": str(2 * a)} for a in range(8)]
    config = _config(tmp_path, warm_model, rows, datasets=[{"path": str(tmp_path / "rows.jsonl"), "type": "ebft_opencode.transform"}],
                     adapter="lora", lora_r=4, lora_alpha=8, lora_target_linear=True, max_steps=3, logging_steps=1,
                     trl={"num_generations": 4, "max_completion_length": 4, "async_prefetch": True, "prefetch_depth": 1})
    assert cli("train", config) == 0
    steps = [m for m in _metrics(tmp_path / "out") if "loss" in m]
    assert [s["async/staleness/max"] for s in steps] == [0.0, 1.0, 1.0]
    assert all("ebft/reward" in s and "sampling/importance_sampling_ratio/mean" in s for s in steps)


@pytest.mark.parametrize("settings, words", [
    ({"ebft": None}, "needs an `ebft:` section"),
    ({"ebft": {"mode": "strided", "n_samples_per_prompt": 1, "use_whitening": True}}, "at least 2 samples per group"),
    ({"ebft": {"mode": "structured", "feature_layers": [0.0, 1.5]}}, "feature_layers"),
])
def test_config_mistakes(warm_model, cli, tmp_path, capsys, settings, words):
    config = _config(tmp_path, warm_model, [{"prompt": "1+1=", "ground_truth": "2"}] * 4)
    data = yaml.safe_load(config.read_text())
    for key, value in settings.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    config.write_text(yaml.safe_dump(data))
    assert cli("validate", config) == 1
    assert words in capsys.readouterr().err


def test_strided_example_lowers_held_out_ce(warm_model, cli, tmp_path, monkeypatch, repo_root):
    monkeypatch.chdir(repo_root)
    out = tmp_path / "strided"
    assert cli("train", "examples/ebft-strided.yaml", f"--base_model={warm_model}", f"--output_dir={out}",
               "--max_steps=15", "--eval_steps=15", "--logging_steps=1", "--learning_rate=1e-3") == 0
    evals = [m for m in _metrics(out) if "eval/ce_loss" in m]
    assert [e["step"] for e in evals] == [0, 15]
    assert evals[-1]["eval/ce_loss"] < evals[0]["eval/ce_loss"], evals
    steps = [m for m in _metrics(out) if "loss" in m]
    names = {"ebft/alignment", "ebft/diversity", "ebft/cfm_loss", "ebft/reward", "ebft/rl_loss", "ebft/ce_loss",
             "ebft/num_blocks", "ebft/advantages_std", "time/generate", "time/reward"}
    assert names <= set(steps[-1]), names - set(steps[-1])
    assert all(s["ebft/num_blocks"] > 0 for s in steps)


def test_strided_flex_attention_on_a_cpu_trains_what_sdpa_trains(warm_model, cli, tmp_path, monkeypatch, repo_root, capsys):
    """Seed config 27 sets flex_attention: true. flex_attention has no backward on a CPU, so the run goes on with SDPA
    and the identical dense block mask, and says so once."""
    monkeypatch.chdir(repo_root)
    losses = {}
    for flex in (True, False):
        out = tmp_path / f"flex-{flex}"
        assert cli("train", "examples/ebft-strided.yaml", f"--base_model={warm_model}", f"--output_dir={out}",
                   "--max_steps=3", "--eval_steps=3", "--logging_steps=1", f"--flex_attention={str(flex).lower()}") == 0
        losses[flex] = [m["loss"] for m in _metrics(out) if "loss" in m]
        said = " ".join(capsys.readouterr().out.split())
        assert ("note: flex_attention: strided EBFT on a CPU runs with SDPA and the identical dense block mask" in said) is flex
    assert losses[True] == losses[False] and len(losses[True]) == 3


def test_strided_loss_through_the_output_layer_trains_what_the_logits_train(warm_model, cli, tmp_path, monkeypatch, repo_root):
    """The strided recipe's chunked output-layer path (rlft.rollout.strided_scores; the byte vocabulary is under
    MIN_VOCAB, so it is lowered here) gives the losses, metrics and held-out CE of the model's own logits."""
    from rlft.models import head
    from rlft.rollout import strided_scores

    monkeypatch.chdir(repo_root)
    calls = []
    for name in ("linear_token_logps", "linear_token_nll"):  # the chunked functions: counted, to know which path ran
        original = getattr(strided_scores, name)
        monkeypatch.setattr(strided_scores, name, lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k))
    runs = {}
    for fused in (True, False):
        monkeypatch.setattr(head, "MIN_VOCAB", 1 if fused else 10**9)
        out = tmp_path / f"fused-{fused}"
        assert cli("train", "examples/ebft-strided.yaml", f"--base_model={warm_model}", f"--output_dir={out}",
                   "--max_steps=3", "--eval_steps=3", "--logging_steps=1") == 0
        assert {"linear_token_logps", "linear_token_nll"} <= set(calls) if fused else not calls
        calls.clear()
        runs[fused] = [{k: v for k, v in m.items() if k in ("loss", "ebft/rl_loss", "ebft/ce_loss", "eval/ce_loss")}
                       for m in _metrics(out) if "loss" in m or "eval/ce_loss" in m]
    assert len(runs[True]) == len(runs[False]) == 5  # 3 steps, 2 evaluations
    for fused, plain in zip(runs[True], runs[False]):
        assert fused.keys() == plain.keys()
        assert all(abs(fused[k] - plain[k]) <= 1e-4 * (1 + abs(plain[k])) for k in plain), (fused, plain)


def test_strided_documents_shorter_than_one_block(warm_model, cli, tmp_path, capsys):
    rows = [{"text": "1+1=2"}] * 4
    config = _config(tmp_path, warm_model, rows, trl={}, ebft={"mode": "strided", "feature_layers": [0.5, 1.0],
                                                                "context_length": 8, "generate_max_len": 4, "stride": 4})
    assert cli("train", config) == 1
    err = capsys.readouterr().err
    assert "no training rows left" in err and "shorter than one EBFT block" in err
