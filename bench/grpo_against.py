"""rlft's GRPO step at this tree against rlft at another commit, in turns: what a change did to the step, measured on
the same machine at the same time (a shared VM's speed drifts by tens of percent between hours, so steps timed on
different days do not compare).

    .venv/bin/python bench/grpo_against.py e3e855b~1            # 5 rounds of 40 steps, compiled, 1 torch thread
    .venv/bin/python bench/grpo_against.py HEAD~3 --eager --rounds 3

Each run is `bench/grpo.py`'s rlft run (size S, 8 completions of 32 tokens per step, its settings; this tree's bench
code) in a process of its own, with the commit's `src/` (checked out in a git worktree, `common.worktree`) or this
tree's first on PYTHONPATH;
the order of the two trees alternates between rounds. Reported: each tree's median step, generate and
forward+backward phases (the median over its runs of each run's median), the round-by-round ratio of the steps
(commit / this tree: above 1, this tree is faster), and whether both trees drew the same rewards (the same tokens).
Results: bench/results/grpo_against-<commit>.json. Not a test: nothing asserts on timings.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child(steps: int, compiled: bool) -> None:
    """One run, in this process (started by `run`): prints its medians as one RESULT line."""
    import tempfile

    import grpo
    import torch
    from common import make_model, quiet

    from rlft.tasks.addition import split_rows, write_jsonl

    quiet()
    torch.set_num_threads(1)
    folder = Path(tempfile.mkdtemp(prefix="rlft-grpo-against-"))
    model = make_model(folder / "model", "S", 0)
    write_jsonl([{"prompt": row["prompt"]} for row in split_rows()[0]], folder / "prompts.jsonl")
    settings = argparse.Namespace(seed=0, bf16=False, force_length=True, long=False)
    result = grpo.run_rlft(model, folder / "prompts.jsonl", folder / "out", steps, settings, None, compiled)
    phases = result["phase_medians"]
    import rlft

    print("RESULT " + json.dumps({"rlft": rlft.__file__, "step_s": result["median_step_s"],
                                  "generate_s": phases["generate_median_s"],
                                  "forward_backward_s": phases["forward_backward_median_s"], "rewards": result["rewards"]}))


def run(src: Path, steps: int, compiled: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])]))
    command = [sys.executable, __file__, "--child", str(steps)] + ([] if compiled else ["--eager"])
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO / "bench", check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"the run with {src} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    result = json.loads(lines[0][len("RESULT "):])
    if not result.pop("rlft").startswith(str(src)):
        raise SystemExit(f"the run meant for {src} imported rlft from elsewhere")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("against", nargs="?", help="the git revision to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--eager", action="store_true", help="torch_compile: false (default: true)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.child:
        return child(args.child, not args.eager)
    if not args.against:
        parser.error("name the git revision to compare with")
    sys.path.insert(0, str(REPO / "bench"))
    from common import RESULTS, median, worktree

    head = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True,
                          check=True).stdout.strip()
    trees = {head: REPO / "src", args.against: worktree(args.against, Path(os.environ.get("RLFT_BENCH_DIR", "/tmp"))) / "src"}
    load_before = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for index in range(args.rounds):
        for name in (list(trees) if index % 2 else list(trees)[::-1]):
            runs[name].append(run(trees[name], args.steps, not args.eager))
            print(f"round {index + 1}/{args.rounds} {name}: step {runs[name][-1]['step_s'] * 1e3:.1f} ms", flush=True)
    summary = {name: {key: median(r[key] for r in rows) for key in ("step_s", "generate_s", "forward_backward_s")}
               for name, rows in runs.items()}
    by_round = [old["step_s"] / new["step_s"] for old, new in zip(runs[args.against], runs[head])]
    report = {"benchmark": "grpo_against", "head": head, "against": args.against, "compiled": not args.eager,
              "steps": args.steps, "rounds": args.rounds, "threads": 1,
              "load_average_1m_before_after": [load_before, os.getloadavg()[0]], "medians": summary,
              "ratio_against_over_head_by_round": by_round, "ratio_against_over_head": median(by_round),
              "same_rewards": all(a["rewards"] == b["rewards"] for a, b in zip(runs[args.against], runs[head])),
              "runs": runs, "command": " ".join(["bench/grpo_against.py", *sys.argv[1:]])}
    out = args.out or RESULTS / f"grpo_against-{args.against}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    for name, values in summary.items():
        print(f"{name:>14}: step {values['step_s'] * 1e3:.1f} ms, generate {values['generate_s'] * 1e3:.1f} ms, "
              f"forward+backward {values['forward_backward_s'] * 1e3:.1f} ms")
    print(f"{args.against}/{head} step: {report['ratio_against_over_head']:.3f}x (by round "
          f"{', '.join(f'{r:.3f}' for r in by_round)}); same rewards: {report['same_rewards']}; wrote {out}")


if __name__ == "__main__":
    main()
