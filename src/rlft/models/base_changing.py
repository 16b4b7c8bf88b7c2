"""LoRA inits that rewrite the base weights (PiSSA, OLoRA), and their adapters saved as plain LoRAs on the original base.

PiSSA and OLoRA start the adapter from the base weights' principal directions, B0 A0, and train on the residual base
W - s B0 A0 (s: the adapter's scale). An adapter saved as trained loads right only on that residual, which PEFT rebuilds
by running the init again when it loads one: an SVD or QR of every target weight, and for `pissa_niter_N` a randomised
SVD that gives another residual each time. So rlft saves such adapters converted (checkpoints' `model/` and the final
model): (W - s B0 A0) + s B A = W + s [B | -B0] [A ; A0], a LoRA of rank 2r on the untouched base with the same scale
(lora_alpha doubled; x sqrt(2) under rsLoRA), as PEFT's own conversion (`path_initial_model_for_weight_conversion`)
computes it. PEFT's keeps only the lora_A and lora_B tensors; this one keeps every other tensor the adapter trains
(`lora_modules_to_save`, DoRA's magnitudes), which a conversion leaves as they are. A checkpoint also keeps the adapter
as trained (`RESUME_FOLDER`), which a resume, built on the same residual from the same seed, loads.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
import shutil

import torch
from safetensors.torch import load_file, save_file

from rlft.config.lora_inits import rewriting
from rlft.config.settings.model import AdapterSettings

INIT_FOLDER = "init-adapter"  # in output_dir: the adapter as initialised (B0, A0)
RESUME_FOLDER = "adapter-as-trained"  # in a checkpoint: the adapter on the residual base, for resuming
WEIGHTS, CONFIG = "adapter_model.safetensors", "adapter_config.json"
FACTOR_A = re.compile(r"\.lora_(embedding_)?A(\.|$)")  # (r, in): the new rows go below
FACTOR_B = re.compile(r"\.lora_(embedding_)?B(\.|$)")  # (out, r): the new columns go to the right


def changes_base(model) -> bool:
    """Whether the model's adapter init rewrote the base weights."""
    config = getattr(model, "peft_config", {}).get("default")
    return config is not None and rewriting(config.init_lora_weights)


def rewrites_base(adapter: AdapterSettings) -> bool:
    """Whether the config's new adapter starts with an init that rewrites the base weights (an adapter from
    `lora_model_dir` keeps the init its folder names)."""
    return bool(adapter.kind) and rewriting(adapter.init_lora_weights) and not adapter.model_dir


def save_initial_adapter(model, output_dir: Path) -> Path | None:
    """For inits that rewrite the base weights, the adapter as initialised, written as each run starts (a resumed run
    rebuilds the same one from the seed; a new run in the same output_dir must not convert against an older run's)."""
    if not changes_base(model):
        return None
    init = model.peft_config["default"]
    folder, staging = output_dir / INIT_FOLDER, output_dir / f".tmp-{INIT_FOLDER}"
    shutil.rmtree(staging, ignore_errors=True)
    kind = init.init_lora_weights
    init.init_lora_weights = True  # the saved copy must not run the init again when loaded
    try:
        model.save_pretrained(staging, safe_serialization=True)
    finally:
        init.init_lora_weights = kind
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return folder


def is_converted(folder: Path) -> bool:
    """Whether the adapter in `folder` loads as it is (no init of PiSSA or OLoRA named in its config)."""
    return not rewriting(json.loads((folder / CONFIG).read_text()).get("init_lora_weights"))


def as_plain_lora(trained: dict[str, torch.Tensor], initial: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors of the rank-2r LoRA that gives, on the original base, what `trained` gives on the residual one."""
    converted = {}
    for name, tensor in trained.items():
        if FACTOR_A.search(name) or FACTOR_B.search(name):
            if name not in initial:
                raise ValueError(f"the initial adapter has no {name}: it belongs to another adapter")
            start = initial[name].to(tensor.dtype)
            converted[name] = torch.cat([tensor, start], 0) if FACTOR_A.search(name) else torch.cat([tensor, -start], 1)
        else:  # modules_to_save, DoRA's magnitudes: the same on either base
            converted[name] = tensor
    return converted


def plain_lora_config(config: dict) -> dict:
    """The adapter config of `as_plain_lora`'s tensors: twice the rank, the same scale, no init to run."""
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ValueError("an adapter with rank_pattern or alpha_pattern cannot be converted here")
    factor = math.sqrt(2) if config.get("use_rslora") else 2  # scale = alpha / r, or alpha / sqrt(r) under rsLoRA
    return {**config, "r": config["r"] * 2, "lora_alpha": config["lora_alpha"] * factor, "init_lora_weights": True}


def convert_folder(folder: Path, initial_folder: Path) -> None:
    """Rewrite the adapter that `save_pretrained` wrote to `folder` as a plain LoRA on the original base."""
    config = json.loads((folder / CONFIG).read_text())
    tensors = as_plain_lora(load_file(folder / WEIGHTS), load_file(initial_folder / WEIGHTS))
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, folder / WEIGHTS, metadata={"format": "pt"})
    (folder / CONFIG).write_text(json.dumps(plain_lora_config(config), indent=2, sort_keys=True) + "\n")


def keep_for_resume(model_folder: Path, checkpoint: Path) -> None:
    """Copy the adapter as trained out of a checkpoint's `model/` before it is converted."""
    (checkpoint / RESUME_FOLDER).mkdir()
    for name in (WEIGHTS, CONFIG):
        shutil.copy2(model_folder / name, checkpoint / RESUME_FOLDER / name)


def resume_weights(checkpoint: Path) -> Path:
    """The folder whose weights a resume loads: the adapter as trained where the checkpoint kept one, else `model/`."""
    kept = checkpoint / RESUME_FOLDER
    return kept if (kept / WEIGHTS).exists() else checkpoint / "model"
