"""Rules on the preference-optimisation and reward-model keys."""

from __future__ import annotations

from rlft.config.methods import METHODS, method_spec
from rlft.config.rules.batching import prompt_sharing_problem

# the preference losses' own keys and the methods whose loss reads them
METHOD_KEYS = {key: tuple(name for name, spec in METHODS.items() if key in spec.loss_keys)
               for spec in METHODS.values() for key in spec.loss_keys}


def preference_problems(cfg):
    spec = method_spec(cfg.method)
    if cfg.reward_model and cfg.rl:
        yield f"reward_model: true trains a reward model, rl: {cfg.rl} trains a policy: set one of them"
    if cfg.num_labels not in (None, 1) and not cfg.process_reward_model:  # `train` says a PRM is not built
        yield f"num_labels is {cfg.num_labels}: a Bradley-Terry reward model has a single score (num_labels: 1)"
    if cfg.micro_batch_size < spec.min_micro_batch_size:
        yield (f"rl: {spec.name} needs micro_batch_size >= {spec.min_micro_batch_size}: the KL reference point is a batch mean over mismatched "
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
    if spec.fixed_loss_types and cfg.dpo_loss_type not in (None, list(spec.default_loss_types)):
        yield (f"rl: {spec.name} is DPO with dpo_loss_type [{', '.join(spec.default_loss_types)}]; remove dpo_loss_type "
               f"{cfg.dpo_loss_type} or use rl: dpo")
    for key in ("precompute_ref_log_probs", "ref_model"):
        if getattr(cfg, key) and spec.pairs and not spec.needs_reference:
            yield f"{key}: {cfg.method} uses no reference model; remove the key"
    if cfg.share_prompts and (problem := prompt_sharing_problem(cfg)):
        yield f"share_prompts: {problem}; remove the key (or set it to false)"
    if spec.preference_beta and cfg.trl.beta == 0:
        yield f"trl.beta is {cfg.method}'s beta here (it takes precedence over rl_beta, as in Axolotl) and must be > 0"
    for key, methods in METHOD_KEYS.items():  # a method's own key set for another method would do nothing
        value = getattr(cfg, key)
        if key in cfg.model_fields_set and key not in spec.loss_keys and value != type(cfg).model_fields[key].default:
            yield f"{key}: {value} acts only with rl: {' or '.join(methods)}, and this config trains {cfg.method}: remove it"
