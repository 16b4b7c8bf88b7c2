"""Axolotl config keys that rlft knows but does not run (generated from Axolotl's schema, then kept by hand).

Every key of Axolotl's schema is known to rlft: it either works (it is a field of `RlftConfig` or its
sections), or it is listed here. A listed key validates, so an Axolotl config checks clean; `rlft
train` refuses a listed key set to anything but Axolotl's default or "off" (null, false, 0, empty),
with the reason of its category, unless the value means what rlft does anyway (`SAME_AS_RLFT`).
Keys that Axolotl computes for itself (`derived`) are named in a note and have no effect.
"""

from __future__ import annotations

from typing import Any, Callable

REASONS = {
    "tracker": "this tracker option is not built in rlft: it logs to metrics.jsonl and, through accelerate, to TensorBoard, "
               "W&B, MLflow, Comet, Trackio and SwanLab (docs/training.md#experiment-trackers)",
    "ui": "Axolotl's Gradio demo is not part of rlft: sample with `rlft generate CHECKPOINT --prompt ...`",
    "kernel": "a GPU kernel or compilation switch of Axolotl that rlft has not wired in: the model runs with transformers' own "
              "layers and attention (attn_implementation)",
    "technique": "an Axolotl plugin or training technique that rlft does not have",
    "launcher": "Ray launching is not built: start the processes with `rlft train --num-processes N`, accelerate launch or "
                "torchrun (docs/distributed.md)",
    "multimodal": "rlft trains text models only",
    "hub": "rlft never uploads (it runs offline): push the output folder yourself, e.g. `hf upload ORG/NAME outputs/run`",
    "quant": "quantised training other than load_in_4bit / load_in_8bit (bitsandbytes, CUDA) is not built",
    "parallel": "rlft takes devices and process layout from the launcher and from fsdp / fsdp_config (docs/distributed.md)",
    "dataloader": "rlft builds batches in the training process (no torch DataLoader), so there are no loader options",
    "samples": "sampling during training is not built: run `rlft generate` on a checkpoint",
    "optim": "an optimizer option rlft does not pass on: optimizers come from transformers by name (docs/training.md)",
    "deprecated": "deprecated in Axolotl too: use the key that replaced it",
    "other": "not built in rlft",
    "dataset": "a dataset option rlft does not have (formats: docs/sft.md, docs/preference-data.md, docs/grpo.md)",
    "trl": "a trl option rlft does not have (docs/grpo.md lists the trl keys)",
    "derived": "a value Axolotl computes for itself; rlft does not read it",
    "vllm": "rlft's rollout server picks its device itself",
}
# reasons that say more than their category
SPECIFIC = {
    "auto_resume_from_checkpoints": "set resume_from_checkpoint: auto instead (same effect)",
    "dataset_processes": "Axolotl's older name of dataset_num_proc: rename the key",
    "batch_size": "Axolotl's derived batch size: set micro_batch_size and gradient_accumulation_steps",
    "merge_lora": "merge after training with `rlft merge-lora CHECKPOINT OUT`",
    "chat_template_kwargs": "set trl.chat_template_kwargs (online-RL prompts); SFT renders templates without extra arguments",
    "processor_type": "rlft trains text models only (no processors)",
    "pretrain_multipack_buffer_size": "Axolotl's older name of streaming_multipack_buffer_size: rename the key",
}


def _any_of(*values: Any) -> Callable[[Any], bool]:
    return lambda value: value in values


# values that mean what rlft does anyway
SAME_AS_RLFT: dict[str, Callable[[Any], bool]] = {
    "fsdp_version": _any_of(2, "2"),  # rlft always runs FSDP2
    "save_safetensors": _any_of(True),
    "include_tokens_per_second": _any_of(True),
    "include_tkps": _any_of(True),
    "tokenizer_use_fast": _any_of(True),
    "low_cpu_mem_usage": _any_of(True),
}

TOP_LEVEL = {
    'accelerator_config': ('parallel', None),
    'adam_beta3': ('optim', None),
    'adam_epsilon2': ('optim', None),
    'added_tokens_overrides': ('other', None),
    'auto_find_batch_size': ('other', None),
    'auto_resume_from_checkpoints': ('other', None),
    'axolotl_config_path': ('derived', None),
    'batch_size': ('other', None),
    'bench_dataset': ('other', None),
    'bench_split': ('other', None),
    'bnb_config_kwargs': ('quant', None),
    'capabilities': ('derived', None),
    'chat_template_kwargs': ('other', None),
    'chunked_cross_entropy': ('kernel', None),
    'chunked_cross_entropy_num_chunks': ('kernel', None),
    'cls_model_config': ('other', None),
    'comet_experiment_config': ('tracker', None),
    'cosine_constant_lr_ratio': ('optim', None),
    'curriculum_sampling': ('other', None),
    'dataloader_drop_last': ('dataloader', None),
    'dataloader_num_workers': ('dataloader', None),
    'dataloader_pin_memory': ('dataloader', None),
    'dataloader_prefetch_factor': ('dataloader', None),
    'dataset_keep_in_memory': ('other', None),
    'dataset_processes': ('other', None),
    'dataset_shard_idx': ('other', None),
    'dataset_shard_num': ('other', None),
    'ddp': ('parallel', None),
    'deepcompile': ('kernel', None),
    'default_system_message': ('other', None),
    'dense_mixer': ('kernel', True),
    'device': ('parallel', None),
    'device_map': ('parallel', None),
    'diffusion': ('technique', None),
    'dion_lr': ('optim', None),
    'dion_momentum': ('optim', None),
    'dion_rank_fraction': ('optim', 1.0),
    'dion_rank_multiple_of': ('optim', 1),
    'do_bench_eval': ('other', None),
    'do_causal_lm_eval': ('other', None),
    'dp_replicate_size': ('parallel', None),
    'dp_shard_size': ('parallel', None),
    'dpo_beta': ('deprecated', None),
    'dpo_generate_during_eval': ('deprecated', None),
    'dpo_norm_loss': ('deprecated', None),
    'dpo_use_liger_kernel': ('kernel', None),
    'dpo_use_logits_to_keep': ('deprecated', None),
    'dsv4_bf16_all': ('kernel', None),
    'dsv4_fp4_grouped_mode': ('kernel', None),
    'dsv4_fp8_lora_kernel': ('kernel', None),
    'dsv4_fp8_nonexpert_mode': ('kernel', None),
    'dsv4_shared_mlp_lora_kernel': ('kernel', None),
    'dynamic_checkpoint': ('other', None),
    'eaft_alpha': ('other', 1.0),
    'eaft_k': ('other', 20),
    'embedding_lr': ('optim', None),
    'embedding_lr_scale': ('optim', None),
    'embeddings_skip_upcast': ('other', None),
    'env_capabilities': ('derived', None),
    'eval_causal_lm_metrics': ('other', None),
    'eval_max_new_tokens': ('deprecated', None),
    'eval_sequence_len': ('other', None),
    'eval_table_size': ('deprecated', None),
    'evaluation_strategy': ('deprecated', None),
    'experimental_skip_move_to_device': ('other', True),
    'expert_backend': ('kernel', None),
    'expert_parallel_backend': ('kernel', 'deep_ep'),
    'expert_parallel_fallback_on_unsupported': ('kernel', True),
    'expert_parallel_num_nvl_bytes': ('kernel', 268435456),
    'expert_parallel_num_rdma_bytes': ('kernel', 0),
    'expert_parallel_size': ('kernel', 1),
    'expert_parallel_token_capacity': ('kernel', None),
    'experts_implementation': ('kernel', None),
    'fix_untrained_tokens': ('other', None),
    'flash_attn_cross_entropy': ('kernel', None),
    'flash_attn_d512': ('kernel', None),
    'flash_attn_fuse_mlp': ('kernel', None),
    'flash_attn_rms_norm': ('deprecated', None),
    'flash_optimum': ('kernel', None),
    'flex_attn_compile_kwargs': ('kernel', None),
    'float16': ('other', None),
    'float32': ('other', None),
    'fp32_norm_classes': ('other', None),
    'fp32_norms': ('other', None),
    'fp8': ('quant', None),
    'fp8_enable_fsdp_float8_all_gather': ('quant', None),
    'freeze_mm_modules': ('other', None),
    'fsdp_final_state_dict_type': ('parallel', None),
    'fsdp_version': ('other', None),
    'fused_attn_kernel': ('kernel', None),
    'gc_collect_steps': ('other', None),
    'gc_steps': ('other', None),
    'gemma4_fp8_nonexpert': ('kernel', None),
    'gemma4_hybrid_attn_impl': ('kernel', None),
    'gemma4_nf4_nonexpert': ('kernel', None),
    'generate_samples': ('samples', False),
    'generation_do_sample': ('samples', True),
    'generation_max_new_tokens': ('samples', 50),
    'generation_prompt_ratio': ('samples', 0.5),
    'generation_temperature': ('samples', 0.7),
    'generation_top_k': ('samples', None),
    'generation_top_p': ('samples', None),
    'gptq': ('quant', None),
    'gpu_memory_limit': ('parallel', None),
    'gradio_max_new_tokens': ('ui', None),
    'gradio_server_name': ('ui', None),
    'gradio_server_port': ('ui', None),
    'gradio_share': ('ui', None),
    'gradio_temperature': ('ui', None),
    'gradio_title': ('ui', None),
    'grokfast_alpha': ('technique', 0.98),
    'grokfast_lamb': ('technique', 2.0),
    'hatchery': ('technique', None),
    'heads_k_stride': ('parallel', None),
    'hf_mlflow_log_artifacts': ('tracker', None),
    'hf_use_auth_token': ('hub', None),
    'hub_model_id': ('hub', None),
    'hub_revision': ('hub', None),
    'hub_strategy': ('hub', None),
    'image_resize_algorithm': ('multimodal', None),
    'image_size': ('multimodal', None),
    'include_tkps': ('other', True),
    'include_tokens_per_second': ('other', None),
    'is_falcon_derived_model': ('derived', None),
    'is_llama_derived_model': ('derived', None),
    'is_mistral_derived_model': ('derived', None),
    'is_preprocess': ('derived', None),
    'is_qwen_derived_model': ('derived', None),
    'jagged_restart_anneal_steps': ('technique', None),
    'jagged_restart_steps': ('technique', None),
    'jagged_restart_warmup_steps': ('technique', None),
    'kd_alpha': ('technique', None),
    'kd_beta': ('technique', 0.0),
    'kd_ce_alpha': ('technique', None),
    'kd_normalize_topk': ('technique', None),
    'kd_online_server': ('technique', 'vllm'),
    'kd_online_server_base_url': ('technique', None),
    'kd_online_timeout': ('technique', 120),
    'kd_online_topk': ('technique', None),
    'kd_temperature': ('technique', None),
    'kd_temperature_min': ('technique', None),
    'kd_trainer': ('technique', None),
    'large_head_attention': ('kernel', None),
    'layer_offloading': ('other', False),
    'liger_rms_norm_gated': ('kernel', None),
    'liger_use_token_scaling': ('kernel', None),
    'lisa_layers_attribute': ('technique', 'model.layers'),
    'lisa_n_layers': ('technique', None),
    'lisa_step_interval': ('technique', None),
    'llama4_linearized_experts': ('kernel', None),
    'llmcompressor': ('technique', None),
    'lm_eval_batch_size': ('technique', 8),
    'lm_eval_model': ('technique', None),
    'lm_eval_post_train': ('technique', True),
    'lm_eval_tasks': ('technique', []),
    'local_rank': ('parallel', None),
    'lora_alpha_pattern': ('other', None),
    'lora_embedding_kernel': ('kernel', None),
    'lora_mlp_kernel': ('kernel', None),
    'lora_o_kernel': ('kernel', None),
    'lora_on_cpu': ('parallel', None),
    'lora_qkv_kernel': ('kernel', None),
    'lora_rank_pattern': ('other', None),
    'loraplus_lr_embedding': ('optim', 1e-06),
    'loraplus_lr_ratio': ('optim', None),
    'low_cpu_mem_usage': ('other', None),
    'lr_div_factor': ('optim', None),
    'lr_groups': ('optim', None),
    'lr_quadratic_warmup': ('optim', None),
    'max_memory': ('parallel', None),
    'max_packed_sequence_len': ('deprecated', None),
    'max_prompt_len': ('other', None),
    'merge_lora': ('other', None),
    'merge_method': ('other', 'memory_efficient'),
    'min_sample_len': ('other', None),
    'model_kwargs': ('other', None),
    'model_quantization_config': ('quant', None),
    'model_quantization_config_kwargs': ('quant', None),
    'moe_bnb_fast': ('kernel', None),
    'moe_dequant_chunk_size': ('kernel', None),
    'moe_grouped_backend': ('kernel', None),
    'mora': ('technique', None),
    'multipack_real_batches': ('other', None),
    'noisy_embedding_alpha': ('deprecated', None),
    'nonexpert_quantization': ('kernel', None),
    'num_dataset_shards_to_save': ('other', None),
    'num_generation_samples': ('samples', 3),
    'nvfp4_merge_aware': ('kernel', None),
    'nvfp4_merge_aware_start_step': ('kernel', None),
    'optim_args': ('optim', None),
    'optim_target_modules': ('optim', None),
    'otel_metrics_host': ('tracker', 'localhost'),
    'otel_metrics_port': ('tracker', 8000),
    'overrides_of_model_kwargs': ('other', None),
    'peft': ('other', None),
    'peft_autocast_adapter_dtype': ('other', None),
    'peft_ensure_weight_tying': ('other', None),
    'peft_layer_replication': ('other', None),
    'peft_layers_pattern': ('other', None),
    'peft_layers_to_transform': ('other', None),
    'peft_trainable_token_indices': ('other', None),
    'pose_max_context_len': ('other', None),
    'pose_num_chunks': ('other', None),
    'pose_split_on_token_ids': ('other', None),
    'preprocess_iterable': ('other', None),
    'pretrain_multipack_buffer_size': ('deprecated', None),
    'pretraining_sample_concatenation': ('other', None),
    'process_reward_model': ('other', None),
    'processor_kwargs': ('other', None),
    'processor_type': ('other', None),
    'profiler_steps': ('other', None),
    'profiler_steps_start': ('other', 0),
    'push_dataset_to_hub': ('hub', None),
    'qgalore_cos_threshold': ('optim', 0.4),
    'qgalore_gamma_proj': ('optim', 2),
    'qgalore_proj_bits': ('optim', 4),
    'qgalore_proj_group_size': ('optim', 256),
    'qgalore_proj_quant': ('optim', True),
    'qgalore_proj_type': ('optim', 'std'),
    'qgalore_queue_size': ('optim', 5),
    'qgalore_rank': ('optim', 256),
    'qgalore_scale': ('optim', 0.25),
    'qgalore_update_proj_gap': ('optim', 200),
    'qlora_sharded_model_loading': ('quant', False),
    'quantization': ('quant', None),
    'quantize_moe_experts': ('quant', False),
    'ray_num_workers': ('launcher', 1),
    'ray_run_name': ('launcher', None),
    'relora': ('technique', None),
    'relora_cpu_offload': ('technique', None),
    'relora_prune_method': ('technique', 'magnitude'),
    'relora_prune_ratio': ('technique', None),
    'resources_per_worker': ('launcher', {'GPU': 1}),
    'ring_attn_func': ('parallel', None),
    'role_boundaries': ('multimodal', None),
    'rope_scaling': ('deprecated', None),
    'rpo_alpha': ('deprecated', None),
    's2_attention': ('deprecated', None),
    'sage_attention': ('kernel', None),
    'sample_packing_bin_size': ('other', 200),
    'sample_packing_eff_est': ('derived', None),
    'sample_packing_group_size': ('other', 100000),
    'sample_packing_mp_start_method': ('other', None),
    'sample_packing_sequentially': ('other', None),
    'save_first_step': ('other', None),
    'save_safetensors': ('other', True),
    'scaling_softmax': ('kernel', None),
    'scaling_softmax_bias': ('kernel', None),
    'scaling_softmax_factor': ('kernel', None),
    'sdpa_varlen': ('kernel', None),
    'selective_checkpointing': ('other', None),
    'sequence_parallel_degree': ('parallel', None),
    'shuffle_before_merging_datasets': ('other', False),
    'spectrum_model_name': ('technique', None),
    'spectrum_top_fraction': ('technique', 0.5),
    'strict': ('other', False),
    'swanlab_api_host': ('tracker', None),
    'swanlab_completion_log_interval': ('tracker', 100),
    'swanlab_completion_max_buffer': ('tracker', 128),
    'swanlab_lark_secret': ('tracker', None),
    'swanlab_lark_webhook_url': ('tracker', None),
    'swanlab_log_completions': ('tracker', True),
    'swanlab_log_model': ('tracker', False),
    'swanlab_web_host': ('tracker', None),
    'tensor_parallel_size': ('parallel', None),
    'tiled_mlp': ('kernel', None),
    'tiled_mlp_num_shards': ('kernel', None),
    'tiled_mlp_use_original_mlp': ('kernel', True),
    'tokenizer_legacy': ('other', None),
    'tokenizer_save_jinja_files': ('other', True),
    'tokenizer_use_fast': ('other', None),
    'torch_compile_options': ('kernel', None),
    'torch_empty_cache_steps': ('other', None),
    'torchdistx_path': ('optim', None),
    'total_num_tokens': ('derived', None),
    'total_supervised_tokens': ('derived', None),
    'trainer_cls': ('other', None),
    'use_dsv4_kernels': ('kernel', None),
    'use_eaft': ('other', None),
    'use_glm_dsa_kernels': ('kernel', None),
    'use_kernels': ('kernel', None),
    'use_onebitllms': ('quant', None),
    'use_otel_metrics': ('tracker', False),
    'use_pose': ('other', None),
    'use_ray': ('launcher', False),
    'use_scattermoe': ('kernel', None),
    'use_sonicmoe': ('kernel', None),
    'wandb_log_model': ('tracker', None),
    'wandb_run_id': ('tracker', None),
    'wandb_watch': ('tracker', None),
    'world_size': ('parallel', None),
    'xformers_attention': ('kernel', None),
}

DATASET = {
    'chat_template': ('dataset', None),
    'chat_template_jinja': ('dataset', None),
    'conversation': ('dataset', None),
    'field_human': ('dataset', None),
    'field_model': ('dataset', None),
    'field_thinking': ('dataset', None),
    'input_format': ('dataset', None),
    'input_transform': ('dataset', None),
    'length': ('dataset', 1000),
    'logprobs_field': ('dataset', None),
    'max_completion_length': ('dataset', None),
    'max_input_id': ('dataset', None),
    'message_field_training': ('dataset', None),
    'message_field_training_detail': ('dataset', None),
    'min_input_id': ('dataset', 100),
    'preprocess_shards': ('dataset', None),
    'seed': ('dataset', None),
    'sequence_length': ('dataset', None),
    'shards': ('dataset', None),
    'shards_idx': ('dataset', None),
    'split_thinking': ('dataset', None),
    'step_separator': ('dataset', None),
    'temperature': ('dataset', None),
    'template_thinking_key': ('dataset', None),
    'train_on_eot': ('dataset', None),
    'train_on_last_step_only': ('dataset', None),
    'trust_remote_code': ('dataset', False),
}

TRL = {
    'use_liger_loss': ('trl', None),
    'vllm_enable_sleep_mode': ('trl', None),
    'vllm_guided_decoding_regex': ('trl', None),
}

VLLM = {
    'device': ('vllm', 'auto'),
}


def is_off(value: Any, default: Any) -> bool:
    """Null, Axolotl's default, or an empty / false / zero value where Axolotl's default is off."""
    return value is None or value == default or (default in (None, False) and value in (False, 0, "", [], {}))


def refusal(key: str, category: str) -> str:
    return SPECIFIC.get(key) or REASONS[category]


def known_only(name: str, table: dict[str, tuple[str, Any]]):
    """A config section holding the keys of `table` (any value validates; `train` judges them)."""
    from pydantic import Field, create_model

    from rlft.config.base import Section

    fields = {}
    for key, (category, _) in table.items():
        extra = {"axolotl_only": category}
        description = f"Axolotl key that rlft does not run ({refusal(key, category)})."
        # `model_config` is pydantic's own attribute: the field gets another name, the key stays
        attribute = f"{key}_" if key == "model_config" else key
        fields[attribute] = (Any, Field(None, alias=key if attribute != key else None, description=description, json_schema_extra=extra))
    return create_model(name, __base__=Section, **fields)


def unsupported_settings(cfg) -> tuple[list[tuple[str, str]], list[str]]:
    """([(key path, why train refuses it)], [key paths of Axolotl's computed values]) for a validated config."""
    refused, derived = [], []
    sections = [("", cfg, TOP_LEVEL), ("trl.", cfg.trl, TRL), ("vllm.", cfg.vllm, VLLM)]
    for list_name in ("datasets", "test_datasets", "pretraining_dataset"):
        sections += [(f"{list_name}[{i}].", ds, DATASET) for i, ds in enumerate(getattr(cfg, list_name) or [])]
    for prefix, section, table in sections:
        for attribute, info in type(section).model_fields.items():
            extra = info.json_schema_extra
            if not (isinstance(extra, dict) and "axolotl_only" in extra) or attribute not in section.model_fields_set:
                continue
            key = info.alias or attribute
            category, default = table[key]
            value = getattr(section, attribute)
            if category == "derived":
                derived.append(prefix + key)
            elif not is_off(value, default) and not SAME_AS_RLFT.get(key, lambda _: False)(value):
                refused.append((prefix + key, refusal(key, category)))
    from rlft.config.schema import ATTENTION, CCE_PLUGIN, LIGER_PLUGIN, NEMO_GYM_PLUGIN

    SWANLAB_PLUGIN = "axolotl.integrations.swanlab.SwanLabPlugin"  # rlft logs to SwanLab through accelerate (use_swanlab)
    for plugin in cfg.plugins or []:
        if plugin not in (NEMO_GYM_PLUGIN, SWANLAB_PLUGIN, LIGER_PLUGIN, CCE_PLUGIN):
            refused.append((f"plugins: {plugin}", "Axolotl's plugin classes do not run in rlft (it implements the NeMo Gym, "
                                                  "SwanLab, Liger and Cut Cross-Entropy ones); its switches are refused one by "
                                                  "one above where set"))
    if cfg.attn_implementation and cfg.attn_implementation not in ATTENTION:
        refused.append((f"attn_implementation: {cfg.attn_implementation}", f"not built in rlft: use one of {', '.join(ATTENTION)}"))
    from rlft.data.chat_templates import NOT_SHIPPED

    if cfg.chat_template in NOT_SHIPPED:
        refused.append((f"chat_template: {cfg.chat_template}", "a vision template; use a text template or tokenizer_default "
                        "(rlft trains text-only models)"))
    model_type = cfg.model_type or "AutoModelForCausalLM"
    if cfg.method == "reward_model" and model_type not in ("AutoModelForCausalLM", "AutoModelForSequenceClassification"):
        refused.append((f"model_type: {model_type}", "reward models load as AutoModelForSequenceClassification (one score head)"))
    elif cfg.method != "reward_model" and not model_type.endswith("ForCausalLM"):
        refused.append((f"model_type: {model_type}", "rlft trains causal language models: AutoModelForCausalLM or a *ForCausalLM class"))
    if cfg.skip_prepare_dataset and cfg.rl not in ("grpo", "gdpo") and not (cfg.rl == "ebft" and cfg.ebft.mode == "structured"):
        refused.append(("skip_prepare_dataset", "applies to prompt datasets (grpo, gdpo, structured ebft); other methods need "
                                                "rows tokenised and fitted to sequence_len"))
    if cfg.gradient_checkpointing == "offload_disk":
        refused.append(("gradient_checkpointing: offload_disk", "offloading activations to disk is not built: use "
                        "gradient_checkpointing: offload (to host memory)"))
    if cfg.activation_offloading == "disk":
        refused.append(("activation_offloading: disk", "offloading activations to disk is not built: use "
                        "activation_offloading: true (to host memory)"))
    return refused, derived
