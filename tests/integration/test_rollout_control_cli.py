"""Cosmos-RL's GRPO rollout control through the real CLI: the allowed_outdated_steps throttle and on_policy on
asynchronous GRPO, the shared-prefix filter and dynamic sampling's draw limit, and the optimizer state started again
exactly at each reference reset (as the checkpoints hold it)."""

import json

import pytest
import torch
import yaml

from rlft.train.metrics import read_metrics

pytestmark = pytest.mark.slow
REWARD = ("def r(completions, answer, **kwargs):\n"
          "    return [float(c.strip() == a) + 0.1 * len(c) for c, a in zip(completions, answer)]\n")


def _config(tmp_path, model, name: str, trl: dict, **settings):
    module = "rewards_" + "".join(ch if ch.isalnum() else "_" for ch in tmp_path.name)
    (tmp_path / f"{module}.py").write_text(REWARD)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a in range(8) for b in range(4)))
    config = {"base_model": str(model), "rl": "grpo", "datasets": [{"path": str(data)}], "sequence_len": 32,
              "micro_batch_size": 8, "max_steps": 5, "learning_rate": 1e-3, "logging_steps": 1,
              "output_dir": str(tmp_path / name),
              "trl": {"num_generations": 4, "max_completion_length": 4, "reward_funcs": [f"{module}.r"], **trl}, **settings}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _steps(folder) -> list[dict]:
    return [m for m in read_metrics(folder / "metrics.jsonl") if "loss" in m]


def test_async_grpo_with_the_throttle_and_on_policy(warm_model, cli, tmp_path, monkeypatch):
    """prefetch_depth 2 with allowed_outdated_steps 1: every batch starts training one step after its weights (depth 2
    alone gives 2), none is dropped. on_policy: every batch is sampled by the weights that train on it, so the
    importance-sampling ratios of every step are 1 (up to float32 round-off)."""
    monkeypatch.chdir(tmp_path)
    throttled = _config(tmp_path, warm_model, "throttled", {"async_prefetch": True, "prefetch_depth": 2,
                                                            "allowed_outdated_steps": 1})
    assert cli("train", throttled) == 0
    steps = _steps(tmp_path / "throttled")
    assert [m["async/staleness/max"] for m in steps] == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert [m["async/throttled"] for m in steps] == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert not any("async/stale_rows_dropped" in m for m in steps)

    on_policy = _config(tmp_path, warm_model, "on-policy", {"async_prefetch": True, "prefetch_depth": 2, "on_policy": True,
                                                            "filter_reward_metric": "reward", "max_retry_for_on_policy": 0,
                                                            "min_filter_prefix_tokens": 1}, max_steps=4)
    assert cli("train", on_policy) == 0
    steps = _steps(tmp_path / "on-policy")
    assert len(steps) == 4 and all(m["async/staleness/max"] == 0.0 for m in steps)
    for m in steps:
        assert abs(m["sampling/importance_sampling_ratio/max"] - 1) < 1e-4, m
        assert abs(m["sampling/importance_sampling_ratio/min"] - 1) < 1e-4, m
    assert all("prefix_filter/masked_tokens" in m and "dynamic_sampling/retries" in m for m in steps)
    assert all(m["frac_reward_zero_std"] == 0.0 for m in steps)  # dynamic sampling filled every batch


def _optimizer_steps(checkpoint) -> tuple[set[float], bool]:
    """The step counts in a checkpoint's optimizer state, and whether every Adam moment is zero."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    whole = checkpoint.parent / f"{checkpoint.name}-optimizer.pt"
    dcp_to_torch_save(str(checkpoint / "optimizer"), str(whole))
    state = torch.load(whole, weights_only=False)["optimizer"]["state"]
    steps = {float(entry["step"]) for entry in state.values()}
    zero = all(not entry[key].any() for entry in state.values() for key in ("exp_avg", "exp_avg_sq"))
    return steps, zero


@pytest.mark.parametrize("reset", [True, False])
def test_the_optimizer_state_starts_again_exactly_at_a_reference_reset(warm_model, cli, tmp_path, monkeypatch, reset):
    """reference_reset_interval 2, a checkpoint after every step: the optimizer state saved after step 2 is a new
    optimizer's (step count 0, moments 0), the one after step 3 has taken one step since; without
    reset_optimizer_with_reference the counts go on 1, 2, 3."""
    monkeypatch.chdir(tmp_path)
    config = _config(tmp_path, warm_model, "out", {"beta": 0.1, "reference_reset_interval": 2,
                                                   "reset_optimizer_with_reference": reset}, max_steps=3, save_steps=1)
    assert cli("train", config) == 0
    found = [_optimizer_steps(tmp_path / "out" / f"checkpoint-{step}") for step in (1, 2, 3)]
    if reset:
        assert found == [({1.0}, False), ({0.0}, True), ({1.0}, False)]
    else:
        assert found == [({1.0}, False), ({2.0}, False), ({3.0}, False)]
    assert (tmp_path / "out" / "checkpoint-2" / "reference.safetensors").is_file()


def test_the_optimizer_reset_under_deepspeed(warm_model, tmp_path):
    """ZeRO keeps the optimizer state in its own flat partitions (zero2.json: on the CPU): at the reference reset it
    starts again there too, as the checkpoint's per-parameter state shows (step count 0 and zero moments after step 2,
    one step after step 3)."""
    pytest.importorskip("deepspeed")
    from safetensors.torch import load_file

    from distributed_utils import STRATEGIES, train

    config = _config(tmp_path, warm_model, "out", {"beta": 0.1, "reference_reset_interval": 2}, max_steps=3, save_steps=1,
                     **STRATEGIES["zero2"])
    train(config, processes=1, cwd=tmp_path)
    found = []
    for step in (1, 2, 3):
        folder = tmp_path / "out" / f"checkpoint-{step}" / "optimizer"
        moments = load_file(str(folder / "zero-0.safetensors"))
        found.append((json.loads((folder / "zero.json").read_text())["scalars"]["step"],
                      all(not value.any() for name, value in moments.items() if "::exp_avg" in name)))
    assert found == [(1.0, False), (0.0, True), (1.0, False)]
