"""Which weights a run ends with (`load_best_model_at_end`) and which eval metric decides it and early stopping
(`metric_for_best_model`, `greater_is_better`): the keys as Axolotl and transformers read them."""

from __future__ import annotations

BEST_MODEL_METHODS = ("sft", "reward_model")  # Axolotl's causal builder turns it on; its RL builder never does


def has_eval_set(cfg) -> bool:
    return bool(cfg.test_datasets) or cfg.val_set_size > 0


def axolotl_loads_best(cfg) -> bool:
    """Axolotl's default (core/builders/causal.py, its steps from utils/config): SFT and reward models with one eval
    source, save steps and eval steps, the first a multiple of the second. `saves_per_epoch` / `evals_per_epoch`
    count there as fractions of the run, 1 / (per_epoch * num_epochs), and only below 1."""
    if cfg.method not in BEST_MODEL_METHODS or bool(cfg.test_datasets) == (cfg.val_set_size > 0):
        return False

    def steps(fixed, per_epoch):
        if fixed:
            return fixed
        fraction = 1.0 / (per_epoch * cfg.num_epochs) if per_epoch else None
        return fraction if fraction is not None and fraction < 1.0 else None

    save, evaluate = steps(cfg.save_steps, cfg.saves_per_epoch), steps(cfg.eval_steps, cfg.evals_per_epoch)
    return bool(save and evaluate and save % evaluate == 0)


def loads_best_model(cfg) -> bool:
    """Whether the final model is the best checkpoint's: as set, else Axolotl's default."""
    return cfg.load_best_model_at_end if cfg.load_best_model_at_end is not None else axolotl_loads_best(cfg)


def best_metric(cfg) -> tuple[str, bool]:
    """The metrics.jsonl key of `metric_for_best_model` (`loss`, `eval_loss` and `eval/loss` all name eval/loss) and
    whether higher is better (transformers' default: not for a name ending in "loss")."""
    name = cfg.metric_for_best_model or "loss"
    for prefix in ("eval_", "eval/"):
        name = name[len(prefix):] if name.startswith(prefix) else name
    higher = cfg.greater_is_better if cfg.greater_is_better is not None else not name.endswith("loss")
    return f"eval/{name}", higher


def best_model_problems(cfg):
    """Sentences for `combination_problems`: the keys set where they cannot do what they say."""
    if cfg.load_best_model_at_end:
        if not has_eval_set(cfg):
            yield ("load_best_model_at_end: true keeps the checkpoint with the best eval metric, and this run has no eval "
                   "set: set val_set_size or test_datasets, or remove load_best_model_at_end")
        if not (cfg.save_steps or cfg.saves_per_epoch):
            yield ("load_best_model_at_end: true chooses among the checkpoints, and without save_steps or saves_per_epoch "
                   "the only one is the last step's: set save_steps (a multiple of eval_steps), or remove "
                   "load_best_model_at_end")
    if not loads_best_model(cfg) and not cfg.early_stopping_patience:
        for key in ("metric_for_best_model", "greater_is_better"):
            if getattr(cfg, key) is not None:
                yield (f"{key} is read by load_best_model_at_end and early_stopping_patience, and neither is on in this "
                       f"run: remove {key}, or turn one of them on")
