"""What each training method is: one `MethodSpec` per value of `RlftConfig.method` (`sft`, `reward_model`, or the
value of `rl:`), holding what the config's checks and the later layers decide by method. How a run of each
method is set up and which recipe trains it is the train layer's own table (`rlft.train.methods.SETUPS`); nothing here
imports beyond the config layer."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional


@dataclass(frozen=True)
class MethodSpec:
    name: str
    rl: bool  # chosen with `rl:` (sft and reward models are not)
    # the rows it trains on: sft (instruction / chat / text rows), pair (prompt, chosen, rejected), unpaired (prompt,
    # completion, desirable label: KTO), prompt (prompts whose answers the run generates), prompt_answer (prompts with a
    # ground-truth answer, answers generated: structured EBFT), text (documents, blocks generated inside: strided EBFT)
    data: str
    pairs: bool = False  # trained on (prompt, chosen, rejected) pairs
    bradley_terry: bool = False  # its pairs may lack a prompt (whole conversations: Bradley-Terry rows) and carry a margin
    orpo_formats: bool = False  # Axolotl's ORPO row formats (chat_template.argilla) read its data beside the pair formats
    preference: bool = False  # a preference loss (DPO family, KTO): dpo_padding_free and the preference batches
    needs_reference: bool = False  # a frozen reference model (or its precomputed log-probs) always
    preference_beta: bool = False  # its loss reads beta (trl.beta, else rl_beta), which must be > 0
    default_loss_types: tuple[str, ...] = ()  # dpo_loss_type when unset
    fixed_loss_types: bool = False  # dpo_loss_type may only be default_loss_types (rl: ipo is DPO with the ipo loss)
    loss_keys: tuple[str, ...] = ()  # top-level keys only this method's loss reads
    odds_ratio: bool = False  # ORPO's odds-ratio loss beside the chosen answers' NLL over orpo_nll_span
    min_micro_batch_size: int = 1  # KTO's KL reference point is a mean over the micro-batch's mismatched pairs
    generates: bool = False  # trains on answers it generates (the GRPO family, EBFT)
    engine: bool = False  # generates through a rollout engine (in-process or the rollout server): the online-RL trl: keys
    reward_functions: bool = False  # scores its generations with reward functions or environments (NeMo Gym)
    normalises_each_reward: bool = False  # multi_objective_aggregation is normalize_then_sum (GDPO)
    feature_matching: bool = False  # rewarded by matching a frozen network's features (the ebft: section)
    mode: Optional[str] = None  # EBFT's ebft.mode this spec is for
    strided_blocks: bool = False  # generates blocks inside each document in the training forward, under a strided mask
    shares_prompts: bool = False  # several answers to one prompt in a micro-batch: share_prompts applies
    flattens: bool = False  # batch_flattening applies
    packs: bool = False  # sample_packing, streamed data (pretraining_dataset, streaming) and mistral-common apply
    groups_by_length: bool = False  # group_by_length applies
    router_loss: bool = False  # an MoE router's load-balancing loss joins its loss (output_router_logits)
    qat: bool = False  # the qat: section applies
    fused_cross_entropy: bool = False  # its loss is SFT's token cross-entropy, which Liger's fused linear kernel computes
    neftune: bool = False  # neftune_noise_alpha applies (Axolotl passes it to the SFT and reward-model trainers)
    best_model: bool = False  # Axolotl's load_best_model_at_end / early stopping builder (its causal builder)
    eval_metric: str = "loss"  # what its evaluation reports as eval/<metric>, for metric_for_best_model
    warmup_as_ratio: bool = False  # Axolotl hands transformers a warm-up ratio (it counts no steps for these)
    sequence_classification: bool = False  # the model is a sequence classifier with a score head
    strided: Optional["MethodSpec"] = None  # the spec in ebft.mode: strided


_DPO_KEYS = ("dpo_loss_type", "dpo_loss_weights", "dpo_use_weighting", "dpo_ld_alpha", "dpo_discopop_tau",
             "dpo_label_smoothing")
_PAIR = dict(data="pair", pairs=True, shares_prompts=True, groups_by_length=True)
_PREFERENCE = dict(preference=True, router_loss=True)
_GRPO = dict(rl=True, data="prompt", generates=True, engine=True, reward_functions=True, shares_prompts=True, flattens=True,
             router_loss=True, eval_metric="reward")
_EBFT = MethodSpec("ebft", rl=True, data="prompt_answer", generates=True, engine=True, feature_matching=True,
                   mode="structured", flattens=True, eval_metric="ce_loss", warmup_as_ratio=True)

# in the order messages list them
METHODS: dict[str, MethodSpec] = {spec.name: spec for spec in (
    MethodSpec("sft", rl=False, data="sft", flattens=True, packs=True, groups_by_length=True, router_loss=True, qat=True,
               fused_cross_entropy=True, neftune=True, best_model=True),
    MethodSpec("dpo", rl=True, **_PAIR, **_PREFERENCE, needs_reference=True, preference_beta=True,
               default_loss_types=("sigmoid",), loss_keys=_DPO_KEYS),
    MethodSpec("ipo", rl=True, **_PAIR, **_PREFERENCE, needs_reference=True, preference_beta=True,
               default_loss_types=("ipo",), fixed_loss_types=True, loss_keys=_DPO_KEYS),
    MethodSpec("kto", rl=True, data="unpaired", **_PREFERENCE, groups_by_length=True, needs_reference=True,
               preference_beta=True, loss_keys=("kto_desirable_weight", "kto_undesirable_weight"), min_micro_batch_size=2),
    MethodSpec("orpo", rl=True, **_PAIR, **_PREFERENCE, orpo_formats=True, odds_ratio=True,
               loss_keys=("orpo_alpha", "orpo_nll_span")),
    MethodSpec("simpo", rl=True, **_PAIR, **_PREFERENCE, preference_beta=True,
               loss_keys=("dpo_label_smoothing", "cpo_loss_type", "cpo_alpha", "simpo_gamma")),
    MethodSpec("reward_model", rl=False, **_PAIR, bradley_terry=True, neftune=True, best_model=True,
               sequence_classification=True),
    MethodSpec("grpo", **_GRPO, warmup_as_ratio=True),
    MethodSpec("gdpo", **_GRPO, normalises_each_reward=True),
    replace(_EBFT, strided=replace(_EBFT, data="text", engine=False, mode="strided", strided_blocks=True,
                                 flattens=False)),
)}
RL_METHODS = tuple(name for name, spec in METHODS.items() if spec.rl)


def method_spec(name: str, ebft_mode: Optional[str] = None) -> MethodSpec:
    """The spec of a method name (`RlftConfig.method`); EBFT's in `ebft_mode` (structured unless strided)."""
    spec = METHODS[name]
    return spec.strided if ebft_mode == "strided" and spec.strided is not None else spec


def spec_of(cfg) -> MethodSpec:
    """The spec of the method this config trains, EBFT's in its mode."""
    return method_spec(cfg.method, cfg.ebft.mode)


def names_where(flag: str) -> tuple[str, ...]:
    """The methods whose spec has `flag` set, in the table's order (for messages)."""
    return tuple(name for name, spec in METHODS.items() if getattr(spec, flag))
