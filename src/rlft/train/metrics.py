"""Run observability: metrics.jsonl (always), TensorBoard / W&B (when configured), progress with ETA, MFU.

MFU = achieved model FLOP/s / peak FLOP/s of the device. Achieved FLOPs per token are
2N (forward) + 2N (activation gradients) + 2N_trainable (weight gradients), N = parameter count without an input
embedding that is not tied to the output layer (a lookup); attention FLOPs are ignored. The peak: `rlft.train.peak`
(`mfu_peak_flops`, else a named GPU's data-sheet figure, else a matmul probe of this machine).
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch
from accelerate.tracking import LOGGER_TYPE_TO_CLASS

from rlft.config.trackers import tracker_specs
from rlft.phase_ranges import phase_range

def flops_per_token(total_params: int, trainable_params: int) -> float:
    return 4.0 * total_params + 2.0 * trainable_params


def flop_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(N, N_trainable) for MFU: the parameters that take part in a product for every token. An input embedding is a
    lookup, so it counts only when it is also the output layer (tied embeddings: the output product uses it)."""
    get_input, get_output = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    embedding = get_input() if callable(get_input) else None
    output = get_output() if callable(get_output) else None
    lookup = set()
    if embedding is not None and getattr(embedding, "weight", None) is not getattr(output, "weight", None):
        lookup = {id(p) for p in embedding.parameters()}
    counted = [p for p in model.parameters() if id(p) not in lookup]
    size = lambda p: getattr(p, "ds_numel", p.numel())  # noqa: E731  (ZeRO-3: numel() is 0)
    return sum(size(p) for p in counted), sum(size(p) for p in counted if p.requires_grad)


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


def plain_line(console, text: str) -> None:
    """`text` as one whole line on a rich console that is no terminal: what `print` writes with markup, highlighting,
    emoji and wrapping off, without rich's rendering of it (0.05-0.13 ms, a step's per-step line at size S on a CPU).
    A recording console renders it, so that its record holds the line."""
    if console.record:
        console.print(text, markup=False, highlight=False, emoji=False, soft_wrap=True)
    elif not console.quiet:
        console.file.write(text + "\n")
        console.file.flush()  # as rich does: a piped log shows each step as it ends


def clock() -> float:
    """time.perf_counter() once this process's GPU has finished the work queued on it. CUDA kernels run
    asynchronously: without the wait a phase's time would be the time to queue its kernels, and its GPU time would
    land on whichever phase waits next. On a CPU (or before CUDA is used) it is just the clock."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


class PhaseTimer:
    """Accumulates wall time per phase (`with timer("forward_backward"): ...`), GPU work included (`clock`); while a
    profiler records, each phase is also a range on its timeline (`rlft.phase_ranges`)."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    def __call__(self, phase: str) -> "_Phase":
        return _Phase(self, phase)

    def add(self, phase: str, seconds: float) -> None:
        self.totals[phase] = self.totals.get(phase, 0.0) + seconds

    def pop(self) -> dict[str, float]:
        totals, self.totals = self.totals, {}
        return {f"time/{k}": round(v, 4) for k, v in totals.items()}


class _Phase:
    def __init__(self, timer: PhaseTimer, phase: str) -> None:
        self.timer, self.phase = timer, phase

    def __enter__(self) -> None:
        self.range = phase_range(self.phase)
        self.range.__enter__()
        self.start = clock()

    def __exit__(self, *exc: Any) -> None:
        self.timer.add(self.phase, clock() - self.start)
        self.range.__exit__(*exc)


class MetricsLog:
    """Writes one JSON object per logged step to output_dir/metrics.jsonl, and to the configured trackers
    (accelerate's TensorBoard, W&B, MLflow, Comet, Trackio and SwanLab trackers: config/trackers.py)."""

    def __init__(self, cfg, output_dir: Path, enabled: bool = True) -> None:
        self.enabled = enabled
        self.path = output_dir / "metrics.jsonl"
        self.trackers = []
        self._file = None  # opened at the first line (the path may be set aside before), flushed after every line
        if not enabled:
            return
        output_dir.mkdir(parents=True, exist_ok=True)
        for spec in tracker_specs(cfg):
            if spec.name == "mlflow" and cfg.mlflow_tracking_uri:
                os.environ.setdefault("MLFLOW_TRACKING_URI", cfg.mlflow_tracking_uri)
            if spec.name == "swanlab" and cfg.swanlab_api_key:
                os.environ.setdefault("SWANLAB_API_KEY", cfg.swanlab_api_key)
            tracker = LOGGER_TYPE_TO_CLASS[spec.name](**spec.arguments)
            tracker.start()
            tracker.store_init_configuration(_flat(cfg.model_dump(mode="json", exclude_unset=True)))
            self.trackers.append(tracker)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        """One line of strict JSON: a NaN or infinite value is written as null and its key listed under `nonfinite`."""
        if not self.enabled:
            return
        record = {"step": step, **{k: None if _nonfinite(v) else v for k, v in metrics.items()}}
        bad = [k for k, v in metrics.items() if _nonfinite(v)]
        if bad:
            record["nonfinite"] = bad
        if self._file is None:
            self._file = open(self.path, "a")  # noqa: SIM115 (one handle for the run: an open per line cost 0.1 ms a step)
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()  # each line reaches the file as it is logged, as a crash or a reader would need
        numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        for tracker in self.trackers:
            tracker.log(numbers, step=step)

    def truncate_after(self, step: int) -> None:
        """Drop the lines logged after `step` (a resumed run trains those steps again), keeping the file's order."""
        if self.enabled:
            self.close_file()
            truncate_after(self.path, step)

    def close_file(self) -> None:
        """Close metrics.jsonl (every line is on file already); a later line opens it again."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def close(self) -> None:
        self.close_file()
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []


def truncate_after(path: Path, step: int) -> None:
    """Drop the JSON lines of `path` whose "step" is after `step` (a resumed run logs those again), keeping the order."""
    if not path.exists():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if _line_step(line) <= step]
    if len(kept) != len(lines):
        staging = path.with_name(path.name + ".tmp")
        staging.write_text("".join(kept))
        staging.replace(path)


def _nonfinite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _line_step(line: str) -> float:
    try:
        return float(json.loads(line).get("step", 0))
    except (ValueError, AttributeError):  # a line cut by a kill mid-write: dropped with what follows the checkpoint
        return math.inf


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config -> `section.key` entries of numbers, strings and booleans (what every tracker stores)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        elif value is not None:
            flat[f"{prefix}{key}"] = value if isinstance(value, (int, float, str, bool)) else json.dumps(value)
    return flat


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
