"""Rules on the profiler keys: one way of choosing the profiled steps at a time, and no key that would record nothing."""

from __future__ import annotations

SUB = "profiler.sub_profiler_config"


def profiler_problems(cfg):
    profiler = cfg.profiler
    chosen = [f"profiler.{key}" for key in ("enable_profiler", "enable_nsys") if getattr(profiler, key)]
    if cfg.profiler_steps and chosen:
        yield (f"profiler_steps (Axolotl's profiler) and {' and '.join(chosen)} (Cosmos-RL's) both choose the profiled steps: "
               "keep one (profiler_steps records profiler_steps_start + 1 onwards; the profiler: section waits "
               "sub_profiler_config.wait_steps, warms up warmup_steps, records active_steps)")
    sub = profiler.sub_profiler_config
    # do_profile is Cosmos-RL's controller switch, which `rlft train` refuses as not built whatever the rest says
    written = [f"{SUB}.{key}" for key in type(sub).model_fields if key in sub.model_fields_set and key != "do_profile"]
    if not chosen and not cfg.profiler_steps and written:
        yield (f"{', '.join(written)} {_are(written)} read while a profiler runs, and none is on: set "
               f"profiler.enable_profiler: true (or enable_nsys), or remove {_them(written)}")
    elif cfg.profiler_steps and not chosen and (fixed := [key for key in written if not key.endswith(".rank_filter")]):
        yield (f"{', '.join(fixed)} with profiler_steps (Axolotl's profiler), which records profiler_steps steps after "
               "profiler_steps_start with shapes, memory and stacks whatever these say (it reads rank_filter alone): "
               f"remove {_them(fixed)}, or profile with profiler.enable_profiler: true instead of profiler_steps")
    if "profiler_steps_start" in cfg.model_fields_set and not cfg.profiler_steps:
        yield ("profiler_steps_start counts the steps trained before profiler_steps records, and profiler_steps is not set "
               "(unset or 0: off): set profiler_steps, or remove profiler_steps_start")
    if sub.with_modules:
        yield (f"{SUB}.with_modules: true asks torch.profiler for each operator's module hierarchy, which it records for "
               "TorchScript models only, and rlft trains eager models (never TorchScript): remove it; with_stack: true "
               "shows each nn.Module call as a range of its own")


def _are(keys: list[str]) -> str:
    return "is" if len(keys) == 1 else "are"


def _them(keys: list[str]) -> str:
    return "it" if len(keys) == 1 else "them"
