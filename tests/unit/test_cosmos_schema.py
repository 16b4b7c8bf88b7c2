"""Cosmos-RL's schema as rlft holds it (src/rlft/config/cosmos/schema.json), the generator that wrote it from the text
extraction of Cosmos-RL's JSON schema, and the check of a file against it."""

from __future__ import annotations

import importlib.util

import pytest

from rlft.config.cosmos.schema import SCHEMA, all_keys, check, effective, find, policy_section, policy_type, unknown_path


def test_known_keys_have_their_type_default_and_description():
    kl = find("train.train_policy.kl_beta")
    assert (kl.entry["types"], kl.default, kl.section) == (["number"], 0.0, "GrpoConfig")
    assert "KL coefficient" in kl.description
    assert find("policy.parallelism.tp_size").default == 2  # Cosmos-RL's default, not 1
    assert find("rollout.parallelism.dp_shard_size").default == -1
    assert find("train.ckpt.save_mode").default == "async"
    assert find("train.optm_betas").default == [0.9, 0.999]
    assert find("train.train_policy.balance_dp_token", "sft").default is True
    assert find("train.train_policy.balance_dp_token", "grpo").default is False
    assert find("train.train_policy.reward_function").entry["types"] == ["string", "array", "object"]
    assert find("policy.lora").entry == {"section": "LoraConfig", "nullable": True, "description": "LoRA configuration"}
    assert find("redis").default == ""  # a launcher key Cosmos-RL's schema hides from its docs
    assert find("distillation.enable").later and not kl.later


def test_every_section_of_the_schema_is_there_and_every_key_described():
    expected = {"Config", "CheckpointConfig", "DatasetConfig", "FP4Config", "FP8Config", "GrpoConfig", "LoggingConfig",
                "LoraConfig", "MultiTurnRolloutConfig", "OverlongRewardConfig", "ParallelismConfig", "PolicyConfig",
                "ProfilerConfig", "RolloutConfig", "RolloutParallelismConfig", "SFTDataConfig", "SamplingConfig",
                "SubProfilerConfig", "TrainingConfig", "ValidationConfig", "DistillationConfig"}
    assert set(SCHEMA) == expected
    plain = [k for k in all_keys() if not k.is_section]
    assert len(plain) > 200
    assert not [k.path for k in plain if not k.description and k.name != "type"]


@pytest.mark.parametrize("data,path,words", [
    ({"train": {"train_policy": {"type": "grpo", "kl_beta": "high"}}}, "train.train_policy.kl_beta",
     "expected a number, got 'high'"),
    ({"rollout": {"n_generation": 2.5}}, "rollout.n_generation", "expected a whole number"),
    ({"train": {"optm_lr": True}}, "train.optm_lr", "expected a number or a list of numbers"),
    ({"policy": {"parallelism": 4}}, "policy.parallelism", "expected a table"),
    ({"logging": {"logger": "wandb"}}, "logging.logger", "expected a list of strings"),
    ({"train": {"train_policy": {"type": "dpo"}}}, "train.train_policy.type", "not a Cosmos-RL policy type"),
])
def test_a_wrong_type_names_the_expected_type(data, path, words):
    found = [f for f in check(data) if not f.unknown]
    assert [f.path for f in found] == [path] and words in found[0].message, found


def test_an_unknown_key_names_the_closest_valid_key():
    found = check({"train": {"train_policy": {"type": "grpo", "kl_bta": 0.1}}, "policy": {"paralelism": {}}})
    assert all(f.unknown for f in found)
    messages = {f.path: f.message for f in found}
    assert "did you mean 'train.train_policy.kl_beta'?" in messages["train.train_policy.kl_bta"]
    assert "did you mean 'policy.parallelism'?" in messages["policy.paralelism"]
    assert "it belongs under train.train_policy" in check({"train": {"mu_iterations": 2}})[0].message
    assert unknown_path("rollout.sampling_config.topp").endswith("did you mean 'rollout.sampling_config.top_p'?")


def test_the_policy_type_follows_cosmos_rl():
    assert policy_section({"type": "sft"}) == "SFTDataConfig"
    assert policy_section({"kl_beta": 0.1}) == "GrpoConfig"  # Cosmos-RL's rule: a GRPO key without `type`
    assert policy_section({"mini_batch": 2}) == "SFTDataConfig"


def test_a_file_without_a_policy_table_is_read_as_a_grpo_policy():
    """Cosmos-RL's TrainingConfig.train_policy defaults to a GRPO policy; a table without `type` is Cosmos-RL's guess."""
    assert effective({})["train"]["train_policy"]["type"] == "grpo" and policy_type({}) == "grpo"
    assert effective({"train": {"epoch": 2}})["train"]["train_policy"]["reward_function"] == ["single_choice"]
    assert policy_type({"train": {"epoch": 2}}) == "grpo"
    assert effective({"train": {"train_policy": {}}})["train"]["train_policy"]["type"] == "sft"
    assert policy_type({"train": {"train_policy": {}}}) == "sft"


def test_effective_fills_cosmos_rl_defaults():
    full = effective({"train": {"train_policy": {"type": "sft"}}, "policy": {"lora": {"r": 16}}})
    assert full["train"]["optm_lr"] == 1e-6 and full["train"]["train_policy"]["conversation_column_name"] == "conversations"
    assert full["policy"]["lora"]["r"] == 16 and full["policy"]["lora"]["lora_alpha"] == 8.0
    assert effective({})["policy"]["lora"] is None


EXTRACT = """Config |
|||||
type |
object |
||||
properties |
|||||
|
#/$defs/PolicyConfig |
||||
$defs |
|||||
|
PolicyConfig |
||||
type |
object |
||||
properties |
|||||
|
LoRA configuration |
||||
default |
None |
||||
anyOf |
#/$defs/LoraConfig |
||||
type |
null |
||||
|
Model Max Length |
||||
The maximum length |
|||||
type |
integer |
||||
default |
4096 |
||||
|
Target Modules |
||||
LoRA target modules |
|||||
anyOf |
type |
array |
|||
items |
type |
string |
|||
type |
string |
||||
|
Trainable Map |
||||
Mapping of name -> bool |
|||||
default |
None |
||||
anyOf |
type |
object |
|||
additionalProperties |
type |
boolean |
|||
type |
null |
||||
"""


def test_the_generator_reads_the_extraction_format(repo_root):
    spec = importlib.util.spec_from_file_location("gen_cosmos_schema", repo_root / "docs" / "gen_cosmos_schema.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    models = gen.parse(EXTRACT)
    policy = models["PolicyConfig"]
    assert models["Config"]["policy"]["section"] == "PolicyConfig"
    assert policy["lora"] == {"section": "LoraConfig", "nullable": True, "description": "LoRA configuration"}
    assert policy["model_max_length"] == {"types": ["integer"], "description": "The maximum length", "default": 4096}
    assert policy["target_modules"]["types"] == ["array", "string"] and policy["target_modules"]["items"] == ["string"]
    assert policy["trainable_map"] == {"types": ["object", "null"], "values": ["boolean"], "description":
                                       "Mapping of name -> bool", "default": None}
