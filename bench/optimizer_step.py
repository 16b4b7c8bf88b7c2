"""rlft's optimizer step on the torch optimizer itself (its default where accelerate's wrapper adds nothing: no fp16
scaler, not XLA) against through accelerate's `AcceleratedOptimizer`, alternating in one process.

    .venv/bin/python bench/optimizer_step.py             # size S, 100 steps, 5 rounds, 2 torch threads

rlft's compiled SFT run of `bench/sft_vs_trl.py` (as `bench/short_rows.py`), each setting in turn; the wrapper runs
make `rlft.train.optim.stepping_optimizer` return accelerate's optimizer, as the loop did before. The `optimizer`
phase is clipping, the step, the schedule and zeroing the gradients. Results: bench/results/optimizer_step-<size>.json.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
from short_rows import alternate, parse  # noqa: E402

import rlft.train.trainer as loop  # noqa: E402


def main() -> None:
    args = parse(__doc__.split("\n")[0])
    alternate(args, {"direct": contextlib.nullcontext,
                     "wrapper": lambda: mock.patch.object(loop, "stepping_optimizer", lambda optimizer: optimizer)},
              "optimizer_step", "wrapper")


if __name__ == "__main__":
    main()
