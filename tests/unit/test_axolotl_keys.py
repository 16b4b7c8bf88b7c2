"""Axolotl's config idioms and keys: empty values, per-epoch cadences, padding and packing switches."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from rlft.config.settings import resolve
from rlft.config.settings.model import adapter_settings, model_settings
from rlft.data.batches import BatchPlan
from rlft.data.collate import pad_batch
from rlft.train.step_counts import every


def test_an_empty_key_means_unset(config):
    cfg = config(fp16=None, lora_r=None, wandb_project=None, trl={"beta": None})
    assert cfg.fp16 is False and cfg.lora_r == 8 and cfg.trl.beta == config().trl.beta


def test_an_empty_key_inside_a_dataset_means_unset(config):
    assert config(datasets=[{"path": "train.jsonl", "split": None}]).datasets[0].split == "train"


def test_null_keeps_its_own_meaning_where_it_has_one(config):
    assert config(rl="grpo", micro_batch_size=8, trl={"reward_funcs": ["m.r"], "reward_timeout": None}).trl.reward_timeout is None


def test_an_empty_unknown_key_is_still_reported(config_problems):
    assert config_problems(fp61=None) == [("fp61", "unknown key 'fp61': did you mean 'fp16'?")]


@pytest.mark.parametrize("steps, per_epoch, epoch_steps, expected", [
    (None, None, 10, None),  # neither: at the end only
    (3, None, 10, 3),
    (None, 2, 10, 5),
    (None, 4, 10, 2),  # 10 // 4
    (None, 4, 2, 1),  # more evals than steps: every step
    (None, 0, 10, None),  # 0 per epoch (Axolotl's idiom): at the end only
])
def test_every_from_steps_or_per_epoch(steps, per_epoch, epoch_steps, expected):
    assert every(steps, per_epoch, epoch_steps) == expected


def test_steps_and_per_epoch_together_refused(config_problems):
    assert config_problems(save_steps=5, saves_per_epoch=2) == [("combination", "save_steps and saves_per_epoch are both set: keep one")]
    assert ("evals_per_epoch", "must be >= 0, got -1") in config_problems(evals_per_epoch=-1)


def test_pad_to_a_width():
    batch = pad_batch([{"input_ids": [5, 6], "labels": [5, 6]}], pad_id=0, width=4)
    assert batch["input_ids"].tolist() == [[5, 6, 0, 0]] and batch["labels"].tolist() == [[5, 6, -100, -100]]
    assert batch["num_tokens"] == 2


def test_plan_width_pads_packed_rows_too():
    rows = [{"input_ids": [1, 2], "labels": [1, 2]}, {"input_ids": [3], "labels": [3]}]
    packed = BatchPlan(rows, 1, 0, 0, pack_capacity=8, width=8).sequential()
    assert [b["input_ids"].shape[1] for b in packed] == [8]


def test_sft_only_switches_refused_for_preference(config_problems):
    assert config_problems(rl="dpo", eval_sample_packing=True) == [("combination", "eval_sample_packing applies to SFT only, not dpo")]


def test_pad_to_sequence_len_applies_to_pair_batches_not_to_online_rl(config, config_problems):
    """Axolotl pads reward-model and preference batches too (its examples/qwen3/reward-model.yaml sets it)."""
    assert config(rl="dpo", pad_to_sequence_len=True).pad_to_sequence_len
    assert config(rl="kto", micro_batch_size=2, pad_to_sequence_len=True).pad_to_sequence_len
    problems = config_problems(rl="grpo", pad_to_sequence_len=True, trl={"num_generations": 1, "reward_funcs": ["r.f"]})
    assert ("combination", "pad_to_sequence_len applies to SFT, preference and reward-model batches, not grpo") in problems


@pytest.mark.parametrize("packing, eval_packing, packed", [(True, None, True), (True, False, False), (False, True, True)])
def test_eval_sample_packing_follows_sample_packing_unless_set(config, packing, eval_packing, packed):
    from rlft.data.prepared import PreparedData
    from rlft.train.recipes.sft import SFTRecipe

    rows = [{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}] * 4
    cfg = config(sample_packing=packing, eval_sample_packing=eval_packing, sequence_len=16, micro_batch_size=4)
    batches = SFTRecipe(cfg, resolve(cfg), PreparedData(rows, rows, []), pad_id=0).eval_batches
    assert ("position_ids" in batches[0]) is packed


# ------------------------------------------------------------------ every key of Axolotl's schema is known

DATA = __import__("pathlib").Path(__file__).resolve().parents[1] / "data"
CCE = "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"


def _known(model) -> set[str]:
    names = set(model.model_fields)
    for info in model.model_fields.values():
        names |= {info.alias} if info.alias else set()
        names |= set(getattr(info.validation_alias, "choices", []))
    return names


def test_every_top_level_axolotl_key_is_known():
    from rlft.config.schema import RlftConfig

    keys = [line for line in (DATA / "axolotl_keys.txt").read_text().splitlines() if line and not line.startswith("#")]
    assert len(keys) > 450
    assert sorted(set(keys) - _known(RlftConfig)) == []


def test_every_dataset_trl_and_vllm_axolotl_key_is_known():
    import json

    from rlft.config.sections.datasets import DatasetConfig
    from rlft.config.sections.trl import TRLConfig
    from rlft.config.sections.vllm import VLLMConfig

    nested = json.loads((DATA / "axolotl_nested_keys.json").read_text())
    for parent, model in (("datasets[]", DatasetConfig), ("trl", TRLConfig), ("vllm", VLLMConfig)):
        assert sorted(set(nested[parent]) - _known(model)) == [], parent


def test_axolotl_only_keys_validate_and_train_refuses_them_with_reasons(config):
    from rlft.config.axolotl_keys import unsupported_settings

    cfg = config(liger_rms_norm_gated=True, hub_model_id="me/model", strict=False, fsdp_version=2, wandb_watch=None,
                 dataloader_num_workers=0, swanlab_log_completions=False, capabilities={"bf16": True}, datasets=[{"path": "train.jsonl", "field_thinking": "x"}],
                 plugins=["axolotl.integrations.kernels.KernelsPlugin"])
    refused, derived = unsupported_settings(cfg)
    reasons = dict(refused)
    assert set(reasons) == {"liger_rms_norm_gated", "hub_model_id", "datasets[0].field_thinking",
                            "plugins: axolotl.integrations.kernels.KernelsPlugin"}
    assert "GPU kernel" in reasons["liger_rms_norm_gated"] and "never uploads" in reasons["hub_model_id"]
    assert derived == ["capabilities"]


@pytest.mark.parametrize("settings, on", [({"plugins": [CCE]}, True), ({"plugins": [CCE], "cut_cross_entropy": False}, False),
                                          ({"cut_cross_entropy": True}, True), ({}, False)])
def test_the_cut_cross_entropy_plugin_runs_and_turns_its_key_on_as_in_axolotl(config, settings, on):
    from rlft.config.axolotl_keys import unsupported_settings
    from rlft.config.plugins import cut_cross_entropy

    cfg = config(**settings)
    assert unsupported_settings(cfg) == ([], [])
    assert cut_cross_entropy(cfg) is on


def test_the_plan_says_where_the_chunked_loss_runs():
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlft.models.head import loss_path

    model = LlamaForCausalLM(LlamaConfig(vocab_size=4096, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    assert loss_path(model).startswith("rlft's chunked output-layer loss over 4,096 entries")
    assert loss_path(model, sharded=True) == ("the model's own logits: its output layer is sharded (fsdp, DeepSpeed ZeRO-3) "
                                              "and whole only inside the model's forward")


@pytest.mark.parametrize("liger", ["liger_fused_linear_cross_entropy", "liger_cross_entropy"])
def test_cut_cross_entropy_and_ligers_loss_are_not_both_chosen(config, config_problems, liger):
    [(_, message)] = config_problems(plugins=[CCE], **{liger: True})
    assert message.startswith(f"cut_cross_entropy and {liger} both choose the loss's kernel: keep one")
    assert config(plugins=[CCE], cut_cross_entropy=False, **{liger: True})


def test_train_refuses_before_loading_anything(config):
    from rlft.errors import NotImplementedYet
    from rlft.train.unbuilt import refuse_unbuilt

    with pytest.raises(NotImplementedYet, match=r"(?s)do not run in rlft.*- torch_compile_options: .*GPU kernel"):
        refuse_unbuilt(config(torch_compile_options={"max_autotune": True}))


@pytest.mark.parametrize("overrides, key", [
    ({"model_type": "AutoModelForImageTextToText"}, "model_type: AutoModelForImageTextToText"),
    ({"rl": "dpo", "skip_prepare_dataset": True}, "skip_prepare_dataset"),
    ({"gradient_checkpointing": "offload_disk"}, "gradient_checkpointing: offload_disk"),  # offload: built (test_offload)
    ({"attn_implementation": "xformers"}, "attn_implementation: xformers"),
])
def test_values_axolotl_accepts_and_rlft_does_not_run(config, overrides, key):
    from rlft.config.axolotl_keys import unsupported_settings

    assert key in dict(unsupported_settings(config(**overrides))[0])


def test_causal_lm_classes_and_reward_heads_are_not_refused(config):
    from rlft.config.axolotl_keys import unsupported_settings

    assert unsupported_settings(config(model_type="LlamaForCausalLM"))[0] == []
    assert unsupported_settings(config(model_type="AutoModelForSequenceClassification", reward_model=True))[0] == []


# ------------------------------------------------------------------ model_type, tokenizer_type, tokens


def test_model_and_tokenizer_classes_by_name(config, tiny_model_dir):
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    from rlft.models.loading import load_model, load_tokenizer

    cfg = config(base_model=str(tiny_model_dir), random_init=True, model_type="LlamaForCausalLM",
                 tokenizer_type="PreTrainedTokenizerFast", tokens=["<think>", "</think>"])
    tokenizer = load_tokenizer(model_settings(cfg))
    assert type(tokenizer) is PreTrainedTokenizerFast
    assert tokenizer.convert_tokens_to_ids("<think>") >= 260  # added after the byte vocabulary
    model = load_model(model_settings(cfg), tokenizer, "cpu")
    assert type(model) is LlamaForCausalLM and model.get_input_embeddings().num_embeddings >= len(tokenizer)


def test_embedding_rows_follow_axolotls_resize_keys(config, tiny_model_dir):
    """len(tokenizer) rows, or its multiple of 32; spare rows kept unless shrink_embeddings; new rows seeded, drawn around
    the old rows' mean with mean_resizing_embeddings."""
    from rlft.models.loading import fit_embeddings, load_model, load_tokenizer

    def rows(**settings):
        cfg = config(base_model=str(tiny_model_dir), random_init=True, tokens=["<think>", "</think>"], **settings)
        tokenizer = load_tokenizer(model_settings(cfg))
        model = load_model(model_settings(cfg), tokenizer, "cpu")
        return len(tokenizer), model.get_input_embeddings().weight.detach()

    length, grown = rows()
    assert grown.shape[0] == length
    assert torch.equal(rows()[1], grown)  # the new rows are seeded: the same on every process and every run
    assert 0 < grown[length - 2:].std() < 0.1  # drawn as the model's initializer draws (std 0.02), not left empty
    assert rows(resize_token_embeddings_to_32x=True)[1].shape[0] == -(-length // 32) * 32 > length
    old = grown[:length - 2]
    mean_resized = rows(mean_resizing_embeddings=True)[1]
    assert torch.equal(mean_resized[:length - 2], old) and not torch.equal(mean_resized[length - 2:], grown[length - 2:])
    assert (mean_resized[length - 2:] - old.mean(0)).norm() < (grown[length - 2:] - old.mean(0)).norm()

    cfg = config(base_model=str(tiny_model_dir), random_init=True)
    tokenizer = load_tokenizer(model_settings(cfg))
    model = load_model(model_settings(cfg), tokenizer, "cpu")
    model.resize_token_embeddings(len(tokenizer) + 40)
    fit_embeddings(model, model_settings(cfg), tokenizer)
    assert model.get_input_embeddings().num_embeddings == len(tokenizer) + 40  # spare rows are kept
    fit_embeddings(model, model_settings(config(base_model=str(tiny_model_dir), shrink_embeddings=True, resize_token_embeddings_to_32x=True)),
                   tokenizer)
    assert model.get_input_embeddings().num_embeddings == -(-len(tokenizer) // 32) * 32


def test_a_misspelt_class_is_a_clear_error(config, tiny_model_dir):
    from rlft.errors import ModelError
    from rlft.models.loading import load_tokenizer

    with pytest.raises(ModelError, match="tokenizer_type: transformers .* has no class 'LamaTokenizer'"):
        load_tokenizer(model_settings(config(base_model=str(tiny_model_dir), tokenizer_type="LamaTokenizer")))


# ------------------------------------------------------------------ dataset_prepared_path


def test_prepared_data_is_reused_until_the_data_changes(config, tok, write_jsonl, tmp_path, capsys):
    from rlft.data.prepare import prepare_sft_data

    data = write_jsonl([{"prompt": f"{i}+1=", "completion": str(i + 1)} for i in range(6)], "train.jsonl")
    cfg = config(datasets=[{"path": str(data)}], dataset_prepared_path=str(tmp_path / "prepared"), val_set_size=2)
    first = prepare_sft_data(cfg, tok)
    assert "prepared data saved to" in capsys.readouterr().err
    again = prepare_sft_data(cfg, tok)
    assert "prepared data reused from" in capsys.readouterr().err
    assert (again.train, again.eval, again.reports) == (first.train, first.eval, first.reports)
    assert len(list((tmp_path / "prepared").iterdir())) == 1

    data.write_text(data.read_text() + '{"prompt": "9+1=", "completion": "10"}\n')  # new data: prepared again
    changed = prepare_sft_data(cfg, tok)
    assert "prepared data saved to" in capsys.readouterr().err and len(changed.train) == len(first.train) + 1
    prepare_sft_data(config(**{**cfg.model_dump(exclude_unset=True), "sequence_len": 64}), tok)  # new config: again
    assert "prepared data saved to" in capsys.readouterr().err
    prepare_sft_data(config(**{**cfg.model_dump(exclude_unset=True), "learning_rate": 0.1}), tok)  # training only: reused
    assert "prepared data reused from" in capsys.readouterr().err


def test_the_cache_key_sees_a_written_sequence_len_and_the_user_transforms_code(config, tok, tmp_path, monkeypatch):
    """A GRPO prompt's token budget depends on whether sequence_len was written (not only on its value), and a user
    transform's code decides the rows: either change must prepare the data again."""
    from rlft.data.cache import cache_key

    monkeypatch.chdir(tmp_path)
    grpo = {"rl": "grpo", "micro_batch_size": 8, "datasets": [{"path": "p.jsonl", "type": "my_transforms.fn"}]}
    unset = config(**grpo)
    assert cache_key(unset, tok) != cache_key(config(**grpo, sequence_len=unset.sequence_len), tok)
    transform = tmp_path / "my_transforms.py"
    transform.write_text("def fn(cfg, dataset_idx=0):\n    return lambda row: row\n")
    before = cache_key(unset, tok)
    assert cache_key(unset, tok) == before
    transform.write_text("def fn(cfg, dataset_idx=0):\n    return lambda row: {'prompt': row['q']}\n")
    assert cache_key(unset, tok) != before


def test_every_axolotl_template_name_validates_and_unshipped_ones_are_refused_in_train(config):
    from rlft.config.axolotl_keys import unsupported_settings
    from rlft.config.template_names import NOT_SHIPPED
    from rlft.data.chat_templates import TEMPLATES

    names = [line for line in (DATA / "axolotl_chat_templates.txt").read_text().splitlines() if line and not line.startswith("#")]
    assert len(names) > 30
    for name in names:
        text = {"chat_template_jinja": "{{ messages }}"} if name == "jinja" else {}  # jinja needs its text (validation)
        refused = dict(unsupported_settings(config(chat_template=name, **text))[0])
        assert (f"chat_template: {name}" in refused) == (name in NOT_SHIPPED), name
        assert name in TEMPLATES or name in NOT_SHIPPED or name in ("jinja", "tokenizer_default"), name


# ------------------------------------------------------------------ where models are found


def test_a_hub_id_in_the_local_cache_loads_offline(tmp_path, monkeypatch):
    from rlft.models.loading import resolve_source
    from rlft.models.tiny import write_tiny_model

    commit = "0" * 40
    repo = tmp_path / "hub" / "models--someorg--tiny"
    write_tiny_model(repo / "snapshots" / commit, "XS", max_positions=64)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve_source("someorg/tiny", "base_model") == str(repo / "snapshots" / commit)


def test_revision_of_model_picks_the_cached_snapshot_of_that_revision_offline(two_revisions, config):
    from rlft.errors import ModelError
    from rlft.models.loading import base_model_source, resolve_source

    main, v2 = two_revisions
    assert resolve_source("someorg/tiny", "base_model") == str(main)
    assert base_model_source(model_settings(config(base_model="someorg/tiny", revision_of_model="v2"))) == str(v2)
    assert config(model_revision="v2").revision_of_model == "v2"  # Axolotl's other name for it
    assert resolve_source("someorg/tiny", "base_model", "b" * 40) == str(v2)  # a commit hash names it too
    with pytest.raises(ModelError, match=r"'someorg/tiny' at revision 'v3' .*\(hf download someorg/tiny --revision v3\)"):
        resolve_source("someorg/tiny", "base_model", "v3")
    with pytest.raises(ModelError, match="revision_of_model: v2 picks a version of a hub repository, but base_model is the "
                                         "folder"):
        resolve_source(str(main), "base_model", "v2")


def test_every_key_that_names_base_models_repository_takes_its_revision_online_and_offline(two_revisions, config,
                                                                                          monkeypatch, tmp_path):
    """ref_model, tokenizer_config and a saved adapter's base at the same repository load at revision_of_model: offline
    through the cached snapshot, online through from_pretrained's revision; the end-of-answer ids read v2's
    generation config."""
    from rlft.models.loading import adapter_base, hub_revision, model_source, resolve_source
    from rlft.data.tokenizer import end_ids

    main, v2 = two_revisions
    cfg = config(base_model="someorg/tiny", revision_of_model="v2")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "someorg/tiny", "revision": "v2"}))
    tokenizer = AutoTokenizer.from_pretrained(v2)
    assert model_source(model_settings(cfg), "someorg/tiny", "ref_model") == str(v2) and hub_revision(model_settings(cfg), str(v2)) == {}
    assert adapter_base(adapter) == (str(v2), {})
    beside_folder = tmp_path / "other-tool"  # PEFT may record the adapter repository's revision beside a local base
    beside_folder.mkdir()
    (beside_folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(main), "revision": "v9"}))
    assert adapter_base(beside_folder) == (str(main), {})
    assert end_ids(model_source(model_settings(cfg), "someorg/tiny", "base_model"), tokenizer) == (tokenizer.eos_token_id, 5)
    assert end_ids("someorg/tiny", tokenizer, **hub_revision(model_settings(cfg), "someorg/tiny")) == (tokenizer.eos_token_id, 5)  # GRPO's
    assert end_ids(resolve_source("someorg/tiny", "base_model"), tokenizer) == (tokenizer.eos_token_id,)  # main has none
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # online: the hub id stays, and from_pretrained gets the revision
    assert model_source(model_settings(cfg), "someorg/tiny", "tokenizer_config") == "someorg/tiny"
    assert hub_revision(model_settings(cfg), "someorg/tiny") == {"revision": "v2"} and hub_revision(model_settings(cfg), "otherorg/x") == {}
    assert adapter_base(adapter) == ("someorg/tiny", {"revision": "v2"})


def test_bfloat16_is_axolotls_other_name_for_bf16(config, config_problems):
    assert config(bfloat16=True).bf16 is True and config(bfloat16=True, bf16=True).bf16 is True
    assert config(bfloat16=1).bf16 is True and config(bfloat16="yes").bf16 is True  # as --bfloat16=1 reads
    assert config(bfloat16=False).bf16 == "auto" and config(bfloat16=True, bf16="auto").bf16 is True
    disagree = [("config", "bfloat16: true and bf16: false disagree: remove one (bfloat16 is Axolotl's other name for bf16)")]
    assert config_problems(bfloat16=True, bf16=False) == disagree and config_problems(bfloat16="true", bf16="false") == disagree
    assert [key for key, _ in config_problems(bfloat16="maybe")] == ["bfloat16"]
    assert config_problems(revision_of_model="v1", model_revision="v2") == [
        ("config", "revision_of_model and model_revision are both set (two names of one key): keep one")]


@pytest.mark.parametrize("init, words", [
    ("loftq", "LoftQ replaces the base weights with their 4-bit rounding"),
    ("eva", "EVA initialises the adapter from a pass over training data"),
    ("corda", "CorDA needs a pass over training data first"),
    ("pisa", "'pisa' is not one rlft runs"),
    ("pissa\n", "is not one rlft runs"),
    ("pissa_niter_x", "is not one rlft runs"),
])
def test_lora_inits_rlft_cannot_carry_out_are_refused(init, words, config, config_problems):
    """LoftQ's adapter fits only its rounded base; EVA and CorDA need a data pass: accepted, they trained something else."""
    problems = config_problems(adapter="lora", peft_init_lora_weights=init)
    assert len(problems) == 1 and words in problems[0][1], problems
    for fine in (True, False, "gaussian", "orthogonal", "mica", "pissa", "pissa_niter_4", "olora"):
        assert config(adapter="lora", peft_init_lora_weights=fine).peft_init_lora_weights == fine


@pytest.mark.parametrize("settings, words", [
    ({"peft_init_lora_weights": "mica", "peft_use_dora": True}, "mica with peft_use_dora: PEFT has no MiCA version"),
    ({"peft_init_lora_weights": "orthogonal", "lora_r": 5}, "orthogonal needs an even lora_r"),
    ({"peft_init_lora_weights": "pissa", "adapter": "qlora", "load_in_4bit": True}, "with a base loaded in 4 bits"),
])
def test_lora_init_combinations_peft_cannot_build_are_refused(settings, words, config_problems):
    problems = config_problems(**{"adapter": "lora", **settings})
    assert any(words in what for _, what in problems), problems


def test_reinit_weights_is_axolotls_name_for_random_init(config, config_problems):
    """Axolotl builds the model from its config instead of loading the weights (its pretraining examples set it)."""
    from rlft.config import explain

    assert config(reinit_weights=True).random_init is True and config().random_init is False
    assert config(reinit_weights=None, random_init=True).random_init is True  # an empty key is unset, as Axolotl reads it
    assert config_problems(random_init=True, reinit_weights=True) == [
        ("config", "random_init and reinit_weights are both set (two names of one key): keep one")]
    assert "freshly initialised weights" in explain("reinit_weights") and "v2" not in explain("model_revision")


def test_lora_fan_in_fan_out_reaches_peft(config):
    from rlft.models.loading import lora_config

    assert lora_config(adapter_settings(config(adapter="lora", lora_fan_in_fan_out=True))).fan_in_fan_out is True
    assert lora_config(adapter_settings(config(adapter="lora"))).fan_in_fan_out is False


def test_a_hub_id_missing_from_the_cache_is_a_clear_error_offline(tmp_path, monkeypatch):
    from rlft.errors import ModelError
    from rlft.models.loading import resolve_source

    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(ModelError, match="not in the local Hugging Face cache"):
        resolve_source("someorg/absent", "base_model")


def test_a_checkpoint_folder_stands_for_its_model(tmp_path):
    from rlft.models.loading import resolve_source
    from rlft.models.tiny import write_tiny_model

    write_tiny_model(tmp_path / "checkpoint-3" / "model", "XS", max_positions=64)
    assert resolve_source(str(tmp_path / "checkpoint-3"), "base_model") == str((tmp_path / "checkpoint-3" / "model").resolve())


def test_eot_tokens_are_added_as_special_tokens_and_trained_as_turn_ends(config, tiny_model_dir):
    from rlft.data.tokenize import IGNORE, tokenize_record
    from rlft.models.loading import load_tokenizer

    template = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '<|end_of_turn|>' }}{% endfor %}"
    cfg = config(base_model=str(tiny_model_dir), chat_template="jinja", chat_template_jinja=template,
                 eot_tokens=["<|end_of_turn|>"])
    tokenizer = load_tokenizer(model_settings(cfg))
    assert len(tokenizer("<|end_of_turn|>", add_special_tokens=False)["input_ids"]) == 1  # one token, not 15 bytes
    chat = [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}]

    def trained(eot_tokens):
        example = tokenize_record({"messages": chat}, tokenizer, False, ["assistant"], "turn", eot_tokens)
        return tokenizer.convert_ids_to_tokens([t for t, label in zip(example["input_ids"], example["labels"]) if label != IGNORE])

    assert trained(cfg.eot_tokens) == ["2", "<|end_of_turn|>"]
    assert trained(None) == ["2"]  # the template's marker is not one rlft knows: only the answer


# ------------------------------------------------------------------ model_config (overrides_of_model_config)


@pytest.mark.parametrize("fused", [False, True])
def test_model_config_overrides_reach_the_model_and_the_router_loss_joins_sfts_as_transformers_adds_it(
        config, tiny_moe_dir, fused, monkeypatch):
    """Axolotl's Mixtral examples set model_config: {output_router_logits: true}: the loss is then transformers' own,
    the mean NLL of the targets plus router_aux_loss_coef x the load-balancing loss, through the model's logits or
    rlft's chunked output layer."""
    from rlft.models import head
    from rlft.models.loading import load_model, load_tokenizer
    from rlft.train.recipes.sft import SFTRecipe

    monkeypatch.setattr(head, "MIN_VOCAB", 1 if fused else 10**9)
    cfg = config(base_model=str(tiny_moe_dir), random_init=True,
                 model_config={"output_router_logits": True, "max_position_embeddings": 256})
    assert cfg.overrides_of_model_config == {"output_router_logits": True, "max_position_embeddings": 256}
    model = load_model(model_settings(cfg), load_tokenizer(model_settings(cfg)), "cpu")
    assert model.config.output_router_logits is True and model.config.max_position_embeddings == 256
    ids = torch.randint(4, 200, (3, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[2, 7:] = 0  # padding
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :3] = -100  # a prompt
    out = SFTRecipe.__new__(SFTRecipe).loss(model, {"input_ids": ids, "attention_mask": mask, "labels": labels})
    expected = model(input_ids=ids, attention_mask=mask, labels=labels)
    assert expected.aux_loss > 0 and out.metrics == {"aux_loss": pytest.approx(float(expected.aux_loss))}
    assert float(out.loss_sum) / out.units == pytest.approx(float(expected.loss), rel=1e-5)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("method", ["dpo", "orpo", "simpo"])
def test_the_router_loss_joins_the_pair_methods_loss_as_trl_adds_it(config, tiny_moe_dir, method, fused, monkeypatch):
    """TRL's trainers add router_aux_loss_coef x the load-balancing loss of the pairs' forward (chosen and rejected rows
    in one batch) to the mean preference loss: rlft's loss per pair is the same sum."""
    from rlft.config.rl import preference_beta
    from rlft.losses.preference.dpo import dpo_loss
    from rlft.models import head
    from rlft.models.loading import load_model, load_tokenizer
    from rlft.train.recipes.preference import PairRecipe, sequence_logps

    monkeypatch.setattr(head, "MIN_VOCAB", 1 if fused else 10**9)
    cfg = config(base_model=str(tiny_moe_dir), random_init=True, rl=method, model_config={"output_router_logits": True})
    model = load_model(model_settings(cfg), load_tokenizer(model_settings(cfg)), "cpu")
    ids = torch.randint(4, 200, (4, 9), generator=torch.Generator().manual_seed(1))  # 2 chosen rows, then 2 rejected
    mask = torch.ones_like(ids)
    mask[3, 6:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :4] = -100  # the prompt
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels,
             "ref_chosen": torch.tensor([-30.0, -31.0]), "ref_rejected": torch.tensor([-29.0, -33.0])}
    recipe = PairRecipe.__new__(PairRecipe)
    recipe.cfg, recipe.method, recipe.loss_types, recipe.bco_mean, recipe.bco_count = cfg, method, ["sigmoid"], 0.0, 0
    recipe.weights = resolve(cfg).loss
    out = recipe.loss(model, batch)

    forward = model(input_ids=ids, attention_mask=mask)  # the router's loss of the pairs' forward, transformers' own
    coef = model.config.router_aux_loss_coef
    assert forward.aux_loss > 0 and coef > 0 and out.metrics["aux_loss"] == pytest.approx(float(forward.aux_loss), rel=1e-5)
    model.config.output_router_logits = False  # the preference loss alone, without the router's
    plain = recipe.loss(model, batch)
    assert "aux_loss" not in plain.metrics and out.units == plain.units == 2
    assert float(out.loss_sum) / out.units == pytest.approx(float(plain.loss_sum) / 2 + coef * float(forward.aux_loss), rel=1e-5)
    if method == "dpo":  # and the preference loss alone is the paper's, from the same sequence log-probs
        logps = sequence_logps(model, batch).logps
        expected = dpo_loss(logps[:2], logps[2:], batch["ref_chosen"], batch["ref_rejected"], loss_types=["sigmoid"],
                              beta=preference_beta(cfg)).losses.mean()
        assert float(plain.loss_sum) / 2 == pytest.approx(float(expected), rel=1e-5)


def test_the_router_loss_joins_ktos_loss_from_the_completions_forward(config, tiny_moe_dir):
    from rlft.models.loading import load_model, load_tokenizer
    from rlft.train.recipes.preference import KTORecipe

    cfg = config(base_model=str(tiny_moe_dir), random_init=True, rl="kto", micro_batch_size=4,
                 model_config={"output_router_logits": True})
    model = load_model(model_settings(cfg), load_tokenizer(model_settings(cfg)), "cpu")
    ids = torch.randint(4, 200, (3, 8), generator=torch.Generator().manual_seed(2))
    labels = ids.clone()
    labels[:, :3] = -100
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels, "kl_input_ids": ids.flip(0),
             "kl_attention_mask": torch.ones_like(ids), "kl_labels": labels.flip(0),
             "desirable": torch.tensor([True, False, True]), "ref_logps": torch.tensor([-20.0, -21.0, -19.0]),
             "ref_kl_logps": torch.tensor([-20.5, -20.0, -22.0])}
    recipe = KTORecipe.__new__(KTORecipe)
    recipe.cfg, recipe.weights = cfg, resolve(cfg).loss
    out = recipe.loss(model, batch)
    aux = model(input_ids=ids, attention_mask=torch.ones_like(ids)).aux_loss  # the completions' forward
    model.config.output_router_logits = False
    plain = recipe.loss(model, batch)
    coef = model.config.router_aux_loss_coef
    assert out.metrics["aux_loss"] == pytest.approx(float(aux), rel=1e-5) and "aux_loss" not in plain.metrics
    assert float(out.loss_sum) / 3 == pytest.approx(float(plain.loss_sum) / 3 + coef * float(aux), rel=1e-5)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_the_router_loss_joins_the_grpo_loss_as_trl_adds_it(config, tiny_moe_dir, loss_type, fused, monkeypatch):
    """TRL's GRPO trainer adds router_aux_loss_coef x the load-balancing loss of the policy's forward over the prompts
    and completions (left-padded, with their mask) to each micro-batch's loss: rlft's loss per unit is the same sum."""
    from types import SimpleNamespace

    from rlft.models import head
    from rlft.models.loading import load_model, load_tokenizer
    from rlft.data.collate import completion_batch
    from rlft.models.logprobs import left_padded_inputs
    from rlft.train.recipes.grpo import GRPORecipe

    monkeypatch.setattr(head, "MIN_VOCAB", 1 if fused else 10**9)
    cfg = config(base_model=str(tiny_moe_dir), random_init=True, rl="grpo", micro_batch_size=8,
                 trl={"reward_funcs": ["r.f"]}, model_config={"output_router_logits": True})
    model = load_model(model_settings(cfg), load_tokenizer(model_settings(cfg)), "cpu")
    g = torch.Generator().manual_seed(4)
    rows = []
    for prompt, completion, advantage in ((5, 4, 1.0), (3, 2, -0.5), (5, 6, 0.25), (4, 3, -0.75)):
        ids = torch.randint(4, 200, (prompt + completion,), generator=g).tolist()
        rows.append({"prompt_ids": ids[:prompt], "completion_ids": ids[prompt:], "loss_mask": [1] * completion,
                     "advantage": advantage, "old_logps": [-5.5] * completion})
    batch = completion_batch(rows, pad_id=0, values=("old_logps",))
    recipe = GRPORecipe.__new__(GRPORecipe)
    recipe.settings = SimpleNamespace(
        temperature=1.0, entropy_coeff=0.0, off_policy_mask_threshold=None, needs_sampling_correction=False,
        decoupled_loss=False, loss_type=loss_type, epsilon=0.2, epsilon_high=0.28, delta=None, lower_bound_ratio=None,
        aipo_rho=None, importance_sampling_level="token", beta=0.0, positive_nll_coef=None, unbiased_loss_max_tokens=None,
        bias_correction_kl=False)
    recipe.compares_sampled = False
    out = recipe.loss(model, batch)

    forward = model(**left_padded_inputs(model, batch))  # transformers' own router loss of that forward
    coef = model.config.router_aux_loss_coef
    assert forward.aux_loss > 0 and coef > 0 and out.metrics["aux_loss"] == pytest.approx(float(forward.aux_loss), rel=1e-5)
    model.config.output_router_logits = False  # the policy loss alone
    plain = recipe.loss(model, batch)
    assert "aux_loss" not in plain.metrics and out.units == plain.units > 0
    assert float(out.loss_sum) / out.units == pytest.approx(
        float(plain.loss_sum) / plain.units + coef * float(forward.aux_loss), rel=1e-5)


@pytest.mark.compile
def test_an_moe_engine_decodes_without_the_router_logits_eager_and_compiled(tiny_moe_dir):
    """With output_router_logits on, transformers computes the router's loss in every forward from a mask as wide as
    the sequence, which a one-token step's router logits do not match: the engines decode without them, and sample
    what the same model samples with the setting off; so does `rlft generate` (a checkpoint saved with the setting)."""
    import copy

    from transformers import AutoConfig, AutoModelForCausalLM

    from rlft.data.tokenizer import byte_tokenizer
    from rlft.rollout.local import LocalEngine
    from rlft.rollout.types import SamplingParams

    tok = byte_tokenizer()
    torch.manual_seed(0)
    off = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_moe_dir)).eval()
    on = copy.deepcopy(off)
    on.config.output_router_logits = True
    prompts = [tok("12+34=")["input_ids"], tok("1+2=")["input_ids"]]
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    expected = LocalEngine(off, tok.pad_token_id, tok).decode(prompts, params, generator=torch.Generator().manual_seed(1))
    for compiled in (None, (None, "aot_eager")):  # what dynamo traces is the point: no C++ code generation
        got = LocalEngine(on, tok.pad_token_id, tok, compiled=compiled).decode(
            prompts, params, generator=torch.Generator().manual_seed(1))
        assert got.completion_ids == expected.completion_ids
        for row_got, row_expected in zip(got.logprobs, expected.logprobs):
            assert row_got == pytest.approx(row_expected, abs=1e-5)
    from rlft.models.generation import generate_texts

    texts = ["12+34=", "1+2="]  # left-padded together
    assert generate_texts(on, tok, texts, max_new_tokens=4) == generate_texts(off, tok, texts, max_new_tokens=4)


def test_a_model_whose_forward_computes_no_router_loss_is_refused_with_the_setting():
    """transformers' GLM-4 MoE returns its router's logits under output_router_logits but computes no load-balancing
    loss from them: the setting would add nothing, and the first training forward says so."""
    from layout_checks import tiny_of_type

    from rlft.errors import ConfigError
    from rlft.train.recipes.sft import SFTRecipe

    model = tiny_of_type("glm4_moe")
    ids = torch.randint(4, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    assert "aux_loss" not in SFTRecipe.__new__(SFTRecipe).loss(model, batch).metrics
    model.config.output_router_logits = True
    with pytest.raises(ConfigError, match=r"transformers' Glm4MoeForCausalLM computes no router load-balancing loss, so the "
                                          r"setting would add nothing to the loss; remove it"):
        SFTRecipe.__new__(SFTRecipe).loss(model, batch)


def test_a_router_loss_that_config_json_turns_on_is_checked_like_model_configs(config, tiny_moe_dir, tmp_path):
    """A checkpoint saved with output_router_logits: true (rlft's own SFT with model_config saves it so) computes the
    router's loss in every forward: refused where rlft would not add it or its mask is missing; never shared prompts."""
    import json
    import shutil

    from rlft.errors import ConfigError
    from rlft.models.loading import check_router_loss, load_model, load_tokenizer
    from rlft.models.reward import load_reward_model
    from rlft.models.shared_prompts import shared_prompt_problem

    folder = tmp_path / "moe"
    shutil.copytree(tiny_moe_dir, folder)
    (folder / "config.json").write_text(json.dumps({**json.loads((folder / "config.json").read_text()),
                                                    "output_router_logits": True}))
    cfg = config(base_model=str(folder), random_init=True, rl="dpo")
    model = load_model(model_settings(cfg), load_tokenizer(model_settings(cfg)), "cpu")
    assert "output_router_logits: its router loss weighs the tokens by a mask per row" in shared_prompt_problem(model)
    with pytest.raises(ConfigError, match="rlft adds to SFT, the preference methods and the GRPO family, not to reward_model: "
                                          r"or set model_config: \{output_router_logits: false\}"):
        check_router_loss(model_settings(config(base_model=str(folder), reward_model=True)), model, "cpu")
    with pytest.raises(ConfigError, match="packed or flattened rows have only under flash-attention"):
        check_router_loss(model_settings(config(base_model=str(folder), sample_packing=True)), model, "cpu")
    with pytest.raises(ConfigError, match="eval_sample_packing"):  # packed eval rows too
        check_router_loss(model_settings(config(base_model=str(folder), eval_sample_packing=True)), model, "cpu")
    grpo = config(base_model=str(folder), random_init=True, rl="grpo", micro_batch_size=8, trl={"reward_funcs": ["r.f"]})
    assert load_model(model_settings(grpo), load_tokenizer(model_settings(grpo)), "cpu").config.output_router_logits  # the GRPO family adds it
    # on a GPU under SDPA its left-padded rows get rlft's 4-D mask, which the router loss cannot read: refused there,
    # from config.json or model_config alike; flash-attention and eager read the rows' own mask
    for settings in ({}, {"model_config": {"output_router_logits": True}}):
        with pytest.raises(ConfigError, match="output_router_logits with SDPA attention on a GPU: .* set attn_implementation: "
                                              "flash_attention_2 \\(or eager\\)"):
            check_router_loss(model_settings(config(base_model=str(folder), rl="grpo", micro_batch_size=8, trl={"reward_funcs": ["r.f"]},
                                     **settings)), model, "cuda")
    check_router_loss(model_settings(config(base_model=str(folder), rl="grpo", micro_batch_size=8, trl={"reward_funcs": ["r.f"]},
                             attn_implementation="eager")), model, "cuda")
    reward = config(base_model=str(folder), random_init=True, reward_model=True)
    with pytest.raises(ConfigError, match="not to reward_model"):  # the check runs where every trainer loads its model
        load_reward_model(model_settings(reward), load_tokenizer(model_settings(reward)), "cpu")
    with pytest.raises(ConfigError, match="not to reward_model"):
        load_model(model_settings(reward), load_tokenizer(model_settings(reward)), "cpu")
    assert load_model(model_settings(reward), load_tokenizer(model_settings(reward)), "cpu", serving=True).config.output_router_logits  # a server trains nothing
    off = config(base_model=str(folder), random_init=True, reward_model=True, model_config={"output_router_logits": False})
    assert load_model(model_settings(off), load_tokenizer(model_settings(off)), "cpu").config.output_router_logits is False


def test_a_misspelt_model_config_setting_and_the_router_loss_outside_sft_are_refused(config, config_problems, tiny_moe_dir):
    from rlft.errors import ConfigError
    from rlft.models.loading import load_model, load_tokenizer

    cfg = config(base_model=str(tiny_moe_dir), random_init=True, model_config={"output_router_logit": True})
    with pytest.raises(ConfigError, match=r"model_config.output_router_logit: MixtralConfig has no setting of that name "
                                          r"\(did you mean output_router_logits\?\): fix the name or remove it"):
        load_model(model_settings(cfg), load_tokenizer(model_settings(cfg)), "cpu")
    assert ("model_config.output_router_logits: the MoE router's load-balancing loss is added to the loss of SFT, the "
            "preference methods (DPO, IPO, KTO, ORPO, SimPO/CPO) and the GRPO family; for reward_model it is not built: "
            "remove it") in [
        message for _, message in config_problems(reward_model=True, model_config={"output_router_logits": True})]
    [(_, message)] = config_problems(rl="dpo", model_config={"output_router_logits": True}, share_prompts=True)
    assert message.startswith("share_prompts: model_config.output_router_logits: transformers' router loss weighs the tokens")
    [(_, message)] = config_problems(model_config={"output_router_logits": True}, sample_packing=True)
    assert message.startswith("model_config.output_router_logits with packed or flattened rows")
    [(_, message)] = config_problems(model_config={"output_router_logits": True, "rope_scaling": {"factor": 2.0}},
                                     adapter="lora", lora_target_linear=True)
    assert message.startswith("model_config rope_scaling with an adapter: the adapter is saved for the original base")
    assert config(model_config={"output_router_logits": True}, adapter="lora", lora_target_linear=True)


def test_a_model_config_value_the_model_cannot_take_is_named(config, tiny_model_dir):
    from rlft.errors import ConfigError
    from rlft.models.loading import load_model, load_tokenizer

    cfg = config(base_model=str(tiny_model_dir), random_init=True, model_config={"hidden_act": "nope"})
    with pytest.raises(ConfigError, match=r"the model could not be built with model_config hidden_act \(KeyError: 'nope'\)"):
        load_model(model_settings(cfg), load_tokenizer(model_settings(cfg)), "cpu")


def test_a_mapping_in_model_config_merges_into_the_setting(config, tiny_model_dir):
    """transformers 5 keeps rope_theta in rope_parameters: a rope_scaling override without it must keep it."""
    from rlft.models.loading import load_model, load_tokenizer

    cfg = config(base_model=str(tiny_model_dir), random_init=True,
                 model_config={"rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    model = load_model(model_settings(cfg), load_tokenizer(model_settings(cfg)), "cpu")
    assert model.config.rope_parameters == {"rope_theta": 10000.0, "rope_type": "linear", "factor": 2.0}
    assert model(input_ids=torch.tensor([[5, 6, 7]])).logits.isfinite().all()


def test_lora_on_parameters_and_what_it_is_not_built_for(config, config_problems):
    from rlft.errors import NotImplementedYet
    from rlft.models.loading import lora_config
    from rlft.train.unbuilt import refuse_unbuilt

    lora = {"adapter": "lora", "lora_target_parameters": ["experts.gate_up_proj"]}
    [(_, message)] = config_problems(**lora, lora_dropout=0.05)
    assert message == ("lora_target_parameters with lora_dropout 0.05: PEFT's LoRA on parameters has no dropout; set "
                       "lora_dropout: 0")
    assert "PEFT has no DoRA for parameters" in config_problems(**lora, peft_use_dora=True)[0][1]
    grpo = {"rl": "grpo", "micro_batch_size": 8, "trl": {"reward_funcs": ["r.f"]}}
    unbuilt = {"with rl: grpo: sending parameter adapters. weights to the rollout engine": grpo,
               "with fsdp: not built yet": {"fsdp": ["full_shard"],
                                            "fsdp_config": {"fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer"}}}
    for words, settings in unbuilt.items():  # they validate, and train refuses them before loading anything
        with pytest.raises(NotImplementedYet, match=f"lora_target_parameters {words}"):
            refuse_unbuilt(config(**lora, **settings))
    refuse_unbuilt(config(**lora, rl="dpo"))
    single = lora_config(adapter_settings(config(adapter="lora", lora_target_parameters="experts.down_proj")))
    assert single.target_parameters == ["experts.down_proj"] and single.target_modules == set()  # no module of PEFT's


def test_a_process_reward_model_is_refused_as_not_built_not_for_its_labels(config, config_problems):
    """Axolotl's PRM example sets num_labels: 2 (token classification): the reason to give is that PRMs are not built."""
    from rlft.config.axolotl_keys import unsupported_settings

    assert config_problems(num_labels=2)[0][1].startswith("num_labels is 2: a Bradley-Terry reward model has a single score")
    refused = dict(unsupported_settings(config(process_reward_model=True, num_labels=2))[0])
    assert refused["process_reward_model"] == "not built in rlft"
