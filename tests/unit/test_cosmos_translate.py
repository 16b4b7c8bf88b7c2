"""The translation table from Cosmos-RL keys to rlft keys: every key has its row, every row does what it says."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from rlft.config.cosmos.rows_policy import BUILTIN_REWARDS
from rlft.config.cosmos.schema import all_keys, find
from rlft.config.cosmos.targets import rlft_has
from rlft.config.cosmos.translate import ROWS, row_for, translate
from rlft.config.loading import build_config
from rlft.errors import ConfigError

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "data" / "cosmos").glob("*.toml"))
GRPO = {"type": "grpo", "dataset": {"name": "data.jsonl"}}


def cosmos(**sections) -> dict:
    """A Cosmos-RL file: the given sections over a GRPO policy on a local file."""
    data = {"policy": {"model_name_or_path": "./model"}, "train": {"train_policy": dict(GRPO)}}
    for name, section in sections.items():
        if name == "train_policy":
            data["train"]["train_policy"].update(section)
        elif isinstance(section, dict):
            data[name] = {**data.get(name, {}), **section}
        else:
            data[name] = section
    return data


def leaf(translation, path: str):
    return next(o for o in translation.outcomes if o.path == path)


def test_every_key_of_the_schema_has_its_row():
    keys = [k for k in all_keys() if not k.is_section or k.entry.get("nullable")]
    missing = sorted({k.path for k in keys if row_for(k.path, "grpo" if k.section != "SFTDataConfig" else "sft") is None})
    assert not missing, f"Cosmos-RL keys with no row in the translation table: {missing}"
    stale = [row.cosmos for row in ROWS if find(row.cosmos, row.method) is None]
    assert not stale, f"rows of keys that are not in Cosmos-RL's schema: {stale}"


def test_every_row_names_rlft_keys_that_exist():
    targets = {target for row in ROWS for target in row.targets}
    unknown = sorted(t for t in targets if not rlft_has(t))
    assert not unknown, f"rows name rlft keys that do not exist: {unknown}"


def test_rlft_builtin_rewards_are_the_tables():
    from rlft.rollout.rewards.builtin import BUILTIN_REWARDS as BUILT

    assert set(BUILTIN_REWARDS) == set(BUILT)


CASES = [
    (dict(train_policy={"kl_beta": 0.04}), {"trl": {"beta": 0.04}}),
    (dict(train_policy={"mu_iterations": 2}), {"trl": {"num_iterations": 2}}),
    (dict(rollout={"n_generation": 8, "max_response_length": 64}), {"trl": {"num_generations": 8, "max_completion_length": 64}}),
    (dict(rollout={"sampling_config": {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1}}),
     {"trl": {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1}}),
    (dict(policy={"model_name_or_path": "m", "model_revision": "v2", "model_max_length": 8192}),
     {"base_model": "m", "revision_of_model": "v2", "sequence_len": 8192}),
    (dict(train={"optm_lr": 3e-6, "optm_weight_decay": 0.1, "optm_betas": [0.9, 0.95], "epsilon": 1e-8, "epoch": 3,
                 "optm_grad_norm_clip": 0.5, "output_dir": "out"}),
     {"learning_rate": 3e-6, "weight_decay": 0.1, "adam_beta1": 0.9, "adam_beta2": 0.95, "adam_epsilon": 1e-8,
      "num_epochs": 3, "max_grad_norm": 0.5, "output_dir": "out"}),
    (dict(train={"optm_impl": "foreach"}), {"optimizer": "adamw_torch"}),
    (dict(train={"optm_warmup_steps": 0.1}), {"warmup_ratio": 0.1}),
    (dict(train={"optm_decay_type": "cosine", "optm_min_lr_factor": 0.1}),
     {"lr_scheduler": "cosine", "cosine_min_lr_ratio": 0.1}),
    (dict(train={"train_batch_per_replica": 64}, train_policy={"mini_batch": 8}),
     {"micro_batch_size": 8, "gradient_accumulation_steps": 8}),
    (dict(train={"train_batch_per_replica": 64}, train_policy={"mini_batch": 4, "batch_size_per_optimize": 16}),
     {"micro_batch_size": 4, "gradient_accumulation_steps": 4, "trl": {"steps_per_generation": 4}}),
    (dict(train={"train_batch_per_replica": 8}, rollout={"n_generation": 16}), {"trl": {"generation_batch_size": 16}}),
    (dict(train={"ckpt": {"enable_checkpoint": True, "save_freq": 50, "max_keep": 3}}),
     {"save_steps": 50, "save_total_limit": 3}),
    (dict(train={"ckpt": {"enable_checkpoint": True, "save_mode": "async", "max_keep": -1, "save_freq_in_epoch": 2}}),
     {"save_mode": "async", "save_total_limit": -1, "save_every_n_epochs": 2}),
    (dict(train_policy={"min_filter_prefix_tokens": 8, "reference_reset_interval": 10, "kl_beta": 0.01,
                        "reset_optimizer_with_reference": False}),
     {"trl": {"min_filter_prefix_tokens": 8, "reference_reset_interval": 10, "reset_optimizer_with_reference": False}}),
    (dict(train={"max_num_steps": 10, "seed": 7, "resume": True, "compile": True, "param_dtype": "float32"}),
     {"max_steps": 10, "seed": 7, "resume_from_checkpoint": "auto", "torch_compile": True, "bf16": False}),
    (dict(train_policy={"dataset": {"name": "org/data", "subset": "main", "split": ["train", "extra"]}}),
     {"datasets": [{"path": "org/data", "name": "main", "split": "train"},
                   {"path": "org/data", "name": "main", "split": "extra"}]}),
    (dict(train_policy={"loss_type": "seq-mean-token-mean", "unbiased_loss_max_tokens": 512}),
     {"trl": {"loss_type": "seq-mean-token-mean", "unbiased_loss_max_tokens": 512}}),
    (dict(train_policy={"balance_dp_token": True, "max_token_len_per_mini_batch": 4096}),
     {"trl": {"balance_dp_token": True, "max_token_len_per_mini_batch": 4096}}),
    (dict(train_policy={"reward_function": {"boxed_math": 0.9, "format": 0.1}}),
     {"trl": {"reward_funcs": ["boxed_math", "format"], "reward_weights": [0.9, 0.1]}}),
    (dict(train_policy={"reward_function": "single_choice"}), {"trl": {"reward_funcs": ["single_choice"]}}),
    (dict(train_policy={"variant": "gspo"}), {"trl": {"importance_sampling_level": "sequence", "lower_bound_ratio": None}}),
    (dict(train_policy={"variant": "dapo", "filter_reward_metric": ["boxed_math"]}),
     {"trl": {"filter_reward_metric": ["boxed_math"]}}),
    (dict(train_policy={"epsilon_low": 0.1, "epsilon_high": 0.28, "entropy_coeff": 0.01, "aipo_rho": 2.0}),
     {"trl": {"epsilon": 0.1, "epsilon_high": 0.28, "entropy_coeff": 0.01, "aipo_rho": 2.0}}),
    (dict(train_policy={"overlong_reward": {"enable_overlong_penalty": True, "buffer_length": 128, "penalty_factor": 0.5}}),
     {"trl": {"overlong_penalty": True, "overlong_buffer_length": 128, "overlong_penalty_factor": 0.5}}),
    (dict(train={"train_batch_per_replica": 32}, train_policy={"allowed_outdated_steps": 2}),
     {"trl": {"async_prefetch": True, "prefetch_depth": 2, "allowed_outdated_steps": 2}}),
    (dict(logging={"logger": ["console", "wandb"], "project_name": "p", "experiment_name": "e"}),
     {"logger": ["console", "wandb"], "wandb_project": "p", "wandb_name": "e"}),
    (dict(profiler={"enable_profiler": True, "sub_profiler_config": {"active_steps": 2, "rank_filter": [0, 1]}}),
     {"profiler": {"enable_profiler": True, "sub_profiler_config": {"active_steps": 2, "rank_filter": [0, 1]}}}),
    (dict(policy={"lora": {"r": 16, "target_modules": "all-linear"}}),
     {"adapter": "lora", "lora_r": 16, "lora_alpha": 8.0, "lora_target_linear": True}),
    (dict(policy={"parallelism": {"dp_shard_size": 4}}, train={"fsdp_offload": True}),
     {"fsdp": ["full_shard", "auto_wrap"], "fsdp_config": {"fsdp_offload_params": True}}),
    (dict(rollout={"parallelism": {"tp_size": 4}, "gpu_memory_utilization": 0.5}),
     {"vllm": {"tensor_parallel_size": 4, "gpu_memory_utilization": 0.5}}),
    (dict(validation={"enable": True, "freq": 10, "batch_size": 4, "dataset": {"name": "v.jsonl", "split": "test",
                                                                              "test_size": 0.25}}),
     {"eval_steps": 10, "eval_batch_size": 4,
      "validation": {"enable": True, "datasets": [{"path": "v.jsonl", "split": "test"}], "top_k": 1}}),
    (dict(validation={"enable": True, "dataset": {"name": "v.jsonl"}, "temperature": 0.7, "top_k": -1, "n_generation": 4,
                      "max_response_length": 64, "reward_function": {"boxed_math": 1.0}}),
     {"validation": {"temperature": 0.7, "top_k": -1, "n_generation": 4, "max_response_length": 64,
                     "reward_function": {"boxed_math": 1.0}}}),
    (dict(validation={"enable": True}, train_policy={"dataset": {"name": "data.jsonl", "test_size": 16}}),
     {"val_set_size": 16, "validation": {"enable": True}}),
    (dict(validation={"enable": True}), {"val_set_size": 0.1}),
    (dict(train_policy={"prompt_column_name": "question", "response_column_name": "solution"}),
     {"datasets": [{"path": "data.jsonl", "field_prompt": "question", "field_response": "solution"}]}),
    (dict(logging={"logger": ["console", "tensorboard"]}), {"logger": ["console", "tensorboard"]}),
]


def subset(expected, actual) -> bool:
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(k in actual and subset(v, actual[k]) for k, v in expected.items())
    return expected == actual


@pytest.mark.parametrize("sections,expected", CASES, ids=[str(i) for i in range(len(CASES))])
def test_rows_translate_their_keys(sections, expected):
    translation = translate(cosmos(**sections))
    assert subset(expected, translation.rlft), translation.rlft
    assert not translation.of("refused"), [(o.path, o.detail) for o in translation.of("refused")]
    build_config(translation.rlft)


def test_on_policy_and_no_staleness_are_synchronous():
    for policy in ({"on_policy": True}, {"allowed_outdated_steps": 0}):
        trl = translate(cosmos(train={"train_batch_per_replica": 32}, train_policy=policy)).rlft["trl"]
        assert "async_prefetch" not in trl and "allowed_outdated_steps" not in trl


def test_balance_dp_token_is_read_with_token_mean_only():
    """Cosmos-RL balances loss_type token-mean alone; with another loss it ignores the key, and so does the translation
    (rlft refuses trl.balance_dp_token with a loss that has no per-process token mean)."""
    translation = translate(cosmos(train_policy={"balance_dp_token": True, "loss_type": "seq-mean-token-mean"}))
    assert "balance_dp_token" not in translation.rlft["trl"]
    [outcome] = [o for o in translation.outcomes if o.path == "train.train_policy.balance_dp_token"]
    assert outcome.kind == "mapped" and "loss_type token-mean only" in outcome.detail, outcome
    build_config(translation.rlft)


def test_validation_of_an_sft_run_is_its_eval_loss():
    data = {"train": {"train_policy": {"type": "sft", "dataset": {"name": "chat.jsonl"}}}, "policy": {"model_name_or_path": "m"},
            "validation": {"enable": True, "freq": 5, "dataset": {"name": "held.jsonl", "split": ["a", "b"]}}}
    rlft = translate(data).rlft
    assert "validation" not in rlft and rlft["eval_steps"] == 5
    assert rlft["test_datasets"] == [{"path": "held.jsonl", "split": "a"}, {"path": "held.jsonl", "split": "b"}]
    build_config(rlft)


def test_an_sft_policy():
    translation = translate({"train": {"train_policy": {"type": "sft", "dataset": {"name": "chat.jsonl"},
                                                        "conversation_column_name": "conversation", "mini_batch": 4},
                                       "train_batch_per_replica": 8}, "policy": {"model_name_or_path": "m"}})
    assert translation.method == "sft" and "rl" not in translation.rlft
    assert translation.rlft["datasets"] == [{"path": "chat.jsonl", "type": "chat_template", "field_messages": "conversation"}]
    assert (translation.rlft["micro_batch_size"], translation.rlft["gradient_accumulation_steps"]) == (4, 2)
    build_config(translation.rlft)


def test_cosmos_rl_defaults_that_differ_from_rlft_are_carried():
    rlft = translate(cosmos()).rlft
    assert rlft["learning_rate"] == 1e-6 and rlft["warmup_steps"] == 20 and rlft["lr_scheduler"] == "constant_with_warmup"
    assert rlft["trl"]["loss_type"] == "token-mean" and rlft["trl"]["num_generations"] == 16
    assert rlft["save_strategy"] == "no"  # Cosmos-RL saves no checkpoint unless train.ckpt.enable_checkpoint
    assert "tensor_parallel_size" not in rlft.get("vllm", {}) and "fsdp" not in rlft  # hardware defaults are not carried


@pytest.mark.parametrize("sections,key,words", [
    (dict(policy={"parallelism": {"tp_size": 2}}), "policy.parallelism.tp_size", "FSDP2"),
    (dict(policy={"parallelism": {"pp_size": 2}}), "policy.parallelism.pp_size", "pipeline parallelism"),
    (dict(policy={"parallelism": {"cp_size": 2}}), "policy.parallelism.cp_size", "context parallelism"),
    (dict(policy={"parallelism": {"ep_size": 8}}), "policy.parallelism.ep_size", "expert parallelism"),
    (dict(policy={"parallelism": {"n_init_replicas": 2}}), "policy.parallelism.n_init_replicas", "--num-processes"),
    (dict(rollout={"parallelism": {"n_init_replicas": 2}}), "rollout.parallelism.n_init_replicas", "one rlft rollout server"),
    (dict(rollout={"backend": "trtllm"}), "rollout.backend", "TensorRT-LLM"),
    (dict(train={"fp8": {"enable_fp8": True}}), "train.fp8.enable_fp8", "fp8 training"),
    (dict(rollout={"quantization": "fp8"}), "rollout.quantization", "kv_cache_dtype"),
    (dict(train_policy={"reward_function": "gsm8k"}), "train.train_policy.reward_function", "gsm8k: not built"),
    (dict(train_policy={"loss_type": "seq-mean-token-sum"}), "train.train_policy.loss_type", "dr_grpo"),
    (dict(train_policy={"epsilon_low": -1.0}), "train.train_policy.epsilon_low", "does not take -1.0"),
    (dict(distillation={"enable": True}), "distillation.enable", "distillation"),
    (dict(train={"ckpt": {"upload_hf": True}}), "train.ckpt.upload_hf", "never uploads"),
])
def test_what_rlft_does_not_build_is_refused_with_the_nearest_option(sections, key, words):
    translation = translate(cosmos(**sections))
    outcome = leaf(translation, key)
    assert outcome.kind == "refused" and words in outcome.detail, outcome
    build_config(translation.rlft)  # the rest still validates: `rlft validate` passes, `rlft train` refuses


def test_launcher_keys_are_not_used_and_unknown_keys_are_reported():
    translation = translate(cosmos(redis="12800", eth_ips="a;b", custom={"x": 1}, policy={"model_gradient_checkpointig": True}))
    assert {o.path for o in translation.of("unused")} >= {"redis", "eth_ips", "custom"}
    unknown = translation.of("unknown")
    assert [o.path for o in unknown] == ["policy.model_gradient_checkpointig"]
    assert "did you mean 'policy.model_gradient_checkpointing'?" in unknown[0].detail


def test_a_left_out_key_at_a_default_rlft_does_not_build_is_not_refused():
    translation = translate(cosmos())  # Cosmos-RL's policy tp_size default is 2: not applied, never refused
    assert not translation.of("refused")


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_cosmos_rl_examples_translate_to_valid_rlft_configs(path):
    translation = translate(tomllib.loads(path.read_text()))
    assert not translation.problems
    build_config(translation.rlft, source=path.name)


def sample(key):
    """A value of the key's type other than its default."""
    entry, default = key.entry, key.default
    kinds = [] if entry.get("const") else entry.get("types", [])
    if "boolean" in kinds:
        return not default
    if "integer" in kinds:
        return (default if isinstance(default, int) and not isinstance(default, bool) else 0) + 2
    if "number" in kinds:
        return (default if isinstance(default, float) else 0.0) + 0.5
    if "string" in kinds:
        choices = [c for c in entry.get("choices", []) if c != default]
        return choices[-1] if choices else "x"
    if "array" in kinds:
        return {"number": [0.9, 0.95], "integer": [0, 1]}.get((entry.get("items") or ["string"])[0], ["x"])
    if "object" in kinds:
        return {"x": {"number": 1.5, "integer": 2}.get((entry.get("values") or ["boolean"])[0], True)}
    return None


def nest(path: str, value) -> dict:
    data: dict = {}
    node = data
    *parents, name = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[name] = value
    return data


KEYS = [k for k in all_keys() if not k.is_section and sample(k) is not None]


@pytest.mark.parametrize("key", KEYS, ids=[f"{k.section}.{k.name}" for k in KEYS])
def test_each_row_says_what_its_key_became(key):
    """Any value of the key's type: the key gets one outcome, and what it wrote is among its row's rlft keys."""
    policy = {"SFTDataConfig": {"type": "sft"}}.get(key.section, {"type": "grpo"})
    data = cosmos()
    data["train"]["train_policy"] = {**policy, "dataset": {"name": "data.jsonl"}}
    from rlft.config.loading import deep_merge

    data = deep_merge(data, nest(key.path, sample(key)))
    if key.path.startswith("policy.lora."):
        data["policy"]["lora"] = {**data["policy"].get("lora", {})}
    translation = translate(data)
    outcome = leaf(translation, key.path)
    assert outcome.kind in ("mapped", "refused", "unused") and (outcome.kind == "mapped" or outcome.detail), outcome
    row = row_for(key.path, translation.method)
    for written in outcome.rlft:
        general = re.sub(r"\[\d+\]", "[*]", written)
        assert any(general == t or t.startswith(general + "[") for t in row.targets), (written, row.targets)


def test_a_file_without_a_train_policy_table_trains_grpo_with_grpos_defaults():
    """Cosmos-RL's train_policy default is a GRPO policy: the method and the defaults the rows read agree."""
    translation = translate({"train": {"train_batch_per_replica": 8}, "policy": {"model_name_or_path": "./model"}})
    assert translation.method == "grpo" and translation.rlft["rl"] == "grpo"
    assert translation.rlft["trl"]["reward_funcs"] == ["single_choice"] and translation.rlft["trl"]["loss_type"] == "token-mean"


@pytest.mark.parametrize("sections,key,words", [
    (dict(train={"train_batch_per_replica": 0}), "train.train_batch_per_replica",
     "train_batch_per_replica 0 trains no rows: set it to the rows each process trains per step, at least 1"),
    (dict(train={"train_batch_per_replica": -8}, train_policy={"mini_batch": 4}), "train.train_policy.mini_batch",
     "train_batch_per_replica -8 trains no rows"),
    (dict(train_policy={"mini_batch": 3}), "train.train_policy.mini_batch",  # the default 8 rows: not 3s
     "train_batch_per_replica 8 is not a whole number of mini-batches of 3 rows"),
    (dict(train={"optm_betas": [0.9]}), "train.optm_betas", "optm_betas has 1 number(s), and Adam takes two"),
    (dict(train={"optm_betas": [0.9, 0.95, 0.99]}), "train.optm_betas", "has 3 number(s), and Adam takes two"),
    (dict(train_policy={"dataloader_shuffle": False}), "train.train_policy.dataloader_shuffle",
     "rlft draws each epoch's rows in a seeded random order (train.seed) and has no key that keeps the dataset's order"),
    (dict(validation={"enable": True, "val_before_train": False}), "validation.val_before_train",
     "rlft evaluates before the first step whenever it evaluates"),
    (dict(train_policy={"reward_function": {"boxed_math": float("nan")}}), "train.train_policy.reward_function",
     "the weight of 'boxed_math' is nan; give a finite number"),
    (dict(train_policy={"reward_function": {"": 1.0}}), "train.train_policy.reward_function",
     "the key '' is not a reward function's name"),
])
def test_values_rlft_cannot_run_are_refused_with_the_key_and_the_fix(sections, key, words):
    translation = translate(cosmos(**sections))
    outcome = leaf(translation, key)
    assert outcome.kind == "refused" and words in outcome.detail, outcome


def test_keys_at_what_rlft_does_are_accepted():
    translation = translate(cosmos(train_policy={"dataloader_shuffle": True}, validation={"val_before_train": True}))
    assert not translation.of("refused")
    off = translate(cosmos(validation={"enable": False, "val_before_train": False}))
    assert leaf(off, "validation.val_before_train").detail == "validation is off (validation.enable)"


def test_fsdp_keys_say_why_they_set_nothing_by_the_sharding():
    for shards, words in ((1, "dp_shard_size = 1 shards nothing"), (4, "FSDP2 keeps the parameters on the GPU")):
        translation = translate(cosmos(policy={"parallelism": {"dp_shard_size": shards}}, train={"fsdp_offload": False}))
        outcome = leaf(translation, "train.fsdp_offload")
        assert outcome.kind == "mapped" and not outcome.rlft and words in outcome.detail, outcome
    sharded = translate(cosmos(policy={"parallelism": {"dp_shard_size": 4}}, train={"fsdp_reshard_after_forward": "default"}))
    assert "FSDP2 reshards after each forward" in leaf(sharded, "train.fsdp_reshard_after_forward").detail


def test_on_policy_is_rlfts_on_policy_and_needs_a_sync_every_step():
    translation = translate(cosmos(train={"train_batch_per_replica": 32}, train_policy={"on_policy": True}))
    assert translation.rlft["trl"]["on_policy"] is True and "async_prefetch" not in translation.rlft["trl"]
    assert build_config(translation.rlft).trl.on_policy
    every_two = translate(cosmos(train={"train_batch_per_replica": 32, "sync_weight_interval": 2},
                                 train_policy={"on_policy": True}))
    with pytest.raises(ConfigError, match="trl.on_policy samples every batch .* set trl.vllm_sync_interval: 1"):
        build_config(every_two.rlft)


def test_outdated_rollouts_are_fetched_only_while_rollouts_are_sampled_ahead():
    ahead = translate(cosmos(train={"train_batch_per_replica": 32}, train_policy={"outdated_rollout_fetch_batch_size": 2}))
    assert ahead.rlft["trl"]["outdated_rollout_fetch_batch_size"] == 2 and ahead.rlft["trl"]["async_prefetch"]
    build_config(ahead.rlft)
    assert translate(cosmos(train={"train_batch_per_replica": 32})).rlft["trl"]["outdated_rollout_fetch_batch_size"] == 1
    for policy in ({"on_policy": True}, {"allowed_outdated_steps": 0}):
        synchronous = translate(cosmos(train={"train_batch_per_replica": 32},
                                       train_policy={**policy, "outdated_rollout_fetch_batch_size": 2}))
        assert "outdated_rollout_fetch_batch_size" not in synchronous.rlft["trl"]
        outcome = leaf(synchronous, "train.train_policy.outdated_rollout_fetch_batch_size")
        assert not outcome.rlft and "this run samples each generation batch when it trains" in outcome.detail
        build_config(synchronous.rlft)


def test_profiler_settings_are_translated_where_a_profiler_runs():
    off = translate(cosmos(profiler={"sub_profiler_config": {"active_steps": 2, "rank_filter": [1]}}))
    assert "profiler" not in off.rlft
    assert "the profiler, which is off" in leaf(off, "profiler.sub_profiler_config.rank_filter").detail
    build_config(off.rlft)
    on = translate(cosmos(profiler={"enable_nsys": True, "sub_profiler_config": {"active_steps": 2, "with_modules": True}}))
    assert on.rlft["profiler"]["sub_profiler_config"] == {"active_steps": 2}
    modules = leaf(on, "profiler.sub_profiler_config.with_modules")
    assert modules.kind == "unused" and "TorchScript models only" in modules.detail
    build_config(on.rlft)


def test_an_override_of_a_key_only_rlft_has_goes_to_rlft(tmp_path):
    from rlft.config.cosmos.front import split_overrides
    from rlft.config.loading import load_translated

    cosmos_side, rlft_side = split_overrides({"validation": {"enable": True, "pass_threshold": 0.5, "dataset": {"name": "v"}},
                                              "profiler": {"enable_profiler": True}, "max_steps": 2})
    assert cosmos_side == {"validation": {"enable": True, "dataset": {"name": "v"}}, "profiler": {"enable_profiler": True}}
    assert rlft_side == {"validation": {"pass_threshold": 0.5}, "max_steps": 2}
    path = tmp_path / "grpo.toml"
    path.write_text('[policy]\nmodel_name_or_path = "./model"\n[train.train_policy]\ntype = "grpo"\n'
                    'dataset.name = "data.jsonl"\n[validation]\nenable = true\ndataset.name = "val.jsonl"\n')
    cfg, translation = load_translated(path, ["--validation.pass_threshold=0.5", "--validation.freq=5"])
    assert cfg.validation.pass_threshold == 0.5 and cfg.eval_steps == 5
    assert not translation.of("unknown")


def test_a_translation_rlft_refuses_names_the_refused_keys_too(tmp_path):
    """A refused key is left out of the translation, which may then fail rlft's rules: the error says both."""
    from rlft.config.loading import load_translated

    path = tmp_path / "grpo.toml"
    path.write_text('[policy]\nmodel_name_or_path = "./model"\n[train]\ntrain_batch_per_replica = 0\n'
                    '[train.train_policy]\ntype = "grpo"\ndataset.name = "data.jsonl"\n')
    with pytest.raises(ConfigError) as caught:
        load_translated(path)
    text = str(caught.value)
    assert "must be divisible by trl.num_generations" in text
    assert ("Cosmos-RL keys that rlft train refuses, left out of the translation:\n  - train.train_batch_per_replica = 0: "
            "train_batch_per_replica 0 trains no rows") in text
