"""The `ebft:` section: energy-based fine-tuning by feature matching."""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field

from rlft.config.base import Section, field, planned

DepthFraction = Annotated[float, Field(gt=0.0, le=1.0)]


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
        what="reasoning transforms",
    )
