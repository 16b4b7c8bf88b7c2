"""GRPO, async GRPO, DPO and EBFT on several training processes on CPU (gloo), through the real launcher: the same global
batch on 1 and on 2 processes gives the same losses under DDP, FSDP2 and DeepSpeed ZeRO-3 (GRPO under FSDP2 and ZeRO-3, also with
micro-batches packed by a token budget; Cosmos-RL's token-mean with and without balance_dp_token); a GRPO checkpoint written by
2 FSDP processes resumes on 1. (SFT and the launcher's own behaviour: test_distributed.py.)"""

import json
from pathlib import Path

import pytest
import yaml

from distributed_utils import FSDP, STRATEGIES, assert_same_evals, evals, losses, train, train_here, write
from server_utils import addition_prompts
from rlft.train.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


REWARD = "def r(completions, answer, **kwargs):\n    return [float(c.strip() == a) + 0.1 * len(c) for c, a in zip(completions, answer)]\n"


@pytest.fixture(scope="module")
def grpo(tmp_path_factory, warm_model):
    """A GRPO config maker (reference KL on: reference log-probs are split over processes and shared), and the
    1-process run with 2 micro-batches of 8 completions per step."""
    folder = tmp_path_factory.mktemp("grpo")
    (folder / "dist_rewards.py").write_text(REWARD)
    data = folder / "prompts.jsonl"
    addition_prompts(data)

    def config(name: str, accumulation: int, trl: dict | None = None, **extra) -> Path:
        return write(folder / f"{name}.yaml", {
            "base_model": str(warm_model), "rl": "grpo", "datasets": [{"path": str(data)}], "sequence_len": 32,
            "micro_batch_size": 8, "gradient_accumulation_steps": accumulation, "max_steps": 10, "learning_rate": 1e-3,
            "logging_steps": 1, "output_dir": str(folder / name), "save_steps": 5,
            "trl": {"num_generations": 4, "max_completion_length": 4, "reward_funcs": ["dist_rewards.r"], "beta": 0.01,
                    **(trl or {})}, **extra})

    train_here(config("one", 2), cwd=folder)
    return config, losses(folder / "one"), folder


# (GRPO on two DDP processes: test_async_grpo_on_two_ranks_learns below, and against the rollout server equal to one
# process in test_async_server.py)
@pytest.mark.parametrize("strategy", ["fsdp", "zero3"])
def test_grpo_two_processes_equal_one(grpo, strategy):
    """Rank 0 samples and scores all 16 completions of a step and broadcasts them; each process trains 8."""
    config, expected, folder = grpo
    train(config(strategy, 1, **STRATEGIES[strategy]))
    got = losses(folder / strategy)
    assert got.keys() == expected.keys() == set(range(1, 11))
    assert max(abs(got[s] - expected[s]) for s in got) < 1e-5, (got, expected)
    rewards = [m["reward"] for m in read_metrics(folder / strategy / "metrics.jsonl") if "reward" in m]
    assert rewards == [m["reward"] for m in read_metrics(folder / "one" / "metrics.jsonl") if "reward" in m]


def test_grpo_under_zero3_on_one_process_trains_what_the_plain_run_trains(grpo):
    """DeepSpeed partitions ZeRO-3's parameters on one process too (none holds elements outside the forward): the
    in-process engine is built from, and synced with, a gathered whole copy, as with several processes."""
    config, expected, folder = grpo
    train(config("zero3-one", 2, **STRATEGIES["zero3"]), processes=1)
    got = losses(folder / "zero3-one")
    assert got.keys() == expected.keys() == set(range(1, 11))
    assert max(abs(got[s] - expected[s]) for s in got) < 1e-5, (got, expected)
    rewards = [m["reward"] for m in read_metrics(folder / "zero3-one" / "metrics.jsonl") if "reward" in m]
    assert rewards == [m["reward"] for m in read_metrics(folder / "one" / "metrics.jsonl") if "reward" in m]


def test_grpo_fsdp_checkpoint_resumes_on_one_process(grpo):
    import shutil

    config, expected, folder = grpo
    if not (folder / "fsdp" / "checkpoint-5").exists():
        train(config("fsdp", 1, **FSDP))
    (folder / "resumed").mkdir()
    shutil.copytree(folder / "fsdp" / "checkpoint-5", folder / "resumed" / "checkpoint-5")
    train(config("resumed", 2, resume_from_checkpoint="auto"), processes=1)
    got = losses(folder / "resumed")
    assert set(got) == {6, 7, 8, 9, 10}
    assert max(abs(got[s] - expected[s]) for s in got) < 1e-5, (got, expected)


def test_micro_batches_packed_by_tokens_under_fsdp_equal_one_process(grpo):
    """trl.max_token_len_per_mini_batch: 20 on 2 FSDP processes: each packs its 8 completions into micro-batches of at
    most 20 tokens, the process with fewer runs padding ones (FSDP's collectives need as many forward passes on each),
    and the old and reference log-prob passes pack the same way. dapo's token mean does not depend on the split: the
    losses of one process with 2 fixed micro-batches of 8."""
    config, expected, folder = grpo
    train(config("budget", 1, {"max_token_len_per_mini_batch": 20}, **FSDP))
    assert max(abs(got - expected[step]) for step, got in losses(folder / "budget").items()) < 1e-5
    counts = [m["batching/micro_batches"] for m in read_metrics(folder / "budget" / "metrics.jsonl") if "loss" in m]
    assert len(counts) == 10 and min(counts) >= 2, counts


def test_balance_dp_token_takes_token_mean_over_both_processes(grpo):
    """loss_type token-mean on 2 processes with one micro-batch of 8 completions each. balance_dp_token: true divides
    both processes' token sums by their tokens together: one token mean over the step's 16 completions, which is dapo's
    (the fixture's one-process run). false (Cosmos-RL's default): each process's own token mean, averaged, which is
    one process's token-mean over 2 micro-batches of 8, and another loss wherever the two processes' completions hold
    different numbers of tokens."""
    config, expected, folder = grpo
    train(config("balanced", 1, {"loss_type": "token-mean", "balance_dp_token": True}))
    balanced = losses(folder / "balanced")
    assert balanced.keys() == expected.keys() and max(abs(balanced[s] - expected[s]) for s in balanced) < 1e-5
    train(config("per-rank", 1, {"loss_type": "token-mean"}))
    train_here(config("per-rank-one", 2, {"loss_type": "token-mean"}), cwd=folder)
    per_rank, one = losses(folder / "per-rank"), losses(folder / "per-rank-one")
    assert per_rank.keys() == one.keys() == expected.keys() and max(abs(per_rank[s] - one[s]) for s in one) < 1e-5
    assert max(abs(per_rank[s] - balanced[s]) for s in one) > 1e-3, (per_rank, balanced)


def test_async_grpo_on_two_ranks_learns(warm_model, tmp_path, repo_root):
    """Rank 0 samples the next batch on its background thread while both ranks train on this one: the shipped
    example's settings with the same global batch (64 completions x 1 accumulation x 2 processes)."""
    out = tmp_path / "async"
    config = yaml.safe_load((repo_root / "examples" / "grpo-arithmetic.yaml").read_text())
    config.update(base_model=str(warm_model), output_dir=str(out), max_steps=100, eval_steps=100, logging_steps=1,
                  learning_rate=5e-4, gradient_accumulation_steps=1)
    config["trl"].update(reward_funcs=["examples.grpo.arithmetic.close_enough"], async_prefetch=True, prefetch_depth=1)
    output = train(write(tmp_path / "async.yaml", config), cwd=repo_root, timeout=400)
    assert "64 micro x 1 accumulation x 2 process(es)" in output
    steps = [m for m in read_metrics(out / "metrics.jsonl") if "reward" in m]
    mean = lambda rows: sum(r["reward"] for r in rows) / len(rows)  # noqa: E731
    # the first and last quarter's means at learning rate 5e-4 rose by 0.072 on an Intel Xeon with its AVX-512 kernels and
    # by 0.081 with AVX2 kernels (ATEN_CPU_CAPABILITY=avx2); at 2e-3 they rose by 0.074-0.086 on an AMD EPYC and collapsed
    # on the Xeon (0.056 to 0.000), at 1e-3 the Xeon's stayed at 0.18
    assert mean(steps[-25:]) > mean(steps[:25]) + 0.03, (mean(steps[:25]), mean(steps[-25:]))
    assert all(m["async/staleness/max"] == 1.0 for m in steps[1:])
    assert [m["step"] for m in read_metrics(out / "metrics.jsonl") if "eval/reward" in m] == [0, 100]


@pytest.fixture(scope="module")
def dpo(tmp_path_factory, warm_model):
    """A DPO config maker and the 1-process run with 4 micro-batches of 4 pairs per step: the reference."""
    folder = tmp_path_factory.mktemp("dpo")
    # 128 pairs: 32 micro-batches an epoch, which divide by the 2 processes (otherwise an epoch's last step differs: one
    # process has a padding micro-batch where a single process would take the next epoch's first)
    rows = [(f"{a}+{b}=", str(a + b)) for a in range(0, 40, 3) for b in range(0, 40, 4)]
    data, held_out = folder / "pairs.jsonl", folder / "held_out.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "chosen": c, "rejected": "no idea"}) + "\n" for p, c in rows[:128]))
    # 12 pairs: 3 eval batches, 2 on one process and 1 (with a padding batch) on the other
    held_out.write_text("".join(json.dumps({"prompt": p, "chosen": c, "rejected": "no idea"}) + "\n" for p, c in rows[128:]))

    def config(name: str, accumulation: int, **extra) -> Path:
        return write(folder / f"{name}.yaml", {
            "base_model": str(warm_model), "rl": "dpo", "datasets": [{"path": str(data)}], "sequence_len": 32,
            "micro_batch_size": 4, "gradient_accumulation_steps": accumulation, "max_steps": 12, "learning_rate": 1e-3,
            "logging_steps": 1, "output_dir": str(folder / name), "test_datasets": [{"path": str(held_out)}],
            "eval_steps": 6, **extra})

    train_here(config("one", 4))
    return config, folder


# DDP (gradients averaged, every process holding the model) is method-blind and runs in this suite under SFT, strided
# EBFT with LoRA, async GRPO and the rollout server's trainers; DPO's own layer over the processes (reference
# log-probs, evaluation gathered) is what FSDP2 and ZeRO-3 shard
@pytest.mark.parametrize("strategy", ["fsdp", "zero3"])
def test_dpo_two_processes_equal_one(dpo, strategy):
    config, folder = dpo
    train(config(strategy, 2, **STRATEGIES[strategy]))
    got, expected = losses(folder / strategy), losses(folder / "one")
    assert got.keys() == expected.keys() == set(range(1, 13))  # steps 9-12 are the second epoch
    assert max(abs(got[s] - expected[s]) for s in got) < 1e-5, (got, expected)
    assert_same_evals(evals(folder / strategy), evals(folder / "one"))


@pytest.fixture(scope="module")
def ebft(tmp_path_factory, warm_model, repo_root):
    """EBFT config makers on the shipped examples' data (held-out set trimmed to 8 rows)."""
    folder = tmp_path_factory.mktemp("ebft")

    def config(example: str, name: str, accumulation: int, held_out: str, **extra) -> Path:
        settings = yaml.safe_load((repo_root / "examples" / f"ebft-{example}.yaml").read_text())
        (folder / "held_out.jsonl").write_text("".join((repo_root / held_out).read_text().splitlines(keepends=True)[:8]))
        train_data = settings["datasets"][0]["path"]
        settings.update(base_model=str(warm_model), datasets=[{"path": str(repo_root / train_data)}],
                        test_datasets=[{"path": str(folder / "held_out.jsonl")}], gradient_accumulation_steps=accumulation,
                        max_steps=4, eval_steps=2, logging_steps=1, learning_rate=1e-3, output_dir=str(folder / name),
                        **extra)
        return write(folder / f"{name}.yaml", settings)

    return config, folder


LORA = {"adapter": "lora", "lora_r": 8, "lora_alpha": 16, "lora_target_modules": ["q_proj", "v_proj"]}


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "zero3"])
def test_strided_ebft_two_processes_equal_one(ebft, strategy):
    """Each micro-batch samples its blocks from a generator seeded by its place in the global order, so 2 processes
    draw what 1 process draws: the same losses, rewards and held-out evaluations. With LoRA the feature network is the
    policy with its adapter disabled: through the DDP wrapper, or the FSDP2-sharded model (called whole, so its root
    weights are gathered)."""
    config, folder = ebft
    held_out = "examples/ebft/data/heldout.jsonl"
    if not (folder / "strided-one" / "metrics.jsonl").exists():
        train_here(config("strided", "strided-one", 2, held_out, micro_batch_size=4, **LORA))
    output = train(config("strided", f"strided-{strategy}", 1, held_out, micro_batch_size=4, **LORA,
                          **STRATEGIES[strategy]))
    assert "4 micro x 1 accumulation x 2 process(es)" in output
    got, expected = losses(folder / f"strided-{strategy}"), losses(folder / "strided-one")
    assert got.keys() == expected.keys() == set(range(1, 5))
    # ZeRO-3 computes the features through its gathered parameters, which differ from one process's in the last float
    # bits on some CPUs (AVX-512); whitening (an ill-conditioned covariance of 4 samples) makes that 6e-6 in a reward
    # and the policy loss, a sum of advantages x log-probs, 2e-4 (held-out CE 1.3e-5 relative two steps later). Other
    # draws would move the losses by 1e-2 or more.
    assert max(abs(got[s] - expected[s]) for s in got) < (5e-4 if strategy == "zero3" else 1e-5), (got, expected)
    steps = lambda out, key: [m[key] for m in read_metrics(out / "metrics.jsonl") if key in m]  # noqa: E731
    for key in ("ebft/num_blocks", "ebft/generated_tokens"):  # the same blocks drawn, step by step
        assert steps(folder / f"strided-{strategy}", key) == steps(folder / "strided-one", key)
    assert steps(folder / f"strided-{strategy}", "ebft/reward") == pytest.approx(steps(folder / "strided-one", "ebft/reward"),
                                                                                  abs=1e-5)
    assert_same_evals(evals(folder / f"strided-{strategy}"), evals(folder / "strided-one"), 1e-4 if strategy == "zero3" else 1e-5)


def test_structured_ebft_with_lora_under_fsdp_equals_one_process(ebft):
    """Rank 0 samples and scores for both processes; the feature network is the policy with its adapter disabled, which
    rank 0 runs on its full copy of the sharded policy (alone, while the other rank waits for the broadcast)."""
    config, folder = ebft
    lora = {**LORA, "micro_batch_size": 16}
    held_out = "examples/quickstart/data/heldout.jsonl"
    train_here(config("structured", "structured-one", 2, held_out, **lora))
    train(config("structured", "structured-fsdp", 1, held_out, **lora, **FSDP))
    got, expected = losses(folder / "structured-fsdp"), losses(folder / "structured-one")
    assert got.keys() == expected.keys() == set(range(1, 5))
    assert max(abs(got[s] - expected[s]) for s in got) < 1e-5, (got, expected)
    steps = [m for m in read_metrics(folder / "structured-fsdp" / "metrics.jsonl") if "reward" in m]
    assert [m["reward"] for m in steps] == [m["reward"] for m in read_metrics(folder / "structured-one" / "metrics.jsonl")
                                            if "reward" in m]
    assert all(m["reward_std"] > 0 for m in steps)  # the feature network separates the samples: a real signal
    assert_same_evals(evals(folder / "structured-fsdp"), evals(folder / "structured-one"))
