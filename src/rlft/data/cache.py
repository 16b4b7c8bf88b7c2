"""`dataset_prepared_path`: tokenised data kept on disk and reused while config, data, tokenizer and rlft are unchanged.

The cache key hashes everything that can change the prepared rows: the config without the keys
that only steer training (learning rate, steps, logging, output...), the tokenizer (its vocabulary,
special tokens and chat template), each local data file's path, size and modification time, the
source of rlft's data code and of the user transforms the datasets name. Entries are plain JSON lines (never pickles: a cache folder from
elsewhere cannot run code), written to a temporary folder and renamed, so a crash leaves no half entry. With several
processes on a node, the first (LOCAL_RANK 0) prepares the entry and the others wait for it and read it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from rlft.config.methods import spec_of
from rlft.data.mistral_common import fingerprint, is_mistral_common
from rlft.data.prepared import LengthReport, PreparedData
from rlft.config.settings.training import prompt_budget
from rlft.usercode import module_origin

TRAINING_ONLY = {
    "learning_rate", "optimizer", "lr_scheduler", "lr_scheduler_kwargs", "warmup_steps", "warmup_ratio", "cosine_min_lr_ratio",
    "max_steps", "num_epochs", "logging_steps", "eval_steps", "save_steps", "evals_per_epoch", "saves_per_epoch",
    "save_total_limit", "output_dir", "resume_from_checkpoint", "micro_batch_size", "eval_batch_size",
    "gradient_accumulation_steps", "max_grad_norm", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "use_tensorboard",
    "use_wandb", "wandb_project", "wandb_entity", "wandb_name", "wandb_mode", "mfu_peak_flops", "dataset_prepared_path",
    "dataset_num_proc", "ddp_timeout", "bf16", "fp16", "tf32", "gradient_checkpointing", "gradient_checkpointing_kwargs",
    "activation_offloading",
    "eval_strategy", "save_strategy", "load_best_model_at_end", "metric_for_best_model", "greater_is_better",
    "early_stopping_patience", "unfrozen_parameters", "neftune_noise_alpha", "logger", "balance_dp_token",
    "save_every_n_epochs", "save_mode",
    # the profiler records steps; validation: tokenises its own prompts apart from the cached rows (data/validation_sets.py)
    "profiler", "profiler_steps", "profiler_steps_start", "validation",
}


def _files(ds) -> list[list[Any]]:
    """(path, size, mtime) of every local file an entry reads; a hub id stands for itself."""
    found = []
    for name in [ds.path] + ([ds.data_files] if isinstance(ds.data_files, str) else list(ds.data_files or [])):
        if not name:
            continue
        path = Path(name).expanduser()
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path] if path.exists() else []
        found += [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in files] or [[name]]
    return found


def tokenizer_fingerprint(tokenizer) -> str:
    if is_mistral_common(tokenizer):
        return fingerprint(tokenizer)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    extra = json.dumps([tokenizer.chat_template, tokenizer.all_special_tokens, tokenizer.padding_side], default=str)
    return hashlib.sha256((text + extra).encode()).hexdigest()


def _user_code(cfg) -> list[str]:
    """The source of every user transform (`type: module.fn`) the datasets name and of every multi-turn tool (whose
    docstring is shown in the prompts), found as rlft imports it (the working directory first): an edit of one changes
    the prepared rows."""
    texts = []
    names = [ds.type for ds in list(cfg.datasets) + list(cfg.test_datasets or [])]
    names += list(cfg.trl.multi_turn_config.tools or []) if cfg.trl.multi_turn_config.enable else []
    for name in names:
        module = name.rpartition(".")[0] if isinstance(name, str) else ""
        origin = module_origin(module) if module else None  # None for a built-in format's name (chatml.intel)
        if origin and Path(origin).is_file():
            texts.append(hashlib.sha256(Path(origin).read_bytes()).hexdigest())
    return texts


def cache_key(cfg, tokenizer) -> str:
    config = cfg.model_dump(mode="json", exclude=TRAINING_ONLY)
    # what depends on whether a key was written, not only on its value: an online-RL prompt's token budget
    config["prompt_budget"] = prompt_budget(cfg) if spec_of(cfg).generates else None
    # rlft's own code that decides ids and labels: the data package (formats, tokenisation, chat templates, end-of-turn markers)
    code = "".join(p.read_text() for p in sorted(Path(__file__).parent.rglob("*.py")))
    parts = [config, [_files(ds) for ds in list(cfg.datasets) + list(cfg.test_datasets or [])], tokenizer_fingerprint(tokenizer),
             hashlib.sha256(code.encode()).hexdigest(), _user_code(cfg)]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _local_rank() -> int:
    """This process's place on its node when several train together (torchrun, accelerate launch), else 0."""
    return int(os.environ.get("LOCAL_RANK", "0")) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else 0


def _wait_for(path: Path, poll_s: float = 0.5) -> None:
    """Until the node's first process has written `path` (its entry appears whole: renamed into place). A process that
    fails stops the others (the launcher), so there is no time limit, as there is none on preparing the data."""
    while not path.exists():
        time.sleep(poll_s)


def cached(cfg, tokenizer, prepare: Callable[[], Any], console: Console | None = None):
    """The prepared data of this config from `dataset_prepared_path`, or `prepare()` written there."""
    console = console or Console(stderr=True)
    folder = Path(cfg.dataset_prepared_path).expanduser() / cache_key(cfg, tokenizer)
    if _local_rank() > 0:  # the node's first process prepares the entry; the others read it (no tokenising N times)
        _wait_for(folder / "reports.json")
    if (folder / "reports.json").exists():
        console.print(f"prepared data reused from {folder} (config, data and tokenizer unchanged)", markup=False, highlight=False)
        load = lambda name: [json.loads(line) for line in (folder / name).read_text().splitlines()]  # noqa: E731
        reports = [LengthReport(**r) for r in json.loads((folder / "reports.json").read_text())]
        return PreparedData(train=load("train.jsonl"), eval=load("eval.jsonl"), reports=reports)
    data = prepare()
    staging = folder.with_name(f".tmp-{folder.name}-{os.getpid()}")
    staging.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.jsonl", data.train), ("eval.jsonl", data.eval)):
        (staging / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
    (staging / "reports.json").write_text(json.dumps([asdict(r) for r in data.reports]))
    try:
        staging.rename(folder)
        console.print(f"prepared data saved to {folder}", markup=False, highlight=False)
    except OSError:  # another process wrote the same entry first: theirs is identical
        for child in staging.iterdir():
            child.unlink()
        staging.rmdir()
    return data
