"""The profiler through the real CLI: a few SFT (and GRPO) steps write a Chrome trace that holds rlft's phases."""

import json
import textwrap

import pytest
import yaml

from distributed_utils import train, write
from rlft.phase_ranges import ranges_open

pytestmark = pytest.mark.slow


def _trace(folder, name):
    path = folder / name
    assert path.exists(), sorted(p.name for p in folder.iterdir()) if folder.exists() else f"no {folder}"
    events = json.loads(path.read_text())["traceEvents"]
    return events, {event.get("name") for event in events}


def test_sft_trace_of_the_chosen_step_holds_the_phases_and_shapes(make_config, cli, tmp_path, capsys):
    config = make_config(max_steps=4, profiler={"enable_profiler": True, "sub_profiler_config": {
        "wait_steps": 1, "warmup_steps": 1, "active_steps": 1, "record_shape": True}})
    assert cli("train", config) == 0
    folder = tmp_path / "out" / "profile"
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.3.pt.trace.json"]  # step 3: after one waiting, one warm-up
    events, names = _trace(folder, "rank0.3.pt.trace.json")
    assert {"data", "forward_backward", "optimizer", "step 3"} <= names, sorted(n for n in names if n and ":" not in n)
    assert not {"step 2", "step 4"} & names  # only the recorded step
    shaped = [e for e in events if e.get("args", {}).get("Input Dims")]
    assert any(e["name"] == "aten::mm" or e["name"] == "aten::addmm" for e in shaped)  # record_shape: the matmuls' shapes
    assert not ranges_open()  # the run is over: phases cost nothing again
    printed = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "profile: rank 0: step 3 recorded in" in printed and "rank0.3.pt.trace.json" in printed
    assert "rank0.3.pt.trace.json (traces: https://ui.perfetto.dev" in printed  # the summary names it


def test_sft_without_the_profiler_writes_nothing(make_config, cli, tmp_path):
    assert cli("train", make_config(max_steps=2)) == 0
    assert not (tmp_path / "out" / "profile").exists()


def test_axolotl_profiler_steps_records_memory_on_a_cpu(make_config, cli, tmp_path, capsys):
    """profiler_steps: 2 from profiler_steps_start: 1 records steps 2-3 with shapes, memory and stacks; on a CPU the
    trace's memory events stand in for the CUDA snapshot."""
    assert cli("train", make_config(max_steps=4, profiler_steps=2, profiler_steps_start=1)) == 0
    events, names = _trace(tmp_path / "out" / "profile", "rank0.2.pt.trace.json")
    assert {"step 2", "step 3", "forward_backward"} <= names and "step 4" not in names
    assert any(e.get("name") == "[memory]" for e in events)  # profile_memory: host allocations
    assert any(e.get("cat") == "python_function" for e in events)  # with_stack
    printed = " ".join(capsys.readouterr().out.split())
    assert "steps 2-3 recorded" in printed and "no CUDA memory snapshot (this machine has no CUDA GPU)" in printed


def test_a_run_shorter_than_the_wait_says_nothing_was_recorded(make_config, cli, tmp_path, capsys):
    config = make_config(max_steps=2, profiler={"enable_profiler": True, "sub_profiler_config": {"wait_steps": 3}})
    assert cli("train", config) == 0
    assert not list((tmp_path / "out" / "profile").glob("*.json"))
    printed = " ".join(capsys.readouterr().out.split())
    assert "nothing recorded: the run ended at step 2, before the first profiled step 5" in printed


def test_grpo_trace_holds_the_rollout_phases(tiny_model_dir, cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    module = "rewards_" + "".join(ch if ch.isalnum() else "_" for ch in tmp_path.name)
    (tmp_path / f"{module}.py").write_text(textwrap.dedent("""
        def short(completions, **kwargs):
            return [-float(len(c)) for c in completions]
    """))
    rows = [{"prompt": f"{a}+{b}="} for a in range(4) for b in range(4)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = {"base_model": str(tiny_model_dir), "random_init": True, "rl": "grpo", "datasets": [{"path": "prompts.jsonl"}],
              "sequence_len": 32, "micro_batch_size": 8, "max_steps": 2, "learning_rate": 1e-4, "output_dir": "out",
              "trl": {"num_generations": 4, "max_completion_length": 4, "reward_funcs": [f"{module}.short"], "beta": 0.04},
              "profiler": {"enable_profiler": True, "sub_profiler_config": {"wait_steps": 0, "warmup_steps": 1}}}
    (tmp_path / "grpo.yaml").write_text(yaml.safe_dump(config))
    assert cli("train", "grpo.yaml") == 0
    _, names = _trace(tmp_path / "out" / "profile", "rank0.2.pt.trace.json")
    assert {"generate", "reward", "logprobs", "forward_backward", "optimizer", "weight_sync", "step 2"} <= names, \
        sorted(n for n in names if n and "::" not in n)


@pytest.mark.multiprocess
def test_rank_filter_profiles_only_the_ranks_it_names(tiny_model_dir, addition_files, tmp_path):
    """Two processes, rank_filter [1]: rank 1 writes its trace and says where (its console is otherwise quiet); rank 0
    records nothing, and the summary lists rank 1's file."""
    config = write(tmp_path / "two.yaml", {
        "base_model": str(tiny_model_dir), "random_init": True, "datasets": [{"path": str(addition_files["train"])}],
        "sequence_len": 32, "micro_batch_size": 8, "max_steps": 3, "output_dir": str(tmp_path / "out"),
        "profiler": {"enable_profiler": True, "sub_profiler_config": {"wait_steps": 0, "warmup_steps": 1, "active_steps": 1,
                                                                      "rank_filter": [1]}}})
    output = train(config)
    folder = tmp_path / "out" / "profile"
    assert sorted(p.name for p in folder.iterdir()) == ["rank1.2.pt.trace.json"]
    _, names = _trace(folder, "rank1.2.pt.trace.json")
    assert {"step 2", "forward_backward", "optimizer"} <= names
    assert f"profile: rank 1: step 2 recorded in {folder / 'rank1.2.pt.trace.json'}" in output
    assert "rank1.2.pt.trace.json (traces:" in " ".join(output.replace("│", " ").split())
