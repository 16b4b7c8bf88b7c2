"""The config language: seed examples, error messages, YAML reading, overrides, explain, planned settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlft.config import build_config, deep_merge, explain, load_config, parse_overrides, planned_settings, read_yaml
from rlft.config.settings import resolve
from rlft.errors import ConfigError, NotImplementedYet

SEEDS = Path(__file__).resolve().parents[1] / "data" / "seed_configs"  # the seed guide's YAML examples, verbatim
SEED_FILES = sorted(SEEDS.glob("[0-9]*.yaml"))


def base_for(fragment: dict) -> str:
    """The base a seed fragment merges onto (tests/data/seed_configs/README.md)."""
    return "_base-grpo.yaml" if "trl" in fragment or fragment.get("rl") in ("grpo", "gdpo") else "_base-dpo.yaml"


def messages(problems: list[tuple[str, str]]) -> str:
    return "\n".join(f"{where}: {what}" for where, what in problems)


# ---------------------------------------------------------------- seed examples


@pytest.mark.parametrize(
    "seed",
    [pytest.param(p, id=p.name) for p in SEED_FILES],
)
def test_seed_example_validates_merged_onto_its_base(seed):
    fragment = read_yaml(seed)
    merged = deep_merge(read_yaml(SEEDS / base_for(fragment)), fragment)
    cfg = build_config(merged, source=seed.name)
    assert cfg.rl == merged["rl"]
    if cfg.rl in ("grpo", "gdpo"):  # what train checks first of the data: a validated seed must not be refused there
        from rlft.data.prepare import prompt_steps

        prompt_steps(cfg)


def test_seed_examples_are_all_there():
    assert len(SEED_FILES) == 32
    assert (SEEDS / "_base-dpo.yaml").is_file() and (SEEDS / "_base-grpo.yaml").is_file()


def test_deep_merge_merges_mappings_and_replaces_lists():
    base = {"trl": {"beta": 0.1, "num_generations": 4}, "datasets": [{"path": "a"}, {"path": "b"}], "seed": 1}
    update = {"trl": {"beta": 0.2}, "datasets": [{"path": "c"}]}
    assert deep_merge(base, update) == {"trl": {"beta": 0.2, "num_generations": 4}, "datasets": [{"path": "c"}], "seed": 1}
    assert base["trl"] == {"beta": 0.1, "num_generations": 4}  # inputs untouched


# ---------------------------------------------------------------- misspelt keys


def test_top_level_typo_names_closest_key(config_problems):
    assert config_problems(lerning_rate=1e-5) == [("lerning_rate", "unknown key 'lerning_rate': did you mean 'learning_rate'?")]
    # a capitalised key is no union member's name: it ends the location (it raised IndexError, or named the section)
    assert config_problems(Learning_rate=1e-5) == [("Learning_rate", "unknown key 'Learning_rate': did you mean 'learning_rate'?")]
    assert config_problems(trl={"Beta": 0.1}) == [("trl.Beta", "unknown key 'Beta': did you mean 'beta'?")]


def test_trl_typo_names_closest_key(config_problems):
    assert config_problems(trl={"num_generaitons": 4}) == [
        ("trl.num_generaitons", "unknown key 'num_generaitons': did you mean 'num_generations'?")
    ]


def test_dataset_entry_typo_names_closest_key(config_problems):
    problems = config_problems(datasets=[{"path": "a.jsonl"}, {"pth": "b.jsonl"}])
    assert ("datasets[1].pth", "unknown key 'pth': did you mean 'path'?") in problems


def test_user_defined_type_typo_names_closest_key(config_problems):
    problems = config_problems(datasets=[{"path": "a.jsonl", "type": {"field_promt": "question"}}])
    assert problems == [("datasets[0].type.field_promt", "unknown key 'field_promt': did you mean 'field_prompt'?")]


def test_key_in_wrong_section_names_its_section(config_problems):
    assert config_problems(beta=0.04) == [("beta", "unknown key 'beta' here; it belongs under trl.beta")]


def test_wrong_type_names_expected_type_and_value(config_problems):
    assert config_problems(micro_batch_size="two") == [("micro_batch_size", "expected a whole number, got 'two' (str)")]


def test_literal_typo_suggests_closest_value(config_problems):
    [(where, what)] = config_problems(excess_length_strategy="trunkate")
    assert where == "excess_length_strategy"
    assert what.startswith("'trunkate' is not allowed: expected 'drop'")
    assert what.endswith("(did you mean 'truncate'?)")


# ---------------------------------------------------------------- impossible combinations


def test_grpo_batch_not_divisible_by_generations_names_both_numbers(config_problems):
    [(where, what)] = config_problems(rl="grpo", micro_batch_size=3, gradient_accumulation_steps=2, trl={"num_generations": 4})
    assert where == "combination"
    assert "micro_batch_size * gradient_accumulation_steps = 3 * 2 = 6" in what
    assert "divisible by trl.num_generations = 4" in what


def test_grpo_default_generations_is_eight(config_problems):
    [(_, what)] = config_problems(rl="grpo", micro_batch_size=4)
    assert "= 4 must be divisible by trl.num_generations = 8" in what


def test_grpo_divisible_batch_validates(config):
    cfg = config(rl="grpo", micro_batch_size=2, gradient_accumulation_steps=2, trl={"num_generations": 4})
    assert cfg.trl.num_generations == 4


def test_one_generation_per_prompt_is_refused(config_problems):
    assert config_problems(rl="grpo", trl={"num_generations": 1}) == [
        ("combination", "trl.num_generations is 1: group-relative advantages need at least 2 completions per prompt")
    ]


def test_bf16_and_fp16_together(config_problems):
    assert config_problems(bf16=True, fp16=True) == [("combination", "bf16 and fp16 are both true: choose one precision")]


def test_bf16_auto_with_fp16_is_allowed(config):
    assert config(bf16="auto", fp16=True).fp16 is True


def test_warmup_steps_below_one_is_a_fraction_of_the_run_as_transformers_reads_it(config, config_problems):
    """Four of Axolotl's examples set warmup_steps: 0.1, which transformers 5's TrainingArguments reads as
    ceil(0.1 x the run's steps)."""
    from rlft.config.settings.training import optim_settings
    from rlft.train.optim import warmup_steps

    assert warmup_steps(optim_settings(config(warmup_steps=0.1)), total_steps=95) == 10  # ceil(9.5)
    assert warmup_steps(optim_settings(config(warmup_steps=5.0)), total_steps=95) == 5  # a whole float is a count
    assert warmup_steps(optim_settings(config(warmup_steps=0)), total_steps=95) == 0
    [(where, what)] = config_problems(warmup_steps=2.5)
    assert where == "warmup_steps" and "neither a whole number of steps nor a fraction of the run below 1" in what


def test_warmup_steps_and_ratio_together(config_problems):
    assert config_problems(warmup_steps=10, warmup_ratio=0.1) == [
        ("combination", "warmup_steps and warmup_ratio are both set: keep one")
    ]


def test_lora_keys_without_adapter(config_problems):
    assert config_problems(lora_r=16, lora_alpha=32) == [
        ("combination", "lora_alpha, lora_r set without `adapter`: add `adapter: lora` (or remove them)")
    ]


def test_lora_keys_with_adapter_validate(config):
    assert config(adapter="lora", lora_r=16).lora_r == 16


def test_gdpo_with_sum_then_normalize(config_problems):
    [(where, what)] = config_problems(
        rl="gdpo", micro_batch_size=4, trl={"num_generations": 4, "multi_objective_aggregation": "sum_then_normalize"}
    )
    assert where == "combination"
    assert what.startswith("rl: gdpo normalises each reward before summing")
    assert "sum_then_normalize" in what


@pytest.mark.parametrize("settings", [{"rl": "gdpo"}, {"rl": "grpo", "trl": {"multi_objective_aggregation": "normalize_then_sum"}}])
def test_rloo_with_per_reward_normalisation_is_a_config_problem(config_problems, settings):
    trl = {"num_generations": 4, "advantage_estimator": "rloo", **settings.get("trl", {})}
    [(where, what)] = config_problems(rl=settings["rl"], micro_batch_size=4, trl=trl)
    assert where == "combination" and what.startswith("trl.advantage_estimator: rloo with per-reward normalisation")


def test_an_overlong_buffer_past_the_completion_limit_is_a_config_problem(config, config_problems):
    trl = {"overlong_penalty": True, "max_completion_length": 64, "overlong_buffer_length": 64}
    assert config(rl="grpo", micro_batch_size=8, trl=trl).trl.overlong_buffer_length == 64  # the whole completion: allowed
    [(where, what)] = config_problems(rl="grpo", micro_batch_size=8, trl={**trl, "overlong_buffer_length": 65})
    assert where == "combination" and what.startswith("trl.overlong_buffer_length 65 is longer than trl.max_completion_length 64")


def test_qlora_without_4bit(config_problems):
    assert config_problems(adapter="qlora") == [("combination", "adapter: qlora needs load_in_4bit: true")]


def test_sample_packing_with_dpo(config_problems):
    assert config_problems(rl="dpo", sample_packing=True) == [("combination", "sample_packing applies to SFT only, not dpo")]


def test_missing_base_model_and_empty_datasets_both_reported():
    with pytest.raises(ConfigError) as caught:
        build_config({"datasets": []})
    text = messages(caught.value.problems)
    assert "base_model is not set" in text
    assert "datasets is empty" in text


def test_dataset_without_path_or_data_files(config_problems):
    assert config_problems(datasets=[{"split": "train"}]) == [
        ("datasets[0]", "a dataset needs `path` (a file, folder or hub id) or `data_files`")
    ]


def test_several_key_problems_all_listed(config_problems):
    problems = config_problems(lerning_rate=1e-5, micro_batch_size="two", trl={"num_generaitons": 4}, optimizer="sgdd")
    assert sorted(where for where, _ in problems) == ["lerning_rate", "micro_batch_size", "optimizer", "trl.num_generaitons"]


def test_several_combination_problems_all_listed(config_problems):
    text = messages(config_problems(bf16=True, fp16=True, warmup_steps=1, warmup_ratio=0.1, adapter="qlora"))
    assert "bf16 and fp16 are both true" in text
    assert "warmup_steps and warmup_ratio are both set" in text
    assert "adapter: qlora needs load_in_4bit: true" in text


@pytest.mark.xfail(strict=True, reason="by design: combination checks run once every key is valid")
def test_key_problems_and_combination_problems_listed_together(config_problems):
    text = messages(config_problems(lerning_rate=1e-5, bf16=True, fp16=True))
    assert "did you mean 'learning_rate'" in text
    assert "bf16 and fp16 are both true" in text


def test_error_message_counts_and_lists_problems():
    with pytest.raises(ConfigError) as caught:
        build_config({"base_model": "m", "datasets": [{"path": "x"}], "lerning_rate": 1, "seeed": 2}, source="my.yaml")
    first_line, *rest = str(caught.value).splitlines()
    assert first_line == "my.yaml: 2 problem(s)"
    assert len(rest) == 2 and all(line.startswith("  - ") for line in rest)


# ---------------------------------------------------------------- read_yaml


def test_read_yaml_missing_file_names_path(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="config file not found: " + str(missing)):
        read_yaml(missing)


def test_read_yaml_syntax_error_names_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("base_model: m\nlearning_rate: 1.0e-5\nseed: a: b\nmax_steps: 3\n")
    with pytest.raises(ConfigError) as caught:
        read_yaml(path)
    assert str(caught.value).startswith(f"{path}: YAML syntax error at line 3, column ")


def test_read_yaml_top_level_list_refused(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- base_model: m\n")
    with pytest.raises(ConfigError, match="the top level must be a mapping of keys, got list"):
        read_yaml(path)


def test_read_yaml_empty_file_is_empty_mapping(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing\n")
    assert read_yaml(path) == {}


def test_read_yaml_folder_refused(tmp_path):
    with pytest.raises(ConfigError, match="is a folder"):
        read_yaml(tmp_path)


# ---------------------------------------------------------------- overrides


def test_override_dotted_key_is_nested_float():
    assert parse_overrides(["--trl.beta=0.01"]) == {"trl": {"beta": 0.01}}


def test_override_space_separated_value():
    assert parse_overrides(["--max_steps", "5"]) == {"max_steps": 5}


def test_override_list_value():
    assert parse_overrides(["--lora_target_modules=[q_proj,v_proj]"]) == {"lora_target_modules": ["q_proj", "v_proj"]}


def test_override_bare_flag_is_true():
    assert parse_overrides(["--sample_packing", "--max_steps=2"]) == {"sample_packing": True, "max_steps": 2}


def test_override_dashes_become_underscores():
    assert parse_overrides(["--learning-rate=0.5"]) == {"learning_rate": 0.5}


def test_override_without_dashes_refused():
    with pytest.raises(ConfigError, match="unexpected argument 'max_steps=5'"):
        parse_overrides(["max_steps=5"])


def test_load_config_applies_overrides_over_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "base_model: m\nrl: grpo\nmicro_batch_size: 4\ndatasets:\n  - path: d.jsonl\n"
        "trl:\n  num_generations: 4\n  beta: 0.1\nmax_steps: 100\n"
    )
    cfg = load_config(path, ["--trl.beta=0.01", "--max_steps", "5"])
    assert cfg.trl.beta == 0.01
    assert cfg.trl.num_generations == 4  # kept from the file
    assert cfg.max_steps == 5


def test_load_config_override_errors_name_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("base_model: m\ndatasets:\n  - path: d.jsonl\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, ["--lerning_rate=1"])
    assert str(caught.value).startswith(f"{path}: 1 problem(s)")


# ---------------------------------------------------------------- explain


def test_explain_trl_beta_has_default_and_description():
    text = explain("trl.beta")
    assert text.splitlines()[0] == "trl.beta"
    assert "default: None" in text
    assert "KL coefficient (k3 estimator) to the reference" in text
    assert "not built yet" not in text
    assert "not built: custom vLLM server code" in explain("vllm.serve_module")
    assert "not built yet" not in explain("trl.use_vllm")


def test_explain_lora_r_has_default_and_description():
    text = explain("lora_r")
    assert "default: 8" in text
    assert "LoRA rank." in text
    assert "planned" not in text


def test_explain_dataset_key():
    assert "default: 'train'" in explain("datasets.split")


def test_explain_typo_suggests_key():
    with pytest.raises(ConfigError, match="unknown key 'lora_rr': did you mean 'lora_r'"):
        explain("lora_rr")


def test_explain_typo_in_section_suggests_key():
    with pytest.raises(ConfigError, match="did you mean 'trl.num_generations'"):
        explain("trl.num_generaitons")


# ---------------------------------------------------------------- planned settings


def test_planned_setting_is_reported_with_what_is_not_built(config):
    cfg = config(rl="grpo", micro_batch_size=8, vllm={"serve_module": "my.server"})
    assert planned_settings(cfg) == [("vllm.serve_module", "custom vLLM server code")]


def test_planned_setting_at_default_not_reported(config):
    cfg = config(rl="grpo", micro_batch_size=8, trl={"sapo_temperature_pos": 1.0, "use_vllm": True})
    assert planned_settings(cfg) == []


def test_plain_sft_config_has_no_planned_settings(config):
    assert planned_settings(config(learning_rate=1e-4, lora_r=4, adapter="lora")) == []


def test_refuse_unbuilt_method_names_issue(config):
    from rlft.train.unbuilt import refuse_unbuilt

    refuse_unbuilt(config(rl="dpo"))  # built: no refusal


def test_strided_flex_attention_is_accepted_on_a_cpu_and_on_a_gpu(config, monkeypatch):
    import torch

    from rlft.train.unbuilt import refuse_unbuilt

    strided = config(rl="ebft", ebft={"mode": "strided"}, flex_attention=True)
    refuse_unbuilt(strided)  # a CPU: train() runs it on SDPA with the dense mask (tests/integration/test_ebft.py)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    refuse_unbuilt(strided)  # a GPU: flex_attention with the strided BlockMask (tests/unit/test_strided.py)


def test_refuse_unbuilt_setting_on_sft(config):
    from rlft.train.unbuilt import refuse_unbuilt

    with pytest.raises(NotImplementedYet) as caught:
        refuse_unbuilt(config(vllm={"serve_module": "my.server"}))
    assert "  - vllm.serve_module (not built: custom vLLM server code)" in str(caught.value)


@pytest.mark.parametrize("key, value", [("sync_ref_model", True), ("reference_reset_interval", 10)])
def test_reference_moves_are_refused_where_nothing_would_move(config, config_problems, key, value):
    """TR-DPO's reference moves run in the GRPO family's recipe only: a preference method is refused with the reason,
    and GRPO without a KL term (beta 0: no reference model) is a config problem; GRPO with one accepts them."""
    from rlft.train.unbuilt import refuse_unbuilt

    with pytest.raises(NotImplementedYet, match=f"trl.{key} with rl: dpo: moving the reference model during training"):
        refuse_unbuilt(config(rl="dpo", trl={key: value}))
    grpo = {"rl": "grpo", "micro_batch_size": 8, "trl": {"reward_funcs": ["r.f"], key: value}}
    [(_, what)] = config_problems(**grpo)
    assert what.startswith(f"trl.{key} moves the reference model, but trl.beta is 0")
    refuse_unbuilt(config(**{**grpo, "trl": {**grpo["trl"], "beta": 0.04}}))
    structured = {"rl": "ebft", "micro_batch_size": 8, "trl": {key: value, "beta": 0.04}}  # EBFT's structured recipe is GRPO's
    refuse_unbuilt(config(**structured, ebft={"mode": "structured"}))
    with pytest.raises(NotImplementedYet, match=f"trl.{key} with rl: ebft in strided mode"):
        refuse_unbuilt(config(**structured, ebft={"mode": "strided"}))


def test_refuse_unbuilt_accepts_plain_sft(config):
    from rlft.train.unbuilt import refuse_unbuilt

    assert refuse_unbuilt(config()) is None


def test_test_datasets_entry_typo_names_closest_key(config_problems):
    assert ("test_datasets[0].splt", "unknown key 'splt': did you mean 'split'?") in config_problems(
        test_datasets=[{"path": "e.jsonl", "splt": "test"}]
    )


def test_dataset_key_at_top_level_names_its_section(config_problems):
    assert config_problems(vllm={"learning_rate": 1}) == [
        ("vllm.learning_rate", "unknown key 'learning_rate' here; it belongs under learning_rate (top level)")
    ]


# ---------------------------------------------------------------- rollout engine, async, IS correction (trl:)

GRPO = {"rl": "grpo", "micro_batch_size": 8}


def test_rollout_and_is_keys_are_built_not_planned(config):
    from rlft.train.unbuilt import refuse_unbuilt

    trl = {
        "use_vllm": True, "vllm_mode": "server", "vllm_server_host": "10.0.0.2", "vllm_server_port": 8001,
        "vllm_server_timeout": 60, "vllm_sync_interval": 2, "use_data_producer": True, "async_prefetch": True,
        "prefetch_depth": 2, "streaming_partial_batch": True, "streaming_min_groups": 2,
        "vllm_importance_sampling_correction": True, "vllm_importance_sampling_mode": "sequence_mask",
        "vllm_importance_sampling_cap": 2.0, "off_policy_mask_threshold": 0.5, "use_bias_correction_kl": True,
        "replay_buffer_size": 16, "replay_recompute_logps": False, "reroll_start_fraction": 0.5, "reroll_max_groups": 2,
        "allowed_outdated_steps": 4, "vllm_group_port": 6000,
    }
    cfg = config(**GRPO, max_steps=10, trl=trl)
    assert planned_settings(cfg) == []
    assert refuse_unbuilt(cfg) is None


def test_a_weight_group_needs_a_rollout_server(config_problems):
    for trl in ({"vllm_group_port": 6000}, {"vllm_group_port": 6000, "use_vllm": True, "vllm_mode": "colocate"}):
        problems = config_problems(**GRPO, trl=trl)
        assert any("trl.vllm_group_port opens a weight group with a rollout server" in text for _, text in problems)


def test_the_rules_judge_the_trl_keys_as_the_run_resolves_them(config, config_problems, monkeypatch):
    """variant and defaults are applied before the cross-field rules run: the rules see the values the run trains
    with, and each default has one home (rlft.config.rl.DEFAULTS), shared by the rules and rl_settings."""
    from rlft.config import rl
    from rlft.config.rl import rl_settings, trl_options

    cfg = config(**GRPO, trl={"variant": "dapo", "beta": 0.05})
    options = trl_options(cfg)
    assert (options["epsilon_high"], options["overlong_penalty"], options["filter_reward_metric"]) == (0.28, True, "reward")
    assert options["beta"] == 0.05  # a key the user sets wins over the variant
    assert options["num_generations"] == rl.DEFAULTS["num_generations"]
    s = rl_settings(cfg)
    assert (s.epsilon_high, s.beta, s.num_generations, s.loss_type) == (0.28, 0.05, 8, "dapo")
    monkeypatch.setitem(rl.DEFAULTS, "num_generations", 1)
    assert ("combination", "trl.num_generations is 1: group-relative advantages need at least 2 completions per "
            "prompt") in config_problems(**GRPO)


@pytest.mark.parametrize("trl, loss_type, length", [
    ({"loss_type": "seq-mean-token-mean"}, "grpo", 256),
    ({"loss_type": "seq-mean-token-mean", "unbiased_loss_max_tokens": 100}, "dr_grpo", 100),  # Cosmos-RL's Dr. GRPO
    ({"loss_type": "token-mean"}, "token-mean", 256),
    ({"loss_type": "token-mean", "unbiased_loss_max_tokens": 100}, "token-mean", 100),  # ignored there, as in Cosmos-RL
    ({"variant": "dapo", "loss_type": "seq-mean-token-mean"}, "grpo", 256),
])
def test_cosmos_loss_names(config, trl, loss_type, length):
    from rlft.config.rl import rl_settings
    from rlft.train.unbuilt import refuse_unbuilt

    cfg = config(**GRPO, trl=trl)
    settings = rl_settings(cfg)
    assert (settings.loss_type, settings.unbiased_loss_max_tokens) == (loss_type, length)
    assert refuse_unbuilt(cfg) is None


def test_rl_settings_defaults_for_a_sync_run(config):
    from rlft.config.rl import rl_settings

    s = rl_settings(config(**GRPO))
    assert (s.use_vllm, s.vllm_mode, s.server_port, s.server_timeout) == (False, "server", 8000, 240.0)
    assert s.server_host == "127.0.0.1"  # the schema default 0.0.0.0 is a listen address
    assert (s.lora_sync, s.sync_interval, s.async_prefetch, s.prefetch_depth, s.streaming, s.streaming_min_groups) == (
        False, 1, False, 1, False, 1)
    assert (s.is_correction, s.is_level, s.is_mode, s.is_cap) == (False, "token", "truncate", 3.0)
    assert (s.off_policy_mask_threshold, s.bias_correction_kl) == (None, False)
    assert (s.decoupled_loss, s.behav_imp_weight_cap) == (False, None)
    assert (s.replay_buffer_size, s.replay_recompute_logps, s.reroll_start_fraction, s.reroll_max_groups) == (0, True, 1.0, 1)
    assert s.allowed_outdated_steps is None
    assert (s.outdated_fetch_prompts, s.max_retry_for_on_policy, s.min_filter_prefix_tokens) == (0, None, 0)
    assert s.reset_optimizer_with_reference
    assert not s.needs_sampling_correction


@pytest.mark.parametrize("trl", [{"use_vllm": True}, {"async_prefetch": True}, {"replay_buffer_size": 4},
                                 {"vllm_sync_interval": 2}])
def test_is_correction_defaults_on_with_an_engine_or_async(config, trl):
    """Wherever rows can be sampled by older weights than the trainer's: a server, prefetching, replayed rows, or an
    in-process engine synced every few steps."""
    from rlft.config.rl import rl_settings

    s = rl_settings(config(**GRPO, trl=trl))
    assert s.is_correction and s.needs_sampling_correction
    assert s.raw["vllm_importance_sampling_correction"] is True  # trainer.args sees the resolved value


@pytest.mark.parametrize("trl, skips", [({}, True), ({"beta": 0.04}, False), ({"entropy_coeff": 0.01}, False),
                                        ({"skip_zero_advantage_batches": False}, False)])
def test_all_zero_advantages_skip_the_step_only_when_nothing_else_trains(config, trl, skips):
    """A KL term (beta) pulls the policy towards the reference and an entropy term moves it, whatever the advantages:
    those steps run, as TRL runs them."""
    from rlft.config.rl import rl_settings

    settings = rl_settings(config(**GRPO, trl=trl))
    assert settings.skip_zero_advantage_batches is skips
    assert settings.raw["skip_zero_advantage_batches"] is skips  # trainer.args sees the resolved value


@pytest.mark.parametrize("ce_coef, skips", [(0.0, True), (0.03, False)])
def test_ebft_cross_entropy_keeps_all_zero_advantage_steps(config, ce_coef, skips):
    """Structured EBFT's cross-entropy on the ground truth trains whatever the advantages."""
    from rlft.config.rl import rl_settings

    cfg = config(rl="ebft", micro_batch_size=8, ebft={"mode": "structured", "ce_coef": ce_coef})
    assert rl_settings(cfg).skip_zero_advantage_batches is skips


def test_decoupled_loss_turns_the_default_is_correction_off(config):
    from rlft.config.rl import rl_settings

    s = rl_settings(config(**GRPO, trl={"use_vllm": True, "use_decoupled_loss": True, "behav_imp_weight_cap": 5.0}))
    assert (s.decoupled_loss, s.behav_imp_weight_cap, s.is_correction) == (True, 5.0, False)
    assert s.needs_sampling_correction


@pytest.mark.parametrize("mode,level,kind", [
    ("token_truncate", "token", "truncate"), ("token_mask", "token", "mask"),
    ("sequence_truncate", "sequence", "truncate"), ("sequence_mask", "sequence", "mask"),
])
def test_is_mode_splits_into_level_and_kind(config, mode, level, kind):
    from rlft.config.rl import rl_settings

    s = rl_settings(config(**GRPO, trl={"vllm_importance_sampling_mode": mode, "vllm_importance_sampling_cap": 2.5}))
    assert (s.is_level, s.is_mode, s.is_cap) == (level, kind, 2.5)


@pytest.mark.parametrize("host,expected", [("0.0.0.0", "127.0.0.1"), ("::", "::1"), ("gpu-node-3", "gpu-node-3")])
def test_listen_address_becomes_a_client_address(config, host, expected):
    from rlft.config.rl import rl_settings

    assert rl_settings(config(**GRPO, trl={"use_vllm": True, "vllm_server_host": host})).server_host == expected


@pytest.mark.parametrize("cap,words", [(0, "IS cap <= 0"), (-1.0, "IS cap <= 0"), (0.5, "IS cap 0.5 < 1: the floor 1/C")])
def test_is_cap_below_one_refused(config_problems, cap, words):
    [(where, what)] = config_problems(**GRPO, trl={"vllm_importance_sampling_cap": cap})
    assert where == "trl.vllm_importance_sampling_cap"
    assert what.startswith(words)


def test_is_cap_of_one_accepted(config):
    assert config(**GRPO, trl={"vllm_importance_sampling_cap": 1.0}).trl.vllm_importance_sampling_cap == 1.0


def test_async_prefetch_with_depth_zero(config_problems, config):
    assert config_problems(**GRPO, trl={"async_prefetch": True, "prefetch_depth": 0}) == [("combination", (
        "trl.prefetch_depth is 0 with trl.async_prefetch: true: prefetch_depth counts the rollout batches generated "
        "ahead and must be >= 1 (1 is the usual choice), or set async_prefetch: false"))]
    assert config(**GRPO, trl={"prefetch_depth": 0}).trl.prefetch_depth == 0  # sync: nothing is generated ahead


def test_allowed_outdated_steps_below_the_prefetch_age_throttles_and_below_the_sync_interval_is_refused(config_problems,
                                                                                                          config):
    # below the age prefetch_depth alone would give (2 batches ahead): a throttle, the producer waits
    assert config(**GRPO, trl={"async_prefetch": True, "prefetch_depth": 2, "allowed_outdated_steps": 0}).trl.prefetch_depth == 2
    # below vllm_sync_interval - 1: even a batch sampled on demand is that old
    [(_, what)] = config_problems(**GRPO, trl={"allowed_outdated_steps": 1, "vllm_sync_interval": 4})
    assert what.startswith("trl.allowed_outdated_steps = 1 is below vllm_sync_interval - 1 = 3: the engine gets new "
                           "weights every 4 optimizer steps")
    assert config(**GRPO, trl={"allowed_outdated_steps": 3, "vllm_sync_interval": 4}).trl.allowed_outdated_steps == 3


def test_lora_sync_without_adapter(config_problems, config):
    assert config_problems(**GRPO, trl={"use_vllm": True, "vllm_lora_sync": True}) == [("combination", (
        "trl.vllm_lora_sync sends the LoRA adapter: set adapter: lora, or remove vllm_lora_sync to send full weights"))]
    assert config(**GRPO, adapter="lora", trl={"vllm_lora_sync": True}).trl.vllm_lora_sync


def test_lora_rank_above_server_max_lora_rank(config_problems, config):
    [(_, what)] = config_problems(**GRPO, adapter="lora", lora_r=32, vllm={"max_lora_rank": 16}, trl={"vllm_lora_sync": True})
    assert what == ("lora_r = 32 is above vllm.max_lora_rank = 16: the server would refuse the adapter sent by "
                    "trl.vllm_lora_sync; raise vllm.max_lora_rank to at least 32")
    assert config(**GRPO, adapter="lora", lora_r=16, vllm={"max_lora_rank": 16}, trl={"vllm_lora_sync": True})
    assert config(**GRPO, adapter="lora", lora_r=32, vllm={"max_lora_rank": 16})  # full-weight sync: rank irrelevant


def test_decoupled_loss_with_explicit_is_correction(config_problems, config):
    [(_, what)] = config_problems(**GRPO, trl={"use_decoupled_loss": True, "vllm_importance_sampling_correction": True})
    assert what.startswith("trl.use_decoupled_loss and trl.vllm_importance_sampling_correction: true both weight")
    assert "pick one" in what
    assert config(**GRPO, trl={"use_decoupled_loss": True, "vllm_importance_sampling_correction": False})


def test_behav_imp_weight_cap_without_decoupled_loss(config_problems):
    [(_, what)] = config_problems(**GRPO, trl={"behav_imp_weight_cap": 5.0})
    assert what.startswith("trl.behav_imp_weight_cap caps the decoupled loss's behaviour weight: set trl.use_decoupled_loss")


def test_streaming_min_groups_without_streaming(config_problems, config):
    assert config_problems(**GRPO, trl={"streaming_min_groups": 2}) == [("combination", (
        "trl.streaming_min_groups sizes the chunks of streaming scoring: set trl.streaming_partial_batch: true, "
        "or remove streaming_min_groups"))]
    assert config(**GRPO, trl={"streaming_partial_batch": True, "streaming_min_groups": 2}).trl.streaming_min_groups == 2


def test_reroll_without_max_steps(config_problems, config):
    assert config_problems(**GRPO, trl={"reroll_start_fraction": 0.5}) == [("combination", (
        "trl.reroll_start_fraction = 0.5 is a fraction of max_steps, which is not set: set max_steps, or remove "
        "reroll_start_fraction (1.0 = no re-roll)"))]
    assert config(**GRPO, max_steps=100, trl={"reroll_start_fraction": 0.5}).trl.reroll_start_fraction == 0.5


ENGINE_KEYS = {"on_policy": True, "outdated_rollout_fetch_batch_size": 2, "max_retry_for_on_policy": 3,
               "min_filter_prefix_tokens": 8, "reset_optimizer_with_reference": False, "vllm_group_port": 6000}


@pytest.mark.parametrize("method", [{}, {"rl": "dpo"}, {"rl": "ipo"}, {"rl": "kto", "micro_batch_size": 2}, {"rl": "orpo"},
                                    {"rl": "simpo"}, {"reward_model": True}])
def test_trl_keys_only_a_rollout_engine_reads_are_refused_for_methods_without_one(config_problems, method):
    [(_, what)] = config_problems(**method, trl=ENGINE_KEYS)
    named = ", ".join(f"trl.{key}" for key in ENGINE_KEYS)
    assert what.startswith(f"{named} are read only where a rollout engine generates (rl: grpo, gdpo, or ebft in "
                           "structured mode), not by "), what
    [(_, what)] = config_problems(**method, trl={"use_vllm": False})  # a value at its default, written, is refused too
    assert what.startswith("trl.use_vllm is read only where a rollout engine generates") and what.endswith("remove it")


def test_trl_keys_methods_without_an_engine_read_are_not_refused(config):
    from rlft.config.rl import preference_beta
    from rlft.config.rules.online import engine_only
    from rlft.train.unbuilt import refuse_unbuilt

    assert preference_beta(config(rl="dpo", trl={"beta": 0.3})) == 0.3
    assert not any(engine_only(key) for key in ("beta", "sync_ref_model", "reference_reset_interval", "use_liger_loss"))
    with pytest.raises(NotImplementedYet, match="trl.use_liger_loss"):  # an Axolotl key: refused by train, its own way
        refuse_unbuilt(config(rl="dpo", trl={"use_liger_loss": True}))
    config(rl="grpo", micro_batch_size=8, trl={"reward_funcs": ["m.r"], "min_filter_prefix_tokens": 8, "use_vllm": False})
    config(rl="ebft", micro_batch_size=8, ebft={"mode": "structured"}, trl={"min_filter_prefix_tokens": 8})


def test_strided_ebft_refuses_rollout_engine_keys(config_problems):
    problems = config_problems(rl="ebft", ebft={"mode": "strided"}, trl={"use_vllm": True, "async_prefetch": True})
    assert ("combination", "trl.use_vllm, trl.async_prefetch are read only where a rollout engine generates (rl: grpo, gdpo, "
            "or ebft in structured mode), not by ebft in strided mode, which generates its blocks inside each document in "
            "the trainer: remove them") in problems


def test_replay_with_recorded_logps_and_sampling_filters_is_refused(config_problems, config):
    [(_, what)] = config_problems(**GRPO, trl={"replay_buffer_size": 4, "replay_recompute_logps": False, "top_p": 0.9})
    assert what.startswith("trl.replay_recompute_logps: false with trl.top_p: a replayed row would keep the log-probs")
    assert config(**GRPO, trl={"replay_buffer_size": 4, "replay_recompute_logps": False, "top_k": -1})


def test_qlora_against_a_server_needs_adapter_sync(config_problems):
    problems = config_problems(**GRPO, adapter="qlora", load_in_4bit=True, trl={"use_vllm": True})
    assert any(what.startswith("adapter: qlora with trl.use_vllm sends merged weights") for _, what in problems)


NEMO = {"rl": "grpo", "micro_batch_size": 8, "plugins": ["axolotl.integrations.nemo_gym.NemoGymPlugin"],
        "nemo_gym_auto_start": False, "nemo_gym_datasets": [{"path": "data/t.jsonl", "server_name": "math"}]}


def test_nemo_gym_config_of_the_guide_validates_without_datasets(config):
    cfg = config(**{**NEMO, "datasets": []})
    from rlft.config.plugins import nemo_gym_enabled

    assert nemo_gym_enabled(cfg) and cfg.nemo_gym_head_port == 11000 and cfg.nemo_gym_verify_timeout == 30


@pytest.mark.parametrize("change,words", [
    ({"plugins": ["my.Plugin"], "nemo_gym_enabled": True}, "plugins: my.Plugin is not one of Axolotl's plugins"),
    ({"plugins": None}, "nemo_gym_datasets is set but NeMo Gym is off"),
    ({"nemo_gym_datasets": None}, "NeMo Gym is on and nemo_gym_datasets is empty"),
    ({"rl": "dpo"}, "NeMo Gym environments score online-RL rollouts"),
])
def test_nemo_gym_combinations_name_the_fix(config_problems, change, words):
    problems = config_problems(**{**NEMO, **change})
    assert any(what.startswith(words) for _, what in problems), problems


@pytest.mark.parametrize("change,words", [
    ({"nemo_gym_auto_start": True}, "nemo_gym_auto_start is true (the default) but nemo_gym_config_paths is empty"),
    ({"nemo_gym_max_turns": 4}, "nemo_gym_max_turns limits multi-turn episodes: set nemo_gym_multi_turn: true"),
    ({"nemo_gym_multi_turn": True}, "nemo_gym_multi_turn: true: the Gym agent calls the policy over HTTP"),
    ({"nemo_gym_multi_turn": True, "trl": {"use_vllm": True, "vllm_mode": "colocate"}}, "nemo_gym_multi_turn: true: the Gym agent"),
    ({"nemo_gym_multi_turn": True, "trl": {"use_vllm": True, "reward_funcs": [
        "axolotl.integrations.nemo_gym.rewards.reward_nemo_gym_verify"]}}, "trl.reward_funcs: axolotl.integrations.nemo_gym"),
    ({"nemo_gym_multi_turn": True, "trl": {"use_vllm": True, "rollout_func": "m.f"}}, "trl.rollout_func and nemo_gym_multi_turn"),
    ({"nemo_gym_multi_turn": True, "trl": {"use_vllm": True, "top_k": 20, "min_p": 0.05}},
     "trl.top_k: 20, trl.min_p: 0.05 with nemo_gym_multi_turn: the Gym agent sends the rollout server temperature and top_p"),
    ({"nemo_gym_multi_turn": True, "trl": {"use_vllm": True, "repetition_penalty": 1.1}}, "trl.repetition_penalty: 1.1 with"),
])
def test_nemo_gym_auto_start_and_multi_turn_combinations_name_the_fix(config_problems, change, words):
    problems = config_problems(**{**NEMO, **change})
    assert any(what.startswith(words) for _, what in problems), problems


def test_nemo_gym_multi_turn_with_the_rollout_server_and_auto_start_with_configs_validate(config):
    cfg = config(**{**NEMO, "nemo_gym_multi_turn": True, "nemo_gym_max_turns": 3, "nemo_gym_auto_start": True,
                    "nemo_gym_config_paths": ["a.yaml"], "trl": {"use_vllm": True, "top_k": -1, "top_p": 0.9, "reward_funcs": [
                        "axolotl.integrations.nemo_gym.rewards.reward_env"]}})
    assert cfg.nemo_gym_multi_turn and cfg.nemo_gym_run_timeout == 300 and cfg.nemo_gym_server_timeout == 360


def test_nemo_gym_refuses_evaluation_keys_it_would_ignore(config_problems):
    problems = config_problems(**{**NEMO, "val_set_size": 0.1})
    assert any(what.startswith("val_set_size with NeMo Gym: evaluation on Gym tasks is not built yet") for _, what in problems)


def test_generation_kwargs_stop_token_ids_end_completions_besides_eos(config, config_problems):
    """Axolotl's Qwen 3.5 EBFT examples pass vLLM's stop_token_ids; the in-process engine stops on them as on EOS."""
    from rlft.config.rl import rl_settings
    from rlft.data.tokenizer import byte_tokenizer
    from rlft.rollout.types import sampling_params

    tok = byte_tokenizer()
    s = rl_settings(config(**GRPO, trl={"generation_kwargs": {"stop_token_ids": [7, 9], "stop": "###"}}))
    assert s.stop_token_ids == (7, 9) and s.stop_strings == ("###",)
    assert sampling_params(s, (tok.eos_token_id,)).stop_token_ids == (tok.eos_token_id, 7, 9)
    s = rl_settings(config(**GRPO, trl={"generation_kwargs": {"stop_token_ids": [7], "ignore_eos": True}}))
    assert sampling_params(s, (tok.eos_token_id, 5)).stop_token_ids == (7,)  # ignore_eos ignores EOS only, as in vLLM
    for bad, words in (({"stop_token_ids": "7"}, "list of token ids"), ({"stop_token_ids": [-1]}, "list of token ids"),
                       ({"stop": [""]}, "non-empty strings"), ({"ignore_eos": "yes"}, "true or false")):
        assert words in messages(config_problems(**GRPO, trl={"generation_kwargs": bad}))


def test_completions_end_at_the_generation_configs_eos_ids_too(tmp_path, monkeypatch):
    """Gemma's instruct models end a turn with <end_of_turn> (106), which their generation_config.json lists beside
    the tokenizer's <eos> (1); Qwen's list <|im_end|> and <|endoftext|>. vLLM and transformers' generate stop at all
    of them, and so does rlft's engine (the run's stop ids); a folder without the file: the tokenizer's EOS."""
    import json

    from rlft.data.tokenizer import byte_tokenizer, end_ids

    tok = byte_tokenizer()
    assert end_ids(tmp_path, tok) == (tok.eos_token_id,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [106, tok.eos_token_id, 1]}))
    assert end_ids(tmp_path, tok) == (tok.eos_token_id, 106, 1)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 106}))
    assert end_ids(tmp_path, tok) == (tok.eos_token_id, 106)
    checkpoint = tmp_path / "checkpoint-300"  # base_model: an rlft checkpoint, whose model is in its model/ folder
    (checkpoint / "model").mkdir(parents=True)
    (checkpoint / "model" / "generation_config.json").write_text(json.dumps({"eos_token_id": [107]}))
    assert end_ids(str(checkpoint), tok) == (tok.eos_token_id, 107)
    monkeypatch.setenv("HOME", str(tmp_path))  # base_model written as ~/...
    assert end_ids("~/checkpoint-300", tok) == (tok.eos_token_id, 107)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "generation_config.json").write_text(json.dumps({"eos_token_id": [108]}))
    assert end_ids("~/plain", tok) == (tok.eos_token_id, 108)  # before: read as a hub id, and the tokenizer's EOS alone
    from types import SimpleNamespace

    from rlft.config import build_config
    from rlft.train.recipes.grpo import GRPORecipe

    cfg = build_config({"base_model": str(tmp_path), "datasets": [{"path": "x.jsonl"}], "rl": "grpo", "micro_batch_size": 4,
                        "trl": {"num_generations": 2, "reward_funcs": ["r.f"], "generation_kwargs": {"stop_token_ids": [7]}}})
    recipe = GRPORecipe(cfg, resolve(cfg), SimpleNamespace(train=[], eval=[]), tok, None, None)
    assert recipe.sampling.stop_token_ids == (tok.eos_token_id, 106, 7)


@pytest.mark.parametrize("method, key, value, acts_in", [
    ("orpo", "dpo_ld_alpha", 0.5, "dpo or ipo"), ("simpo", "dpo_use_weighting", True, "dpo or ipo"),
    ("kto", "dpo_loss_type", ["hinge"], "dpo or ipo"), ("dpo", "cpo_loss_type", "hinge", "simpo"),
    ("dpo", "simpo_gamma", 1.0, "simpo"), ("dpo", "orpo_alpha", 0.5, "orpo"), ("dpo", "kto_desirable_weight", 2.0, "kto"),
    ("orpo", "dpo_label_smoothing", 0.1, "dpo or ipo or simpo"), ("grpo", "orpo_nll_span", "sequence", "orpo"),
])
def test_a_preference_losss_own_key_under_another_method_is_refused(config_problems, method, key, value, acts_in):
    """Each loss reads its own keys; set for another method they would do nothing (and dpo_use_weighting would build
    the whole logits for nothing): refused, naming the methods it acts in."""
    problems = config_problems(rl=method, **{key: value})
    assert ("combination", f"{key}: {value} acts only with rl: {acts_in}, and this config trains {method}: remove it") in problems


def test_a_preference_keys_default_or_own_method_passes(config):
    """A pasted config that sets another method's key to its default (off) value, or a method's own key, validates."""
    assert config(rl="orpo", dpo_use_weighting=False, dpo_discopop_tau=0.05, orpo_alpha=0.2).orpo_alpha == 0.2
    assert config(rl="simpo", dpo_label_smoothing=0.1, simpo_gamma=1.0).simpo_gamma == 1.0


def test_a_set_sequence_len_without_room_for_grpo_prompts_is_refused_at_validation(config_problems, config):
    grpo = {"rl": "grpo", "micro_batch_size": 8, "trl": {"reward_funcs": ["r.f"], "max_completion_length": 512}}
    assert any(what.startswith("sequence_len 512 leaves no room for prompts next to trl.max_completion_length 512")
               for _, what in config_problems(**grpo, sequence_len=512))
    assert config(**grpo).sequence_len == 512  # unset: prompts are not limited (as in Axolotl), nothing to refuse
    assert config(**grpo, sequence_len=512, skip_prepare_dataset=True).skip_prepare_dataset


def test_beta_follows_axolotls_precedence(config, config_problems):
    """Axolotl gives every method `trl.beta`, else `rl_beta`, else (ORPO) `orpo_alpha` (its core/builders/rl.py): a DPO
    config's trl.beta was ignored (beta 0.1 trained), a GRPO config's rl_beta too (no KL)."""
    from rlft.config.rl import orpo_lambda, preference_beta, rl_settings

    assert preference_beta(config(rl="dpo")) == 0.1
    assert preference_beta(config(rl="dpo", rl_beta=0.3)) == 0.3
    assert preference_beta(config(rl="kto", micro_batch_size=2, rl_beta=0.3, trl={"beta": 0.5})) == 0.5
    assert orpo_lambda(config(rl="orpo", orpo_alpha=0.2)) == 0.2
    assert orpo_lambda(config(rl="orpo", orpo_alpha=0.2, rl_beta=0.3)) == 0.3
    assert orpo_lambda(config(rl="orpo", orpo_alpha=0.2, rl_beta=0.3, trl={"beta": 0.4})) == 0.4
    grpo = {"rl": "grpo", "micro_batch_size": 8, "trl": {"reward_funcs": ["r.f"]}}
    assert rl_settings(config(**grpo)).beta == 0.0
    assert rl_settings(config(**grpo, rl_beta=0.04)).beta == 0.04
    assert rl_settings(config(**{**grpo, "trl": {"reward_funcs": ["r.f"], "beta": 0.01}}, rl_beta=0.04)).beta == 0.01
    assert any("trl.beta is dpo's beta here" in what for _, what in config_problems(rl="dpo", trl={"beta": 0.0}))


def test_chat_template_jinja_alone_means_jinja_and_a_mismatch_is_refused(config, config_problems):
    """Axolotl sets chat_template: jinja when only chat_template_jinja is given (it was ignored here: the tokenizer's
    own template trained); jinja without the text, or the text beside another named template, is refused."""
    assert config(chat_template_jinja="{{ messages }}").chat_template == "jinja"
    assert ("combination", "chat_template: jinja needs chat_template_jinja (the template text or a .jinja file path)") in \
        config_problems(chat_template="jinja")
    assert any(what.startswith("chat_template_jinja is read with chat_template: jinja")
               for _, what in config_problems(chat_template="chatml", chat_template_jinja="{{ messages }}"))


@pytest.mark.parametrize("trl, words", [
    ({"generation_batch_size": 12}, "trl.generation_batch_size = 12 is not a whole number of optimizer steps' rows "
                                    "(micro_batch_size * gradient_accumulation_steps * processes = 8)"),
    ({"generation_batch_size": 4}, "trl.generation_batch_size = 4 is not a whole number"),
    ({"generation_batch_size": 16, "steps_per_generation": 2}, "trl.generation_batch_size and trl.steps_per_generation both"),
])
def test_a_generation_batch_of_part_steps_or_sized_twice_is_refused(config_problems, trl, words):
    """A generation batch is cut into optimizer steps of micro_batch_size x accumulation x processes rows: 12 rows at 8
    per step trained a step of 4; and with steps_per_generation too it held 32 completions where 16 were asked for."""
    problems = config_problems(rl="grpo", micro_batch_size=4, gradient_accumulation_steps=2,
                               trl={"num_generations": 4, "reward_funcs": ["r.f"], **trl})
    assert any(what.startswith(words) for _, what in problems), problems


def test_unset_keys_take_axolotls_defaults(config_dict):
    """An Axolotl config that leaves these out writes where Axolotl writes and keeps as many checkpoints
    (warm-up: tests/unit/test_optim.py)."""
    cfg = build_config(config_dict())
    assert (cfg.output_dir, cfg.save_total_limit) == ("./model-out", 4)
    assert build_config(config_dict(save_total_limit=None)).save_total_limit == 4  # an empty key is unset
    assert build_config(config_dict(save_total_limit=0)).save_total_limit == 4  # Axolotl's `save_total_limit or 4`
    # -1: every checkpoint kept, as transformers' rotation reads what Axolotl passes on (Cosmos-RL's max_keep: -1)
    assert build_config(config_dict(save_total_limit=-1)).save_total_limit == -1
    assert build_config(config_dict()).save_mode == "sync"


def test_test_datasets_with_val_set_size_is_refused(config_problems, config):
    """Axolotl refuses the pair (check_val_w_test_datasets): evaluation reads test_datasets, so val_set_size would hold
    nothing out and be ignored."""
    problems = config_problems(test_datasets=[{"path": "eval.jsonl"}], val_set_size=0.1)
    assert ("combination", "test_datasets and val_set_size are both set: evaluation takes test_datasets, so val_set_size "
            "would hold nothing out; keep one") in problems
    assert config(test_datasets=[{"path": "eval.jsonl"}]).val_set_size == 0.0


def test_every_method_has_a_spec(config):
    """rlft.config.methods holds one spec per value of `method` (`sft`, `reward_model`, every `rl:`), EBFT's in each mode."""
    import typing

    from rlft.config.methods import METHODS, method_spec, spec_of
    from rlft.config.schema import RlMethod

    assert set(METHODS) == {"sft", "reward_model", *typing.get_args(RlMethod)}
    assert config(rl="dpo").method == "dpo" and spec_of(config(reward_model=True)).sequence_classification
    structured, strided = method_spec("ebft"), method_spec("ebft", "strided")
    assert (structured.mode, structured.engine, structured.flattens) == ("structured", True, True)
    assert (strided.mode, strided.engine, strided.flattens, strided.data) == ("strided", False, False, "text")
    assert [name for name, spec in METHODS.items() if spec.needs_reference] == ["dpo", "ipo", "kto"]
