"""Rows of Cosmos-RL's `[train]` section: optimizer and schedule, precision, batches, checkpoints, fp8 and fp4."""

from __future__ import annotations

import math
from typing import Any

from rlft.config.cosmos.rows import Row, View, refused_when, rows_to, to, unused

SCHEDULE = ("lr_scheduler", "cosine_min_lr_ratio")
BATCHES = ("micro_batch_size", "gradient_accumulation_steps", "trl.steps_per_generation", "trl.generation_batch_size")
NOT_SHARDED = "an FSDP setting, and policy.parallelism.dp_shard_size = 1 shards nothing"
SHARDED_DEFAULTS = {"train.fsdp_offload": "false: FSDP2 keeps the parameters on the GPU (rlft's fsdp_offload_params default)",
                    "train.fsdp_reshard_after_forward": "default: FSDP2 reshards after each forward (rlft's "
                                                        "fsdp_reshard_after_forward default)"}
HUB = "rlft never uploads (it runs offline): push the output folder yourself, e.g. `hf upload ORG/NAME outputs/run`"


def _optimizer(value: Any, view: View) -> dict[str, Any]:
    return {"optimizer": "adamw_torch_fused" if view.get("train.optm_impl") == "fused" else "adamw_torch"}


def _adam(value: Any, view: View) -> str | None:
    if value not in ("AdamW", "Adam"):
        return f"{value!r} is not one of Cosmos-RL's optimizers (AdamW, Adam)"
    if value == "Adam" and view.get("train.optm_weight_decay"):
        return ("Adam with weight decay adds the decay to the gradient (L2); rlft builds AdamW, which decays the weights "
                "themselves: set optm_name = \"AdamW\", or optm_weight_decay = 0 (Adam and AdamW are then the same)")
    return None


def _warmup(value: Any) -> dict[str, Any]:
    """Cosmos-RL: a float up to 1.0 is a fraction of the run, rounded down (rlft's warmup_ratio), else steps."""
    if isinstance(value, float) and value <= 1.0:
        return {"warmup_ratio": value}
    return {"warmup_steps": int(value)}


def _schedule(value: Any, view: View) -> dict[str, Any]:
    """Cosmos-RL's schedule: linear warm-up, then a decay of `optm_decay_type` to `optm_min_lr_factor` over the steps
    after warm-up (optm_decay_ratio unset), or none: transformers' constant_with_warmup, linear or cosine."""
    kind, floor = view.get("train.optm_decay_type"), view.get("train.optm_min_lr_factor") or 0.0
    if kind in (None, "none") or view.get("train.optm_decay_ratio") == 0:
        return {"lr_scheduler": "constant_with_warmup"}
    if kind == "cosine":
        return {"lr_scheduler": "cosine", "cosine_min_lr_ratio": floor}
    return {"lr_scheduler": "linear"}


def _schedule_refused(value: Any, view: View) -> str | None:
    kind, ratio = view.get("train.optm_decay_type"), view.get("train.optm_decay_ratio")
    if kind in (None, "none") or ratio == 0:
        return None
    if kind not in ("linear", "cosine", "sqrt"):
        return f"optm_decay_type {kind!r} is not one of Cosmos-RL's decays (linear, cosine, sqrt, none)"
    if ratio is not None and ratio < 1:
        return ("a decay over the last optm_decay_ratio of the run (warm-up, constant, then decay) is transformers' "
                "warmup_stable_decay, which takes its decay in steps; rlft has no key that sizes it as a fraction: "
                "remove optm_decay_ratio (decay over every step after warm-up)")
    if kind == "sqrt":
        return "a 1-sqrt decay is built only as transformers' warmup_stable_decay with a step count: use cosine or linear"
    if kind == "linear" and view.get("train.optm_min_lr_factor"):
        return "a linear decay to a floor (optm_min_lr_factor) is not built: use optm_decay_type = \"cosine\" with it"
    return None


def _precision(value: Any, view: View) -> dict[str, Any]:
    """bfloat16: rlft's bf16: auto (bfloat16 on a GPU that has it, float32 elsewhere); float16 and float32 as named."""
    return {"bfloat16": {}, "float16": {"fp16": True}, "float32": {"bf16": False}}.get(value, {})


def batches(value: Any, view: View) -> dict[str, Any]:
    """train_batch_per_replica rows per process and generation batch, in micro-batches of mini_batch rows; GRPO's
    batch_size_per_optimize splits them into several optimizer steps (trl.steps_per_generation). Where the rows are
    not whole groups of n_generation completions, a generation batch of whole groups serves several optimizer steps
    (trl.generation_batch_size): each group's advantages are still computed over the whole group, as in Cosmos-RL.
    Nothing where train_batch_per_replica is below 1 (`batches_refused` says why)."""
    rows, step_rows, micro = _batch_sizes(view)
    if rows < 1:
        return {}
    out: dict[str, Any] = {"micro_batch_size": micro, "gradient_accumulation_steps": max(1, step_rows // micro)}
    if view.method != "grpo":
        return out
    group = view.get("rollout.n_generation") or 1
    if rows % group:
        out["trl.generation_batch_size"] = math.lcm(rows, group)
    elif step_rows < rows:
        out["trl.steps_per_generation"] = rows // step_rows
    return out


def steps_per_batch(view: View) -> int:
    """Optimizer steps one generation batch serves: its steps of rows, each taken mu_iterations times."""
    rows, step_rows, _ = _batch_sizes(view)
    group = view.get("rollout.n_generation") or 1
    if rows < 1:  # refused (`batches_refused`)
        return 1
    batch_rows = math.lcm(rows, group) if rows % group else rows
    return max(1, batch_rows // max(1, step_rows)) * max(1, view.get("train.train_policy.mu_iterations") or 1)


def _batch_sizes(view: View) -> tuple[int, int, int]:
    rows = view.get("train.train_batch_per_replica")
    per_optimize = view.get("train.train_policy.batch_size_per_optimize") if view.method == "grpo" else None
    step_rows = min(per_optimize, rows) if per_optimize and per_optimize > 0 else rows
    mini = view.get("train.train_policy.mini_batch")
    return rows, step_rows, min(mini, step_rows) if mini and mini > 0 else step_rows


def batches_refused(value: Any, view: View) -> str | None:
    rows, step_rows, micro = _batch_sizes(view)
    if rows < 1:
        return (f"train_batch_per_replica {rows} trains no rows: set it to the rows each process trains per step, at least 1 "
                "(Cosmos-RL's default is 8)")
    if step_rows % micro or rows % step_rows:
        return (f"train_batch_per_replica {rows} is not a whole number of mini-batches of {micro} rows (or of "
                f"batch_size_per_optimize {step_rows}): rlft steps in whole micro-batches; make it a multiple")
    return None


def _sharded(convert):
    """An FSDP key: read where policy.parallelism.dp_shard_size shards the model (an fsdp_config alone turns FSDP on)."""
    return lambda value, view: convert(value) if _shards(view) else {}


def _shards(view: View) -> bool:
    return view.get("policy.parallelism.dp_shard_size") != 1


def _unsharded(key: str):
    """Why an FSDP key sets nothing: no sharding, or its value is what rlft's FSDP2 does by default."""
    return lambda value, view: SHARDED_DEFAULTS[key] if _shards(view) else NOT_SHARDED


def _betas(value: Any, view: View) -> str | None:
    if len(value) == 2:
        return None
    return (f"optm_betas has {len(value)} number(s), and Adam takes two (beta1, beta2): write two, e.g. [0.9, 0.999] "
            "(Cosmos-RL's default)")


def _saving(convert):
    """A `[train.ckpt]` key that counts only when enable_checkpoint is on."""
    return lambda value, view: convert(value) if view.get("train.ckpt.enable_checkpoint") else {}


def _keep(value: Any) -> dict[str, Any]:
    return {"save_total_limit": -1 if value < 0 else value}


TRAIN_ROWS: list[Row] = [
    Row("train.optm_name", ("optimizer",), _optimizer, refuse=_adam, carry=True),
    Row("train.optm_impl", ("optimizer",), _optimizer, carry=True,
        refuse=lambda value, view: ("one implementation per optimizer (a list): rlft trains one optimizer; give one of "
                                    "fused, foreach, for-loop") if isinstance(value, list) else None,
        note="fused: adamw_torch_fused; foreach, for-loop: adamw_torch"),
    to("train.optm_lr", "learning_rate", carry=True,
       refuse=lambda value, view: ("one learning rate per optimizer (a list): rlft trains one optimizer; give one number")
       if isinstance(value, list) else None),
    to("train.optm_weight_decay", "weight_decay", carry=True),
    Row("train.optm_betas", ("adam_beta1", "adam_beta2"), lambda value, view: {"adam_beta1": value[0], "adam_beta2": value[1]},
        refuse=_betas, carry=True),
    rows_to("train.optm_warmup_steps", ("warmup_steps", "warmup_ratio"), lambda value, view: _warmup(value), carry=True,
            note="a float up to 1.0: warmup_ratio (a fraction of the run, rounded down, as Cosmos-RL); else warmup_steps"),
    Row("train.optm_decay_type", SCHEDULE, _schedule, refuse=_schedule_refused, carry=True,
        note="unset or none: constant_with_warmup; cosine: cosine to optm_min_lr_factor; linear: linear to 0"),
    Row("train.optm_decay_ratio", SCHEDULE, _schedule, refuse=_schedule_refused),
    Row("train.optm_min_lr_factor", SCHEDULE, _schedule, refuse=_schedule_refused),
    to("train.optm_grad_norm_clip", "max_grad_norm", carry=True),
    to("train.epsilon", "adam_epsilon", carry=True),
    unused("train.master_dtype", lambda value, view: None if value == "float32" else (
        "rlft keeps float32 master weights under mixed precision (more memory, the same or better numerics)"),
           note="float32: what rlft keeps under mixed precision; other values are not used"),
    Row("train.param_dtype", ("bf16", "fp16"), _precision, carry=True,
        note="bfloat16: bf16: auto (bfloat16 on a GPU that has it); float16: fp16: true; float32: bf16: false"),
    unused("train.transfer_dtype", "a rollout server receives the weights in its own dtype (vllm.dtype)"),
    unused("train.fsdp_reduce_dtype", "rlft's FSDP2 reduces gradients in the dtype of its mixed-precision policy"),
    Row("train.fsdp_offload", ("fsdp_config.fsdp_offload_params",),
        _sharded(lambda value: {"fsdp_config.fsdp_offload_params": True} if value else {}),
        unused=_unsharded("train.fsdp_offload"), note="true: FSDP2 keeps parameters on the CPU"),
    Row("train.fsdp_reshard_after_forward", ("fsdp_config.fsdp_reshard_after_forward",), _sharded(
        lambda value: {} if value == "default" else {"fsdp_config.fsdp_reshard_after_forward": value == "always"}),
        unused=_unsharded("train.fsdp_reshard_after_forward"), note="with dp_shard_size sharding: always, never: true, false"),
    Row("train.train_batch_per_replica", BATCHES, batches, refuse=batches_refused, carry=True,
        note="rows per process and step: micro_batch_size = train_policy.mini_batch, gradient_accumulation_steps = the rest"),
    rows_to("train.resume", ("resume_from_checkpoint",), lambda value, view: {} if value is False else {
        "resume_from_checkpoint": "auto" if value is True else value}),
    to("train.epoch", "num_epochs", carry=True),
    to("train.output_dir", "output_dir", carry=True,
       note="rlft writes into output_dir itself (Cosmos-RL adds a timestamped folder)"),
    unused("train.timestamp", "rlft writes into output_dir itself, with no timestamped folder (train.resume = true "
                              "resumes from the newest checkpoint there)"),
    refused_when("train.async_tp_enabled", bool, "async tensor parallelism needs tensor parallelism, which rlft does not "
                                                 "build: remove it (and see policy.parallelism.tp_size)"),
    to("train.compile", "torch_compile"),
    rows_to("train.sync_weight_interval", ("trl.vllm_sync_interval",),
            lambda value, view: {"trl.vllm_sync_interval": value} if view.method == "grpo" else {}, carry=True),
    refused_when("train.deterministic", bool, "deterministic kernels (torch.use_deterministic_algorithms) have no rlft "
                                              "key: rlft seeds data, weights and sampling from train.seed; remove it"),
    to("train.activation_offload", "activation_offloading"),
    rows_to("train.fa_version", ("attn_implementation",), lambda value, view: {} if value is None else {
        "attn_implementation": f"flash_attention_{value}"}),
    rows_to("train.seed", ("seed",), lambda value, view: {} if value is None else {"seed": value}),
    unused("train.local_dataset", "a detail of Cosmos-RL's controller: rlft's trainer reads its dataset itself"),
    unused("train.force_use_hf", "rlft reads a local path where one is given and the hub otherwise (online only)"),
    rows_to("train.max_num_steps", ("max_steps",), lambda value, view: {} if value is None else {"max_steps": value}),
    rows_to("train.sequence_packing", ("batch_flattening",), lambda value, view: {"batch_flattening": True} if value else {},
            note="true: each micro-batch as one sequence without padding, rows kept apart"),
    # fp8 and fp4 training
    refused_when("train.fp8.enable_fp8", bool, "fp8 training (float8 linear layers) is not built in rlft; nearest: bf16 "
                                               "mixed precision (train.param_dtype = \"bfloat16\"), or quantization-aware "
                                               "training with the qat section (docs/training.md)",
                 otherwise="fp8 is off"),
    unused("train.fp8.fp8_recipe", "a setting of fp8 training (train.fp8.enable_fp8)"),
    unused("train.fp8.quant_recipe", "a setting of fp8 training (train.fp8.enable_fp8)"),
    refused_when("train.fp4.enable_fp4", bool, "fp4 training is not built in rlft; nearest: bf16 mixed precision "
                                               "(train.param_dtype = \"bfloat16\")", otherwise="fp4 is off"),
    unused("train.fp4.fp4_recipe", "a setting of fp4 training (train.fp4.enable_fp4)"),
    unused("train.fp4.quant_recipe", "a setting of fp4 training (train.fp4.enable_fp4)"),
    # checkpoints
    rows_to("train.ckpt.enable_checkpoint", ("save_strategy",), lambda value, view: {} if value else {"save_strategy": "no"},
            carry=True, note="false (Cosmos-RL's default): save_strategy: no (rlft still writes the final model)"),
    Row("train.ckpt.save_freq", ("save_steps",), lambda value, view: {} if view.get("train.ckpt.save_freq_in_epoch") else
        _saving(lambda steps: {"save_steps": steps})(value, view), carry=True,
        unused="train.ckpt.save_freq_in_epoch, set above 0, wins (as in Cosmos-RL)"),
    rows_to("train.ckpt.save_freq_in_epoch", ("save_every_n_epochs",),
            _saving(lambda value: {"save_every_n_epochs": value} if value else {})),
    rows_to("train.ckpt.save_mode", ("save_mode",), _saving(lambda value: {"save_mode": value})),
    rows_to("train.ckpt.max_keep", ("save_total_limit",), _saving(_keep), carry=True,
            note="-1 keeps every checkpoint"),
    unused("train.ckpt.export_safetensors", lambda value, view: "rlft writes its final model as safetensors" if value else
           "rlft writes its final model as safetensors whatever this says", note="rlft writes safetensors always"),
    refused_when("train.ckpt.upload_hf", bool, HUB, otherwise="uploading is off"),
    unused("train.ckpt.hf_repo_name", "a setting of train.ckpt.upload_hf"),
    refused_when("train.ckpt.upload_s3", bool, "rlft never uploads: copy the output folder to S3 yourself (aws s3 sync "
                                               "outputs/run s3://BUCKET/PREFIX)", otherwise="uploading is off"),
    unused("train.ckpt.s3_bucket", "a setting of train.ckpt.upload_s3"),
    unused("train.ckpt.s3_prefix", "a setting of train.ckpt.upload_s3"),
]
