"""Rules on the warm-up, evaluation and checkpoint schedule keys."""

from __future__ import annotations


def schedule_problems(cfg):
    if cfg.warmup_steps is not None and cfg.warmup_ratio is not None:
        yield "warmup_steps and warmup_ratio are both set: keep one"
    if cfg.test_datasets and cfg.val_set_size:  # as Axolotl refuses it: the held-out rows would be neither trained nor used
        yield ("test_datasets and val_set_size are both set: evaluation takes test_datasets, so val_set_size would hold "
               "nothing out; keep one")
    for steps, per_epoch in (("eval_steps", "evals_per_epoch"), ("save_steps", "saves_per_epoch")):
        if getattr(cfg, steps) and getattr(cfg, per_epoch):
            yield f"{steps} and {per_epoch} are both set: keep one"
    if cfg.save_every_n_epochs:
        for key in ("save_steps", "saves_per_epoch"):
            if getattr(cfg, key):
                yield f"save_every_n_epochs and {key} are both set: keep one"
        if cfg.save_strategy not in (None, "epoch"):
            yield (f"save_every_n_epochs saves at the end of every Nth epoch, and save_strategy: {cfg.save_strategy} asks "
                   "for another schedule: keep one")
    if cfg.save_mode == "async" and cfg.save_strategy == "no":
        yield ("save_mode: async writes the checkpoints of save_strategy on a background thread, and save_strategy: no "
               "saves none (the final model, and a checkpoint when a run is stopped, are written while the run waits): "
               "remove save_mode, or choose a save_strategy that saves checkpoints")
