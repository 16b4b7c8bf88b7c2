"""Online-RL settings resolved once: every `None -> default` of the `trl:` section is decided here.

The schema keeps Axolotl's `None` defaults (so users' configs validate unchanged and `rlft validate
--explain` shows what they wrote); everything that trains reads `RLSettings` instead, so a default
lives in exactly one place. The `variant` shorthand (Cosmos-RL) and `rl: gdpo` are applied here too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlft.config.methods import method_spec
from rlft.config.parallel import rows_per_step

# `trl:` keys whose schema default is None, and the value that then applies (TRL's GRPOConfig defaults,
# except loss_type, where Axolotl's documented default is dapo)
DEFAULTS: dict[str, Any] = {
    "num_generations": 8, "max_completion_length": 256, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
    "repetition_penalty": 1.0, "num_iterations": 1, "steps_per_generation": 1, "scale_rewards": "group",
    "loss_type": "dapo", "epsilon": 0.2, "beta": 0.0, "multi_objective_aggregation": "sum_then_normalize",
    "advantage_estimator": "grpo", "importance_sampling_level": "token", "mask_truncated_completions": False,
    "positive_nll_coef": 0.0,
    # rollout engine and async (Axolotl's async-trainer defaults)
    "vllm_mode": "server", "vllm_server_timeout": 240.0, "vllm_sync_interval": 1, "prefetch_depth": 1,
    "streaming_partial_batch": False, "streaming_min_groups": 1, "vllm_importance_sampling_mode": "token_truncate",
    "vllm_importance_sampling_cap": 3.0, "use_bias_correction_kl": False,
}

# a listen address is not an address to connect to (TRL #3736)
LISTEN_ADDRESSES = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}

# variant: Cosmos-RL shorthand -> the options it implies (only where the user did not set them)
VARIANTS: dict[str, dict[str, Any]] = {
    "grpo": {"loss_type": "grpo", "scale_rewards": "group"},
    "dapo": {"loss_type": "dapo", "epsilon_high": 0.28, "beta": 0.0, "overlong_penalty": True, "filter_reward_metric": "reward"},
    "gspo": {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4, "beta": 0.0},
}

# generation_kwargs the in-process engine understands (vLLM's names)
GENERATION_KWARGS = ("stop", "stop_token_ids", "ignore_eos")


@dataclass(frozen=True)
class RLSettings:
    """The `trl:` options an online-RL run trains with, no None left where a default applies."""

    # rollouts
    num_generations: int
    max_completion_length: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    stop_strings: tuple[str, ...]
    stop_token_ids: tuple[int, ...]  # ids that end a completion besides EOS (e.g. Qwen's <|im_end|>), kept in it as EOS is
    ignore_eos: bool
    chat_template_kwargs: dict | None
    rollout_func: str | None
    mask_truncated_completions: bool
    log_completions: bool
    num_completions_to_print: int | None
    # batching
    prompts_per_step: int
    num_iterations: int
    steps_per_generation: int
    max_token_len_per_mini_batch: int | None  # micro-batches packed to at most this many tokens; None = micro_batch_size rows
    balance_dp_token: bool  # token-mean's per-micro-batch mean over every process's tokens (Cosmos-RL)
    # rewards and advantages
    scale_rewards: str | bool  # group | batch | none, or TRL's booleans (losses.advantages.normalise_scale reads them)
    multi_objective_aggregation: str
    advantage_estimator: str
    skip_zero_advantage_batches: bool
    filter_reward_metric: tuple[str, ...]
    dynamic_sampling_max_retries: int
    overlong_penalty: bool
    overlong_buffer_length: int
    overlong_penalty_factor: float
    # policy loss
    loss_type: str
    importance_sampling_level: str
    epsilon: float
    epsilon_high: float | None
    delta: float | None
    lower_bound_ratio: float | None
    aipo_rho: float | None
    unbiased_loss_max_tokens: int
    entropy_coeff: float
    positive_nll_coef: float
    # reference model
    beta: float
    reference_reset_interval: int
    sync_ref_model: bool
    ref_model_mixup_alpha: float
    ref_model_sync_steps: int
    # rollout engine (vLLM / rollout server) and weight sync
    use_vllm: bool
    vllm_mode: str  # server | colocate
    server_host: str  # where the trainer connects: a listen address (0.0.0.0, ::) becomes loopback
    server_port: int
    server_timeout: float  # seconds the trainer waits for the server at start
    group_port: int | None  # the collective weight-sync group's port on the server's machine; None = over HTTP
    lora_sync: bool  # send the LoRA adapter instead of full weights
    sync_interval: int  # optimizer steps between weight syncs
    # async rollouts
    async_prefetch: bool  # rollouts generated in the background (use_data_producer alone implies nothing)
    prefetch_depth: int  # rollout batches generated ahead
    streaming: bool  # score a rollout batch in chunks of prompt groups
    streaming_min_groups: int
    allowed_outdated_steps: int | None  # the throttle's bound (0: on_policy), rows older when trained dropped; None: none
    outdated_fetch_prompts: int  # prompts of a batch the throttle holds sampled at once (outdated_rollout_fetch_batch_size)
    max_retry_for_on_policy: int | None  # dynamic sampling's draw limit (an error past it); <= 0: none; None: the retries
    min_filter_prefix_tokens: int  # the shared-prefix filter's least prefix; 0 = off
    reset_optimizer_with_reference: bool  # a reference reset also clears the optimizer's state
    # importance-sampling correction and off-policy control (rlft.losses.importance)
    is_correction: bool  # weight the policy term by exp(old - sampling) (TRL's vllm_importance_sampling_correction)
    is_level: str  # token | sequence
    is_mode: str  # truncate | mask
    is_cap: float
    off_policy_mask_threshold: float | None
    bias_correction_kl: bool
    decoupled_loss: bool  # AReaL decoupled PPO (Cosmos-RL use_decoupled_loss)
    behav_imp_weight_cap: float | None
    # replay and re-roll
    replay_buffer_size: int
    replay_recompute_logps: bool
    reroll_start_fraction: float
    reroll_max_groups: int
    # what the user wrote, for `rollout_func(prompts, trainer)`'s `trainer.args` (TRL passes its GRPOConfig)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def needs_sampling_correction(self) -> bool:
        """The policy term is weighted by exp(old - sampling): IS correction or the decoupled loss."""
        return self.is_correction or self.decoupled_loss

    def __getitem__(self, name: str) -> Any:  # `trainer.args["max_completion_length"]`: user rollout functions index it
        return self.raw[name]

    def __getattr__(self, name: str) -> Any:  # `trainer.args.<any trl key>` for user rollout functions
        raw = self.__dict__.get("raw", {})
        if name in raw:
            return raw[name]
        raise AttributeError(name)


def trl_options(cfg) -> dict[str, Any]:
    """Every `trl:` key as a run reads it: the `variant`'s options where the key is not set, then `DEFAULTS` where it is
    still None, Cosmos-RL's loss name `seq-mean-token-mean` as grpo (dr_grpo with unbiased_loss_max_tokens), then
    `rl_beta`, `rl: gdpo`, `on_policy` (a staleness bound of 0) and RLOO's scaling. The cross-field rules judge these values."""
    trl = cfg.trl
    options = {name: getattr(trl, name) for name in type(trl).model_fields}
    if trl.variant:
        for key, value in VARIANTS[trl.variant].items():
            if key not in trl.model_fields_set:
                options[key] = value
    for key, value in DEFAULTS.items():
        if options.get(key) is None:
            options[key] = value
    if options["loss_type"] == "seq-mean-token-mean":  # Cosmos-RL's name of grpo; its Dr. GRPO with a token budget
        options["loss_type"] = "dr_grpo" if options["unbiased_loss_max_tokens"] else "grpo"
    if trl.beta is None and "rl_beta" in cfg.model_fields_set:  # Axolotl's precedence: trl.beta, else rl_beta
        options["beta"] = cfg.rl_beta
    if method_spec(cfg.method).normalises_each_reward:
        options["multi_objective_aggregation"] = "normalize_then_sum"
    if options["on_policy"] and options["allowed_outdated_steps"] is None:  # Cosmos-RL: on-policy is a bound of 0
        options["allowed_outdated_steps"] = 0
    if options["advantage_estimator"] == "rloo" and "scale_rewards" not in trl.model_fields_set:
        options["scale_rewards"] = "none"  # RLOO (Ahmadian et al. 2024) and TRL's RLOOTrainer do not divide by a std
    return options


def rl_settings(cfg) -> RLSettings:
    """Resolve `cfg.trl` (`trl_options`, then the importance-sampling switch and batch sizes) into the settings a run
    uses."""
    trl = cfg.trl
    options = trl_options(cfg)
    scale = "none" if options["unbiased_advantage"] else options["scale_rewards"]
    group = options["num_generations"]
    completions_per_step = options["generation_batch_size"] or rows_per_step(cfg)
    kwargs = options["generation_kwargs"] or {}
    metric = options["filter_reward_metric"]
    maximum = options["max_completion_length"]
    is_correction = options["vllm_importance_sampling_correction"]
    if is_correction is None:  # Axolotl's async trainer defaults it on; a sync in-process run samples on-policy
        # unless it replays rows or syncs its engine every few steps; the decoupled loss applies the same
        # exp(old - sampling) weight itself
        stale = bool(options["use_vllm"] or options["async_prefetch"] or options["replay_buffer_size"]
                     or (options["vllm_sync_interval"] or 1) > 1)
        is_correction = stale and not options["use_decoupled_loss"]
        options["vllm_importance_sampling_correction"] = is_correction
    is_level, is_mode = options["vllm_importance_sampling_mode"].split("_", 1)
    # all-zero advantages leave nothing to learn only without a KL, an entropy or EBFT's cross-entropy term (TRL steps
    # on every batch); trainer.args sees the resolved value
    ebft_ce = method_spec(cfg.method).feature_matching and bool(cfg.ebft.ce_coef)
    options["skip_zero_advantage_batches"] = bool(options["skip_zero_advantage_batches"] and not options["beta"]
                                                  and not options["entropy_coeff"] and not ebft_ce)
    # one config drives `rlft vllm-serve` and `rlft train`: unless trl.vllm_server_* is set, connect where vllm: listens
    server = getattr(cfg, "vllm", None)
    if server is not None and "vllm_server_port" not in trl.model_fields_set and server.port:
        options["vllm_server_port"] = server.port
    if server is not None and "vllm_server_host" not in trl.model_fields_set and server.host:
        options["vllm_server_host"] = server.host
    host = options["vllm_server_host"] or ""
    return RLSettings(
        num_generations=group, max_completion_length=maximum, temperature=options["temperature"], top_p=options["top_p"],
        top_k=options["top_k"] or 0, min_p=options["min_p"], repetition_penalty=options["repetition_penalty"],
        stop_strings=tuple(kwargs.get("stop") or ()), stop_token_ids=tuple(kwargs.get("stop_token_ids") or ()),
        ignore_eos=bool(kwargs.get("ignore_eos", False)),
        chat_template_kwargs=options["chat_template_kwargs"], rollout_func=options["rollout_func"],
        mask_truncated_completions=options["mask_truncated_completions"], log_completions=bool(options["log_completions"]),
        num_completions_to_print=options["num_completions_to_print"],
        prompts_per_step=completions_per_step // group, num_iterations=options["num_iterations"],
        steps_per_generation=options["steps_per_generation"], scale_rewards=scale,
        max_token_len_per_mini_batch=options["max_token_len_per_mini_batch"] or None, balance_dp_token=options["balance_dp_token"],
        multi_objective_aggregation=options["multi_objective_aggregation"], advantage_estimator=options["advantage_estimator"],
        skip_zero_advantage_batches=options["skip_zero_advantage_batches"],
        filter_reward_metric=((metric,) if isinstance(metric, str) else tuple(metric or ())),
        dynamic_sampling_max_retries=options["dynamic_sampling_max_retries"], overlong_penalty=options["overlong_penalty"],
        overlong_buffer_length=options["overlong_buffer_length"] or max(1, maximum // 4),
        overlong_penalty_factor=options["overlong_penalty_factor"], loss_type=options["loss_type"],
        importance_sampling_level=options["importance_sampling_level"], epsilon=options["epsilon"],
        epsilon_high=options["epsilon_high"], delta=options["delta"], lower_bound_ratio=options["lower_bound_ratio"],
        aipo_rho=options["aipo_rho"], unbiased_loss_max_tokens=options["unbiased_loss_max_tokens"] or maximum,
        entropy_coeff=options["entropy_coeff"], positive_nll_coef=options["positive_nll_coef"], beta=options["beta"],
        reference_reset_interval=options["reference_reset_interval"] or 0, sync_ref_model=options["sync_ref_model"],
        ref_model_mixup_alpha=options["ref_model_mixup_alpha"], ref_model_sync_steps=options["ref_model_sync_steps"],
        use_vllm=options["use_vllm"], vllm_mode=options["vllm_mode"], server_host=LISTEN_ADDRESSES.get(host.strip(), host),
        server_port=options["vllm_server_port"] or 8000, server_timeout=float(options["vllm_server_timeout"]),
        group_port=options["vllm_group_port"],
        lora_sync=options["vllm_lora_sync"], sync_interval=options["vllm_sync_interval"],
        async_prefetch=options["async_prefetch"], prefetch_depth=options["prefetch_depth"],
        streaming=bool(options["streaming_partial_batch"]), streaming_min_groups=options["streaming_min_groups"],
        allowed_outdated_steps=options["allowed_outdated_steps"],
        outdated_fetch_prompts=options["outdated_rollout_fetch_batch_size"],
        max_retry_for_on_policy=options["max_retry_for_on_policy"],
        min_filter_prefix_tokens=options["min_filter_prefix_tokens"] or 0,
        reset_optimizer_with_reference=options["reset_optimizer_with_reference"], is_correction=is_correction, is_level=is_level,
        is_mode=is_mode, is_cap=float(options["vllm_importance_sampling_cap"]),
        off_policy_mask_threshold=options["off_policy_mask_threshold"], bias_correction_kl=options["use_bias_correction_kl"],
        decoupled_loss=options["use_decoupled_loss"], behav_imp_weight_cap=options["behav_imp_weight_cap"],
        replay_buffer_size=options["replay_buffer_size"], replay_recompute_logps=options["replay_recompute_logps"],
        reroll_start_fraction=options["reroll_start_fraction"], reroll_max_groups=options["reroll_max_groups"],
        raw=options,
    )


def preference_beta(cfg) -> float:
    """β of the DPO family, IPO (τ), KTO and SimPO/CPO, with Axolotl's precedence: `trl.beta` where set, else `rl_beta`."""
    return cfg.trl.beta if cfg.trl.beta is not None else cfg.rl_beta


def orpo_lambda(cfg) -> float:
    """ORPO's λ (the odds-ratio weight, TRL's `beta` for ORPO), with Axolotl's precedence: `trl.beta` where set, else
    `rl_beta` where set, else `orpo_alpha`."""
    if cfg.trl.beta is not None:
        return cfg.trl.beta
    return cfg.rl_beta if "rl_beta" in cfg.model_fields_set else cfg.orpo_alpha
