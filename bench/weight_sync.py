"""Weight sync to `rlft vllm-serve` by model size: seconds per sync and the server's peak memory, for every way weights
travel, in one run.

    .venv/bin/python bench/weight_sync.py                          # sizes M, L, 358M, 0.5B
    .venv/bin/python bench/weight_sync.py --sizes 358M 0.5B 1.5B --repeats 3
    .venv/bin/python bench/weight_sync.py --plot-only              # redraw the plot from the JSON

Models (seeded random weights, fp32, saved once under --work): rlft's tiny Llama sizes M and L; "358M", a Llama with
Qwen2-0.5B's widths and depth and the byte tokenizer's 260-token vocabulary (1.43 GB); "0.5B" and "1.5B", Qwen2
architectures of Qwen2-0.5B's and Qwen2-1.5B's shapes with their 151,936-token vocabulary (the byte tokenizer's ids
are a subset of it). One server per size (transformers backend, 1 thread; the trainer side here, 1 thread), then:

  http     full weights over HTTP (64 MiB safetensors buckets, streamed into the engine)
  group    full weights as gloo broadcasts of a weight group (trl.vllm_group_port)
  path     full weights from a shared path: save to /dev/shm as safetensors, the server reads them
  lora     a LoRA adapter (r 16 on every linear layer) saved as a PEFT folder and loaded (trl.vllm_lora_sync)
  merged   a LoRA run's merged layers (only the layers the adapter touches) over HTTP, and through the group
           (path, lora and merged are left out above 1B parameters: their copies would not fit in 24 GiB)

Each is the median of --repeats syncs, timed on the trainer's side from the call to the verified answer (the
snapshot a training step takes first is not included). The server's peak resident memory is reset before each way
(`/proc/PID/clear_refs`) and read after it; "idle" is the server's resident memory once it holds the model. Results
go to bench/results/weight_sync.json and the plot to bench/results/weight_sync.png. Nothing here is a test.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import RESULTS, device_name, free_port, quiet  # noqa: E402

SHAPES = {  # hidden, layers, heads, kv heads, intermediate, vocab (None: the byte tokenizer's), architecture
    "M": (256, 4, 8, 4, 1024, None, "llama"),
    "L": (1024, 8, 16, 8, 2816, None, "llama"),
    "358M": (896, 24, 14, 2, 4864, None, "llama"),
    "0.5B": (896, 24, 14, 2, 4864, 151936, "qwen2"),
    "1.5B": (1536, 28, 12, 2, 8960, 151936, "qwen2"),
}
WAYS = ["http", "group", "path", "lora", "merged-http", "merged-group"]


def build(folder: Path, size: str) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from rlft.data.tokenizer import byte_tokenizer

    if (folder / "config.json").exists():
        return folder
    hidden, layers, heads, kv, inter, vocab, arch = SHAPES[size]
    tokenizer = byte_tokenizer()
    keys = dict(vocab_size=vocab or len(tokenizer), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv, intermediate_size=inter, max_position_embeddings=1024, tie_word_embeddings=True,
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    config, model_class = (Qwen2Config(**keys), Qwen2ForCausalLM) if arch == "qwen2" else (LlamaConfig(**keys), LlamaForCausalLM)
    torch.manual_seed(0)
    model_class(config).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


class Server:
    def __init__(self, folder: Path, work: Path):
        import yaml

        self.port = free_port()
        config = work / f"serve-{self.port}.yaml"
        config.write_text(yaml.safe_dump({"base_model": str(folder), "datasets": [{"path": "unused.jsonl"}],
                                          "vllm": {"host": "127.0.0.1", "port": self.port, "max_lora_rank": 16}}))
        env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO / "src"))
        self.log = work / f"server-{self.port}.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "rlft.cli", "vllm-serve", str(config)], stdout=out,
                                            stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def memory_mib(self) -> dict[str, float]:
        fields = {}
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmHWM", "VmRSS"):
                    fields[key] = int(value.split()[0]) / 1024
        return fields

    def reset_peak(self) -> None:
        with open(f"/proc/{self.process.pid}/clear_refs", "w") as refs:
            refs.write("5")  # the peak resident set starts again from now

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(30)


def measure(size: str, work: Path, repeats: int) -> dict:
    import copy

    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from rlft.models.weights import weights_checksum
    from rlft.rollout.remote import RemoteEngine
    from rlft.rollout.weight_group import specs_of
    from rlft.train.weight_sync import plain_weights

    folder = build(work / f"model-{size}", size)
    model = AutoModelForCausalLM.from_pretrained(folder)
    weights = dict(model.state_dict())
    model_mib = sum(t.numel() * t.element_size() for t in {t.data_ptr(): t for t in weights.values()}.values()) / 2**20
    server = Server(folder, work)
    result: dict = {"size": size, "parameters": sum(p.numel() for p in model.parameters()), "model_mib": round(model_mib, 1)}
    try:
        engine = RemoteEngine("127.0.0.1", server.port, timeout=3600)
        engine.wait_until_ready(600)
        engine.load_weights(weights, 1)  # every page of the served model resident, as after any first push
        result["idle_mib"] = round(server.memory_mib()["VmRSS"], 1)
        version = [1]

        def timed(way: str, sync) -> None:
            server.reset_peak()
            times = []
            for _ in range(repeats):
                version[0] += 1
                began = time.perf_counter()
                sync(version[0])
                times.append(time.perf_counter() - began)
            result[way] = {"seconds": round(statistics.median(times), 3), "all": [round(t, 3) for t in times],
                           "server_peak_mib": round(server.memory_mib()["VmHWM"], 1)}
            print(f"{size:>5} {way:<13} {result[way]['seconds']:7.2f} s   server peak {result[way]['server_peak_mib']:8.0f} MiB "
                  f"(model {model_mib:.0f} MiB)", flush=True)

        timed("http", lambda v: engine.load_weights(weights, v))
        engine.open_group(free_port(), specs_of(engine.wire_tensors(weights)))
        timed("group", lambda v: engine.load_weights(weights, v))
        if result["parameters"] > 1e9:  # a copy in shared memory beside both processes' would not fit in 24 GiB
            engine.close()
            return result
        shared = Path(tempfile.mkdtemp(dir="/dev/shm" if Path("/dev/shm").is_dir() else None, prefix="rlft-bench-"))

        def by_path(v: int) -> None:
            tensors = engine.wire_tensors(weights)
            stored, seen = {}, set()
            for name, tensor in tensors.items():  # safetensors writes each storage under one name only
                stored[name] = tensor.clone() if tensor.data_ptr() in seen else tensor
                seen.add(tensor.data_ptr())
            save_file(stored, str(shared / "model.safetensors"))
            engine.load_weights_from_path(shared, v, weights_checksum(tensors))
        timed("path", by_path)
        (shared / "model.safetensors").unlink()
        policy = get_peft_model(copy.deepcopy(model), LoraConfig(r=16, lora_alpha=32, target_modules="all-linear",
                                                                init_lora_weights=False))

        def adapter(v: int) -> None:
            out = shared / f"v{v}"
            policy.save_pretrained(out, safe_serialization=True)
            engine.load_adapter(out, v)
        timed("lora", adapter)
        merged = plain_weights(policy)
        result["merged_mib"] = round(sum(t.numel() * t.element_size() for t in merged.values()) / 2**20, 1)
        engine.load_weights(weights, version[0] + 1)  # a full update drops the adapter
        version[0] += 1
        timed("merged-group", lambda v: engine.load_weights(merged, v))
        group, engine.group = engine.group, None
        timed("merged-http", lambda v: engine.load_weights(merged, v))
        engine.group = group
        engine.close()
    finally:
        server.stop()
    return result


def versions() -> dict[str, str]:
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    sizes = [r["model_mib"] / 1024 for r in results]
    for way, style in (("http", "o-"), ("group", "s-"), ("path", "^-"), ("lora", "d--"), ("merged-http", "v:"),
                       ("merged-group", "x:")):
        points = [(size, r[way]["seconds"]) for size, r in zip(sizes, results) if way in r]
        left.plot(*zip(*points), style, label=way)
    left.set(xlabel="full model, GiB (fp32)", ylabel="seconds per sync", title="weight sync time", xscale="log",
             yscale="log")
    left.legend(fontsize=8)
    for way, style in (("http", "o-"), ("group", "s-"), ("path", "^-")):
        points = [(size, r[way]["server_peak_mib"] / r["model_mib"]) for size, r in zip(sizes, results) if way in r]
        right.plot(*zip(*points), style, label=way)
    right.plot(sizes, [r["idle_mib"] / r["model_mib"] for r in results], "k--", label="idle (model loaded)")
    right.set(xlabel="full model, GiB (fp32)", ylabel="server peak memory / model size", xscale="log",
              title="rollout server peak memory")
    right.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["M", "L", "358M", "0.5B"], choices=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "rlft-bench-weight-sync")
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args()
    out = RESULTS / "weight_sync.json"
    if not args.plot_only:
        quiet()
        import torch

        torch.set_num_threads(1)
        args.work.mkdir(parents=True, exist_ok=True)
        load = os.getloadavg()[0]
        results = [measure(size, args.work, args.repeats) for size in args.sizes]
        out.write_text(json.dumps({"command": " ".join(sys.argv), "machine": device_name(), "versions": versions(),
                                   "load_average": [round(load, 2), round(os.getloadavg()[0], 2)],
                                   "threads": {"trainer": 1, "server": 1}, "repeats": args.repeats, "results": results},
                                  indent=1) + "\n")
    plot(json.loads(out.read_text())["results"], RESULTS / "weight_sync.png")
    print(f"wrote {out} and {RESULTS / 'weight_sync.png'}")


if __name__ == "__main__":
    main()
