"""Run each RL config of a folder (e.g. Axolotl's `examples/`) through `rlft train` on a tiny local model.

    PYTHONPATH=src .venv/bin/python docs/train_axolotl_rl_examples.py path/to/axolotl/examples [--steps 2]

For every YAML file with an `rl:` key, the config is kept as written except for what cannot come from the
internet here: `base_model` becomes a tiny random Llama (the byte tokenizer), each dataset `path` becomes a
local JSONL file of a few rows in the shape its `type` reads, `max_steps` is capped and `output_dir` is a
temporary folder. The config's folder is the working directory, so its Python modules (reward functions,
dataset transforms) import as in Axolotl; a module named by the config that is not there (`rwd` of the
GRPO/GDPO docs) is written with the functions the config names.

Each config is run twice:
  as written  -> trains, or is refused by `rlft train` with its reason (e.g. bitsandbytes on a CPU);
  on a CPU    -> the same, with what a CPU cannot run switched off (4/8-bit loading, bitsandbytes
                 optimizers, vLLM, flash-attention, hosted trackers, bf16) so that the rest of the config is exercised.
A traceback in either run is a failure of rlft. Prints one line per config and run; exits 1 on a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import yaml
from transformers import AutoConfig, LlamaForCausalLM

from rlft.models.tiny import write_tiny_model

CODE = "def add(a, b):\n    return a + b\n"
TURN = [{"role": "user", "content": "Write add."}]


def rows_for(dataset: dict, rl: str) -> list[dict]:
    """A few rows in the shape `dataset["type"]` reads (the fields of the dataset its config names)."""
    kind = str(dataset.get("type") or "")
    answer = {"role": "assistant", "content": CODE}
    bad = {"role": "assistant", "content": "no"}
    if kind.startswith("chat_template.") and rl == "orpo":
        return [{dataset.get("field_chosen", "chosen"): TURN + [answer],
                 dataset.get("field_rejected", "rejected"): TURN + [bad]}] * 200
    if kind.startswith("chat_template."):
        return [{dataset.get("field_messages", "messages"): TURN, dataset.get("field_chosen", "chosen"): answer,
                 dataset.get("field_rejected", "rejected"): bad}] * 200
    if kind.endswith(".ultra") and rl == "kto":
        return [{"prompt": "Write add.", "completion": CODE, "label": i % 2 == 0} for i in range(200)]
    if kind.endswith(".ultra"):
        return [{"prompt": "Write add.", "chosen": TURN + [answer], "rejected": TURN + [bad]}] * 200
    if kind.startswith("ebft_pretrain"):
        return [{"text": CODE * 4, "question": "", "answer": ""}] * 200
    if kind.startswith("ebft_"):
        return [{"input": "Write add.", "output": CODE}] * 200
    if kind.startswith("rwd."):  # gsm8k's columns
        return [{"question": f"What is {i} + 2?", "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"} for i in range(200)]
    raise SystemExit(f"no row shape for dataset type {kind!r}: add one to rows_for()")


RWD = '''"""The user module of Axolotl's GRPO docs, as a user writes it (gsm8k prompts, format and answer rewards)."""
import re


def gsm8k_transform(cfg, *args, **kwargs):
    def transform_fn(example, tokenizer=None):
        return {"prompt": [{"role": "user", "content": example["question"]}],
                "answer": example["answer"].split("####")[-1].strip()}
    return transform_fn, {"remove_columns": ["question"]}


def format_reward(completions, **kwargs):
    return [1.0 if re.search(r"\\d", c[0]["content"]) else 0.0 for c in completions]


def correctness_reward(completions, answer, **kwargs):
    return [1.0 if a in c[0]["content"] else 0.0 for c, a in zip(completions, answer)]
'''


def cpu_only(cfg: dict) -> dict:
    """What a user on a CPU would switch off; everything else stays as written."""
    cfg = dict(cfg, load_in_4bit=False, load_in_8bit=False, bf16=False, use_swanlab=False, wandb_project=None)
    if cfg.get("adapter") == "qlora":
        cfg["adapter"] = "lora"
    if "bnb" in str(cfg.get("optimizer")) or "8bit" in str(cfg.get("optimizer")):
        cfg["optimizer"] = "adamw_torch"
    if cfg.get("trl"):
        cfg["trl"] = dict(cfg["trl"], use_vllm=False)
        cfg["trl"].pop("async_prefetch", None)
    cfg["use_wandb"] = False
    for key in ("use_vllm", "vllm", "fsdp_config", "fsdp_version", "deepspeed", "flash_attention"):
        cfg.pop(key, None)
    if str(cfg.get("attn_implementation", "")).startswith("flash"):
        cfg.pop("attn_implementation")
    return cfg


def run(cfg: dict, folder: Path, work: Path, env: dict) -> tuple[str, str]:
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    proc = subprocess.run([sys.executable, "-m", "rlft.cli", "train", str(path)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=900)
    text = proc.stdout + proc.stderr
    if "Traceback (most recent call last)" in text:
        return "TRACEBACK", text[-3000:]
    if proc.returncode == 0:
        losses = [json.loads(line).get("loss") for line in (Path(cfg["output_dir"]) / "metrics.jsonl").open()
                  if '"loss"' in line]
        return "trained", f"{len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}"
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if line.startswith("error:")), max(0, len(lines) - 3))
    return "refused", " | ".join(lines[start:start + 4])[:400]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        tiny = write_tiny_model(Path(tmp) / "tiny", "XS", max_positions=8192)
        torch.manual_seed(0)
        LlamaForCausalLM(AutoConfig.from_pretrained(tiny)).save_pretrained(tiny)  # weights, as a hub model has
        for source in sorted(Path(args.folder).rglob("*.y*ml")):
            cfg = yaml.safe_load(source.read_text())
            if not isinstance(cfg, dict) or not cfg.get("rl"):
                continue
            work = Path(tmp) / source.stem
            folder = work / "cwd"
            shutil.copytree(source.parent, folder, ignore=shutil.ignore_patterns("*.y*ml", "*.md", "*.ipynb"))
            if any(str(d.get("type", "")).startswith("rwd.") for d in cfg.get("datasets") or []):
                (folder / "rwd.py").write_text(RWD)
            cfg.update(base_model=str(tiny), output_dir=str(work / "out"), max_steps=args.steps, num_epochs=1,
                       save_steps=None, eval_steps=None, val_set_size=0)
            cfg.pop("base_model_config", None)
            cfg.pop("tokenizer_config", None)
            for i, dataset in enumerate(cfg.get("datasets") or []):
                data = work / f"data{i}.jsonl"
                data.write_text("".join(json.dumps(row) + "\n" for row in rows_for(dataset, cfg["rl"])))
                dataset.update(path=str(data), ds_type="json")
                dataset.pop("name", None)
            for label, variant in (("as written", cfg), ("on a CPU", cpu_only(cfg))):
                shutil.rmtree(work / "out", ignore_errors=True)
                outcome, detail = run(variant, folder, work, env)
                failures += outcome == "TRACEBACK"
                print(f"{source.relative_to(args.folder)} [{label}]: {outcome}: {detail}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
