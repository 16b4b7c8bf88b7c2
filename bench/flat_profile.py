"""Where a flattened micro-batch's SFT loss spends its time on a GPU, against the same rows padded: rlft's own loss
path (final hidden states, chunked cross-entropy at the target positions) under bf16 autocast, timed, then profiled.

Rows: 8 of 64-640 tokens, the last 8 the targets; the L model of rlft.models.tiny with a 32768-entry output layer.
Flattened rows run through rlft.models.varlen: with `--grouped` also through its SDPA-per-length path (the flash path
patched off), for comparison. The table lists the operators by their own GPU time, then by their own CPU time; where
the CPU's total is several times the GPU's, the step waits on the CPU.

    python bench/flat_profile.py                # a CUDA GPU
    python bench/flat_profile.py --size XS      # rehearses it on a CPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import make_model  # noqa: E402
from rlft.data.collate import pad_batch, packed_batch  # noqa: E402
from rlft.losses.linear_ce import linear_cross_entropy_sum  # noqa: E402
from rlft.models import varlen  # noqa: E402
from rlft.models.head import forward_hidden, output_layer  # noqa: E402
from rlft.models.masks import with_model_mask  # noqa: E402

INPUTS = ("input_ids", "attention_mask", "position_ids", "documents")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="L")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--grouped", action="store_true", help="also time the flat rows through SDPA per length")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    folder = make_model(Path(tempfile.mkdtemp(prefix="rlft-profile-")), args.size, args.seed, vocab=32768)
    model = LlamaForCausalLM.from_pretrained(folder, attn_implementation="sdpa").to(device)
    head = output_layer(model)
    g = torch.Generator().manual_seed(args.seed)
    rows = []
    for _ in range(8):
        ids = torch.randint(3, 256, (int(torch.randint(64, 641, (1,), generator=g)),), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": [-100] * (len(ids) - 8) + ids[-8:]})
    batches = {"padded": pad_batch(rows, 0, multiple=64), "flat": packed_batch([rows], 0, 0, True, 64)}
    batches = {name: {k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()} for name, b in batches.items()}

    def step(batch) -> None:
        inputs = with_model_mask(model, {k: batch[k] for k in INPUTS if k in batch})
        with torch.autocast(device, torch.bfloat16):
            hidden, _ = forward_hidden(model, inputs, head)
            targets = batch["labels"][:, 1:]
            keep = targets != -100
            loss = linear_cross_entropy_sum(hidden[:, :-1][keep], head.weight, head.bias, targets[keep])
        loss.backward()
        if device == "cuda":
            torch.cuda.synchronize()

    def median_ms(batch) -> float:
        step(batch), step(batch)
        times = []
        for _ in range(15):
            start = time.perf_counter()
            step(batch)
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    cases = [("padded", batches["padded"], None), ("flat", batches["flat"], None)]
    if args.grouped:
        cases.append(("flat, SDPA per length", batches["flat"], lambda *a: None))
    for name, batch, choose in cases:
        with mock.patch.object(varlen, "flash_dtype", choose or varlen.flash_dtype):
            print(f"{name}: loss forward+backward {median_ms(batch):.1f} ms, input {tuple(batch['input_ids'].shape)}", flush=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    for name in ("padded", "flat"):
        with profile(activities=activities) as prof:
            for _ in range(3):
                step(batches[name])
        for key in (["self_cuda_time_total"] if device == "cuda" else []) + ["self_cpu_time_total"]:
            print(f"--- {name}, 3 steps, by {key}")
            print(prof.key_averages().table(sort_by=key, row_limit=12, max_name_column_width=50))


if __name__ == "__main__":
    main()
