"""The peak FLOP/s of one device that MFU divides by (`rlft.train.metrics`): `mfu_peak_flops` when set, a table of
data-sheet figures for the GPUs it names, else measured on this machine by a short matmul probe and cached.

The probe times square matrix products on the run's device, in the run's matmul precision and with torch's thread
count: the size doubles until one product takes PROBE_SECONDS (large enough that arithmetic, not memory, bounds it),
then the best of REPEATS timings counts, 2 n^3 FLOPs per product. It takes a fraction of a second (0.07 s in fp32,
0.35 s in bf16 on a 2-core CPU). A JSON file under the cache folder ($XDG_CACHE_HOME/rlft, else ~/.cache/rlft) keeps
the best figure a probe of the machine has measured and when it last probed, one entry per device model, precision,
thread count and instruction set (CPUs) and torch version. A start within REPROBE_SECONDS of the last probe reads the
figure; a later one probes again and keeps the higher figure: a probe taken while other work loads the machine reads
low (2.4 against 199 GFLOP/s on a 2-core CPU that a test suite kept busy) and must not stay the machine's figure.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

# Dense peak FLOP/s of the GPUs named here (NVIDIA data sheets, without sparsity). A GPU whose name holds none of
# these keys is probed.
PEAK_FLOPS = {
    "H200": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12},
    "L40S": {"bf16": 362e12, "fp16": 362e12, "fp32": 91.6e12},
    "A10G": {"bf16": 70e12, "fp16": 70e12, "fp32": 31.2e12},
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
PROBE_SECONDS = 0.01  # one timed product at least this long: the GEMM is compute-bound and the clock's resolution small
REPEATS = 3
FIRST_SIZE = 256
MAX_SIZE = {"cpu": 4096, "other": 8192}  # 8192: 3 x 256 MiB of fp32 matrices on a GPU
CACHE_NAME = "peak_flops.json"
REPROBE_SECONDS = 600  # a start this long after the last probe probes again (a figure read under load heals then)


@dataclass(frozen=True)
class Peak:
    """The peak FLOP/s of one device and where the figure comes from."""

    flops: float
    precision: str  # bf16, fp16 or fp32: what the run's matmuls run in
    source: str  # "mfu_peak_flops", "the H100 table", "measured by a matmul probe at start-up, cached in ..."

    def describe(self) -> str:
        return f"{self.flops / 1e12:.4g} TFLOP/s {self.precision} per device ({self.source})"


def device_peak(device: torch.device, precision: str, override: float | None = None, cache: Path | None = None) -> Peak:
    """The peak FLOP/s of one `device` running matmuls in `precision`: `override` (mfu_peak_flops) wins; a GPU the
    table names takes the table's figure; any other device is probed at start-up (`measured_peak`; `cache`: the JSON file,
    `cache_file()` when None)."""
    if override is not None:
        return Peak(float(override), precision, "mfu_peak_flops")
    name = device_name(device)
    if device.type == "cuda":
        for key, table in PEAK_FLOPS.items():
            if key in name:
                return Peak(table[precision], precision, f"the {key} table")
    return measured_peak(device, precision, name, cache or cache_file())


def measured_peak(device: torch.device, precision: str, name: str, cache: Path) -> Peak:
    """This machine's figure: the best a probe of it has measured (`cache`), probed again at a start more than
    REPROBE_SECONDS after the last probe, the higher figure kept. A cache that cannot be read or parsed counts as
    empty; one that cannot be written leaves the figure uncached."""
    key = cache_key(device, precision, name)
    entries = _read_cache(cache)
    best, probed_at = _entry(entries.get(key))
    now = time.time()
    if best > 0 and 0 <= now - probed_at < REPROBE_SECONDS:
        return Peak(best, precision, f"the best a matmul probe of this machine has measured, cached in {cache}")
    flops = probe_flops(device, DTYPES[precision])
    try:
        _write_cache(cache, {**entries, key: {"flops": max(flops, best), "probed_at": now}})
        kept = f", cached in {cache}"
    except OSError as exc:
        kept = f"; not cached: {exc}"
    if flops >= best:
        return Peak(flops, precision, f"measured by a matmul probe at start-up{kept}")
    return Peak(best, precision, f"the best a matmul probe of this machine has measured{kept} (this start's "
                                 f"probe: {flops / 1e12:.4g} TFLOP/s)")


def _entry(value) -> tuple[float, float]:
    """(best FLOP/s, when it was last probed) of a cache entry; (0, 0) for anything else. A bare number (an entry
    without its time) counts as probed long ago."""
    def number(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    if number(value) and value > 0:
        return float(value), 0.0
    if isinstance(value, dict) and number(value.get("flops")) and value["flops"] > 0 and number(value.get("probed_at")):
        return float(value["flops"]), float(value["probed_at"])
    return 0.0, 0.0


def probe_flops(device: torch.device, dtype: torch.dtype) -> float:
    """The best FLOP/s of square matmuls on `device` in `dtype` (the module's docstring). The matrices come from
    their own generator: the run's seeded random streams are left as they were."""
    limit = MAX_SIZE["cpu" if device.type == "cpu" else "other"]
    generator = torch.Generator(device).manual_seed(0)
    size = FIRST_SIZE
    while True:  # random values: a GPU multiplies constant matrices faster (it draws less power) than a model's
        left, right = (torch.rand(size, size, generator=generator, device=device, dtype=dtype) for _ in range(2))
        out = torch.empty_like(left)
        _product_seconds(left, right, out, 1)  # the first product at a size pays for allocation and kernel choice
        seconds = _product_seconds(left, right, out, 1)
        if seconds >= PROBE_SECONDS or size >= limit:
            break
        size *= 2
    count = max(1, math.ceil(PROBE_SECONDS / max(seconds, 1e-9)))  # products per timing: each timing >= PROBE_SECONDS
    best = min(_product_seconds(left, right, out, count) for _ in range(REPEATS)) / count
    del left, right, out
    if device.type == "cuda":  # the probe's matrices are not the run's memory: free them and forget their peak
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return 2.0 * size**3 / max(best, 1e-12)


def _product_seconds(left: torch.Tensor, right: torch.Tensor, out: torch.Tensor, count: int) -> float:
    """Wall seconds of `count` products, the device's queued work included (CUDA kernels run asynchronously)."""
    _synchronize(left.device)
    start = time.perf_counter()
    for _ in range(count):
        torch.mm(left, right, out=out)
    _synchronize(left.device)
    return time.perf_counter() - start


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type != "cpu":  # mps, xpu, ...: their module's synchronize, where it has one
        getattr(torch.get_device_module(device), "synchronize", lambda: None)()


def device_name(device: torch.device) -> str:
    """The device's model: the GPU's name, or the CPU's model name (/proc/cpuinfo on Linux)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return cpu_model()
    module = torch.get_device_module(device)
    return module.get_device_name(device) if hasattr(module, "get_device_name") else device.type


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:  # not Linux
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cache_key(device: torch.device, precision: str, name: str) -> str:
    """One machine's entry: the device model, the precision, on a CPU torch's thread count (a GPU's matmuls do not
    use them) and the kernels' instruction set torch picked (one CPU model name covers VMs with and without AVX-512,
    and ATEN_CPU_CAPABILITY can lower it), and the torch version (its kernels set the speed)."""
    cpu = f" ({torch.backends.cpu.get_cpu_capability()}) | {torch.get_num_threads()} threads" if device.type == "cpu" else ""
    return f"{device.type}: {name} | {precision}{cpu} | torch {torch.__version__}"


def cache_file() -> Path:
    """$XDG_CACHE_HOME/rlft/peak_flops.json, else ~/.cache/rlft/peak_flops.json."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "rlft" / CACHE_NAME


def _read_cache(path: Path) -> dict:
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):  # missing, unreadable, or cut short / corrupt: measured again and rewritten
        return {}
    return entries if isinstance(entries, dict) else {}


def _write_cache(path: Path, entries: dict) -> None:
    """Written whole to a file of this process, then renamed over the cache: a run that reads it meanwhile (another
    process of the same launch) sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        staging.write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
        staging.replace(path)
    finally:
        staging.unlink(missing_ok=True)
