"""Where rlft's SFT step spends its time on a CPU: torch.profiler over steps of `bench/sft_vs_trl.py`'s rlft run
(the addition rows, micro batch 32), compiled by default.

    .venv/bin/python bench/sft_profile.py                # size S, steps 41-60 of 65 profiled, 2 torch threads
    .venv/bin/python bench/sft_profile.py --eager

The profiler steps at each optimizer step (a global post-step hook), so a profiled step runs from one optimizer step's
end to the next: the batch, the forward and backward, clipping, the update. The table lists operators by their own
CPU time, per step; "TorchDynamo Cache Lookup" is the guard check before the compiled forward, "Call CompiledFxGraph"
rows inductor's own kernels, `aten::mm` the matrix products. Writes bench/results/sft_profile-<size>[-eager].txt.
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
from common import RESULTS, quiet  # noqa: E402
from short_rows import sft_run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="S")
    parser.add_argument("--eager", action="store_true", help="without torch_compile")
    parser.add_argument("--wait", type=int, default=35, help="steps before the profiler's 5 warm-up steps")
    parser.add_argument("--active", type=int, default=20, help="steps profiled")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    quiet()
    torch.set_num_threads(args.threads)
    run = sft_run(args.size, 0, args.wait + 5 + args.active + 5, compile=not args.eager)
    out_dir = Path(tempfile.mkdtemp(prefix="rlft-sft-profile-")) / "out"
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
    lines = [f"rlft SFT {args.size}, {'eager' if args.eager else 'torch_compile'}, {args.threads} threads, torch "
             f"{torch.__version__}; {args.active} steps profiled, their median step_time_s under the profiler "
             f"{median * 1e3:.1f} ms", f"{'operator':60s} {'self ms/step':>12s} {'total ms/step':>13s} {'calls/step':>10s}"]
    for event in events[:30]:
        lines.append(f"{event.key[:60]:60s} {event.self_cpu_time_total / 1e3 / args.active:12.3f} "
                     f"{event.cpu_time_total / 1e3 / args.active:13.3f} {event.count / args.active:10.1f}")
    text = "\n".join(lines)
    print(text)
    out = RESULTS / f"sft_profile-{args.size}{'-eager' if args.eager else ''}.txt"
    out.write_text(text + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
