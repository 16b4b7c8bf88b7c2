"""The peak FLOP/s that MFU divides by (rlft.train.peak): the user's figure, a named GPU's table entry, or a matmul
probe of this machine kept in a cache file. The probe's figure itself depends on the machine: only its form is checked."""

import json
import math

import pytest
import torch

from rlft.train import peak

CPU = torch.device("cpu")


@pytest.fixture
def probes(monkeypatch):
    """The probe replaced by a counter that returns 2e11 (a figure the tests can recognise)."""
    calls = []
    monkeypatch.setattr(peak, "probe_flops", lambda device, dtype: calls.append((device.type, dtype)) or 2e11)
    return calls


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_probe_measures_a_positive_finite_figure(precision):
    flops = peak.probe_flops(CPU, peak.DTYPES[precision])
    assert isinstance(flops, float) and math.isfinite(flops) and flops > 0


def test_the_probe_leaves_the_runs_random_stream_as_it_was():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    peak.probe_flops(CPU, torch.float32)
    assert torch.equal(torch.rand(3), expected)


def test_the_cache_keeps_the_best_figure_and_a_later_start_probes_again(tmp_path, monkeypatch):
    """A start within REPROBE_SECONDS of the last probe reads the cached figure; a later one probes again. A probe that
    reads lower than the cache (the machine busy with other work) leaves the best figure in place; one that reads
    higher replaces it, so a figure measured under load does not stay the machine's."""
    figures = iter([2e11, 5e10, 3e11])
    calls = []
    monkeypatch.setattr(peak, "probe_flops", lambda device, dtype: calls.append(dtype) or next(figures))
    clock = [1000.0]
    monkeypatch.setattr(peak.time, "time", lambda: clock[0])
    cache = tmp_path / "rlft" / "peak_flops.json"
    key = peak.cache_key(CPU, "fp32", peak.cpu_model())
    first = peak.device_peak(CPU, "fp32", None, cache)
    assert first.flops == 2e11 and first.source == f"measured by a matmul probe at start-up, cached in {cache}"
    assert json.loads(cache.read_text()) == {key: {"flops": 2e11, "probed_at": 1000.0}}
    assert peak.cpu_model() in key and "fp32" in key and f"{torch.get_num_threads()} threads" in key and torch.__version__ in key
    clock[0] += peak.REPROBE_SECONDS - 1
    read = peak.device_peak(CPU, "fp32", None, cache)
    assert len(calls) == 1 and read.flops == 2e11  # read, not measured again
    assert read.describe() == f"0.2 TFLOP/s fp32 per device (the best a matmul probe of this machine has measured, cached in {cache})"
    clock[0] += 2
    busy = peak.device_peak(CPU, "fp32", None, cache)
    assert len(calls) == 2 and busy.flops == 2e11 and busy.source.endswith("(this start's probe: 0.05 TFLOP/s)")
    assert json.loads(cache.read_text())[key]["flops"] == 2e11
    clock[0] += peak.REPROBE_SECONDS
    quiet = peak.device_peak(CPU, "fp32", None, cache)
    assert quiet.flops == 3e11 and "at start-up" in quiet.source and json.loads(cache.read_text())[key]["flops"] == 3e11
    assert calls == [torch.float32] * 3


def test_an_entry_without_its_probe_time_is_probed_again_and_kept_if_higher(probes, tmp_path):
    cache = tmp_path / "peak_flops.json"
    key = peak.cache_key(CPU, "fp32", peak.cpu_model())
    cache.write_text(json.dumps({key: 4e11}))
    found = peak.device_peak(CPU, "fp32", None, cache)
    assert probes and found.flops == 4e11 and json.loads(cache.read_text())[key]["flops"] == 4e11


def test_another_precision_thread_count_or_instruction_set_is_measured_for_itself(probes, tmp_path, monkeypatch):
    cache = tmp_path / "peak_flops.json"
    peak.device_peak(CPU, "fp32", None, cache)
    peak.device_peak(CPU, "bf16", None, cache)
    threads = torch.get_num_threads()
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads + 1)
    peak.device_peak(CPU, "fp32", None, cache)
    assert probes == [("cpu", torch.float32), ("cpu", torch.bfloat16), ("cpu", torch.float32)]
    assert len(json.loads(cache.read_text())) == 3
    # the same CPU model's kernels for another instruction set (a VM without AVX-512, or ATEN_CPU_CAPABILITY=avx2)
    capability = torch.backends.cpu.get_cpu_capability()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2" if capability != "AVX2" else "DEFAULT")
    peak.device_peak(CPU, "fp32", None, cache)
    assert len(probes) == 4 and len(json.loads(cache.read_text())) == 4


@pytest.mark.parametrize("text", ["{not json", "", "[1, 2]", '{"KEY": "fast"}', '{"KEY": -1}', '{"KEY": NaN}', '{"KEY": true}',
                                  '{"KEY": {"flops": "fast", "probed_at": 1}}', '{"KEY": {"flops": 1e12}}'])
def test_a_corrupt_cache_is_measured_again_and_rewritten(text, probes, tmp_path):
    cache = tmp_path / "peak_flops.json"
    cache.write_text(text.replace("KEY", peak.cache_key(CPU, "fp32", peak.cpu_model())))
    found = peak.device_peak(CPU, "fp32", None, cache)
    assert probes and found.flops == 2e11 and "at start-up" in found.source
    assert json.loads(cache.read_text())[peak.cache_key(CPU, "fp32", peak.cpu_model())]["flops"] == 2e11


def test_a_cache_that_cannot_be_written_leaves_the_figure_uncached(probes, tmp_path):
    (tmp_path / "a-file").write_text("")
    cache = tmp_path / "a-file" / "peak_flops.json"  # its folder is a file: no folder can be made there
    found = peak.device_peak(CPU, "fp32", None, cache)
    assert found.flops == 2e11 and found.source.startswith("measured by a matmul probe at start-up; not cached: ")
    assert peak.device_peak(CPU, "fp32", None, cache).flops == 2e11 and len(probes) == 2


def test_the_users_peak_wins_over_the_table_and_the_probe(probes, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    for device in (CPU, torch.device("cuda")):
        found = peak.device_peak(device, "bf16", 5e12, tmp_path / "peak_flops.json")
        assert (found.flops, found.source) == (5e12, "mfu_peak_flops")
        assert found.describe() == "5 TFLOP/s bf16 per device (mfu_peak_flops)"
    assert probes == [] and not (tmp_path / "peak_flops.json").exists()


@pytest.mark.parametrize("name, precision, flops, table", [("NVIDIA H100 80GB HBM3", "bf16", 989e12, "H100"),
                                                             ("NVIDIA H200", "fp32", 67e12, "H200"),
                                                             ("NVIDIA A100-SXM4-80GB", "fp16", 312e12, "A100"),
                                                             ("NVIDIA A10G", "bf16", 70e12, "A10G")])
def test_a_named_gpu_takes_its_table_figure(name, precision, flops, table, probes, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
    found = peak.device_peak(torch.device("cuda"), precision, None, tmp_path / "peak_flops.json")
    assert (found.flops, found.source) == (flops, f"the {table} table") and probes == []


def test_a_gpu_the_table_does_not_name_is_probed_not_given_another_gpus_figure(probes, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA GeForce RTX 4090")
    cache = tmp_path / "peak_flops.json"
    found = peak.device_peak(torch.device("cuda"), "bf16", None, cache)
    assert probes == [("cuda", torch.bfloat16)] and found.flops == 2e11
    [key] = json.loads(cache.read_text())
    assert key.startswith("cuda: NVIDIA GeForce RTX 4090 | bf16 | torch ") and "threads" not in key


def test_the_cache_lives_in_xdg_cache_home_else_in_the_homes_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert peak.cache_file() == tmp_path / "xdg" / "rlft" / "peak_flops.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert peak.cache_file() == tmp_path / "home" / ".cache" / "rlft" / "peak_flops.json"
