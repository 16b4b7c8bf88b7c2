"""Which weights a run ends with (`load_best_model_at_end`), which eval metric decides it, early stopping and
`save_strategy: best` (`metric_for_best_model`, `greater_is_better`), and the eval and save schedules' strategies:
the keys as Axolotl and transformers read them."""

from __future__ import annotations

from rlft.config.methods import method_spec


def has_eval_set(cfg) -> bool:
    return bool(cfg.test_datasets) or cfg.val_set_size > 0 or bool(cfg.validation.enable and cfg.validation.datasets)


def axolotl_loads_best(cfg) -> bool:
    """Axolotl's decision (core/builders/causal.py, its steps from utils/config), for SFT and reward models: on when
    `load_best_model_at_end` is true or `early_stopping_patience` is set (its schema's default is false), and the run
    has one eval source, save steps and eval steps, the first a multiple of the second. `saves_per_epoch` /
    `evals_per_epoch` count there as fractions of the run, 1 / (per_epoch * num_epochs), and only below 1."""
    if not method_spec(cfg.method).best_model or bool(cfg.test_datasets) == (cfg.val_set_size > 0):
        return False
    if not (cfg.load_best_model_at_end or cfg.early_stopping_patience):
        return False

    def steps(fixed, per_epoch):
        if fixed:
            return fixed
        fraction = 1.0 / (per_epoch * cfg.num_epochs) if per_epoch else None
        return fraction if fraction is not None and fraction < 1.0 else None

    save, evaluate = steps(cfg.save_steps, cfg.saves_per_epoch), steps(cfg.eval_steps, cfg.evals_per_epoch)
    return bool(save and evaluate and save % evaluate == 0)


def loads_best_model(cfg) -> bool:
    """Whether the final model is the best checkpoint's: as set, else Axolotl's decision (on with
    early_stopping_patience). Unlike Axolotl, an explicit false stays false with early stopping, and an explicit
    true that cannot work is refused (`best_model_problems`) rather than dropped."""
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
    for strategy, steps, per_epoch in (("save_strategy", "save_steps", "saves_per_epoch"),
                                       ("eval_strategy", "eval_steps", "evals_per_epoch")):
        value = getattr(cfg, strategy)
        for key in (steps, per_epoch):
            if value not in (None, "steps") and getattr(cfg, key):
                yield f"{strategy}: {value} and {key} are both set: {key} goes with {strategy}: steps, so remove one"
    evaluates = has_eval_set(cfg) and cfg.eval_strategy != "no"
    if not evaluates:
        for key, what in (("load_best_model_at_end", "keeps the checkpoint with the best eval metric"),
                          ("early_stopping_patience", "stops when the eval metric stops improving")):
            if getattr(cfg, key):
                yield (f"{key} {what}, and this run does not evaluate ({'eval_strategy: no' if has_eval_set(cfg) else 'no eval set'}): "
                       f"set val_set_size or test_datasets (and eval_steps), or remove {key}")
    periodic = cfg.eval_steps or cfg.evals_per_epoch or cfg.eval_strategy == "epoch"
    once_an_epoch = (cfg.eval_strategy == "epoch" or cfg.evals_per_epoch == 1) and not cfg.eval_steps
    if cfg.early_stopping_patience and evaluates and (not periodic or (once_an_epoch and not cfg.max_steps
                                                                        and cfg.num_epochs <= 1)):
        yield ("early_stopping_patience stops when the eval metric stops improving, and this run's only evaluation "
               "before the end is at step 0 (" + ("one evaluation an epoch, one epoch" if periodic else
                                                  "no eval_steps, evals_per_epoch or eval_strategy: epoch") +
               "): set eval_steps or evals_per_epoch above 1, or remove early_stopping_patience")
    if cfg.save_strategy == "best" and not (evaluates and periodic):
        yield ("save_strategy: best saves after an evaluation that improves metric_for_best_model, and this run evaluates "
               "only at its end: set an eval set and eval_steps, evals_per_epoch or eval_strategy: epoch")
    if cfg.load_best_model_at_end and evaluates and not (cfg.save_steps or cfg.saves_per_epoch or cfg.save_every_n_epochs or
                                                         cfg.save_strategy in ("epoch", "best")):
        yield ("load_best_model_at_end: true chooses among the checkpoints, and without save_steps, saves_per_epoch or "
               "save_strategy: epoch or best the only one is the last step's: set save_steps (a multiple of eval_steps), "
               "or remove load_best_model_at_end")
    watching = [key for key, on in (("early_stopping_patience", cfg.early_stopping_patience),
                                    ("load_best_model_at_end", loads_best_model(cfg)),
                                    ("save_strategy: best", cfg.save_strategy == "best")) if on]
    reports = method_spec(cfg.method).eval_metric
    if watching and reports != "loss" and cfg.metric_for_best_model is None:
        yield (f"{watching[0]} watches eval/loss, which {cfg.method}'s evaluation does not report: set "
               f"metric_for_best_model: {reports} (eval/{reports}{', higher is better' if reports == 'reward' else ''})")
    if not watching:
        for key in ("metric_for_best_model", "greater_is_better"):
            if getattr(cfg, key) is not None:
                yield (f"{key} is read by load_best_model_at_end, early_stopping_patience and save_strategy: best, and "
                       f"none is on in this run: remove {key}, or turn one of them on")
