"""Cosmos-RL's own example configs train through the real CLI: the GRPO and the SFT example of a 3B model, with only the
model and the dataset replaced by local stand-ins of the same columns.

On the command line, in Cosmos-RL's names: two steps, a CPU-sized batch and completion length, console logging (wandb
is not installed here), and for GRPO `min_filter_prefix_tokens` unset (a filter of completions that share a prefix,
which these short random completions would not meet)."""

from __future__ import annotations

import json

import pytest

from rlft.train.metrics import read_metrics

pytestmark = pytest.mark.slow
SCALE = ["--train.max_num_steps=2", "--logging.logger=[console]"]


@pytest.fixture(scope="module")
def stand_in_model(tmp_path_factory):
    """A tiny Llama with seeded weights (Cosmos-RL configs have no random_init), 4096 positions as the examples ask."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlft.models.tiny import write_tiny_model

    folder = write_tiny_model(tmp_path_factory.mktemp("models") / "stand-in", "XS", max_positions=4096)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).save_pretrained(folder)
    return folder


def example(repo_root, name: str, tmp_path, model, replacements: dict[str, str]):
    text = (repo_root / "tests" / "data" / "cosmos" / name).read_text()
    for old, new in {**replacements, '"./outputs/': f'"{tmp_path}/outputs/'}.items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return path


def grpo_example(repo_root, tmp_path, model):
    rows = [{"prompt": f"What is {a} + {b}? Put the answer in \\boxed{{}}.", "result": str(a + b)}
            for a in range(8) for b in range(8)]  # JiaxinTsao/math_examples' columns
    data = tmp_path / "math_examples.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return example(repo_root, "qwen2-5-3b-p-fsdp1-tp1-r-tp1-pp1-grpo.toml", tmp_path, model,
                   {'"Qwen/Qwen2.5-3B-Instruct"': f'"{model}"', '"JiaxinTsao/math_examples"': f'"{data}"'})


def test_the_grpo_example_trains_two_steps(cli, repo_root, tmp_path, stand_in_model):
    path = grpo_example(repo_root, tmp_path, stand_in_model)
    assert cli("train", path, *SCALE, "--train.train_batch_per_replica=32", "--rollout.max_response_length=8",
               "--train.train_policy.min_filter_prefix_tokens=") == 0
    out = tmp_path / "outputs" / "qwen2-5-3b-p-fsdp1-tp1-r-tp1-pp1-grpo"
    steps = [m for m in read_metrics(out / "metrics.jsonl") if "reward" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert "rewards/boxed_math/mean" in steps[-1]  # reward_function = "boxed_math", reading the `result` column
    assert (out / "model.safetensors").exists() or (out / "adapter_model.safetensors").exists()


def test_the_sft_example_trains_two_steps(cli, repo_root, tmp_path, stand_in_model):
    rows = [{"conversation": [{"role": "user", "content": f"{a}+{b}="}, {"role": "assistant", "content": str(a + b)}]}
            for a in range(10) for b in range(10)]
    data = tmp_path / "sharegpt.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    path = example(repo_root, "qwen2-5-3b-tp1-sft.toml", tmp_path, stand_in_model,
                   {'"Qwen/Qwen2.5-3B-Instruct"': f'"{stand_in_model}"', '"LNTANOooo/sharegpt52k"': f'"{data}"'})
    assert cli("train", path, *SCALE, "--train.train_batch_per_replica=16") == 0
    out = tmp_path / "outputs" / "qwen2-5-3b-tp1-sft"
    steps = [m for m in read_metrics(out / "metrics.jsonl") if "loss" in m and "step" in m and "eval/loss" not in m]
    assert [m["step"] for m in steps] == [1, 2] and all(m["loss"] > 0 for m in steps)
