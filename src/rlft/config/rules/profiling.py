"""Rules on the profiler keys: one way of choosing the profiled steps at a time."""

from __future__ import annotations


def profiler_problems(cfg):
    profiler = cfg.profiler
    chosen = [f"profiler.{key}" for key in ("enable_profiler", "enable_nsys") if getattr(profiler, key)]
    if cfg.profiler_steps and chosen:
        yield (f"profiler_steps (Axolotl's profiler) and {' and '.join(chosen)} (Cosmos-RL's) both choose the profiled steps: "
               "keep one (profiler_steps records profiler_steps_start + 1 onwards; the profiler: section waits "
               "sub_profiler_config.wait_steps, warms up warmup_steps, records active_steps)")
