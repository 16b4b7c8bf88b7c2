"""Rules on online RL (the GRPO family and EBFT): the `trl:` and `ebft:` sections."""

from __future__ import annotations

from rlft.config.methods import names_where, spec_of
from rlft.config.parallel import rows_per_process, rows_per_step
from rlft.config.rl import trl_options
from rlft.config.sections.trl import TRLConfig


def online_problems(cfg):
    """The rules of online RL. Keys a run resolves (`variant`, defaults) are judged as resolved (`trl_options`): what
    the run will do; a rule about a key the user wrote reads `cfg.trl`."""
    spec, options = spec_of(cfg), trl_options(cfg)
    if spec.feature_matching:
        yield from _ebft_problems(cfg, spec, options)
    if spec.engine:
        yield from _grpo_problems(cfg, spec, options)
    else:
        yield from _engine_keys_problems(cfg, spec)


def engine_only(name: str) -> bool:
    """Whether only a method with a rollout engine reads the `trl:` key `name` (Axolotl's keys are `train`'s to refuse)."""
    extra = TRLConfig.model_fields[name].json_schema_extra
    return not (isinstance(extra, dict) and ("read_without_engine" in extra or "axolotl_only" in extra))


def _engine_keys_problems(cfg, spec):
    """`trl:` keys that only a method with a rollout engine reads, written for one without (`engine_only`)."""
    written = [f"trl.{name}" for name in type(cfg.trl).model_fields if name in cfg.trl.model_fields_set and engine_only(name)]
    if not written:
        return
    one = len(written) == 1
    engines = ", ".join(name for name in names_where("engine") if name != "ebft")
    method = f"{cfg.method} in {spec.mode} mode, which generates its blocks inside each document in the trainer" if \
        spec.strided_blocks else cfg.method
    yield (f"{', '.join(written)} {'is' if one else 'are'} read only where a rollout engine generates (rl: {engines}, or ebft in "
           f"structured mode), not by {method}: remove {'it' if one else 'them'}")


def _ebft_problems(cfg, spec, options):
    ebft = cfg.ebft
    if "ebft" not in cfg.model_fields_set:
        yield "rl: ebft needs an `ebft:` section (at least `mode: structured` or `mode: strided`) saying how features are matched"
    group = ebft.n_samples_per_prompt if spec.strided_blocks else options["num_generations"]
    if ebft.use_whitening and group < 2:
        yield f"ebft.use_whitening needs at least 2 samples per group to estimate a second moment; the group size is {group}"
    if spec.strided_blocks and ebft.embed_method in ("concat", "completion_mean"):
        yield f"ebft.embed_method {ebft.embed_method!r} is for structured mode; strided mode pools a block: last_token or mean_pooling"
    if spec.strided_blocks and ebft.temperature <= 0:
        yield "ebft.temperature must be > 0: the REINFORCE term needs the sampling distribution's log-probs"


def _grpo_problems(cfg, spec, options):
    trl = cfg.trl
    completion = options["max_completion_length"]
    if "sequence_len" in cfg.model_fields_set and not cfg.skip_prepare_dataset and cfg.sequence_len <= completion:
        yield (f"sequence_len {cfg.sequence_len} leaves no room for prompts next to trl.max_completion_length {completion} "
               "(a prompt may use sequence_len - max_completion_length tokens): raise sequence_len, or remove it (prompts "
               "are then kept whatever their length, as in Axolotl)")
    if trl.aipo_rho is not None and options["loss_type"] == "cispo":
        yield "trl.aipo_rho replaces the clipped ratio, cispo clips it its own way: use one of them"
    if trl.reward_weights is not None and trl.reward_funcs is not None and len(trl.reward_weights) != len(trl.reward_funcs):
        yield f"trl.reward_weights has {len(trl.reward_weights)} entries for {len(trl.reward_funcs)} trl.reward_funcs: give one weight per function"
    if options["temperature"] <= 0:
        yield "trl.temperature must be > 0 for online RL: the log-probs of greedy decoding are not a distribution to train on"
    resets = [k for k in ("reference_reset_interval", "sync_ref_model") if getattr(trl, k)]
    if resets and options["beta"] == 0:
        yield (f"trl.{resets[0]} moves the reference model, but trl.beta is 0, so no reference model is loaded: set "
               "trl.beta above 0 (the KL term's weight), or remove the key")
    if resets and cfg.adapter and not cfg.rl_adapter_ref_model:
        yield (f"trl.{resets[0]} updates a frozen reference copy, but with an adapter the reference is the policy with its "
               "adapter disabled: set rl_adapter_ref_model: true to keep a copy, or remove the key")
    if "reset_optimizer_with_reference" in trl.model_fields_set and not trl.reference_reset_interval:
        yield ("trl.reset_optimizer_with_reference says what a reference reset does to the optimizer, and "
               "trl.reference_reset_interval (unset or 0) makes no reset: set reference_reset_interval, or remove "
               "reset_optimizer_with_reference")
    if trl.reference_reset_interval and trl.reset_optimizer_with_reference and "schedule_free" in cfg.optimizer:
        yield (f"trl.reset_optimizer_with_reference (default true) starts the optimizer's state again at each reference "
               f"reset, and optimizer: {cfg.optimizer} keeps the sequence its weights average over in that state: set "
               "trl.reset_optimizer_with_reference: false, or use another optimizer")
    groups = options["num_generations"]
    if groups < 2:
        yield f"trl.num_generations is {groups}: group-relative advantages need at least 2 completions per prompt"
    if trl.generation_batch_size is None:
        per_step = rows_per_process(cfg)
        if per_step % groups:
            yield (
                f"micro_batch_size * gradient_accumulation_steps = {cfg.micro_batch_size} * "
                f"{cfg.gradient_accumulation_steps} = {per_step} must be divisible by trl.num_generations = {groups} "
                f"(each prompt's {groups} completions must land in the same step): change micro_batch_size "
                "or gradient_accumulation_steps, or set trl.generation_batch_size"
            )
    elif trl.generation_batch_size % groups:
        yield f"trl.generation_batch_size = {trl.generation_batch_size} must be divisible by trl.num_generations = {groups}"
    if trl.generation_batch_size is not None:
        step_rows = rows_per_step(cfg)
        if trl.generation_batch_size % step_rows:
            yield (f"trl.generation_batch_size = {trl.generation_batch_size} is not a whole number of optimizer steps' rows "
                   f"(micro_batch_size * gradient_accumulation_steps * processes = {step_rows}): some steps would train "
                   "on fewer rows; make it a multiple of that")
        if trl.steps_per_generation is not None:
            yield ("trl.generation_batch_size and trl.steps_per_generation both size the generation batch (TRL refuses "
                   "both too): keep one of them")
    if spec.normalises_each_reward and trl.multi_objective_aggregation == "sum_then_normalize":
        yield f"rl: {spec.name} normalises each reward before summing: remove trl.multi_objective_aggregation: sum_then_normalize (or use rl: grpo)"
    per_reward = spec.normalises_each_reward or trl.multi_objective_aggregation == "normalize_then_sum"
    if per_reward and options["advantage_estimator"] == "rloo":
        yield ("trl.advantage_estimator: rloo with per-reward normalisation (rl: gdpo or multi_objective_aggregation: "
               "normalize_then_sum): GDPO z-scores each reward within its group, so a leave-one-out baseline would only "
               "rescale it; use advantage_estimator: grpo, or rl: grpo with sum_then_normalize")
    buffer = options["overlong_buffer_length"]
    if options["overlong_penalty"] and buffer is not None and buffer > completion:
        yield (f"trl.overlong_buffer_length {buffer} is longer than trl.max_completion_length {completion}: the penalty "
               "would fall on every completion; make the buffer at most max_completion_length (DAPO uses a quarter of it)")
    yield from _rollout_problems(cfg, options)


def _rollout_problems(cfg, options):
    """Rollout engine, async, importance-sampling and replay keys of the `trl:` section."""
    trl = cfg.trl
    depth = options["prefetch_depth"]
    if trl.async_prefetch and depth < 1:
        yield (f"trl.prefetch_depth is {depth} with trl.async_prefetch: true: prefetch_depth counts the rollout batches "
               "generated ahead and must be >= 1 (1 is the usual choice), or set async_prefetch: false")
    yield from _staleness_problems(cfg, options)
    if trl.vllm_group_port is not None and not (trl.use_vllm and options["vllm_mode"] == "server"):
        yield ("trl.vllm_group_port opens a weight group with a rollout server: it needs trl.use_vllm: true with "
               "vllm_mode: server (a colocated engine shares the trainer's process); remove vllm_group_port otherwise")
    if trl.use_vllm and cfg.adapter == "qlora" and not trl.vllm_lora_sync:
        yield ("adapter: qlora with trl.use_vllm sends merged weights, which a 4-bit base cannot give: set "
               "trl.vllm_lora_sync: true (the server keeps base_model's own weights and loads the adapter)")
    if trl.vllm_lora_sync and cfg.adapter not in ("lora", "qlora"):
        yield ("trl.vllm_lora_sync sends the LoRA adapter: set adapter: lora, or remove vllm_lora_sync to send full "
               "weights")
    if trl.vllm_lora_sync and cfg.vllm.max_lora_rank is not None and cfg.lora_r > cfg.vllm.max_lora_rank:
        yield (f"lora_r = {cfg.lora_r} is above vllm.max_lora_rank = {cfg.vllm.max_lora_rank}: the server would refuse "
               f"the adapter sent by trl.vllm_lora_sync; raise vllm.max_lora_rank to at least {cfg.lora_r}")
    if trl.use_decoupled_loss and trl.vllm_importance_sampling_correction:
        yield ("trl.use_decoupled_loss and trl.vllm_importance_sampling_correction: true both weight the policy term by "
               "exp(old - sampling) log-probs: pick one (remove vllm_importance_sampling_correction, or "
               "use_decoupled_loss)")
    if trl.behav_imp_weight_cap is not None and not trl.use_decoupled_loss:
        yield ("trl.behav_imp_weight_cap caps the decoupled loss's behaviour weight: set trl.use_decoupled_loss: true, "
               "or remove behav_imp_weight_cap (the IS correction's cap is vllm_importance_sampling_cap)")
    if trl.streaming_min_groups is not None and not trl.streaming_partial_batch:
        yield ("trl.streaming_min_groups sizes the chunks of streaming scoring: set trl.streaming_partial_batch: true, "
               "or remove streaming_min_groups")
    filters = [f"trl.{key}" for key, off in (("top_k", (0, -1)), ("top_p", (1.0,)), ("min_p", (0.0,)),
                                              ("repetition_penalty", (1.0,))) if options[key] not in off]
    if trl.replay_buffer_size and not trl.replay_recompute_logps and filters:
        yield (f"trl.replay_recompute_logps: false with {', '.join(filters)}: a replayed row would keep the log-probs "
               "recorded when it was sampled, which are of the filtered distribution, while the PPO ratio compares "
               "temperature-only ones (every ratio off 1); set replay_recompute_logps: true (the default)")
    if trl.reroll_start_fraction < 1 and cfg.max_steps is None:
        yield (f"trl.reroll_start_fraction = {trl.reroll_start_fraction} is a fraction of max_steps, which is not set: "
               "set max_steps, or remove reroll_start_fraction (1.0 = no re-roll)")


def _staleness_problems(cfg, options):
    """On-policy sampling, the staleness bound (the throttle) and dynamic sampling's draw limit."""
    trl = cfg.trl
    bound, interval = options["allowed_outdated_steps"], options["vllm_sync_interval"]
    if trl.on_policy and interval != 1:
        yield (f"trl.on_policy samples every batch with the weights that start training on it, so the engine needs the "
               f"weights of every optimizer step: set trl.vllm_sync_interval: 1 (it is {interval}), or remove on_policy")
    elif trl.on_policy and trl.allowed_outdated_steps:
        yield (f"trl.on_policy is a staleness bound of 0, and trl.allowed_outdated_steps is {trl.allowed_outdated_steps}: "
               "keep one of them")
    elif bound is not None and bound < interval - 1:
        # the weights reach the engine every `interval` steps: a batch sampled when the trainer needs it is up to
        # interval - 1 steps old, and the throttle cannot wait for weights that are not sent
        yield (f"trl.allowed_outdated_steps = {bound} is below vllm_sync_interval - 1 = {interval - 1}: the engine gets "
               f"new weights every {interval} optimizer steps, so even a batch sampled when the trainer needs it can be "
               f"{interval - 1} steps old and its rows would be dropped; raise allowed_outdated_steps to at least "
               f"{interval - 1} (Cosmos-RL raises it so), or lower vllm_sync_interval")
    if trl.on_policy and trl.replay_buffer_size:
        yield ("trl.on_policy trains only on rows sampled by the current weights, and trl.replay_buffer_size trains again "
               "on groups older weights sampled: remove one of them")
    if trl.outdated_rollout_fetch_batch_size and (not trl.async_prefetch or bound is None):
        yield ("trl.outdated_rollout_fetch_batch_size is how many prompts are sampled while allowed_outdated_steps holds the "
               "producer back, which only happens with trl.async_prefetch: true and allowed_outdated_steps (or on_policy) "
               "set: set them, or remove outdated_rollout_fetch_batch_size")
    if trl.max_retry_for_on_policy is not None and not options["filter_reward_metric"]:
        yield ("trl.max_retry_for_on_policy limits the draws of dynamic sampling, which is off: set trl.filter_reward_metric "
               "(or variant: dapo), or remove max_retry_for_on_policy")
    elif trl.max_retry_for_on_policy is not None and "dynamic_sampling_max_retries" in trl.model_fields_set:
        yield ("trl.max_retry_for_on_policy and trl.dynamic_sampling_max_retries both limit dynamic sampling's draws (past "
               "the first the run stops, past the second the step trains on what it has): keep one of them")
