"""Rows of Cosmos-RL's `[policy]` (the trained model, its adapter, how it is split over GPUs) and `[rollout]` (sampling,
and the rollout engine that rlft's `vllm-serve` runs)."""

from __future__ import annotations

from typing import Any

from rlft.config.cosmos.rows import Row, View, above_one, refused_when, rows_to, to, unused
from rlft.config.trackers import SINKS as LOGGERS

FSDP = ("rlft shards a model with FSDP2 over the processes it starts: set policy.parallelism.dp_shard_size to the GPUs "
        "(it becomes fsdp: [full_shard, auto_wrap]) and run `rlft train FILE --num-processes N`")
PARALLEL = {
    "tp_size": f"tensor parallelism (each layer's weights split over GPUs) is not built in rlft; nearest: {FSDP}",
    "pp_size": f"pipeline parallelism (layers split into stages over GPUs) is not built in rlft; nearest: {FSDP}",
    "cp_size": ("context parallelism (each sequence split over GPUs) is not built in rlft; nearest: "
                "policy.model_gradient_checkpointing = true with a smaller train_policy.mini_batch, or " + FSDP),
    "ep_size": f"expert parallelism (the experts of a mixture-of-experts model spread over GPUs) is not built; nearest: {FSDP}",
    "n_init_replicas": ("several policy replicas (each its own group of GPUs) are not built: rlft trains one group of "
                        "processes; nearest: data parallelism over them, `rlft train FILE --num-processes N` (with "
                        "dp_shard_size: FSDP2)"),
}
PIPELINE = "a setting of pipeline parallelism (pp_size)"
ENGINE = {
    "tp_size": None,  # the engine's tensor parallelism: vllm.tensor_parallel_size
    "pp_size": ("pipeline stages in the rollout engine have no key in rlft's server; nearest: "
                "rollout.parallelism.tp_size (vllm.tensor_parallel_size)"),
    "cp_size": "context parallelism in the rollout engine is not built; nearest: rollout.parallelism.tp_size",
    "ep_size": "expert parallelism in the rollout engine has no key in rlft's server; nearest: rollout.parallelism.tp_size",
    "n_init_replicas": ("several rollout engines (replicas) are not built: a run talks to one rlft rollout server "
                        "(vllm.data_parallel_size 1); nearest: one engine over the GPUs, rollout.parallelism.tp_size"),
}
ENGINE_SHARDING = "a rollout engine is not FSDP-sharded: vLLM splits it with tp_size"


def _shards(value: Any, view: View) -> dict[str, Any]:
    return {} if value == 1 else {"fsdp": ["full_shard", "auto_wrap"]}


def _replicas(value: Any, view: View) -> str | None:
    if value > 1 and view.get("policy.parallelism.dp_shard_size") != 1:
        return ("dp_replicate_size above 1 with dp_shard_size (hybrid sharding, HSDP) is not built; nearest: FSDP2 over "
                "every process: dp_replicate_size = 1, dp_shard_size = the GPUs, `rlft train FILE --num-processes N`")
    return None


def _lora(convert):
    """A `[policy.lora]` key: read only when the section is there."""
    return lambda value, view: convert(value) if view.get("policy.lora") is not None else {}


def _targets(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    return {"lora_target_linear": True} if value == "all-linear" else {"lora_target_modules": value}


def _max_length(value: Any, view: View) -> dict[str, Any] | None:
    """SFT: the longest row. GRPO: rlft's sequence_len holds prompt and completion, so it is written only where it leaves
    room for a prompt beside rollout.max_response_length; Cosmos-RL drops longer samples from training instead."""
    if view.method == "grpo" and value <= view.get("rollout.max_response_length"):
        return {}
    return {"sequence_len": value}


def _loggers(view: View) -> list[str]:
    return [name.lower() for name in view.get("logging.logger") or []]


def _unknown_loggers(value: Any, view: View) -> str | None:
    unknown = [name for name in value if name.lower() not in LOGGERS]
    return f"{', '.join(unknown)}: not a logger rlft has ({', '.join(LOGGERS)})" if unknown else None


def _liger(value: Any, view: View) -> dict[str, Any]:
    return {"liger_rope": True, "liger_rms_norm": True, "liger_glu_activation": True} if value else {}


def _sampling(key: str):
    """A rollout key: GRPO generates, SFT does not."""
    return lambda value, view: {key: value} if view.method == "grpo" else {}


def _backend(value: Any, view: View) -> str | None:
    if value == "vllm":
        return None
    if value == "trtllm":
        return ("TensorRT-LLM is not a rollout engine rlft runs; nearest: vLLM, through `rlft vllm-serve FILE` and "
                "trl.use_vllm = true (or rlft's in-process engine, the default)")
    return f"backend {value!r} is a rollout engine that a Cosmos-RL launch script registers; rlft runs vLLM or its own"


def _parallelism_rows() -> list[Row]:
    rows = []
    for key, why in PARALLEL.items():
        rows.append(refused_when(f"policy.parallelism.{key}", above_one, why, otherwise="1: the whole model on each process"))
        engine = ENGINE[key]
        if engine is None:
            rows.append(rows_to(f"rollout.parallelism.{key}", ("vllm.tensor_parallel_size",),
                                lambda value, view: {"vllm.tensor_parallel_size": value} if value > 1 else {},
                                note="GPUs of the engine `rlft vllm-serve` starts"))
        else:
            rows.append(refused_when(f"rollout.parallelism.{key}", above_one, engine, otherwise="1: one engine"))
    rows += [
        Row("policy.parallelism.dp_shard_size", ("fsdp",), _shards,
            note="-1 or above 1: FSDP2 over the processes `rlft train --num-processes N` starts"),
        Row("policy.parallelism.dp_replicate_size", convert=lambda value, view: {}, refuse=_replicas,
            unused="plain data parallelism: the processes `rlft train --num-processes N` starts"),
    ]
    for key in ("pp_dynamic_shape", "pp_micro_batch_size", "pp_schedule", "pp_layers_per_stage"):
        rows.append(unused(f"policy.parallelism.{key}", PIPELINE))
    for key in ("dp_shard_size", "dp_replicate_size", "pp_dynamic_shape", "pp_micro_batch_size", "pp_schedule",
                "pp_layers_per_stage"):
        rows.append(unused(f"rollout.parallelism.{key}", ENGINE_SHARDING))
    return rows


POLICY_MODEL_ROWS: list[Row] = _parallelism_rows() + [
    to("policy.model_name_or_path", "base_model", carry=True, note="a local folder, or a hub id (online)"),
    rows_to("policy.model_revision", ("revision_of_model",),
            lambda value, view: {} if value is None else {"revision_of_model": value}),
    Row("policy.model_max_length", ("sequence_len",), _max_length, carry=True,
        unused="GRPO: rlft keeps every prompt and bounds completions by trl.max_completion_length",
        note="longer rows are dropped; GRPO: only where it leaves room for prompts beside max_response_length"),
    to("policy.model_gradient_checkpointing", "gradient_checkpointing", carry=True),
    rows_to("policy.lora", ("adapter",), lambda value, view: {} if value is None else {"adapter": "lora"},
            note="a [policy.lora] table: adapter: lora"),
    rows_to("policy.lora.r", ("lora_r",), _lora(lambda value: {"lora_r": value}), carry=True),
    rows_to("policy.lora.lora_alpha", ("lora_alpha",), _lora(lambda value: {"lora_alpha": value}), carry=True),
    rows_to("policy.lora.lora_dropout", ("lora_dropout",), _lora(lambda value: {"lora_dropout": value}), carry=True),
    rows_to("policy.lora.target_modules", ("lora_target_modules", "lora_target_linear"), _lora(_targets), carry=True,
            note="all-linear: lora_target_linear: true"),
    rows_to("policy.lora.use_rslora", ("peft_use_rslora",), _lora(lambda value: {"peft_use_rslora": value} if value else {})),
    rows_to("policy.lora.modules_to_save", ("lora_modules_to_save",),
            _lora(lambda value: {} if value is None else {"lora_modules_to_save": value})),
    refused_when("policy.lora.alpha_pattern", bool, "per-module LoRA alpha (alpha_pattern) has no rlft key: one "
                                                    "lora_alpha for every module", otherwise="no per-module alpha"),
    refused_when("policy.lora.r_pattern", bool, "per-module LoRA ranks (r_pattern) have no rlft key: one lora_r for "
                                                "every module", otherwise="no per-module rank"),
    rows_to("policy.lora.init_lora_weights", ("peft_init_lora_weights",),
            _lora(lambda value: {} if value is True else {"peft_init_lora_weights": value})),
    refused_when("policy.trainable_map", bool, "a map of trainable parameters has no rlft key; nearest: "
                 "unfrozen_parameters (regular expressions of the parameter names that train)", otherwise="empty"),
    Row("policy.enable_liger_kernel", ("liger_rope", "liger_rms_norm", "liger_glu_activation"), _liger,
        note="Liger Kernel's RoPE, RMSNorm and gated MLP (CUDA)"),
]

ROLLOUT_ROWS: list[Row] = [
    Row("rollout.enforce_eager", ("vllm.enforce_eager",), _sampling("vllm.enforce_eager"), carry=True,
        note="read by `rlft vllm-serve`"),
    refused_when("rollout.include_stop_str_in_output", bool, "keeping stop strings in the completions has no rlft key "
                 "(rlft stops at EOS and trl.generation_kwargs' stop strings)"),
    Row("rollout.gpu_memory_utilization", ("vllm.gpu_memory_utilization",), _sampling("vllm.gpu_memory_utilization"),
        carry=True, note="read by `rlft vllm-serve`"),
    unused("rollout.enable_chunked_prefill", "a vLLM scheduling option that changes no result: rlft's server leaves it "
                                             "at vLLM's default"),
    Row("rollout.max_response_length", ("trl.max_completion_length",), _sampling("trl.max_completion_length"), carry=True),
    Row("rollout.n_generation", ("trl.num_generations",), _sampling("trl.num_generations"), carry=True),
    unused("rollout.n_generation_to_batch", "rlft's engines sample every completion of a step in one batch"),
    unused("rollout.batch_size", "rlft's engines sample every prompt of a step in one batch"),
    refused_when("rollout.quantization", lambda value: value != "none",
                 "quantised rollout weights are not built in rlft's rollout server; nearest: vllm.kv_cache_dtype = fp8 "
                 "(the KV cache only), or rollout.quantization = \"none\"", otherwise="none: the weights as trained"),
    unused("rollout.seed", "rlft seeds sampling from train.seed"),
    Row("rollout.sampling_config.temperature", ("trl.temperature",), _sampling("trl.temperature"), carry=True),
    Row("rollout.sampling_config.top_p", ("trl.top_p",), _sampling("trl.top_p"), carry=True),
    Row("rollout.sampling_config.top_k", ("trl.top_k",), lambda value, view: _sampling("trl.top_k")(max(value, 0), view),
        carry=True, note="-1: off (0)"),
    Row("rollout.sampling_config.repetition_penalty", ("trl.repetition_penalty",), _sampling("trl.repetition_penalty"),
        carry=True),
    unused("rollout.sampling_config.use_flashinfer", "a sampling kernel choice of vLLM that changes no result"),
    unused("rollout.vllm_use_flashinfer", "an attention kernel choice of vLLM that changes no result"),
    Row("rollout.backend", refuse=_backend, unused="rlft samples in the trainer's process, or with vLLM through `rlft "
        "vllm-serve FILE` and trl.use_vllm = true"),
    refused_when("rollout.multi_turn_config.enable", bool, "Cosmos-RL's multi-turn rollouts take their tools from its "
                 "launch script, and rlft's (trl.multi_turn_config) names them as Python functions: write the run as "
                 "rlft YAML (`rlft convert FILE`) with trl.multi_turn_config: {enable: true, tools: [module.function]}, "
                 "this section's other keys under the same names (docs/environments.md)",
                 otherwise="single-turn rollouts"),
]
for _key in ("enable_tools", "enable_thinking", "max_assistant_turns", "add_generation_prompt", "continue_final_message"):
    ROLLOUT_ROWS.append(unused(f"rollout.multi_turn_config.{_key}", "a setting of multi-turn rollouts "
                               "(rollout.multi_turn_config.enable)", note=f"rlft's trl.multi_turn_config.{_key}"))
ROLLOUT_ROWS.append(unused("rollout.multi_turn_config.custom_chat_template_path", "a setting of multi-turn rollouts "
                           "(rollout.multi_turn_config.enable)", note="rlft's chat_template: the path of a .jinja file"))

LOGGING_ROWS: list[Row] = [
    Row("logging.logger", ("logger",), lambda value, view: {"logger": value}, refuse=_unknown_loggers,
        note="the same names (console, wandb, tensorboard, ...)"),
    rows_to("logging.project_name", ("wandb_project",),
            lambda value, view: {"wandb_project": value} if "wandb" in _loggers(view) else {}, carry=True),
    rows_to("logging.experiment_name", ("wandb_name",),
            lambda value, view: {"wandb_name": value} if value and "wandb" in _loggers(view) else {}),
    unused("logging.report_mfu", "rlft logs MFU in every run"),
]
