"""Schemas of the `trl:`, `ebft:` and `vllm:` sections and of the top-level preference-optimisation
and NeMo Gym keys.

Names, types and defaults follow the Axolotl YAML schema (so users' configs validate unchanged)
and, where that schema leaves a key at None, the trainer default that then applies is named in the
field's description ("None -> X"). A field of a capability built by a later issue is declared with
:func:`planned`: `rlft validate` accepts it, `rlft train` refuses a non-default value until the issue
lands. The `vllm:` keys that `rlft vllm-serve` reads are real fields. Cross-field rules (G >= 2, batch divisibility, `rl: gdpo`
vs. `sum_then_normalize`, ...) live in the top-level schema, not here.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import Field, field_validator

from rlft.config.axolotl_tables import TRL, VLLM, known_only
from rlft.config.base import Section, field, planned

__all__ = [
    "DPOLossType",
    "EBFTConfig",
    "NemoGymDataset",
    "NemoGymFields",
    "PreferenceFields",
    "TRLConfig",
    "VLLMConfig",
]

NCCL_SYNC = "NCCL weight transfer, a later issue"
CUSTOM_SERVER = "custom vLLM server code, a later issue"
REASONING = "reasoning transforms (later issue)"

GRPOLossType = Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"]
ScaleRewards = Union[Literal["group", "batch", "none"], bool]
ImportanceSamplingMode = Literal[
    "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"
]
MultiObjectiveAggregation = Literal["sum_then_normalize", "normalize_then_sum"]
DPOLossType = Literal[
    "sigmoid",
    "hinge",
    "ipo",
    "robust",
    "exo_pair",
    "nca_pair",
    "bco_pair",
    "sppo_hard",
    "aot",
    "aot_unpaired",
    "apo_zero",
    "apo_down",
    "discopop",
    "sft",
    "sigmoid_norm",
]
DepthFraction = Annotated[float, Field(gt=0.0, le=1.0)]


class TRLConfig(known_only("AxolotlTrlKeys", TRL)):
    """The `trl:` section: online RL (GRPO family, GDPO, DAPO, GSPO, Dr. GRPO, RLOO, Cosmos-RL
    loss options), rollouts (in-process or vLLM, sync or async) and rewards."""

    # ---- rewards and rollouts ---------------------------------------------------------------
    reward_funcs: Optional[list[str]] = field(
        None,
        "Reward functions as 'module.fn' (from the working dir) or reward-model paths.",
    )
    reward_weights: Optional[list[float]] = field(
        None,
        "One weight per reward function; None -> all 1.0.",
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
        "https://arxiv.org/abs/2501.05242).",
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
        "Loss aggregation / objective (grpo, dr_grpo, dapo, bnpo, cispo, sapo, luspo, vespo); None"
        " -> dapo.",
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
        issue="SAPO/LUSPO/VESPO losses (later issue)", gt=0.0,
    )
    sapo_temperature_neg: float = planned(
        1.05,
        "SAPO soft-gate temperature for negative advantages (loss_type: sapo).",
        issue="SAPO/LUSPO/VESPO losses (later issue)", gt=0.0,
    )
    unbiased_loss_max_tokens: Optional[int] = field(
        None,
        "Dr. GRPO constant length normaliser; None -> max_completion_length (dr_grpo).", ge=1,
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
        "KL coefficient (k3 estimator) to the reference; None -> 0.0 (no reference loaded).", ge=0.0,
    )
    use_bias_correction_kl: Optional[bool] = field(
        None,
        "Multiply the k3 KL term by the token ratio exp(logp - old) (DeepSeek-V3.2 unbiased KL estimate, "
        "https://arxiv.org/abs/2512.02556 §3.1; TRL); None -> false.",
    )
    reference_reset_interval: Optional[int] = field(
        None,
        "Copy the policy into the frozen reference every N optimizer steps (Cosmos-RL); needs a reference copy.", ge=0,
    )
    sync_ref_model: bool = field(
        False,
        "Soft-update the reference model (TR-DPO, https://arxiv.org/abs/2404.09656).",
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
    vllm_group_port: Optional[int] = planned(
        51216,
        "Port of the NCCL weight-sync group.",
        issue=NCCL_SYNC, ge=1, le=65535,
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
        "Drop rollout rows sampled more than this many optimizer steps before they are trained on (counted in "
        "async/stale_rows_dropped; Cosmos-RL's staleness bound); None = no bound beyond prefetch_depth.", ge=0,
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


class EBFTConfig(Section):
    """The `ebft:` section: energy-based fine-tuning by feature matching
    (https://arxiv.org/abs/2603.12248), structured and strided modes."""

    mode: Literal["structured", "strided"] = field(
        "structured",
        "structured: prompt + ground truth via the rollout engine; strided: raw text, blocks "
        "generated in parallel.",
        )

    # ---- features and rewards (both modes) --------------------------------------------------
    feature_layers: list[DepthFraction] = field(
        [0.25, 0.5, 0.75],
        "Depth fractions in (0, 1] of the frozen network's hidden states used as features.",
        min_length=1,
    )
    embed_method: Literal["last_token", "mean_pooling", "completion_mean", "concat"] = field(
        "last_token",
        "Pooling of token features into one embedding.",
        )
    use_whitening: bool = field(
        False,
        "Whiten features per group by the pseudo-inverse square root of their second moment.",
        )
    alignment_coef: float = field(
        1.0,
        "Weight of the alignment reward 2*cos(generated, ground truth).", ge=0.0,
        )
    diversity_coef: float = field(
        1.0,
        "Weight of the diversity penalty 2/(n-1) * sum of pairwise dot products.", ge=0.0,
        )
    ce_coef: float = field(
        0.0,
        "Cross-entropy coefficient on ground-truth tokens (0 = off; the paper uses 0.03).",
        ge=0.0,
    )

    # ---- structured mode --------------------------------------------------------------------
    adaptive_max_tokens: bool = field(
        True,
        "Cap each batch's completion length by its ground-truth length * gt_length_multiplier.",
        )
    gt_length_multiplier: float = field(
        1.5,
        "Multiplier on ground-truth token count for adaptive_max_tokens.",
        ge=0.1,
    )

    # ---- strided mode -----------------------------------------------------------------------
    stride: int = field(8, "Tokens between anchors (strided).", ge=1)
    context_length: int = field(
        8,
        "Position of the first anchor; each block sees the whole prefix before its anchor "
        "(strided).",
        ge=1,
    )
    generate_max_len: int = field(8, "Tokens generated per block (strided).", ge=1)
    n_samples_per_prompt: int = field(4, "Rollouts per document (strided).", ge=1)
    temperature: float = field(
        0.6,
        "Sampling temperature; generated-token log-probs use it too (strided).",
        ge=0.0,
    )
    top_p: float = field(1.0, "Nucleus-sampling threshold (strided).", gt=0.0, le=1.0)
    rl_coef: float = field(1.0, "Coefficient of the REINFORCE term (strided).", ge=0.0)
    advantage_estimator: Literal["rloo", "grpo", "group_norm", "reinforce"] = field(
        "rloo",
        "Per-block baseline: rloo (leave-one-out), grpo / group_norm (z-score), reinforce (none).",
        )
    min_completion_prefix: int = field(
        0,
        "Completion tokens before the first anchor for prompt+completion data (strided).",
        ge=0,
    )
    mask_thinking_ce: Optional[bool] = planned(
        None,
        "Exclude thinking spans from the CE term (reasoning data); None -> false.",
        issue="reasoning transforms (later issue)",
    )


QuantDtype = Literal["int4", "int8", "float8_e4m3fn", "fp8", "float8", "nvfp4", "mxfp4"]
QUANT_NAMES = {"float8_e4m3fn": "float8", "fp8": "float8"}  # Axolotl's other names of float8 (e4m3)


class QATConfig(Section):
    """The `qat:` section (Axolotl's): quantization-aware training through torchao's fake quantizers
    (docs/training.md#quantization-aware-training-qat)."""

    activation_dtype: Optional[QuantDtype] = field(
        None, "Format the activations entering each linear layer are rounded to: int8 (per token), float8_e4m3fn (also "
              "fp8, float8), nvfp4, mxfp4; unset: weights only.")
    weight_dtype: QuantDtype = field(
        "int8", "Format the weights are rounded to: int4 (in groups of group_size), float8_e4m3fn, nvfp4 (groups of 16), "
                "mxfp4 (blocks of 32). Axolotl's default int8 has no QAT in torchao: set it.")
    group_size: Optional[int] = field(32, "Elements per quantization group of int4 weights (nvfp4: 16, mxfp4: 32).", ge=1)
    quantize_embedding: Optional[bool] = field(False, "Also round the embedding's weights (weights only).")
    fake_quant_after_n_steps: Optional[int] = field(
        None, "Train the first N optimizer steps without rounding, then with it (unset: from the first step).", ge=0)

    @property
    def activation(self) -> Optional[str]:
        """The activation format's canonical name (float8_e4m3fn and fp8 are float8)."""
        return QUANT_NAMES.get(self.activation_dtype, self.activation_dtype)

    @property
    def weight(self) -> str:
        return QUANT_NAMES.get(self.weight_dtype, self.weight_dtype)


def combination_problem(activation: str | None, weight: str, group_size: int | None) -> str | None:
    """Why torchao 0.18 cannot train this (activation, weight) pair of canonical names, or None: the pairs Axolotl's
    `get_quantization_config` refuses, and MXFP4 / NVFP4 weights without activations of their format."""
    if weight == "nvfp4" and group_size not in (None, 16):
        return f"nvfp4 quantizes in groups of 16, and group_size is {group_size}: set group_size: 16"
    if weight == "mxfp4" and group_size not in (None, 32):
        return f"mxfp4 quantizes in blocks of 32, and group_size is {group_size}: set group_size: 32"
    if weight == "mxfp4":
        return None if activation == "mxfp4" else (
            f"torchao rounds MXFP4 weights only together with MXFP4 activations: set activation_dtype: mxfp4, not "
            f"{activation or 'unset'}")
    if weight == "nvfp4":
        return None if activation == "nvfp4" else (
            f"torchao rounds NVFP4 weights only together with NVFP4 activations: set activation_dtype: nvfp4, not "
            f"{activation or 'unset'}")
    supported = {(None, "int4"), ("int8", "int4"), ("float8", "int4"), ("float8", "float8")}
    if (activation, weight) not in supported:
        shown = lambda name: name or "unset"  # noqa: E731
        return (f"torchao has no QAT for activation_dtype {shown(activation)} with weight_dtype {weight}: use int4 weights "
                "(activations unset, int8 or float8), float8 for both, nvfp4 or mxfp4")
    return None


class VLLMConfig(known_only("AxolotlVllmKeys", VLLM)):
    """The `vllm:` section: how `rlft vllm-serve` starts the rollout server (vLLM or transformers backend)."""

    host: Optional[str] = field(
        "0.0.0.0",
        "Address the server listens on (0.0.0.0 = every interface; clients reach it as 127.0.0.1 on this machine).",
    )
    port: Optional[int] = field(8000, "Port the server listens on.", ge=1, le=65535)
    backend: Literal["auto", "transformers", "vllm"] = field(
        "auto",
        "Engine behind the server: vllm, transformers (any device, batched KV-cache decode), "
        "auto -> vllm when it imports and CUDA is available, else transformers.",
    )
    api_key: Optional[str] = field(
        None,
        "Token for weight-changing endpoints; env RLFT_SERVER_TOKEN; generated at start when bound beyond loopback and unset.",
    )
    tensor_parallel_size: Optional[int] = field(
        None,
        "Tensor-parallel GPUs per engine (vllm backend); None -> 1.",
        ge=1,
    )
    data_parallel_size: Optional[int] = field(
        None,
        "Engine replicas (data parallel); None -> 1. Only 1 is supported (start one server per replica).",
        ge=1,
    )
    gpu_memory_utilization: Optional[float] = field(
        None,
        "Fraction of GPU memory for the engine (vllm backend); None -> 0.9.",
        gt=0.0, le=1.0,
    )
    dtype: Optional[str] = field(
        "auto",
        "Engine weight dtype (auto, bfloat16, float16, float32); auto -> the model's dtype, float32 on CPU.",
    )
    max_model_len: Optional[int] = field(
        None,
        "Engine context length (prompt + completion); None -> the model's max_position_embeddings.",
        ge=1,
    )
    enable_prefix_caching: Optional[bool] = field(
        None,
        "Reuse KV cache across prompts sharing a prefix (vllm backend); None -> engine default.",
    )
    enforce_eager: Optional[bool] = field(
        None,
        "Disable CUDA-graph capture (vllm backend); None -> false.",
    )
    kv_cache_dtype: Optional[str] = field(
        None,
        "KV-cache dtype (e.g. fp8; vllm backend); None -> auto.",
    )
    serve_module: Optional[str] = planned(
        None,
        "Python module implementing the server; None -> rlft's rollout server.",
        issue=CUSTOM_SERVER,
    )
    worker_extension_cls: Optional[str] = planned(
        None,
        "vLLM worker extension class for weight sync; None -> the server's default.",
        issue=CUSTOM_SERVER,
    )
    enable_reasoning: Optional[bool] = planned(
        None,
        "Split reasoning content from answers in responses.",
        issue=REASONING,
    )
    reasoning_parser: Optional[str] = planned(
        None,
        "vLLM reasoning parser name (with enable_reasoning).",
        issue=REASONING,
    )
    max_lora_rank: Optional[int] = field(
        None,
        "Largest LoRA rank the engine accepts; None -> lora_r, or 64 without one.",
        ge=1,
    )
    max_loras: int = field(2, "LoRA adapters kept loaded at once (vllm backend).", ge=1)
    lora_dtype: Optional[str] = field(
        "bfloat16",
        "Dtype of loaded LoRA adapters (vllm backend; the transformers backend runs them in the served dtype).",
    )


class NemoGymDataset(Section):
    """One entry of `nemo_gym_datasets`."""

    path: str = field(
        ...,
        "JSONL file, relative to nemo_gym_dir unless absolute (~ expanded).",
    )
    server_name: str = field(
        ...,
        "Resource server that verifies rows without their own agent_ref.",
    )
    max_samples: Optional[int] = field(
        None,
        "Rows sampled at random from the file; None = all.",
        ge=1,
    )


class NemoGymFields(Section):
    """Top-level `plugins` and `nemo_gym_*` keys (NeMo Gym environments as rewards / rollouts)."""

    plugins: Optional[list[str]] = field(
        None,
        "Integration plugins, e.g. axolotl.integrations.nemo_gym.NemoGymPlugin.",
    )
    nemo_gym_enabled: Optional[bool] = field(
        None,
        "Enable NeMo Gym; None -> true when the NeMo Gym plugin is listed.",
    )
    nemo_gym_dir: Optional[str] = field(
        None,
        "NeMo Gym checkout; None -> ~/Gym.",
    )
    nemo_gym_auto_clone: Optional[bool] = planned(
        None,
        "Clone NeMo Gym into nemo_gym_dir if missing; None -> false.",
        issue="install NeMo Gym with `make nemo-gym` instead: a clone needs GitHub and its own `uv sync`",
    )
    nemo_gym_config_paths: Optional[list[str]] = field(
        None,
        "Gym server configs for ng_run, relative to nemo_gym_dir (required when auto-starting).",
    )
    nemo_gym_auto_start: bool = field(
        True,
        "Start the Gym servers (ng_run with nemo_gym_config_paths) before training and stop them after.",
    )
    nemo_gym_head_port: int = field(
        11000,
        "Port of the Gym head server.",
        ge=1, le=65535,
    )
    nemo_gym_server_timeout: int = field(
        360,
        "Seconds to wait for auto-started Gym servers to answer.",
        ge=1,
    )
    nemo_gym_verify_timeout: int = field(
        30,
        "Seconds per /verify request.",
        ge=1,
    )
    nemo_gym_run_timeout: int = field(
        300,
        "Seconds per agent /run (a whole multi-turn episode).",
        ge=1,
    )
    nemo_gym_datasets: Optional[list[NemoGymDataset]] = field(
        None,
        "Gym task files (replace `datasets:`; required when enabled).",
    )
    nemo_gym_model_name: Optional[str] = field(
        None,
        "Model name sent to /verify; None -> base_model.",
    )
    nemo_gym_multi_turn: Optional[bool] = field(
        None,
        "Multi-turn episodes through the agent's /run (needs the rollout server); None -> false.",
    )
    nemo_gym_max_turns: Optional[int] = field(
        None,
        "Model turns per episode: auto-started agents stop there (max_steps), longer episodes are not trained on.",
        ge=1,
    )


class PreferenceFields(Section):
    """Top-level keys of preference optimisation (DPO family, IPO, KTO, ORPO, SimPO/CPO) and
    Bradley-Terry reward models."""

    rl_beta: float = field(
        0.1,
        "Beta of DPO/IPO/KTO/CPO/SimPO (IPO's tau) (DPO, https://arxiv.org/abs/2305.18290).",
        gt=0.0,
    )
    dpo_loss_type: Optional[list[DPOLossType]] = field(
        None,
        "DPO loss(es), combined by dpo_loss_weights; None -> [sigmoid] ([ipo] for rl: ipo).",
        min_length=1,
    )
    dpo_loss_weights: Optional[list[float]] = field(
        None,
        "One weight per dpo_loss_type entry; None -> all 1.0.",
        min_length=1,
    )
    dpo_label_smoothing: float = field(
        0.0,
        "Label-noise epsilon: conservative DPO for sigmoid, robust (rDPO https://arxiv.org/abs/2403.00409), "
        "exo_pair, aot; CPO/SimPO sigmoid smoothing.",
        ge=0.0, lt=0.5,
    )
    dpo_use_weighting: bool = field(
        False,
        "Weight each pair by its policy probability (WPO, https://arxiv.org/abs/2406.11827).",
        )
    dpo_padding_free: Optional[bool] = field(
        None,
        "Each micro-batch of chosen/rejected (KTO: matched/mismatched) rows as one sequence without padding, rows kept "
        "apart (TRL's DPO padding_free; flash-attention finds the rows from the position ids, SDPA attends per row, "
        "eager attention uses a block-diagonal mask); None -> false.",
    )
    dpo_ld_alpha: Optional[float] = field(
        None,
        "Weight of tokens beyond the shorter response (LD-DPO, https://arxiv.org/abs/2409.06411); "
        "None = off.",
        ge=0.0, le=1.0,
    )
    dpo_discopop_tau: float = field(
        0.05,
        "Temperature of the discopop loss (https://arxiv.org/abs/2406.08414).",
        gt=0.0,
    )
    kto_desirable_weight: float = field(
        1.0,
        "Weight of desirable examples in KTO (https://arxiv.org/abs/2402.01306).",
        ge=0.0,
    )
    kto_undesirable_weight: float = field(
        1.0,
        "Weight of undesirable examples in KTO.",
        ge=0.0,
    )
    orpo_alpha: float = field(
        0.1,
        "Weight of the odds-ratio term in ORPO (https://arxiv.org/abs/2403.07691).",
        ge=0.0,
    )
    cpo_alpha: float = field(
        1.0,
        "Weight of the NLL term on chosen in CPO/SimPO (CPO, https://arxiv.org/abs/2401.08417).",
        ge=0.0,
    )
    chosen_nll_average: Literal["pair", "batch"] = field(
        "pair",
        "How the chosen-answer NLL of CPO/SimPO (cpo_alpha), ORPO and DPO's `sft` loss type / rpo_alpha is averaged: "
        "pair = each pair's mean over its tokens, then the mean over pairs (the papers'); batch = the mean over every "
        "chosen token of the micro-batch (TRL's cross-entropy), which weights long answers more.",
    )
    orpo_nll_span: Literal["answer", "sequence"] = field(
        "answer",
        "Tokens of ORPO's NLL term: answer = the chosen answer's (the paper's L_SFT, https://arxiv.org/abs/2403.07691 "
        "eq. 2); sequence = prompt and answer, as TRL's decoder-only ORPOTrainer (with chosen_nll_average: batch, TRL's "
        "loss exactly).",
    )
    simpo_gamma: float = field(
        0.5,
        "Target reward margin gamma of SimPO (https://arxiv.org/abs/2405.14734).", ge=0.0,
        )
    cpo_loss_type: Optional[Literal["sigmoid", "hinge", "ipo", "simpo"]] = field(
        None,
        "CPO-trainer loss variant; None -> simpo for rl: simpo.",
        )
    rl_adapter_ref_model: bool = field(
        False,
        "With an adapter, load a separate reference model instead of disabling the adapter.",
        )
    precompute_ref_log_probs: bool = field(
        False,
        "Compute reference log-probs once before training and store them with the dataset.",
        )
    reward_model: bool = field(
        False,
        "Train a Bradley-Terry reward model (scalar head) on chosen/rejected pairs.",
        )
    num_labels: Optional[int] = field(
        None,
        "Outputs of the sequence-classification head; None -> 1 for reward models.",
        ge=1,
    )
    center_rewards_coefficient: Optional[float] = field(
        None,
        "Reward-centering penalty c * mean((r_c + r_r)^2) (https://arxiv.org/abs/2312.09244); 0.01"
        " suggested.",
        ge=0.0,
    )
    disable_dropout: bool = field(
        True, "Turn dropout off in the policy and reference (preference, reward models and online RL): TRL's default for "
        "preference training; TRL's GRPO keeps it on, rlft turns it off there too (the engine samples without it)."
    )
    ref_model: Optional[str] = field(
        None, "DPO/IPO/KTO: a separate reference model folder (default: the policy's own starting weights)."
    )
