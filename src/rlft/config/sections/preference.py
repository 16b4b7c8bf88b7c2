"""Top-level keys of preference optimisation (DPO family, IPO, KTO, ORPO, SimPO/CPO) and Bradley-Terry reward
models."""

from __future__ import annotations

from typing import Literal, Optional

from rlft.config.base import Section, field

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
