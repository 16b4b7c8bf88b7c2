"""The pipeline at a real model size on a CPU: SFT, DPO and asynchronous GRPO for a few steps each, on a Qwen2-shaped
model of 0.5B parameters with random weights, GRPO sampling from `rlft vllm-serve`.

    .venv/bin/python bench/real_size.py                     # 0.5B, 3 steps each
    .venv/bin/python bench/real_size.py --size 358M --steps 4

The model is bench/weight_sync.py's ("0.5B": Qwen2-0.5B's shapes and 151,936-token vocabulary, fp32, 1.98 GB; its
text uses the byte tokenizer's ids). Every run is `rlft train` in a process of its own with 1 thread, the server (the
transformers backend) another with 1 thread. Reported per run: the median step time and its phases (the run's own
`time/*` metrics), the trainer's peak memory (`peak_memory_mb`), wall time; for GRPO also the server's peak resident
memory and the weight-load time, once over HTTP and once with a weight group (`trl.vllm_group_port`). Results go to
bench/results/real_size-<size>.json. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import RESULTS, device_name, free_port  # noqa: E402
from weight_sync import SHAPES, Server, build, versions  # noqa: E402

# on token ids (the random model's ids are mostly beyond the byte tokenizer's 260, which decode to no text), and
# varying within a group (its completions hold 16 distinct ids each): every step trains and pushes its weights
REWARD = "def distinct(completions, completion_ids, **kwargs):\n    return [sum(ids) % 7 / 7 for ids in completion_ids]\n"


def env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]))


def data(work: Path) -> dict[str, Path]:
    sft, pairs, prompts = work / "sft.jsonl", work / "pairs.jsonl", work / "prompts.jsonl"
    rows = [(a, b) for a in range(10) for b in range(10)]
    sft.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"{a}+{b}="},
                                                    {"role": "assistant", "content": str(a + b)}]}) + "\n" for a, b in rows))
    pairs.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)}) + "\n"
                             for a, b in rows))
    prompts.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a, b in rows))
    (work / "bench_real_size_rewards.py").write_text(REWARD)
    return {"sft": sft, "dpo": pairs, "grpo": prompts}


def run(work: Path, name: str, cfg: dict) -> dict:
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    log = work / f"{name}.log"
    began = time.perf_counter()
    with open(log, "wb") as out:
        code = subprocess.run([sys.executable, "-m", "rlft.cli", "train", str(path)], stdout=out, stderr=subprocess.STDOUT,
                              env=env(), cwd=work).returncode
    if code != 0:
        raise SystemExit(f"{name} failed:\n{log.read_text()[-3000:]}")
    wall = time.perf_counter() - began
    records = [json.loads(line) for line in (Path(cfg["output_dir"]) / "metrics.jsonl").read_text().splitlines() if line]
    steps = [r for r in records if "step_time_s" in r]
    later = steps[1:] or steps  # the first step compiles nothing here, but pays first touches
    phases = sorted({key for r in later for key in r if key.startswith(("time/", "async/weight_load_s"))})
    return {"wall_s": round(wall, 1), "median_step_s": round(statistics.median(r["step_time_s"] for r in later), 2),
            "phases_s": {key: round(statistics.median(r.get(key, 0.0) for r in later), 3) for key in phases},
            "trainer_peak_mb": max(r["peak_memory_mb"] for r in steps), "tokens_per_s": round(
                statistics.median(r["tokens_per_s"] for r in later), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="0.5B", choices=list(SHAPES))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "rlft-bench-real-size")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    model = build(args.work / f"model-{args.size}", args.size)
    files = data(args.work)
    common = {"base_model": str(model), "sequence_len": 64, "micro_batch_size": 2, "gradient_accumulation_steps": 1,
              "max_steps": args.steps, "learning_rate": 1e-5, "logging_steps": 1, "seed": 0, "save_steps": 1000}
    results: dict = {"command": " ".join(sys.argv), "machine": device_name(), "versions": versions(), "size": args.size,
                     "steps": args.steps, "threads": 1, "load_average": [round(os.getloadavg()[0], 2)]}
    results["sft"] = run(args.work, "sft", {**common, "datasets": [{"path": str(files["sft"]), "type": "chat_template"}],
                                            "output_dir": str(args.work / "out-sft")})
    print("sft", results["sft"], flush=True)
    results["dpo"] = run(args.work, "dpo", {**common, "rl": "dpo", "datasets": [{"path": str(files["dpo"])}],
                                            "output_dir": str(args.work / "out-dpo")})
    print("dpo", results["dpo"], flush=True)
    server = Server(model, args.work)
    try:
        for transport in ("http", "group"):
            group = {"vllm_group_port": free_port()} if transport == "group" else {}
            server.reset_peak() if server.process.poll() is None else None
            cfg = {**common, "rl": "grpo", "micro_batch_size": 4, "datasets": [{"path": str(files["grpo"])}],
                   "output_dir": str(args.work / f"out-grpo-{transport}"),
                   "vllm": {"host": "127.0.0.1", "port": server.port, "dtype": "float32"},
                   "trl": {"use_vllm": True, "vllm_server_port": server.port, "vllm_server_timeout": 600, "async_prefetch": True,
                           "num_generations": 4, "max_completion_length": 16, "reward_funcs": ["bench_real_size_rewards.distinct"],
                           **group}}
            result = run(args.work, f"grpo-{transport}", cfg)
            result["server_peak_mib"] = round(server.memory_mib()["VmHWM"], 1)
            results[f"grpo-{transport}"] = result
            print(f"grpo-{transport}", result, flush=True)
    finally:
        server.stop()
    results["load_average"].append(round(os.getloadavg()[0], 2))
    out = RESULTS / f"real_size-{args.size}.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
