"""rlft's compiled SFT step with inductor's default GEMMs (ATen, oneDNN/MKL) against GEMMs autotuned over inductor's
own C++ templates and ATen (`max_autotune_gemm`, what `torch_compile_mode: max-autotune` turns on), alternating in one
process.

    .venv/bin/python bench/gemm_autotune.py              # size S, 100 steps, 5 rounds, 2 torch threads

rlft's compiled SFT run of `bench/sft_vs_trl.py` (as `bench/short_rows.py`), each setting in turn, dynamo's caches
reset before each run; the first round is a warm-up. Autotuning benchmarks every matrix product's candidates while it
compiles (the first steps take longer) and keeps the fastest. Results: bench/results/gemm_autotune-<size>.json.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from torch._inductor import config as inductor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from short_rows import alternate, parse  # noqa: E402


def main() -> None:
    args = parse(__doc__.split("\n")[0])
    alternate(args, {"default": contextlib.nullcontext,
                     "autotuned": lambda: inductor.patch(max_autotune_gemm=True, max_autotune_gemm_backends="CPP,ATEN")},
              "gemm_autotune", "autotuned")


if __name__ == "__main__":
    main()
