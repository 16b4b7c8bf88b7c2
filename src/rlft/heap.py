"""The garbage collector during a command's start-up.

Importing torch and transformers and building a model make about a million objects that live to the end and almost
no garbage. Every full collection set off meanwhile walks all of them, and so does the first young collection after
a pause (they are all still young): time that `bench/startup.py` shows as start-up. Within
`collector_paused()` nothing is collected; at its end what is alive leaves the collector's view (`gc.freeze`, the
way vLLM settles its heap after start-up), so that later collections walk only what was made after.
`release_heap()` gives it all back to the collector, for a command that ran inside a longer-lived process (tests).
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
        gc.freeze()
        if enabled:
            gc.enable()


def release_heap() -> None:
    gc.unfreeze()
