"""What every benchmark shares: the tiny model, the training settings both tools get, quiet logging."""

from __future__ import annotations

import os
import statistics
import warnings
from pathlib import Path

import torch
from transformers import AutoConfig, LlamaForCausalLM

from rlft.models.tiny import write_tiny_model

RESULTS = Path(__file__).resolve().parent / "results"


def quiet() -> None:
    """No warnings or progress bars in benchmark output."""
    import datasets
    import transformers

    if not torch.cuda.is_available():  # DeepSpeed, imported by transformers when installed, would warn
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()


def median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else 0.0


def make_model(folder: Path, size: str, seed: int) -> Path:
    """Config + byte tokenizer from rlft.models.tiny, seeded random weights, saved once for every run."""
    write_tiny_model(folder, size)
    torch.manual_seed(seed)
    LlamaForCausalLM(AutoConfig.from_pretrained(folder)).save_pretrained(folder, safe_serialization=True)
    return folder


def rlft_keys(model_dir: Path, out_dir: Path, steps: int, seed: int, learning_rate: float) -> dict:
    """rlft settings every benchmark shares: fp32, constant lr, AdamW, clip 1.0, one metrics line per step."""
    return {
        "base_model": str(model_dir),
        "random_init": False,
        "gradient_accumulation_steps": 1,
        "max_steps": steps,
        "learning_rate": learning_rate,
        "lr_scheduler": "constant",
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "optimizer": "adamw_torch",
        "max_grad_norm": 1.0,
        "bf16": False,
        "logging_steps": 1,  # per-step times and losses
        "seed": seed,
        "output_dir": str(out_dir),
    }


def trl_keys(steps: int, seed: int) -> dict:
    """The same settings for TRL, plus what TRL turns on by default and rlft does not (bf16, checkpointing)."""
    return {
        "max_steps": steps,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "optim": "adamw_torch",  # TRL defaults to adamw_torch_fused
        "max_grad_norm": 1.0,
        "bf16": False,  # TRL defaults to bf16=True
        "fp16": False,
        "gradient_checkpointing": False,  # TRL defaults to True
        "use_cpu": True,
        "report_to": "none",
        "save_strategy": "no",
        "eval_strategy": "no",
        "disable_tqdm": True,
        "logging_steps": steps,
        "dataloader_num_workers": 0,
        "seed": seed,
    }
