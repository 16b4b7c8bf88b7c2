"""The `trl:` section: online RL (GRPO family, GDPO, DAPO, GSPO, Dr. GRPO, RLOO, Cosmos-RL loss options), rollouts
(in-process or vLLM, sync or async) and rewards.

Names, types and defaults follow the Axolotl YAML schema (so users' configs validate unchanged); where that
schema leaves a key at None, the default that then applies is named in the field's description ("None -> X") and
lives in `rlft.config.rl.DEFAULTS`.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import field_validator, model_validator

from rlft.config.axolotl_tables import TRL, known_only
from rlft.config.base import field, planned
from rlft.config.reward_weights import names_and_weights
from rlft.config.sections.trl_batching import BatchingKeys
from rlft.config.sections.trl_rollout_control import RolloutControlKeys
from rlft.config.sections.trl_multi_turn import MultiTurnKeys

GRPOLossType = Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "token-mean", "seq-mean-token-mean", "sapo", "luspo",
                       "vespo"]
ScaleRewards = Union[Literal["group", "batch", "none"], bool]
ImportanceSamplingMode = Literal[
    "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"
]
MultiObjectiveAggregation = Literal["sum_then_normalize", "normalize_then_sum"]
# A key that methods without a rollout engine read too (the preference losses' beta), or that `rlft train` refuses for
# them with a reason of its own: the rule refusing the other `trl:` keys for them (rlft.config.rules.online) leaves it.
READ_WITHOUT_ENGINE = {"read_without_engine": True}

class TRLConfig(known_only("AxolotlTrlKeys", TRL), RolloutControlKeys, MultiTurnKeys, BatchingKeys):
    """The `trl:` section: online RL (GRPO family, GDPO, DAPO, GSPO, Dr. GRPO, RLOO, Cosmos-RL
    loss options), rollouts (in-process or vLLM, sync or async) and rewards."""

    # ---- rewards and rollouts ---------------------------------------------------------------
    reward_funcs: Optional[list[str]] = field(
        None,
        "Reward functions: a built-in by name (boxed_math, single_choice, format: Cosmos-RL's), 'module.fn' (from the "
        "working dir) or a reward-model path; a mapping {name: weight} (Cosmos-RL's form) sets reward_weights too.",
    )
    reward_weights: Optional[list[float]] = field(
        None,
        "One weight per reward function; None -> all 1.0 (or the weights of a reward_funcs mapping).",
    )
    rollout_func: Optional[str] = field(
        None,
        "Custom rollout 'module.fn': (prompts, trainer) -> prompt_ids/completion_ids/logprobs (TRL), or (model, "
        "processing_class, prompts, generation_config=None) -> completion strings (the Axolotl guide).",
    )
    reward_num_workers: int = field(
        1,
        "Reward worker processes (>1 runs rewards in subprocesses, so signal.alarm works).", ge=1,
    )
    reward_timeout: Optional[float] = field(
        60.0,
        "Seconds one reward-function call may take before it is scored as failed; None = no limit.", gt=0,
    )
    reward_failure_score: Optional[float] = field(
        0.0,
        "Score of a reward call that raises or times out (counted); None = unscorable, like TRL's "
        "None.", allow_inf_nan=False,
    )

    # ---- sampling ---------------------------------------------------------------------------
    num_generations: Optional[int] = field(
        None,
        "Completions sampled per prompt (group size G); None -> 8.", ge=1,
    )
    max_completion_length: Optional[int] = field(
        None,
        "Maximum tokens per completion; None -> 256.", ge=1,
    )
    temperature: Optional[float] = field(
        None,
        "Sampling temperature (log-probs are computed on logits / temperature); None -> 1.0.", ge=0.0,
    )
    top_p: Optional[float] = field(
        None,
        "Nucleus-sampling threshold; None -> 1.0 (off).", gt=0.0, le=1.0,
    )
    top_k: Optional[int] = field(
        None,
        "Top-k sampling; None -> 0 (off; -1 also means off).", ge=-1,
    )
    min_p: Optional[float] = field(
        None,
        "Min-p sampling threshold; None -> 0.0 (off).", ge=0.0, le=1.0,
    )
    repetition_penalty: Optional[float] = field(
        None,
        "Repetition penalty on prompt and generated tokens; None -> 1.0 (off).", gt=0.0,
    )
    generation_kwargs: Optional[dict] = field(
        None,
        "Extra sampling parameters for the engine (vLLM names): stop (strings), stop_token_ids (ids that end a "
        "completion besides EOS), ignore_eos.",
    )
    chat_template_kwargs: Optional[dict] = field(
        None,
        "Extra keyword arguments for the chat template applied to message prompts.",
    )
    mask_truncated_completions: Optional[bool] = field(
        None,
        "Exclude completions that hit the length limit from the loss; None -> false (DAPO, "
        "https://arxiv.org/abs/2503.14476).",
    )
    log_completions: Optional[bool] = field(
        False,
        "Log sampled completions with their rewards (every completion to output_dir/completions.jsonl).",
    )
    num_completions_to_print: Optional[int] = field(
        None,
        "Print this many completions of each generation batch (prompt, completion, rewards, advantage) on the console; "
        "None prints none (TRL prints all when log_completions is on).", ge=1,
    )

    # ---- batching and schedule --------------------------------------------------------------
    num_iterations: Optional[int] = field(
        None,
        "Optimisation passes over each generation batch (mu); None -> 1.", ge=1,
    )
    steps_per_generation: Optional[int] = field(
        None,
        "Optimizer steps served by one generation batch (None -> 1).", ge=1,
    )
    generation_batch_size: Optional[int] = field(
        None,
        "Completions per generation batch, a whole number of optimizer steps' rows; None -> micro_batch_size * "
        "gradient_accumulation_steps * processes * steps_per_generation.", ge=1,
    )

    # ---- advantages -------------------------------------------------------------------------
    scale_rewards: Optional[ScaleRewards] = field(
        None,
        "Advantage std scaling: group | batch | none (true = group, false = none); None -> group.",
    )
    multi_objective_aggregation: Optional[MultiObjectiveAggregation] = field(
        None,
        "Multi-reward aggregation; None -> sum_then_normalize (normalize_then_sum = GDPO, "
        "https://arxiv.org/abs/2601.05242).",
    )
    advantage_estimator: Optional[Literal["grpo", "rloo"]] = field(
        None,
        "Group baseline: grpo (group mean) or rloo (leave-one-out, "
        "https://arxiv.org/abs/2402.14740); None -> grpo.",
    )
    unbiased_advantage: bool = field(
        False,
        "Do not divide advantages by the group std (Dr. GRPO, https://arxiv.org/abs/2503.20783).",
    )
    skip_zero_advantage_batches: bool = field(
        True,
        "Skip the update (no optimizer step) when every advantage of a generation batch is 0 and there is no KL "
        "(beta), entropy or EBFT cross-entropy (ebft.ce_coef) term, so that nothing would be learnt from it.",
    )

    # ---- DAPO: dynamic sampling and overlong penalty ----------------------------------------
    filter_reward_metric: Optional[Union[str, list[str]]] = field(
        None,
        "Dynamic sampling: drop groups whose named reward(s) have zero variance and draw more "
        "(DAPO, https://arxiv.org/abs/2503.14476); None = off.",
    )
    dynamic_sampling_max_retries: int = field(
        10,
        "Extra prompt batches dynamic sampling may draw per step before training on what it has.", ge=0,
    )
    overlong_penalty: bool = field(
        False,
        "Add the soft overlong length penalty to the reward (DAPO, "
        "https://arxiv.org/abs/2503.14476).",
    )
    overlong_buffer_length: Optional[int] = field(
        None,
        "Tokens before max_completion_length where the penalty ramps in; None -> "
        "max_completion_length // 4.", ge=1,
    )
    overlong_penalty_factor: float = field(
        1.0,
        "Penalty reached at max_completion_length (reward -= factor at the limit).", ge=0.0,
    )

    # ---- policy loss ------------------------------------------------------------------------
    variant: Optional[Literal["grpo", "dapo", "gspo"]] = field(
        None,
        "Cosmos-RL shorthand that sets the matching loss options (grpo | dapo | gspo).",
    )
    loss_type: Optional[GRPOLossType] = field(
        None,
        "Loss aggregation / objective (grpo, dr_grpo, dapo, bnpo, cispo, sapo, luspo, vespo; Cosmos-RL's token-mean: "
        "each micro-batch's token mean weighted by its rows, and seq-mean-token-mean: grpo, or dr_grpo with "
        "unbiased_loss_max_tokens set); None -> dapo.",
    )
    importance_sampling_level: Optional[Literal["token", "sequence"]] = field(
        None,
        "Importance ratio per token or per sequence (GSPO, https://arxiv.org/abs/2507.18071); None"
        " -> token.",
    )
    epsilon: Optional[float] = field(
        None,
        "Lower clip range epsilon of the PPO ratio; None -> 0.2.", gt=0.0,
    )
    epsilon_high: Optional[float] = field(
        None,
        "Upper clip range (DAPO clip-higher, 0.28 suggested; CISPO's eps_max); None -> epsilon.", gt=0.0,
    )
    delta: Optional[float] = field(
        None,
        "Two-sided clip: cap the unclipped ratio at delta (INTELLECT-2, "
        "https://arxiv.org/abs/2505.07291).", gt=1.0,
    )
    lower_bound_ratio: Optional[float] = field(
        3.0,
        "Dual-clip bound c: negative-advantage token loss capped at c*|A| "
        "(https://arxiv.org/abs/1912.09729); None = off.", gt=1.0,
    )
    aipo_rho: Optional[float] = field(
        None,
        "AIPO one-sided ratio truncation rho, replaces clipping; 2-10 suggested "
        "(https://arxiv.org/abs/2505.24034).", gt=0.0,
    )
    sapo_temperature_pos: float = planned(
        1.0,
        "SAPO soft-gate temperature for positive advantages (loss_type: sapo).",
        what="the SAPO, LUSPO and VESPO losses", gt=0.0,
    )
    sapo_temperature_neg: float = planned(
        1.05,
        "SAPO soft-gate temperature for negative advantages (loss_type: sapo).",
        what="the SAPO, LUSPO and VESPO losses", gt=0.0,
    )
    unbiased_loss_max_tokens: Optional[int] = field(
        None,
        "Dr. GRPO constant length normaliser; None -> max_completion_length (dr_grpo). Set with loss_type "
        "seq-mean-token-mean, it makes that loss dr_grpo (Cosmos-RL's rule).", ge=1,
    )
    entropy_coeff: float = field(
        0.0,
        "Entropy bonus coefficient (loss -= coeff * mean token entropy).", ge=0.0,
    )
    positive_nll_coef: Optional[float] = field(
        None,
        "NLL on completions with positive reward (VAPO, https://arxiv.org/abs/2504.05118); None = "
        "off.", ge=0.0,
    )

    # ---- KL and reference model -------------------------------------------------------------
    beta: Optional[float] = field(
        None,
        "KL coefficient (k3 estimator) to the reference; None -> 0.0 (no reference loaded). Also the preference losses' "
        "beta (DPO family, KTO, SimPO; ORPO's lambda), where it takes precedence over rl_beta.", ge=0.0,
        json_schema_extra=READ_WITHOUT_ENGINE,
    )
    use_bias_correction_kl: Optional[bool] = field(
        None,
        "Multiply the k3 KL term by the token ratio exp(logp - old) (DeepSeek-V3.2 unbiased KL estimate, "
        "https://arxiv.org/abs/2512.02556; TRL); None -> false.",
    )
    reference_reset_interval: Optional[int] = field(
        None,
        "Copy the policy into the frozen reference every N optimizer steps (Cosmos-RL); needs a reference copy.", ge=0,
        json_schema_extra=READ_WITHOUT_ENGINE,
    )
    sync_ref_model: bool = field(
        False,
        "Soft-update the reference model (TR-DPO, https://arxiv.org/abs/2404.09656).",
        json_schema_extra=READ_WITHOUT_ENGINE,
    )
    ref_model_mixup_alpha: float = field(
        0.9,
        "Reference update: ref = alpha * policy + (1 - alpha) * ref (needs sync_ref_model).", ge=0.0, le=1.0,
    )
    ref_model_sync_steps: int = field(
        64,
        "Steps between reference soft updates (needs sync_ref_model).", ge=1,
    )

    # ---- vLLM client ------------------------------------------------------------------------
    use_vllm: bool = field(
        False,
        "Generate rollouts with vLLM (through the rollout server) instead of in-process.",
    )
    vllm_mode: Optional[Literal["server", "colocate"]] = field(
        None,
        "vLLM in a separate server or colocated in the trainer; None -> server.",
    )
    vllm_server_host: Optional[str] = field(
        "0.0.0.0",
        "Host of the vLLM / rollout server the trainer connects to; unset -> vllm.host; 0.0.0.0 (a listen "
        "address) -> 127.0.0.1.",
    )
    vllm_server_port: Optional[int] = field(
        8000,
        "Port of the vLLM / rollout server the trainer connects to; unset -> vllm.port.", ge=1, le=65535,
    )
    vllm_server_timeout: Optional[float] = field(
        None,
        "Seconds the trainer waits for the server to come up at start; None -> 240 (later calls are watched by /health: a dead server is noticed within ~10 s).", gt=0,
    )
    vllm_group_port: Optional[int] = field(
        None,
        "Port on the rollout server's machine for the collective weight-sync group: full weights travel as "
        "broadcasts (gloo between CPUs, NCCL between CUDA GPUs), falling back to HTTP if the group breaks; unset -> "
        "over HTTP (TRL always opens this group, on 51216).", ge=1, le=65535,
    )
    vllm_lora_sync: bool = field(
        False,
        "Sync weights by saving the LoRA adapter and loading it in the engine (no NCCL); needs adapter: lora|qlora.",
    )
    vllm_sync_interval: Optional[int] = field(
        None,
        "Optimizer steps between weight syncs to the engine; None -> 1.", ge=1,
    )

    # ---- async rollouts ---------------------------------------------------------------------
    use_data_producer: bool = field(
        False,
        "Axolotl's data-producer rollout protocol; rlft always uses one, so this is accepted and implies nothing "
        "else (background rollouts: async_prefetch).",
    )
    async_prefetch: bool = field(
        False,
        "Generate the next rollout batches in the background while training (off-policy by up to prefetch_depth "
        "steps; IS correction turns on by default).",
    )
    prefetch_depth: Optional[int] = field(
        None,
        "Rollout batches generated ahead with async_prefetch; None -> 1 (must be >= 1 with async_prefetch).", ge=0,
    )
    streaming_partial_batch: Optional[bool] = field(
        None,
        "Score a rollout batch in chunks of prompt groups: rewards called and advantages normalised per chunk (as Axolotl's streaming scorer); None -> false.",
    )
    streaming_min_groups: Optional[int] = field(
        None,
        "Prompt groups per streaming chunk; needs streaming_partial_batch: true; None -> 1.", ge=1,
    )
    allowed_outdated_steps: Optional[int] = field(
        None,
        "Cosmos-RL's staleness bound: with async_prefetch the producer waits rather than sample a batch that would "
        "start training more than this many optimizer steps after its weights (the throttle), and rows older than "
        "that when trained are dropped (async/stale_rows_dropped). None = no bound beyond prefetch_depth.", ge=0,
    )

    # ---- importance-sampling correction for stale / engine log-probs ------------------------
    vllm_importance_sampling_correction: Optional[bool] = field(
        None,
        "Weight the policy term by exp(old - sampling) log-prob ratios (trainer at scoring time vs. the engine that "
        "sampled); None -> true where rows can be stale: use_vllm, async_prefetch, replay_buffer_size > 0 or "
        "vllm_sync_interval > 1 (unless use_decoupled_loss), else false.",
    )
    vllm_importance_sampling_mode: Optional[ImportanceSamplingMode] = field(
        None,
        "IS ratio per token or per sequence (sum of log-ratios); truncate = min(ratio, cap) (TIS), mask = 0 outside "
        "[1/cap, cap]; None -> token_truncate.",
    )
    vllm_importance_sampling_cap: Optional[float] = field(
        None,
        "IS cap C >= 1: truncate at C, mask outside [1/C, C]; None -> 3.0.",
    )
    off_policy_mask_threshold: Optional[float] = field(
        None,
        "Drop negative-advantage sequences whose mean log-ratio (sampling - current) exceeds this (DeepSeek-V3.2 "
        "off-policy sequence masking, https://arxiv.org/abs/2512.02556); None = off.", ge=0.0,
    )
    use_decoupled_loss: bool = field(
        False,
        "Decoupled PPO: weight the policy term by exp(old - sampling), masked above behav_imp_weight_cap (AReaL, "
        "https://arxiv.org/abs/2505.24298; Cosmos-RL).",
    )
    behav_imp_weight_cap: Optional[float] = field(
        None,
        "Decoupled loss: tokens whose behaviour weight exp(old - sampling) exceeds this get weight 0; None = no cap.",
        gt=0.0,
    )

    # ---- replay and re-roll -----------------------------------------------------------------
    replay_buffer_size: int = field(
        0,
        "Cached high-signal groups that replace zero-signal groups (0 = off).", ge=0,
    )
    replay_recompute_logps: bool = field(
        True,
        "Recompute old log-probs of replayed groups with the current model.",
    )
    reroll_start_fraction: float = field(
        1.0,
        "Fraction of max_steps after which all-zero-reward prompts are re-rolled (1.0 = off; needs max_steps).",
        ge=0.0, le=1.0,
    )
    reroll_max_groups: int = field(
        1,
        "Most re-rolled prompt groups injected per batch.", ge=0,
    )

    @model_validator(mode="before")
    @classmethod
    def _reward_funcs_mapping(cls, data: Any) -> Any:
        """Cosmos-RL's `reward_funcs: {name: weight}` is `reward_funcs: [names]` with `reward_weights: [weights]`, in
        the mapping's order; with reward_weights given too the weights would be given twice, which is refused."""
        if not isinstance(data, dict) or not isinstance(data.get("reward_funcs"), dict):
            return data
        if data.get("reward_weights") is not None:
            raise ValueError("reward_funcs is a mapping {function: weight} and reward_weights is set too: give the weights "
                             "once, either in the mapping or as reward_weights beside a list of reward_funcs")
        try:
            names, weights = names_and_weights(data["reward_funcs"])
        except ValueError as exc:
            raise ValueError(f"reward_funcs: {exc}") from None
        return {**data, "reward_funcs": names, "reward_weights": weights}

    @field_validator("generation_kwargs")
    @classmethod
    def _generation_kwargs_types(cls, value: Optional[dict]) -> Optional[dict]:
        if not value:
            return value
        ids = value.get("stop_token_ids")
        if ids is not None and not (isinstance(ids, list) and all(type(i) is int and i >= 0 for i in ids)):
            raise ValueError(f"stop_token_ids must be a list of token ids (integers >= 0), got {ids!r}")
        stop = value.get("stop")
        if isinstance(stop, str):  # vLLM takes one string or a list
            value = {**value, "stop": [stop]}
            stop = value["stop"]
        if stop is not None and not (isinstance(stop, list) and all(isinstance(t, str) and t for t in stop)):
            raise ValueError(f"stop must be a list of non-empty strings, got {stop!r}")
        if "ignore_eos" in value and type(value["ignore_eos"]) is not bool:
            raise ValueError(f"ignore_eos must be true or false, got {value['ignore_eos']!r}")
        return value

    @field_validator("vllm_importance_sampling_cap")
    @classmethod
    def _cap_at_least_one(cls, value: Optional[float]) -> Optional[float]:
        if value is None:
            return value
        if not value > 0:
            raise ValueError(f"IS cap <= 0 ({value}): the cap bounds a probability ratio; 3.0 is the usual choice")
        if value < 1:
            raise ValueError(
                f"IS cap {value} < 1: the floor 1/C would lie above the cap C (mask modes would drop every token, "
                "truncation would shrink even on-policy tokens); use C >= 1, 3.0 is the usual choice"
            )
        return value
