"""Rules on the `validation:` section (Cosmos-RL's): which runs it evaluates, and on which prompts."""

from __future__ import annotations

from rlft.config.methods import method_spec
from rlft.config.plugins import nemo_gym_enabled
from rlft.config.rl import trl_options


def validation_problems(cfg):
    section = cfg.validation
    written = sorted(section.model_fields_set - {"enable"})
    if not section.enable:
        if written:
            keys = ", ".join(f"validation.{key}" for key in written)
            one = len(written) == 1
            yield (f"{keys} {'changes' if one else 'change'} nothing while validation.enable is false (the default): set "
                   f"validation.enable: true, or remove {'it' if one else 'them'}")
        return
    if not method_spec(cfg.method).reward_functions:
        yield (f"validation.enable is the evaluation of the GRPO family (rl: grpo or gdpo), scored by reward functions; "
               f"rl: {cfg.rl or 'sft'} evaluates its own way: remove the validation: section")
        return
    if nemo_gym_enabled(cfg):
        yield ("validation.enable with NeMo Gym: evaluation on Gym tasks is not built yet (the task files replace "
               "datasets:); remove the validation: section")
    if cfg.eval_strategy == "no":
        yield "validation.enable with eval_strategy: no: nothing would evaluate; remove one of them"
    split = [key for key in ("test_datasets", "val_set_size") if getattr(cfg, key)]
    if section.datasets and split:
        yield (f"validation.datasets and {' and '.join(split)} are both set: evaluation takes validation.datasets, so "
               f"{split[0]} would be read for nothing (val_set_size even holds training rows out); keep one")
    if not section.datasets and not split:
        yield ("validation.enable has no prompts to evaluate on: list them in validation.datasets, or hold some "
               "training rows out with val_set_size (Cosmos-RL's dataset.test_size), or set test_datasets")
    top_k = section.top_k if section.top_k is not None else trl_options(cfg)["top_k"]
    if section.n_generation > 1 and (section.temperature == 0 or top_k == 1):
        greedy = "validation.temperature 0" if section.temperature == 0 else (
            "validation.top_k 1" if section.top_k is not None else "top_k 1 (trl.top_k, as validation.top_k is unset)")
        yield (f"validation.n_generation {section.n_generation} with {greedy} samples greedily: a prompt's "
               f"{section.n_generation} completions would be the same one, so pass@{section.n_generation} would equal "
               "pass@1; set validation.temperature above 0 (e.g. 1.0) and validation.top_k to 0 (off) or above 1, or "
               "n_generation: 1")
