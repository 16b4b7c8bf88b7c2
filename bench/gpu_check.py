"""What only a GPU can show, each run through the real `rlft train` command:

  strided  strided EBFT with flex_attention (the strided rule as a BlockMask) against SDPA with the identical dense
           mask: the same losses in fp32, then median step time, generation time and peak GPU memory in bf16.
  shapes   what a batch width never seen before costs (cuDNN attention plans, allocator growth), and what rounding
           widths up to a multiple of 64 saves (pad_to_multiple_of).
  flex_generation  where strided generation's time goes under flex_attention: BlockMask creation and the forward.
  liger    SFT with Liger Kernel's RoPE, RMSNorm, SwiGLU and fused linear cross-entropy against rlft's own layers and
           chunked loss: the same losses in fp32, then median step time, tokens/s and peak GPU memory in bf16.
  sharing  share_prompts on a GPU (SDPA with a mask runs the memory-efficient kernel): DPO pairs with long prompts and a
           32768-entry output layer, each prompt once against twice: the same losses in fp32, then median step time and
           peak GPU memory in bf16.
  flatten  batch_flattening on a GPU without the flash-attn package (rlft.models.varlen): SFT on rows of 64-640 tokens
           with a 32768-entry output layer, flattened against padded: the same losses in fp32, then median step time
           and peak GPU memory in bf16, flattened through PyTorch's varlen flash-attention and through SDPA per length.
           Each run records how many layer calls took the flash path.
  examples the shipped GRPO and structured-EBFT examples, 4 steps each in bf16 (their micro-batches hold left-padded
           prompts; on an H200 they once stopped at step 1 with a NaN gradient norm): whether every step's loss and
           gradient norm are finite. Needs the quickstart's checkpoint (outputs/quickstart/checkpoint-600/model).
  offload  activation_offloading: SFT with gradient checkpointing on rows of 1,016 tokens, each checkpointed layer's
           input on the GPU or in host memory: the same losses in fp32, then median step time and peak GPU memory in bf16.
  varlen   per-document attention (rlft.models.varlen): PyTorch's variable-length flash-attention against the documents
           grouped by length through SDPA, bf16, outputs and gradients against float32, forward+backward time.

Models are built from a config (rlft.models.tiny size L: hidden 1024, 8 layers; the byte tokenizer, with a 32768-entry
output layer for the SFT runs as a real tokenizer has), seeded, saved once; data is made here (sums, "12+34=46").
Each run is an `rlft train` process of its own: precision is set per process (accelerate), and Liger patches the model
classes of the process it runs in.

Usage (a CUDA GPU; from the repository root):
  python bench/gpu_check.py [--steps 12] [--only shapes flex_generation strided liger sharing flatten examples varlen offload]
                            [--out PATH]
Results: bench/results/gpu_check-<GPU>.json (bench/results/gpu_check-H200.json: two invocations, named in it).
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("TQDM_DISABLE", "1")

import argparse
import datetime
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, device_name, make_model, quiet  # noqa: E402
from rlft.train.metrics import clock  # noqa: E402  (perf_counter once queued GPU work is done)

SEQUENCE_LEN = 512
RUN_TIMEOUT_S = 300


def documents(count: int, length: int, seed: int) -> list[dict]:
    """Raw-text rows of solved sums, about `length` characters (= byte tokens) each."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        parts = []
        while sum(map(len, parts)) < length:
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            parts.append(f"{a}+{b}={a + b}\n")
        rows.append({"text": "".join(parts)[:length]})
    return rows


def write_rows(rows: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# Counts the calls of rlft.models.varlen's flash-attention path in an `rlft train` process (written at exit), so a
# result says which path the run took; with FLASH_OFF the path is switched off (the SDPA-per-length path runs).
PROBE = """
import atexit
from rlft.models import varlen
calls, real = [0], varlen.flash_documents
def counted(*args, **kwargs):
    calls[0] += 1
    return real(*args, **kwargs)
varlen.flash_documents = counted
if {off}:
    varlen.flash_dtype = lambda *args: None
atexit.register(lambda: open({path!r}, "w").write(str(calls[0])))
"""


def run(settings: dict, out: Path, flash_off: bool = False) -> dict:
    """One `rlft train` process (precision and Liger's patches are per process); its per-step records from
    metrics.jsonl, the wall time of the command and how many layer calls took the flash-attention varlen path."""
    out.mkdir(parents=True, exist_ok=True)
    config = out / "config.yaml"  # JSON is YAML
    config.write_text(json.dumps({**settings, "output_dir": str(out / "run")}))
    probe = PROBE.format(off=flash_off, path=str(out / "flash_calls"))
    command = [sys.executable, "-c", probe + "from rlft.cli import run_command; run_command()", "train", str(config)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"rlft train {config} exited with {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    records = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {"wall_s": round(wall, 2), "steps": [r for r in records if "step_time_s" in r],
            "flash_varlen_calls": int((out / "flash_calls").read_text())}


def summary(result: dict, skip: int) -> dict:
    """Medians over the steps after the first `skip` (compilation, autotuning), and the run's peak GPU memory."""
    steps = result["steps"][skip:] or result["steps"]
    median = lambda key: round(statistics.median(s.get(key, 0.0) for s in steps), 5)  # noqa: E731
    return {"median_step_s": median("step_time_s"), "median_tokens_per_s": median("tokens_per_s"),
            "median_generate_s": median("time/generate"), "median_reward_s": median("time/reward"),
            "median_forward_backward_s": median("time/forward_backward"), "median_mfu": median("mfu"),
            "peak_memory_mb": max(s["peak_memory_mb"] for s in result["steps"]), "first_step_s": result["steps"][0]["step_time_s"],
            "losses": [s["loss"] for s in result["steps"]], "wall_s": result["wall_s"],
            "flash_varlen_calls": result["flash_varlen_calls"]}


def strided_check(tmp: Path, args) -> dict:
    model = make_model(tmp / "model-strided", args.size, args.seed)
    data = write_rows(documents(256, SEQUENCE_LEN - 8, args.seed), tmp / "documents.jsonl")
    base = {"base_model": str(model), "rl": "ebft", "datasets": [{"path": str(data)}], "sequence_len": SEQUENCE_LEN,
            "ebft": {"mode": "strided", "stride": 8, "context_length": 8, "generate_max_len": 8, "n_samples_per_prompt": 4,
                     "temperature": 0.6, "feature_layers": [0.5, 1.0], "embed_method": "last_token", "use_whitening": True,
                     "rl_coef": 1.0, "ce_coef": 0.03, "advantage_estimator": "rloo"},
            "micro_batch_size": 4, "learning_rate": 1e-5, "lr_scheduler": "constant", "logging_steps": 1, "seed": args.seed,
            "save_steps": 10_000}
    report = {}
    for precision, steps in (("fp32", 3), ("bf16", args.steps)):
        for attention in ("flex", "sdpa"):
            settings = {**base, "max_steps": steps, "bf16": precision == "bf16", "flex_attention": attention == "flex"}
            result = summary(run(settings, tmp / f"strided-{precision}-{attention}"), skip=2)
            report[f"{precision}_{attention}"] = result
            print(f"strided {precision} {attention}: median step {result['median_step_s'] * 1e3:.1f} ms, generate "
                  f"{result['median_generate_s'] * 1e3:.1f} ms, peak {result['peak_memory_mb']:.0f} MiB, first step "
                  f"{result['first_step_s']:.1f} s, losses {result['losses'][:3]}", flush=True)
    fp32 = [abs(a - b) for a, b in zip(report["fp32_flex"]["losses"], report["fp32_sdpa"]["losses"])]
    report["fp32_max_loss_difference"] = max(fp32)
    report["bf16_speedup_flex_over_sdpa"] = round(report["bf16_sdpa"]["median_step_s"] / report["bf16_flex"]["median_step_s"], 3)
    report["tokens"] = {"sequence_len": SEQUENCE_LEN, "rows": 16, "blocks": (SEQUENCE_LEN - 8 - 8) // 8 + 1,
                        "strided_sequence_columns": SEQUENCE_LEN + ((SEQUENCE_LEN - 8 - 8) // 8 + 1) * 8}
    return report


def liger_check(tmp: Path, args) -> dict:
    import importlib.metadata

    model = make_model(tmp / "model-sft", args.size, args.seed, vocab=32768)
    rows = [{"prompt": row["text"][:40], "completion": row["text"][40:]} for row in documents(512, 1000, args.seed + 1)]
    data = write_rows(rows, tmp / "sft.jsonl")
    base = {"base_model": str(model), "datasets": [{"path": str(data)}], "sequence_len": 1024, "train_on_inputs": True,
            "micro_batch_size": 8, "learning_rate": 1e-4, "lr_scheduler": "constant", "logging_steps": 1, "seed": args.seed,
            "save_steps": 10_000}
    kernels = {"liger_rope": True, "liger_rms_norm": True, "liger_glu_activation": True, "liger_fused_linear_cross_entropy": True}
    report = {"liger_kernel": importlib.metadata.version("liger-kernel") if torch.cuda.is_available() else None}
    for kernel in ("rlft", "liger"):
        for precision, steps in (("fp32", 3), ("bf16", args.steps)):
            on = kernel == "liger" and torch.cuda.is_available()  # a CPU rehearsal (--size XS) runs the plumbing only
            settings = {**base, "max_steps": steps, "bf16": precision == "bf16", **(kernels if on else {})}
            result = summary(run(settings, tmp / f"sft-{kernel}-{precision}"), skip=2)
            report[f"{precision}_{kernel}"] = result
            print(f"sft {precision} {kernel}: median step {result['median_step_s'] * 1e3:.1f} ms, "
                  f"{result['median_tokens_per_s']:,.0f} tokens/s, MFU {result['median_mfu']:.3f}, peak "
                  f"{result['peak_memory_mb']:.0f} MiB, losses {result['losses'][:3]}", flush=True)
    report["fp32_max_loss_difference"] = max(abs(a - b) for a, b in zip(report["fp32_rlft"]["losses"], report["fp32_liger"]["losses"]))
    report["bf16_speedup_liger_over_rlft"] = round(report["bf16_rlft"]["median_step_s"] / report["bf16_liger"]["median_step_s"], 3)
    return report


def offload_check(tmp: Path, args) -> dict:
    """activation_offloading: SFT with gradient checkpointing on rows of 1,016 tokens (micro batch 32, a 32768-entry output
    layer), each checkpointed layer's input kept on the GPU or in host memory: the same losses in fp32, then median
    step time, tokens/s and peak GPU memory in bf16."""
    model = make_model(tmp / "model-offload", args.size, args.seed, vocab=32768)
    data = write_rows(documents(192, 1016, args.seed + 2), tmp / "long.jsonl")
    base = {"base_model": str(model), "datasets": [{"path": str(data), "type": "completion"}], "sequence_len": 1024,
            "micro_batch_size": 32, "gradient_checkpointing": True, "learning_rate": 1e-4, "lr_scheduler": "constant",
            "logging_steps": 1, "seed": args.seed, "save_steps": 10_000}
    report = {}
    for precision, steps in (("fp32", 3), ("bf16", args.steps)):
        for offload in (False, True):
            settings = {**base, "max_steps": steps, "bf16": precision == "bf16", "activation_offloading": offload}
            result = summary(run(settings, tmp / f"offload-{precision}-{offload}"), skip=2)
            report[f"{precision}_{'offloaded' if offload else 'kept'}"] = result
            print(f"offload {precision} {offload}: median step {result['median_step_s'] * 1e3:.1f} ms, "
                  f"{result['median_tokens_per_s']:,.0f} tokens/s, peak {result['peak_memory_mb']:.0f} MiB, "
                  f"losses {result['losses'][:3]}", flush=True)
    report["fp32_max_loss_difference"] = max(abs(a - b) for a, b in zip(report["fp32_kept"]["losses"],
                                                                         report["fp32_offloaded"]["losses"]))
    report["bf16_peak_saved_mb"] = round(report["bf16_kept"]["peak_memory_mb"] - report["bf16_offloaded"]["peak_memory_mb"], 1)
    report["bf16_step_ratio_offloaded_over_kept"] = round(report["bf16_offloaded"]["median_step_s"]
                                                          / report["bf16_kept"]["median_step_s"], 3)
    return report


def timed(function, *args) -> float:
    start = clock()
    function(*args)
    return clock() - start


def shapes_check(tmp: Path, args) -> dict:
    """What a batch width never seen before costs on a GPU: bf16 SFT steps (micro batch 8, 32768 vocabulary, padded
    rows) over 24 distinct widths, with cuDNN's SDPA backend off and on, the same widths again, and new widths rounded
    up to a multiple of 64 (pad_to_multiple_of). Runs first, on a fresh allocator."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(make_model(tmp / "model-shapes", args.size, args.seed, vocab=32768)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    rng = random.Random(args.seed)

    def step(width: int) -> None:
        ids = torch.randint(0, 256, (8, width), device="cuda")
        lengths = torch.tensor([width] + [rng.randint(width // 2, width) for _ in range(7)], device="cuda")
        mask = (torch.arange(width, device="cuda")[None] < lengths[:, None]).long()
        with torch.autocast("cuda", torch.bfloat16):
            loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100), use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    pool = rng.sample(range(64, 641), 72)
    report = {"cudnn_sdp_enabled_by_default": torch.backends.cuda.cudnn_sdp_enabled()}
    torch.backends.cuda.enable_cudnn_sdp(False)
    report["new_widths_cudnn_off_ms"] = [round(timed(step, w) * 1e3, 1) for w in pool[:24]]
    torch.backends.cuda.enable_cudnn_sdp(True)
    report["new_widths_cudnn_on_ms"] = [round(timed(step, w) * 1e3, 1) for w in pool[24:48]]
    report["same_widths_again_ms"] = [round(timed(step, w) * 1e3, 1) for w in pool[24:48]]
    report["new_widths_rounded_to_64_ms"] = [round(timed(step, -(-w // 64) * 64) * 1e3, 1) for w in pool[48:]]
    for key in [k for k in report if k.endswith("_ms")]:
        report[key.replace("_ms", "_median_ms")] = round(statistics.median(report[key]), 1)
        print(f"shapes {key}: median {report[key.replace('_ms', '_median_ms')]} ms, {report[key][:8]}", flush=True)
    return report


def varlen_check(tmp: Path, args) -> dict:
    """rlft.models.varlen's two per-document paths on the same flattened batch (8 documents of 64-640 tokens, 16 query
    and 8 key/value heads of 64) under bf16 autocast, as training runs them: PyTorch's variable-length flash-attention
    against the documents grouped by length through SDPA. Outputs and gradients against float32 attention of the same
    bf16-rounded inputs, and the median forward+backward time, for full attention and a sliding window of 128."""
    from types import SimpleNamespace
    from unittest import mock

    from rlft.models import varlen

    rng = torch.Generator().manual_seed(args.seed)
    lengths = torch.randint(64, 641, (8,), generator=rng)
    total, device = int(lengths.sum()), "cuda" if torch.cuda.is_available() else "cpu"  # a CPU rehearses the grouped path
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True)
    base = [torch.randn(1, heads, total, 64, generator=rng).bfloat16().float().to(device) for heads in (16, 8, 8)]
    bounds = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(device)
    report = {"document_lengths": lengths.tolist()}
    for window in (None, 128):

        flash_calls = []  # which path ran: the flash case must take flash-attention (a CPU has none)
        counted = lambda *a, real=varlen.flash_documents: flash_calls.append(1) or real(*a)  # noqa: E731

        def attend(flash: bool | None):  # None: float32 without autocast, the reference
            inputs = [x.clone().requires_grad_() for x in base]
            choose = varlen.flash_dtype if flash else (lambda *a: None)
            with mock.patch.object(varlen, "flash_dtype", choose), mock.patch.object(varlen, "flash_documents", counted), \
                    torch.autocast(device, torch.bfloat16, enabled=flash is not None):
                out, _ = varlen.documents_attention(module, *inputs, None, scaling=0.125, rlft_documents=bounds, sliding_window=window)
            return out, inputs

        def step(flash: bool) -> None:
            out, _ = attend(flash)
            out.float().square().sum().backward()

        reference, reference_inputs = attend(None)
        reference.square().sum().backward()
        case = {}
        for name, flash in (("flash_varlen", True), ("sdpa_grouped", False)):
            flash_calls.clear()
            out, inputs = attend(flash)
            ran = "flash_varlen" if flash_calls else "sdpa_grouped"
            assert out.dtype == torch.bfloat16
            out.float().square().sum().backward()
            errors = [float((a.grad - b.grad).abs().max() / b.grad.abs().max()) for a, b in zip(inputs, reference_inputs)]
            step(flash)
            times = [timed(step, flash) for _ in range(20)]
            case[name] = {"path_taken": ran, "output_error": float((out.detach().float() - reference.detach()).abs().max() / reference.abs().max()),
                          "gradient_errors_q_k_v": [round(e, 5) for e in errors],
                          "median_forward_backward_ms": round(statistics.median(times) * 1e3, 3)}
            print(f"varlen window {window} {name}: {case[name]}", flush=True)
        report[f"window_{window}"] = case
    return report


def flex_generation_check(tmp: Path, args) -> dict:
    """Where strided generation's time goes with flex_attention: the BlockMask's creation (eager, and compiled) and
    the model's forward over all T columns, against SDPA with the dense mask (bf16, no grad)."""
    from transformers import LlamaForCausalLM

    from rlft.rollout.strided import flex_block_mask, generate_blocks, strided_attention, strided_layout

    folder = make_model(tmp / "model-flexgen", args.size, args.seed)
    models = {name: LlamaForCausalLM.from_pretrained(folder, attn_implementation=name).cuda().eval()
              for name in ("sdpa", "flex_attention")}
    docs, length = 4, SEQUENCE_LEN
    doc_ids = torch.randint(3, 256, (docs, length), device="cuda")
    doc_attention = torch.ones(docs, length, dtype=torch.long, device="cuda")
    layout = strided_layout(doc_attention.sum(-1), length, stride=8, context_length=8, generate_max_len=8)
    dense, positions = strided_attention(layout, doc_attention)
    dense, positions = dense.repeat_interleave(4, 0), positions.repeat_interleave(4, 0)
    ids = torch.randint(3, 256, (docs * 4, layout.total_len), device="cuda")
    report = {"columns": layout.total_len, "rows": docs * 4}
    from torch.nn.attention.flex_attention import create_block_mask

    from rlft.rollout.strided import strided_mask_mod

    def block_mask_compiled():
        return create_block_mask(strided_mask_mod(layout, doc_attention, 4), B=docs * 4, H=None, Q_LEN=layout.total_len,
                                 KV_LEN=layout.total_len, device="cuda", _compile=True)

    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        for name, function in (("block_mask_eager_ms", lambda: flex_block_mask(layout, doc_attention, 4)),
                               ("block_mask_compiled_ms", block_mask_compiled)):
            function()
            report[name] = round(statistics.median(timed(function) for _ in range(5)) * 1e3, 2)
        mask = flex_block_mask(layout, doc_attention, 4)
        forwards = {"forward_sdpa_ms": lambda: models["sdpa"](input_ids=ids, attention_mask=dense, position_ids=positions),
                    "forward_flex_ms": lambda: models["flex_attention"](input_ids=ids, attention_mask=mask, position_ids=positions)}
        for name, function in forwards.items():
            function()
            function()
            report[name] = round(statistics.median(timed(function) for _ in range(5)) * 1e3, 2)
        for name, model in models.items():
            generate = lambda: generate_blocks(model, doc_ids, doc_attention, layout, num_samples=4, temperature=0.6)  # noqa: E731
            generate()
            report[f"generate_{name}_ms"] = round(statistics.median(timed(generate) for _ in range(3)) * 1e3, 1)
    print(f"flex generation: {report}", flush=True)
    return report


EXAMPLES = {"grpo": "examples/grpo-arithmetic.yaml", "ebft_structured": "examples/ebft-structured.yaml"}


def sharing_check(tmp: Path, args) -> dict:
    from rlft.tasks.addition import preference_rows, split_rows
    from common import long_rows

    model = make_model(tmp / "model-sharing", args.size, args.seed, vocab=32768)
    rows = [{**row, "prompt": lead["prompt"].rsplit("; ", 1)[0] + "; " + row["prompt"]}  # bench/preference.py --long
            for row, lead in zip(preference_rows(split_rows()[0][:512]), long_rows(512, args.seed))]
    data = write_rows(rows, tmp / "pairs.jsonl")
    base = {"base_model": str(model), "rl": "dpo", "datasets": [{"path": str(data)}], "sequence_len": 1024,
            "micro_batch_size": 8, "learning_rate": 1e-5, "lr_scheduler": "constant", "logging_steps": 1, "seed": args.seed,
            "save_steps": 10_000}
    return paired_runs(tmp, args, base, "share_prompts", {True: "once", False: "twice"}, "dpo prompt")


def paired_runs(tmp: Path, args, base: dict, key: str, labels: dict, what: str) -> dict:
    """`base` with `key` at each of the two values of `labels` (value -> name): 3 fp32 steps (the same losses?), then
    `args.steps` bf16 steps (median step time, peak memory)."""
    report = {}
    for precision, steps in (("fp32", 3), ("bf16", args.steps)):
        for value, label in labels.items():
            settings = {**base, "max_steps": steps, "bf16": precision == "bf16", key: value}
            result = summary(run(settings, tmp / f"{key}-{precision}-{label}"), skip=2)
            report[f"{precision}_{label}"] = result
            print(f"{what} {precision} {label}: median step {result['median_step_s'] * 1e3:.1f} ms, "
                  f"peak {result['peak_memory_mb']:.0f} MiB, losses {result['losses'][:3]}", flush=True)
    first, second = labels.values()
    report["fp32_max_loss_difference"] = max(abs(a - b) for a, b in zip(report[f"fp32_{first}"]["losses"],
                                                                         report[f"fp32_{second}"]["losses"]))
    report[f"bf16_speedup_{first}_over_{second}"] = round(report[f"bf16_{second}"]["median_step_s"]
                                                          / report[f"bf16_{first}"]["median_step_s"], 3)
    return report


def flatten_check(tmp: Path, args) -> dict:
    from common import long_rows

    model = make_model(tmp / "model-flatten", args.size, args.seed, vocab=32768)
    data = write_rows(long_rows(512, args.seed), tmp / "long.jsonl")
    base = {"base_model": str(model), "datasets": [{"path": str(data)}], "sequence_len": 1024, "micro_batch_size": 8,
            "learning_rate": 1e-5, "lr_scheduler": "constant", "logging_steps": 1, "seed": args.seed, "save_steps": 10_000}
    report = paired_runs(tmp, args, base, "batch_flattening", {True: "flat", False: "padded"}, "sft")
    # the flattened bf16 run again with the flash-attention varlen path switched off: SDPA once per group of equal lengths
    settings = {**base, "max_steps": args.steps, "bf16": True, "batch_flattening": True}
    report["bf16_flat_sdpa_grouped"] = result = summary(run(settings, tmp / "flatten-bf16-grouped", flash_off=True), skip=2)
    print(f"sft bf16 flat, SDPA per length: median step {result['median_step_s'] * 1e3:.1f} ms, "
          f"peak {result['peak_memory_mb']:.0f} MiB, losses {result['losses'][:3]}", flush=True)
    report["bf16_speedup_flat_over_flat_sdpa_grouped"] = round(result["median_step_s"] / report["bf16_flat"]["median_step_s"], 3)
    return report


def examples_check(tmp: Path, args) -> dict:
    """Each example through `rlft train` from the repository root, 4 steps (bf16 on a GPU: the default `bf16: auto`);
    a run that fails is reported, not raised, with the end of its output."""
    root = Path(__file__).resolve().parents[1]
    if not (root / "outputs/quickstart/checkpoint-600/model").is_dir():
        raise RuntimeError("the examples start from the quickstart's checkpoint: run `rlft quickstart` first")
    report = {}
    for name, path in EXAMPLES.items():
        out = tmp / f"example-{name}"
        command = [sys.executable, "-c", "from rlft.cli import run_command; run_command()", "train", path, "--max_steps=4", "--logging_steps=1",
                   f"--output_dir={out}"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=root)
        metrics = out / "metrics.jsonl"
        steps = [json.loads(line) for line in metrics.read_text().splitlines() if "step_time_s" in line] if metrics.exists() else []
        values = [(s.get("loss"), s.get("grad_norm")) for s in steps]
        report[name] = {"exit_code": done.returncode, "steps": len(steps), "loss_grad_norm": values,
                        "all_finite": bool(steps) and all(v is not None and v == v and abs(v) != float("inf") for pair in values for v in pair),
                        "output_tail": None if done.returncode == 0 else (done.stdout + done.stderr)[-1500:]}
        print(f"example {name}: exit {done.returncode}, {len(steps)} steps, (loss, grad norm) {values}", flush=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=12, help="bf16 steps per run (the first two are not timed)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="+", choices=["shapes", "flex_generation", "strided", "liger", "sharing", "flatten", "examples", "varlen",
                                                 "offload"],
                        default=None)
    parser.add_argument("--size", default="L", help="model size (rlft.models.tiny.SIZES); XS rehearses the script on a CPU")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results/gpu_check-<GPU>.json)")
    args = parser.parse_args()
    if not torch.cuda.is_available() and args.size != "XS":
        raise SystemExit("bench/gpu_check.py needs a CUDA GPU (--size XS rehearses it on a CPU)")
    quiet()
    args.out = args.out or RESULTS / f"gpu_check-{device_name().split()[-1]}.json"
    report = {"benchmark": "gpu_check", "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "machine": device_name(), "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                                                     "cuda": torch.version.cuda}}
    with tempfile.TemporaryDirectory(prefix="rlft-gpu-") as tmp:
        for name, check in (("shapes", shapes_check), ("flex_generation", flex_generation_check), ("strided", strided_check),
                            ("liger", liger_check), ("sharing", sharing_check), ("flatten", flatten_check),
                            ("examples", examples_check), ("varlen", varlen_check), ("offload", offload_check)):
            if args.only and name not in args.only:
                continue
            started = time.perf_counter()
            try:
                report[name] = check(Path(tmp), args)
            except Exception as exc:  # one check failing must not lose the others' numbers
                traceback.print_exc()
                report[name] = {"error": f"{type(exc).__name__}: {exc}"}
            report[name]["check_s"] = round(time.perf_counter() - started, 1)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items()}, indent=1)[:4000])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
