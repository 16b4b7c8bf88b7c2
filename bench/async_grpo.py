"""Synchronous vs asynchronous GRPO on the same model, prompts and steps, in one run.

    .venv/bin/python bench/async_grpo.py                       # 40 steps each, size S, 32-token completions
    .venv/bin/python bench/async_grpo.py --steps 80 --size M --completion-length 64

The workload is the one of bench/grpo.py: a seeded random tiny Llama, "a+b=" prompts,
completions forced to `--completion-length` tokens (`ignore_eos`, as long RL completions), and the reward
count('a') / 10 - 0.01 * length, which a policy learns by writing more 'a's: a reward curve that must rise.

Runs, one after another, each `rlft train` in a fresh process:
  sync        in-process engine, no prefetch, 2 torch threads (the whole machine)
  async-local in-process engine on a background thread (async_prefetch, depth 1), 2 threads
  async       `rlft vllm-serve` (transformers backend) with 1 thread + the trainer with 1 thread, async_prefetch
              depth 1, weights pushed every `--sync-interval` steps (the seed's 2), IS correction on (token_truncate)
  async-vllm  the same against a vLLM-backend server, when a Python with vLLM is given (`make vllm-cpu` builds one)
Reported: median step time (steps 3..N), step-time ratio sync/async, the reward curve (mean reward per quarter
of the run) and held-out greedy accuracy at the end. Then, against the running server: the cost of one full
weight sync and of one LoRA adapter sync, and tokens/s of the server vs the in-process engine on one batch.
Results go to bench/results/async_grpo-<size>.json. Nothing here is a test: no assertion on timings.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import RESULTS, free_port, make_model, median  # noqa: E402

PYTHON = sys.executable


def env(threads: int) -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1",
                TOKENIZERS_PARALLELISM="false", PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]))


def rlft(*args: str, threads: int, log: Path, python: str = PYTHON) -> subprocess.Popen:
    """`rlft ARGS` in the work folder (where the reward module is), in a process group of its own."""
    with open(log, "wb") as out:
        return subprocess.Popen([python, "-m", "rlft.cli", *args], stdout=out, stderr=subprocess.STDOUT, env=env(threads),
                                cwd=log.parent, start_new_session=True)


def finish(process: subprocess.Popen, log: Path) -> None:
    if process.wait() != 0:
        raise SystemExit(f"{process.args} failed:\n{log.read_text()[-3000:]}")


REWARD = """
def count_a(completions, **kwargs):
    return [text.count("a") / 10 - 0.01 * len(text) for text in completions]
"""


def config(work: Path, name: str, model: Path, args, port: int, **trl) -> Path:
    cfg = {
        "base_model": str(model), "rl": "grpo",
        "vllm": {"host": "127.0.0.1", "port": port, "dtype": "float32"},
        "trl": {"num_generations": 8, "max_completion_length": args.completion_length, "temperature": 1.0,
                "generation_kwargs": {"ignore_eos": True}, "reward_funcs": ["bench_async_rewards.count_a"], **trl},
        "datasets": [{"path": str(REPO / "examples/quickstart/data/train.jsonl"), "type": "examples.grpo.arithmetic.transform"}],
        "sequence_len": 16 + args.completion_length, "micro_batch_size": args.completions, "gradient_accumulation_steps": 1,
        "learning_rate": 1e-3, "lr_scheduler": "constant", "max_steps": args.steps, "logging_steps": 1, "seed": 0,
        "output_dir": str(work / name),
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def read_run(out: Path) -> dict:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in records if "step_time_s" in r]
    quarter = max(1, len(train) // 4)
    return {
        "median_step_s": median(r["step_time_s"] for r in train[2:]),
        "step_times_s": [r["step_time_s"] for r in train],
        "reward_by_quarter": [round(sum(r["reward"] for r in train[i:i + quarter]) / len(train[i:i + quarter]), 4)
                              for i in range(0, quarter * 4, quarter)],
        "median_wait_s": median(r.get("time/rollout_wait", 0.0) for r in train[2:]),
        "median_generate_s": median(r.get("time/generate", 0.0) for r in train[2:]),
        "median_forward_backward_s": median(r.get("time/forward_backward", 0.0) for r in train[2:]),
        "median_optimizer_s": median(r.get("time/optimizer", 0.0) for r in train[2:]),
        "median_weight_load_s": median(r.get("async/weight_load_s", 0.0) for r in train[2:]),
        "staleness_max": max(r.get("async/staleness/max", 0.0) for r in train),
        "is_ratio_min": min((r["sampling/importance_sampling_ratio/min"] for r in train
                             if "sampling/importance_sampling_ratio/min" in r), default=None),
    }


def train_run(work: Path, name: str, cfg: Path, threads: int) -> dict:
    log = work / f"{name}.log"
    began = time.perf_counter()
    finish(rlft("train", str(cfg), threads=threads, log=log), log)
    result = read_run(work / name)
    result["wall_s"] = round(time.perf_counter() - began, 2)
    return result


def full_push_seconds(remote, weights) -> float:
    """Median seconds of a full weight push (5 pushes, versions 1-5)."""
    times = []
    for version in range(1, 6):
        began = time.perf_counter()
        remote.load_weights(weights, version)
        times.append(time.perf_counter() - began)
    return round(median(times), 4)


def tokens_per_s(engine, prompts) -> float:
    """Sampled tokens per second of one batch of len(prompts) x 8 completions of 32 tokens, after a warm-up."""
    from rlft.rollout.types import SamplingParams

    params = SamplingParams(max_new_tokens=32, temperature=1.0, stop_token_ids=())
    engine.generate(prompts[:8], params, 1, seed=0)
    began = time.perf_counter()
    rollout = engine.generate(prompts, params, 8, seed=1)
    return round(sum(len(c) for c in rollout.completion_ids) / (time.perf_counter() - began), 1)


def vllm_costs(model: Path, port: int) -> dict:
    """Full weight-sync cost and generation speed of a vLLM-backend server, on the batch of `sync_costs`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlft.rollout.remote import RemoteEngine

    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model)
    remote = RemoteEngine("127.0.0.1", port)
    remote.wait_until_ready(300)
    full = full_push_seconds(remote, {name: p.detach() for name, p in policy.named_parameters()})
    prompts = [tokenizer(f"{a}+{b}=")["input_ids"] for a in range(8) for b in range(8)]
    return {"full_sync_median_s": full, "generate_tokens_per_s": tokens_per_s(remote, prompts)}


def sync_costs(model: Path, port: int, work: Path) -> dict:
    """Weight-sync cost (full, LoRA) and generation speed of the server vs the in-process engine, on one batch."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlft.models.weights import weights_checksum
    from rlft.rollout.local import LocalEngine
    from rlft.rollout.remote import RemoteEngine

    torch.set_num_threads(1)
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model)
    remote = RemoteEngine("127.0.0.1", port, timeout=120)
    remote.wait_until_ready(60)
    weights = {name: p.detach() for name, p in policy.named_parameters()}
    full = full_push_seconds(remote, weights)
    lora_policy = get_peft_model(policy, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False))
    lora = []
    for version in range(6, 11):
        folder = work / "lora" / f"v{version}"
        began = time.perf_counter()
        lora_policy.save_pretrained(folder, safe_serialization=True)
        remote.load_adapter(folder, version)
        lora.append(time.perf_counter() - began)
    prompts = [tokenizer(f"{a}+{b}=")["input_ids"] for a in range(8) for b in range(8)]
    local = LocalEngine(AutoModelForCausalLM.from_pretrained(model), 0)
    speeds = {"server": tokens_per_s(remote, prompts), "in_process": tokens_per_s(local, prompts)}
    return {"full_sync_median_s": full, "full_sync_bytes": sum(t.numel() * 4 for t in weights.values()),
            "lora_sync_median_s": round(median(lora), 4), "generate_tokens_per_s": speeds,
            "checksum": weights_checksum(weights)[:12]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--completion-length", type=int, default=32)
    parser.add_argument("--completions", type=int, default=32, help="completions per step (8 per prompt)")
    parser.add_argument("--size", default="S", help="tiny model size (rlft.models.tiny.SIZES)")
    parser.add_argument("--sync-interval", type=int, default=2, help="vllm_sync_interval of the async runs (the seed's 2)")
    parser.add_argument("--trainer-threads", type=int, default=1, help="torch threads of the async trainer")
    parser.add_argument("--server-threads", type=int, default=1, help="torch threads of the rollout server")
    default_vllm = REPO / ".venv-vllm-cpu" / "bin" / "python"
    parser.add_argument("--vllm-python", default=str(default_vllm) if default_vllm.exists() else None,
                        help="a Python with vLLM (default: .venv-vllm-cpu from `make vllm-cpu`, when built): also run the "
                             "async run against a vLLM-backend server")
    parser.add_argument("--work", type=Path, default=REPO / "outputs" / "bench-async")
    args = parser.parse_args()
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    model = make_model(args.work / f"model-{args.size}", args.size, seed=0)
    (args.work / "bench_async_rewards.py").write_text(REWARD)
    load = os.getloadavg()[0]
    port = free_port()
    runs = {
        "sync": train_run(args.work, "sync", config(args.work, "sync", model, args, port), threads=2),
        "async-local": train_run(args.work, "async-local", config(args.work, "async-local", model, args, port,
                                                                   async_prefetch=True, prefetch_depth=1,
                                                                   vllm_sync_interval=args.sync_interval), threads=2),
    }
    served = config(args.work, "async", model, args, port, use_vllm=True, async_prefetch=True, prefetch_depth=1,
                    vllm_sync_interval=args.sync_interval)
    log = args.work / "server.log"
    server = rlft("vllm-serve", str(served), threads=args.server_threads, log=log)
    try:
        runs["async"] = train_run(args.work, "async", served, threads=args.trainer_threads)
        costs = sync_costs(model, port, args.work)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    head_dim = json.loads((model / "config.json").read_text()).get("head_dim", 0)
    if args.vllm_python and head_dim < 32:
        print(f"no async-vllm run: vLLM's CPU attention needs a head size of at least 32 (size {args.size} has {head_dim})")
    elif args.vllm_python:  # the same async run against the vLLM backend (its CPU build here)
        port = free_port()
        served = config(args.work, "async-vllm", model, args, port, use_vllm=True, async_prefetch=True, prefetch_depth=1,
                        vllm_sync_interval=args.sync_interval)
        log = args.work / "server-vllm.log"
        server = rlft("vllm-serve", str(served), "--backend", "vllm", threads=args.server_threads, log=log,
                      python=args.vllm_python)
        try:
            costs["vllm"] = vllm_costs(model, port)
            runs["async-vllm"] = train_run(args.work, "async-vllm", served, threads=args.trainer_threads)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)
    result = {"size": args.size, "steps": args.steps, "completion_length": args.completion_length, "completions_per_step": args.completions, "sync_interval": args.sync_interval,
              "load_average_before": load, "runs": runs, "server": costs,
              "speedup_async_vs_sync": round(runs["sync"]["median_step_s"] / runs["async"]["median_step_s"], 3),
              "speedup_async_local_vs_sync": round(runs["sync"]["median_step_s"] / runs["async-local"]["median_step_s"], 3)}
    # the most async could gain here: an async step lasts at least as long as each side's own work for one step (the
    # trainer's forward/backward and optimizer on its thread; the engine's generation and weight loads on its own)
    sync_run, async_run = runs["sync"], runs["async"]
    trainer_side = async_run["median_forward_backward_s"] + async_run["median_optimizer_s"]
    engine_side = async_run["median_generate_s"] + async_run["median_weight_load_s"] / args.sync_interval
    result["async_bound"] = {"sync_step_s": sync_run["median_step_s"], "async_trainer_side_s": round(trainer_side, 4),
                             "async_engine_side_s": round(engine_side, 4),
                             "best_speedup": round(sync_run["median_step_s"] / max(trainer_side, engine_side), 3)}
    if "async-vllm" in runs:
        result["speedup_async_vllm_vs_sync"] = round(runs["sync"]["median_step_s"] / runs["async-vllm"]["median_step_s"], 3)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"async_grpo-{args.size}.json").write_text(json.dumps(result, indent=2))
    print(f"{'run':12} {'median step':>12} {'wall':>8}  reward by quarter of the run")
    for name, run in runs.items():
        print(f"{name:12} {run['median_step_s'] * 1000:10.1f}ms {run['wall_s']:7.1f}s  {run['reward_by_quarter']}")
    bound = result["async_bound"]
    print(f"phases: sync step {bound['sync_step_s'] * 1000:.1f} ms on 2 threads; async trainer side "
          f"{bound['async_trainer_side_s'] * 1000:.1f} ms and engine side {bound['async_engine_side_s'] * 1000:.1f} ms per "
          f"step on 1 thread each: async can be at most {bound['best_speedup']}x faster")
    print(f"sync/async step ratio: {result['speedup_async_vs_sync']}x (server); "
          f"{result['speedup_async_local_vs_sync']}x (in-process thread)")
    print(f"full weight sync {costs['full_sync_median_s'] * 1000:.1f} ms ({costs['full_sync_bytes'] / 1e6:.1f} MB), "
          f"LoRA sync {costs['lora_sync_median_s'] * 1000:.1f} ms; tokens/s server {costs['generate_tokens_per_s']['server']} "
          f"vs in-process {costs['generate_tokens_per_s']['in_process']}")
    if "vllm" in costs:
        print(f"vLLM server: full weight sync {costs['vllm']['full_sync_median_s'] * 1000:.1f} ms, tokens/s "
              f"{costs['vllm']['generate_tokens_per_s']}; sync/async-vllm step ratio {result['speedup_async_vllm_vs_sync']}x")


if __name__ == "__main__":
    main()
