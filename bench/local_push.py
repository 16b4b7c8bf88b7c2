"""The in-process engine's weight push by model size: a copy of the trained weights, loaded after every step, against
the engine that shares the policy's tensors (synchronous GRPO with a push every step, rlft's default there).

    .venv/bin/python bench/local_push.py                    # sizes M, L, 0.5B
    .venv/bin/python bench/local_push.py --sizes 0.5B --repeats 5

Models: `weight_sync.py`'s (seeded random weights, fp32, saved once under --work). Per size and engine: the resident
memory building the engine adds (the copy of the weights that train, or nothing), and the median over --repeats of
one synchronous push, `WeightSync.prepare(policy, version, snapshot=False)()` as the trainer runs it after an optimizer
step (the weights are changed in place before each). One torch thread. Results: bench/results/local_push.json.
Nothing here is a test.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, quiet  # noqa: E402
from weight_sync import build  # noqa: E402

from rlft.rollout.local import LocalEngine  # noqa: E402
from rlft.train.weight_sync import WeightSync  # noqa: E402


def resident_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096 / 2**20


def measure(policy, share: bool, repeats: int) -> dict:
    gc.collect()
    before = resident_mib()
    engine = LocalEngine.from_policy(policy, pad_id=0, share=share)
    added = resident_mib() - before
    sync, times = WeightSync(engine), []
    for version in range(1, repeats + 1):
        with torch.no_grad():
            for param in policy.parameters():
                param.mul_(1.0001)  # an optimizer step: new values in the same tensors
        began = time.perf_counter()
        sync.prepare(policy, version, snapshot=False)()
        times.append(time.perf_counter() - began)
    assert engine.version == repeats
    del engine, sync
    gc.collect()
    return {"engine_adds_mib": round(added, 1), "push_s": statistics.median(times), "pushes_s": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["M", "L", "0.5B"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "rlft-bench-weight-sync")
    parser.add_argument("--out", type=Path, default=RESULTS / "local_push.json")
    args = parser.parse_args()
    quiet()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    results = []
    for size in args.sizes:
        policy = AutoModelForCausalLM.from_pretrained(build(args.work / size, size)).train()
        with torch.no_grad():  # every page of the weights resident before anything is measured (loading may map them)
            for param in policy.parameters():
                param.mul_(1.0)
        params = sum(p.numel() for p in policy.parameters())
        row = {"size": size, "params": params, "copy": measure(policy, False, args.repeats),
               "shared": measure(policy, True, args.repeats)}
        results.append(row)
        print(f"{size} ({params / 1e6:.0f}M parameters): copy {row['copy']['push_s'] * 1e3:.1f} ms a push, "
              f"+{row['copy']['engine_adds_mib']:.0f} MiB; shared {row['shared']['push_s'] * 1e3:.3f} ms a push, "
              f"+{row['shared']['engine_adds_mib']:.0f} MiB", flush=True)
        del policy
        gc.collect()
    report = {"benchmark": "local_push", "date": time.strftime("%Y-%m-%d"), "threads": 1, "repeats": args.repeats,
              "torch": torch.__version__, "results": results}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
