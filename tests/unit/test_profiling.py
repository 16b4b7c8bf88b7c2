"""The profiler's own logic: which steps and ranks it records (against torch.profiler's schedule), the keys that choose
them, what `rlft train` refuses, the nsys capture range and NVTX ranges (CUDA calls replaced by recorders: this
machine may have no GPU), Axolotl's memory snapshot, and a profiler that is off doing nothing."""

from __future__ import annotations

import json

import pytest
import torch
from rich.console import Console

from rlft.config.loading import build_config
from rlft.config.settings import resolve
from rlft.config.settings.profiling import ProfileSettings, profile_problems, profile_settings
from rlft.errors import ConfigError, NotImplementedYet
from rlft.phase_ranges import phase_range, ranges_open
from rlft.train import profiling
from rlft.train.profiling import NO_PROFILE, RECORDING, StepProfile, step_schedule
from rlft.train.unbuilt import refuse_unbuilt

BASE = {"base_model": "./model", "datasets": [{"path": "data.jsonl"}], "output_dir": "out"}


def _config(**keys):
    return build_config({**BASE, **keys}, source="test")


def _settings(**fields) -> ProfileSettings:
    values = dict(trace=False, nsys=False, wait=1, warmup=1, active=1, ranks=(0,), record_shapes=False, profile_memory=False,
                  with_stack=False, memory_snapshot=False, keys="profiler")
    return ProfileSettings(**{**values, **fields})


@pytest.mark.parametrize("wait,warmup,active", [(0, 0, 1), (1, 1, 1), (2, 0, 3), (0, 3, 2), (4, 1, 1)])
@pytest.mark.parametrize("first_step", [0, 7])
def test_recorded_steps_are_the_ones_torch_schedule_records(wait, warmup, active, first_step):
    """The steps the messages and file names give (from 1, as metrics.jsonl) are those torch.profiler records."""
    profile = _settings(wait=wait, warmup=warmup, active=active)
    schedule = step_schedule(profile)
    recorded = [first_step + n + 1 for n in range(20) if schedule(n) in RECORDING]
    first, last = profile.recorded_steps(first_step)
    assert recorded == list(range(first, last + 1))


def test_cosmos_keys_resolve_with_cosmos_defaults_and_rank_0_for_an_empty_filter():
    profile = resolve(_config(profiler={"enable_profiler": True})).profile
    assert (profile.trace, profile.nsys, profile.wait, profile.warmup, profile.active) == (True, False, 1, 1, 1)
    assert profile.ranks == (0,) and profile.records(0) and not profile.records(1)
    assert not (profile.record_shapes or profile.profile_memory or profile.with_stack or profile.memory_snapshot)
    ranked = profile_settings(_config(profiler={"enable_profiler": True, "sub_profiler_config": {"rank_filter": [3, 1, 3]}}))
    assert ranked.ranks == (1, 3) and ranked.records(3) and not ranked.records(0)


def test_a_profiler_left_off_records_on_no_rank():
    assert not resolve(_config()).profile.on
    assert not profile_settings(_config(profiler={"enable_profiler": False})).records(0)
    assert not profile_settings(_config(profiler_steps=0)).on  # Axolotl: 0 is off


@pytest.mark.parametrize("keys,words", [
    ({"profiler": {"sub_profiler_config": {"active_steps": 3, "rank_filter": [1]}}},
     "profiler.sub_profiler_config.active_steps, profiler.sub_profiler_config.rank_filter are read while a profiler runs, "
     "and none is on: set profiler.enable_profiler: true"),
    ({"profiler": {"enable_profiler": False, "sub_profiler_config": {"wait_steps": 0}}},
     "profiler.sub_profiler_config.wait_steps is read while a profiler runs"),
    ({"profiler_steps": 2, "profiler": {"sub_profiler_config": {"record_shape": False, "rank_filter": [0]}}},
     "profiler.sub_profiler_config.record_shape with profiler_steps (Axolotl's profiler), which records profiler_steps "
     "steps after profiler_steps_start with shapes, memory and stacks whatever these say"),
    ({"profiler_steps_start": 3}, "profiler_steps_start counts the steps trained before profiler_steps records, and "
                                  "profiler_steps is not set"),
    ({"profiler_steps": 0, "profiler_steps_start": 0}, "profiler_steps_start counts the steps"),
    ({"profiler": {"enable_profiler": True, "sub_profiler_config": {"with_modules": True}}},
     "with_modules: true asks torch.profiler for each operator's module hierarchy, which it records for TorchScript "
     "models only"),
])
def test_profiler_keys_that_would_change_nothing_are_refused(keys, words):
    with pytest.raises(ConfigError) as caught:
        _config(**keys)
    assert words in str(caught.value)


def test_the_keys_each_way_of_profiling_reads_are_accepted():
    _config(profiler={"enable_nsys": True, "sub_profiler_config": {"active_steps": 2, "with_modules": False}})
    assert profile_settings(_config(profiler_steps=2, profiler_steps_start=1, profiler={
        "sub_profiler_config": {"rank_filter": [1]}})).ranks == (1,)  # profiler_steps reads rank_filter


def test_axolotl_profiler_steps_are_a_window_without_warm_up_with_shapes_memory_and_stacks():
    profile = profile_settings(_config(profiler_steps=3, profiler_steps_start=2))
    assert (profile.trace, profile.wait, profile.warmup, profile.active, profile.memory_snapshot) == (True, 2, 0, 3, True)
    assert profile.record_shapes and profile.profile_memory and profile.with_stack
    assert profile.recorded_steps(0) == (3, 5)  # two steps trained first, then three recorded
    assert profile_settings(_config(profiler_steps=2)).recorded_steps(0) == (1, 2)


def test_two_ways_of_choosing_the_steps_are_refused_together():
    with pytest.raises(ConfigError) as caught:
        _config(profiler_steps=2, profiler={"enable_profiler": True})
    assert "profiler_steps" in str(caught.value) and "profiler.enable_profiler" in str(caught.value)


@pytest.mark.parametrize("keys,message", [
    ({"profiler": {"sub_profiler_config": {"active_steps": 0}}}, "active_steps: must be >= 1, got 0"),
    ({"profiler": {"sub_profiler_config": {"wait_steps": -1}}}, "wait_steps: must be >= 0, got -1"),
    ({"profiler": {"sub_profiler_config": {"rank_filter": [-1]}}}, "rank_filter: ranks count from 0, and [-1] are below it"),
    ({"profiler_steps_start": -2}, "profiler_steps_start: must be >= 0, got -2"),
    ({"profiler": {"enable_profilr": True}}, "enable_profilr"),
])
def test_bad_profiler_keys_are_config_errors(keys, message):
    with pytest.raises(ConfigError) as caught:
        _config(**keys)
    assert message in str(caught.value)


def test_train_refuses_nsys_without_cuda_and_ranks_the_run_does_not_have(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError) as caught:
        refuse_unbuilt(_config(profiler={"enable_nsys": True}), processes=1)
    assert "profiler.enable_nsys" in str(caught.value) and "no" in str(caught.value) and "CUDA" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        refuse_unbuilt(_config(profiler={"enable_profiler": True, "sub_profiler_config": {"rank_filter": [0, 2]}}), processes=2)
    assert "rank(s) [2]" in str(caught.value) and "2 process(es)" in str(caught.value)
    refuse_unbuilt(_config(profiler={"enable_profiler": True, "sub_profiler_config": {"rank_filter": [1]}}), processes=2)
    # a filter with the profiler off profiles nothing, so it names no missing rank
    assert profile_problems(_settings(ranks=(5,)), 1, False) == []
    assert profile_problems(profile_settings(_config(profiler={"enable_nsys": True})), 1, cuda=True) == []


def test_do_profile_is_cosmos_controllers_switch_and_refused():
    with pytest.raises(NotImplementedYet) as caught:
        refuse_unbuilt(_config(profiler={"sub_profiler_config": {"do_profile": True}}), processes=1)
    assert "profiler.sub_profiler_config.do_profile" in str(caught.value)


def test_a_profiler_that_is_off_starts_nothing_and_opens_no_ranges(monkeypatch):
    def no_profiler(*args, **kwargs):
        raise AssertionError("a torch.profiler was made for a run that does not profile")

    monkeypatch.setattr(torch.profiler, "profile", no_profiler)
    off = resolve(_config())
    other_rank = resolve(_config(profiler={"enable_profiler": True, "sub_profiler_config": {"rank_filter": [1]}}))
    for settings in (off, other_rank):
        window = profiling.window(settings, 0, Console())
        assert window is NO_PROFILE
        with window as profile:
            profile.step()
            assert not ranges_open()
            assert phase_range("generate") is phase_range("forward_backward")  # one shared do-nothing context


class CudaCalls:
    """Records the CUDA profiling calls the profiler makes, in order (no GPU needed)."""

    def __init__(self, monkeypatch, tmp_path):
        self.calls: list[str] = []
        monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: self.calls.append(f"push {name}"))
        monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: self.calls.append("pop"))
        monkeypatch.setattr(torch.cuda.profiler, "start", lambda: self.calls.append("cudaProfilerStart"))
        monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: self.calls.append("cudaProfilerStop"))
        monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                            lambda enabled="all", **kwargs: self.calls.append(f"memory history {enabled}"))
        monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot",
                            lambda path: (self.calls.append(f"dump {path}"), open(path, "wb").close()))


def _run(profile: StepProfile, steps: int, phases=("forward_backward",)) -> None:
    with profile:
        for _ in range(steps):
            for name in phases:
                with phase_range(name):
                    pass
            profile.step()


def test_nsys_captures_the_recorded_steps_with_nvtx_ranges_per_step_and_phase(monkeypatch, tmp_path):
    cuda = CudaCalls(monkeypatch, tmp_path)
    profile = StepProfile(_settings(nsys=True, wait=1, warmup=1, active=2), 0, 0, tmp_path, Console(quiet=True),
                          cuda=True)
    _run(profile, 5)
    calls = cuda.calls
    assert calls.count("cudaProfilerStart") == 1 and calls.count("cudaProfilerStop") == 1
    # the capture range holds steps 3 and 4: after one waiting and one warm-up step
    start, stop = calls.index("cudaProfilerStart"), calls.index("cudaProfilerStop")
    assert calls.index("push step 2") < start < calls.index("push step 3")
    assert calls.index("push step 4") < stop < calls.index("push step 5")
    assert [c for c in calls if c.startswith("push step")] == [f"push step {n}" for n in range(1, 7)]  # the whole run
    assert calls.count("push forward_backward") == 5
    assert calls.count("pop") == sum(c.startswith("push") for c in calls)  # every range closed
    assert not ranges_open()


def test_a_run_that_ends_inside_the_capture_stops_it(monkeypatch, tmp_path):
    cuda = CudaCalls(monkeypatch, tmp_path)
    _run(StepProfile(_settings(nsys=True, wait=0, warmup=0, active=5), 0, 10, tmp_path, Console(quiet=True),
                     cuda=True), 2)
    assert cuda.calls[0] == "cudaProfilerStart" and cuda.calls[-1] == "cudaProfilerStop"
    assert "push step 11" in cuda.calls  # a resumed run counts from its checkpoint's step


def test_axolotl_memory_snapshot_spans_the_recorded_steps(monkeypatch, tmp_path):
    """profiler_steps_start 0: the history starts before the first step, as Axolotl records it before anything
    trains; it is dumped after the last recorded step."""
    cuda = CudaCalls(monkeypatch, tmp_path)
    console = Console(record=True, width=300)
    settings = _settings(memory_snapshot=True, wait=0, warmup=0, active=2, keys="profiler_steps")
    _run(StepProfile(settings, 0, 0, tmp_path, console, cuda=True), 4)
    snapshot = tmp_path / "rank0.1.memory_snapshot.pickle"
    assert cuda.calls == ["memory history all", f"dump {snapshot}", "memory history None"]
    assert f"steps 1-2 recorded in {snapshot.resolve()}" in console.export_text()
    cuda.calls.clear()
    _run(StepProfile(settings, 0, 0, tmp_path, Console(quiet=True), cuda=False), 4)
    assert cuda.calls == []  # no CUDA: no snapshot


def test_a_trace_cut_short_by_the_runs_end_keeps_its_steps(tmp_path):
    console = Console(record=True, width=300)
    _run(StepProfile(_settings(trace=True, wait=0, warmup=1, active=3), 0, 0, tmp_path, console, cuda=False), 3,
         phases=("forward_backward", "optimizer"))
    trace = tmp_path / "rank0.2.pt.trace.json"
    names = {event.get("name") for event in json.loads(trace.read_text())["traceEvents"]}
    assert {"step 2", "step 3", "forward_backward", "optimizer"} <= names and "step 1" not in names  # step 1: warm-up
    assert "steps 2-3 (the run ended at step 3, before step 4) recorded in" in console.export_text()
    assert not ranges_open()


def test_after_its_steps_the_profiler_stops_and_the_phases_cost_nothing_again(tmp_path):
    profile = StepProfile(_settings(trace=True, wait=0, warmup=0, active=1), 0, 0, tmp_path, Console(quiet=True), cuda=False)
    with profile:
        assert ranges_open()
        profile.step()
        assert profile.profiler is None and not ranges_open()
        assert phase_range("generate") is phase_range("reward")
        profile.step()
    assert [path.name for path in tmp_path.iterdir()] == ["rank0.1.pt.trace.json"]
