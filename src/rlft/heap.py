"""The garbage collector around a run's start-up and its steps.

Importing torch and transformers and building a model make about a million long-lived objects and almost no
garbage, and every full collection set off meanwhile walks all of them: a fifth of a run's start-up
(`bench/startup.py` measures it). `collector_paused()` holds collections off while that happens and restores the
collector as it found it. `settled_heap()` then moves everything alive out of the collector's view while the steps
run (the way vLLM settles its heap after start-up), so that a collection during training walks only what training
made; leaving it gives everything back to the collector.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def collector_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextmanager
def settled_heap() -> Iterator[None]:
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
