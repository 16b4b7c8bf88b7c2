"""Rules on the preference-optimisation and reward-model keys."""

from __future__ import annotations

from rlft.config.rules.batching import prompt_sharing_problem

# the preference losses' own keys and the methods whose loss reads them
METHOD_KEYS = {**dict.fromkeys(("dpo_loss_type", "dpo_loss_weights", "dpo_use_weighting", "dpo_ld_alpha", "dpo_discopop_tau"),
                               ("dpo", "ipo")),
               "dpo_label_smoothing": ("dpo", "ipo", "simpo"), **dict.fromkeys(("cpo_loss_type", "cpo_alpha", "simpo_gamma"), ("simpo",)),
               **dict.fromkeys(("orpo_alpha", "orpo_nll_span"), ("orpo",)),
               **dict.fromkeys(("kto_desirable_weight", "kto_undesirable_weight"), ("kto",))}


def preference_problems(cfg):
    if cfg.reward_model and cfg.rl:
        yield f"reward_model: true trains a reward model, rl: {cfg.rl} trains a policy: set one of them"
    if cfg.num_labels not in (None, 1) and not cfg.process_reward_model:  # `train` says a PRM is not built
        yield f"num_labels is {cfg.num_labels}: a Bradley-Terry reward model has a single score (num_labels: 1)"
    if cfg.rl == "kto" and cfg.micro_batch_size < 2:
        yield ("rl: kto needs micro_batch_size >= 2: the KL reference point is a batch mean over mismatched "
               "prompt/completion pairs, and one pair per step makes it the reward itself")
    if cfg.dpo_loss_weights is not None:
        types = cfg.dpo_loss_type or ["sigmoid"]
        if len(cfg.dpo_loss_weights) != len(types):
            yield f"dpo_loss_weights has {len(cfg.dpo_loss_weights)} entries for {len(types)} dpo_loss_type entries: give one weight per type"
    types = cfg.dpo_loss_type or []
    if "exo_pair" in types and cfg.dpo_label_smoothing == 0:
        yield "dpo_loss_type exo_pair needs dpo_label_smoothing > 0 (the EXO paper uses 1e-3): log(0) is undefined"
    if cfg.dpo_use_weighting and {"aot", "aot_unpaired"} & set(types):
        yield "dpo_use_weighting (WPO) cannot weight aot/aot_unpaired: those losses sort the batch, so rows lose their weights"
    if cfg.rl == "ipo" and cfg.dpo_loss_type not in (None, ["ipo"]):
        yield f"rl: ipo is DPO with dpo_loss_type [ipo]; remove dpo_loss_type {cfg.dpo_loss_type} or use rl: dpo"
    for key in ("precompute_ref_log_probs", "ref_model"):
        if getattr(cfg, key) and cfg.method in ("orpo", "simpo", "reward_model"):
            yield f"{key}: {cfg.method} uses no reference model; remove the key"
    if cfg.share_prompts and (problem := prompt_sharing_problem(cfg)):
        yield f"share_prompts: {problem}; remove the key (or set it to false)"
    if cfg.method in ("dpo", "ipo", "kto", "simpo") and cfg.trl.beta == 0:
        yield f"trl.beta is {cfg.method}'s beta here (it takes precedence over rl_beta, as in Axolotl) and must be > 0"
    for key, methods in METHOD_KEYS.items():  # a method's own key set for another method would do nothing
        value = getattr(cfg, key)
        if key in cfg.model_fields_set and cfg.method not in methods and value != type(cfg).model_fields[key].default:
            yield f"{key}: {value} acts only with rl: {' or '.join(methods)}, and this config trains {cfg.method}: remove it"
