"""A few hundred random mutations of real configs: `validate` never crashes, names every invalid
value, and rejects the values that would train silently wrong (non-finite numbers, negative clip norms, ...)."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys

import pytest

from rlft.config import build_config
from rlft.errors import ConfigError
from tests.unit.test_config_ranges import numeric_fields

BAD_VALUES = [math.nan, math.inf, -math.inf, -1, -1e9, 10**12, "", "abc", [1, 2], {"a": 1}, True, None]


def _set(config: dict, path: str, value) -> dict:
    section, _, key = path.rpartition(".")
    target = config.setdefault(section, {}) if section else config
    target[key] = value
    return config


def _base(config_dict) -> dict:
    return config_dict(rl="grpo", trl={"reward_funcs": ["rewards.r"], "num_generations": 4}, micro_batch_size=8)


@pytest.mark.parametrize("seed", range(6))
def test_random_mutations_are_named_or_accepted_never_a_crash(config_dict, seed):
    chooser = random.Random(seed)
    keys = [key for key, _ in numeric_fields() if not key.startswith(("datasets[]", "ebft.", "vllm."))]
    for _ in range(50):
        mutated = _base(config_dict)
        changed = chooser.sample(keys, 3)
        for key in changed:
            _set(mutated, key, chooser.choice(BAD_VALUES))
        try:
            cfg = build_config(mutated)
        except ConfigError as exc:
            named = {where for where, _ in exc.problems}
            for key in changed:  # each value that made it fail is named (a valid one, e.g. None, need not be)
                value = mutated.get(key) if "." not in key else mutated[key.split(".")[0]][key.split(".")[1]]
                if isinstance(value, float) and not math.isfinite(value):
                    assert key in named, (key, value, exc.problems)
            continue
        for key in changed:  # accepted: every number in it is finite
            value = getattr(cfg.trl, key[4:]) if key.startswith("trl.") else getattr(cfg, key)
            assert not (isinstance(value, float) and not math.isfinite(value)), (key, value)


@pytest.mark.parametrize("key, value, message", [
    ("learning_rate", math.nan, "finite"), ("learning_rate", math.inf, "finite"), ("learning_rate", -1e-4, "must be > 0.0, got -0.0001"),
    ("max_grad_norm", -1.0, "must be >= 0.0, got -1.0"), ("max_grad_norm", math.inf, "finite"),
    ("save_total_limit", -2, "must be >= -1, got -2"), ("adam_beta1", 1.0, "must be < 1.0, got 1.0"), ("adam_beta2", -0.1, ""),
    ("adam_epsilon", -1e-8, ""), ("warmup_ratio", 1.5, "must be <= 1.0, got 1.5"), ("warmup_steps", -1, ""),
    ("max_steps", -1, ""), ("lora_r", 0, "must be >= 1, got 0"), ("lora_dropout", 1.0, "must be < 1.0, got 1.0"),
    ("seed", -1, ""), ("seed", 2**32, "must be <= 4294967295, got 4294967296"), ("weight_decay", math.inf, "finite"),
    ("num_epochs", math.inf, "finite"), ("trl.epsilon", -0.2, "must be > 0.0, got -0.2"), ("trl.epsilon_high", -0.1, ""),
    ("trl.beta", math.nan, "finite"), ("trl.temperature", math.inf, "finite"), ("trl.reward_weights", [math.nan], ""),
])
def test_values_that_would_train_wrong_are_rejected(config_dict, key, value, message):
    mutated = _set(_base(config_dict), key, value)
    if key == "trl.reward_weights":
        mutated["trl"]["reward_funcs"] = ["rewards.r"]
    with pytest.raises(ConfigError) as caught:
        build_config(mutated)
    problems = dict(caught.value.problems)
    where = next((w for w in problems if w.startswith(key)), None)
    assert where is not None and message in problems[where], problems


def test_the_cli_names_a_bad_value_without_a_traceback(tmp_path, config_dict):
    import yaml

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config_dict(learning_rate=".nan", max_grad_norm=-1, seed=2**33)).replace("'.nan'", ".nan"))
    for command in ("validate", "train"):
        done = subprocess.run([sys.executable, "-m", "rlft.cli", command, str(path)], capture_output=True, text=True,
                              env=dict(os.environ, HF_HUB_OFFLINE="1"), cwd=tmp_path, timeout=120)
        output = done.stdout + done.stderr
        assert done.returncode == 1 and "Traceback" not in output, output
        assert "learning_rate" in output and "max_grad_norm" in output and "seed" in output, output
    assert not (tmp_path / "model-out").exists()  # train stopped before any work (model-out: the default output_dir)
