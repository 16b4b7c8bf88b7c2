"""Regenerate the example results the README and docs quote.

    PYTHONPATH=src .venv/bin/python docs/example_results.py             # everything (tens of minutes on 2 cores)
    PYTHONPATH=src .venv/bin/python docs/example_results.py dpo grpo    # some of them
    PYTHONPATH=src .venv/bin/python docs/example_results.py --out docs/example-results-other.json quickstart grpo
                                                                        # into another file (another machine)

Runs the offline quickstart first (the other examples start from its checkpoints), then each
example from the repository root with its own config into outputs/example-results/NAME, and
writes every eval line of each run (step -> eval/* values) to docs/example-results.json, merged
with what is already there. The numbers in README.md, docs/preference.md, docs/grpo.md and
docs/ebft.md are copied from that file; compare them after a change to the training code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "example-results.json"
EXAMPLES = {
    "dpo": "examples/preference/dpo.yaml", "dpo-lora": "examples/preference/dpo-lora.yaml", "ipo": "examples/preference/ipo.yaml",
    "kto": "examples/preference/kto.yaml", "orpo": "examples/preference/orpo.yaml", "simpo": "examples/preference/simpo.yaml",
    "reward-model": "examples/preference/reward-model.yaml", "grpo": "examples/grpo-arithmetic.yaml",
    "gdpo": "examples/grpo/gdpo.yaml", "dapo": "examples/grpo/dapo.yaml", "gspo": "examples/grpo/gspo.yaml",
    "dr-grpo": "examples/grpo/dr-grpo.yaml", "rloo": "examples/grpo/rloo.yaml", "ebft-structured": "examples/ebft-structured.yaml",
    "ebft-strided": "examples/ebft-strided.yaml",
    # the ablations docs/ebft.md reports
    "ebft-structured-ce0": "examples/ebft-structured.yaml --ebft.ce_coef=0",
    "ebft-strided-ce0": "examples/ebft-strided.yaml --ebft.ce_coef=0",
    "ebft-strided-ce0-seed1": "examples/ebft-strided.yaml --ebft.ce_coef=0 --seed=1",
    "ebft-strided-rl0": "examples/ebft-strided.yaml --ebft.rl_coef=0",
    # docs/preference.md: the reward model with each prompt twice, and at its former learning rate
    "reward-model-unshared": "examples/preference/reward-model.yaml --share_prompts=false",
    "reward-model-lr1e-3": "examples/preference/reward-model.yaml --learning_rate=1e-3",
    "reward-model-lr1e-3-unshared": "examples/preference/reward-model.yaml --learning_rate=1e-3 --share_prompts=false",
}


def eval_lines(output_dir: Path) -> dict[str, dict[str, float]]:
    lines = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return {str(m["step"]): {k: v for k, v in m.items() if k.startswith("eval/")} for m in lines if any(k.startswith("eval/") for k in m)}


def main(names: list[str], results_file: Path = RESULTS) -> int:
    import os
    import platform

    from rlft.cli import main as rlft

    os.chdir(ROOT)
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    if results_file != RESULTS:  # the main file's numbers are the docs'; another records where it ran
        results["machine"] = {"cpu": _cpu_name(), "cores": os.cpu_count(), "python": platform.python_version()}
    if not names or "quickstart" in names:
        from rlft.quickstart import run_quickstart

        results["quickstart"] = run_quickstart()
    for name in names or list(EXAMPLES):
        if name == "quickstart":
            continue
        out = ROOT / "outputs" / "example-results" / name
        if rlft(["train", *EXAMPLES[name].split(), f"--output_dir={out}"]) != 0:
            print(f"{name}: the run failed", file=sys.stderr)
            return 1
        results[name] = eval_lines(out)
        results_file.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    results_file.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(f"written {results_file}")
    return 0


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--out" in args:
        at = args.index("--out")
        raise SystemExit(main(args[:at] + args[at + 2:], Path(args[at + 1]).resolve()))
    raise SystemExit(main(args))
