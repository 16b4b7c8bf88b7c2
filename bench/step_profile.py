"""Where rlft's SFT or DPO step spends its time on a CPU: torch.profiler over steps of `bench/sft_vs_trl.py`'s rlft run
(the addition rows, micro batch 32) or `bench/preference.py`'s (the addition pairs, micro batch 8 pairs), compiled by
default.

    .venv/bin/python bench/step_profile.py                          # SFT, size S, steps 41-60 of 65 profiled, 2 threads
    .venv/bin/python bench/step_profile.py --eager
    .venv/bin/python bench/step_profile.py --method dpo --eager --precompute   # DPO, reference log-probs precomputed

The profiler steps at each optimizer step (a global post-step hook), so a profiled step runs from one optimizer step's
end to the next: the batch, the forward and backward, clipping, the update. The table lists operators by their own
CPU time, per step; "TorchDynamo Cache Lookup" is the guard check before the compiled forward, "Call CompiledFxGraph"
rows inductor's own kernels, `aten::mm` the matrix products, `ProfilerStep*` the Python between operators. The
profiler's own cost lengthens every operator call, so the step under it is longer than without it. Writes
bench/results/<method>_profile-<size>[-eager][-precompute].txt.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, make_model, quiet  # noqa: E402
from short_rows import sft_run  # noqa: E402


def dpo_run(size: str, seed: int, steps: int, compile: bool, precompute: bool):
    """`run(out_dir)`: rlft's DPO run of `bench/preference.py` (its first 1,000 pairs, micro batch 8) on a seeded model
    of `size`, into `out_dir`."""
    import preference

    from rlft.tasks.addition import preference_rows, split_rows, write_jsonl

    tmp = Path(tempfile.mkdtemp(prefix="rlft-bench-"))
    model_dir = make_model(tmp / "model", size, seed)
    train_file = tmp / "pairs.jsonl"
    write_jsonl(preference_rows(split_rows()[0][:1000]), train_file)
    run_args = argparse.Namespace(seed=seed, bf16=False, micro_batch=8)
    return lambda out_dir: preference.run_rlft(model_dir, train_file, out_dir, steps, precompute, run_args, compiled=compile)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--method", choices=["sft", "dpo"], default="sft")
    parser.add_argument("--size", default="S")
    parser.add_argument("--eager", action="store_true", help="without torch_compile")
    parser.add_argument("--precompute", action="store_true", help="DPO: reference log-probs precomputed")
    parser.add_argument("--wait", type=int, default=35, help="steps before the profiler's 5 warm-up steps")
    parser.add_argument("--active", type=int, default=20, help="steps profiled")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.precompute and args.method != "dpo":
        parser.error("--precompute is a DPO setting (--method dpo)")
    quiet()
    torch.set_num_threads(args.threads)
    steps = args.wait + 5 + args.active + 5
    run = sft_run(args.size, 0, steps, compile=not args.eager) if args.method == "sft" else \
        dpo_run(args.size, 0, steps, not args.eager, args.precompute)
    out_dir = Path(tempfile.mkdtemp(prefix=f"rlft-{args.method}-profile-")) / "out"
    profiler = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=args.wait, warmup=5, active=args.active))
    hook = register_optimizer_step_post_hook(lambda *_: profiler.step())
    profiler.start()
    try:
        run(out_dir)
    finally:
        profiler.stop()
        hook.remove()
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if "step_time_s" in line]
    median = statistics.median(r["step_time_s"] for r in records[args.wait + 5:args.wait + 5 + args.active])
    events = sorted(profiler.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    calls = sum(e.count for e in events if not e.key.startswith("ProfilerStep")) / args.active
    if not calls:
        raise SystemExit("the profiler recorded no operator calls in its window (seen with --wait 5 and under): raise "
                         "--wait")
    setting = f"{'eager' if args.eager else 'torch_compile'}{', reference precomputed' if args.precompute else ''}"
    lines = [f"rlft {args.method.upper()} {args.size}, {setting}, {args.threads} threads, torch {torch.__version__}; "
             f"{args.active} steps profiled, their median step_time_s under the profiler {median * 1e3:.1f} ms; "
             f"{calls:.0f} operator calls a step (nested ones included)",
             f"{'operator':60s} {'self ms/step':>12s} {'total ms/step':>13s} {'calls/step':>10s}"]
    for event in events[:30]:
        lines.append(f"{event.key[:60]:60s} {event.self_cpu_time_total / 1e3 / args.active:12.3f} "
                     f"{event.cpu_time_total / 1e3 / args.active:13.3f} {event.count / args.active:10.1f}")
    text = "\n".join(lines)
    print(text)
    suffix = ("-eager" if args.eager else "") + ("-precompute" if args.precompute else "")
    out = RESULTS / f"{args.method}_profile-{args.size}{suffix}.txt"
    out.write_text(text + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
