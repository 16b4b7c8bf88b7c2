"""Never lose a run: Ctrl-C (SIGINT) or SIGKILL at random moments of SFT (also streamed, and with checkpoints written in the
background), DPO and GRPO runs, each resumed with
`resume_from_checkpoint: auto` until it finishes, ends where an uninterrupted run ends: the same loss at every step
(each step logged once) and bit-identical final weights on CPU."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from safetensors.torch import load_file

from cli_process import CliProcess
from server_utils import addition_prompts
from rlft.train.metrics import read_metrics

pytestmark = pytest.mark.slow


def _weights(folder):
    state = {}
    for file in sorted(folder.glob("*.safetensors")):
        state.update(load_file(file))
    return state


def _losses(output_dir):
    return [(m["step"], m["loss"]) for m in read_metrics(output_dir / "metrics.jsonl") if "loss" in m]


def _run_with_faults(config, output_dir, seed):
    """Start the run, signal it at a random moment once it trains, restart it with `auto`; until it finishes.
    Returns the exit codes of the interrupted attempts. Each attempt is a process forked with rlft's imports done
    (`tests/cli_process.py`): the faults land in the run, not in the interpreter's start."""
    chooser = random.Random(seed)
    metrics = output_dir / "metrics.jsonl"
    codes = []
    for attempt in range(8):
        before = metrics.read_text().count("\n") if metrics.exists() else 0
        process = CliProcess("train", config, stdout=output_dir.parent / f"{output_dir.name}-{attempt}.out",
                             stderr=output_dir.parent / f"{output_dir.name}-{attempt}.err")
        try:
            if attempt < 6:  # the later attempts run to the end
                deadline = time.time() + 120
                while process.poll() is None and time.time() < deadline and \
                        (metrics.read_text().count("\n") if metrics.exists() else 0) <= before:
                    time.sleep(0.05)
                time.sleep(chooser.uniform(0.0, 0.4))
                if process.poll() is None:
                    process.send_signal(chooser.choice([signal.SIGINT, signal.SIGINT, signal.SIGKILL]))
            out, err = process.communicate(timeout=300)
        finally:
            process.kill_group()
        assert "Traceback" not in err, err
        if process.returncode == 0:
            return codes
        if process.returncode == -signal.SIGINT:  # it came as the interpreter shut down, after the run had ended
            assert "rlft train: done" in out, out
            continue
        assert process.returncode in (130, -signal.SIGKILL), err
        if process.returncode == 130:
            assert "checkpoint saved to" in err or "nothing to save" in err, err
        codes.append(process.returncode)
    raise AssertionError(f"the run did not finish in 8 attempts: {codes}")


def _write(path, config):
    path.write_text(yaml.safe_dump(config))
    return path


def _sft(tmp_path, tiny_model_dir, addition_files, output_dir, **extra):
    return _write(tmp_path / f"{output_dir.name}.yaml", {
        "base_model": str(tiny_model_dir), "random_init": True, "datasets": [{"path": str(addition_files["train"])}],
        "sequence_len": 32, "micro_batch_size": 16, "gradient_accumulation_steps": 2, "max_steps": 30, "save_steps": 4,
        "learning_rate": 3e-3, "warmup_steps": 3, "logging_steps": 1, "seed": 5, "output_dir": str(output_dir),
        "resume_from_checkpoint": "auto", **extra})


def _streamed(tmp_path, tiny_model_dir, addition_files, output_dir):
    """SFT on raw text read as it trains (`pretraining_dataset`): buffers of 40 rows, so that a resume lands inside a
    buffer, at its end, or in the next epoch, and reads the rows before it again."""
    corpus = tmp_path / "sums.jsonl"
    rows = [json.loads(line) for line in addition_files["train"].read_text().splitlines()[:300]]
    corpus.write_text("".join(json.dumps({"text": row["prompt"] + row["completion"]}) + "\n" for row in rows))
    return _write(tmp_path / f"{output_dir.name}.yaml", {
        "base_model": str(tiny_model_dir), "random_init": True, "pretraining_dataset": [{"path": str(corpus)}],
        "sample_packing": True, "streaming_multipack_buffer_size": 40, "sequence_len": 32, "micro_batch_size": 4,
        "gradient_accumulation_steps": 2, "max_steps": 30, "save_steps": 4, "learning_rate": 3e-3, "warmup_steps": 3,
        "logging_steps": 1, "seed": 5, "output_dir": str(output_dir), "resume_from_checkpoint": "auto"})


def _dpo(tmp_path, warm_model, output_dir):
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i % 7}=", "chosen": str(i + i % 7), "rejected": str(i + i % 7 + 1)})
                            + "\n" for i in range(40)))
    return _write(tmp_path / f"{output_dir.name}.yaml", {
        "base_model": str(warm_model), "rl": "dpo", "datasets": [{"path": str(data)}], "sequence_len": 32,
        "micro_batch_size": 4, "max_steps": 40, "save_steps": 3, "learning_rate": 1e-4, "logging_steps": 1,
        "output_dir": str(output_dir), "resume_from_checkpoint": "auto"})


def _grpo(tmp_path, warm_model, output_dir):
    (tmp_path / "interrupt_rewards.py").write_text(
        "def r(completions, answer, **kwargs):\n    return [float(c.strip() == a) + 0.1 * len(c) for c, a in zip(completions, answer)]\n")
    data = tmp_path / "prompts.jsonl"
    addition_prompts(data)
    return _write(tmp_path / f"{output_dir.name}.yaml", {
        "base_model": str(warm_model), "rl": "grpo", "datasets": [{"path": str(data)}], "sequence_len": 32,
        "micro_batch_size": 8, "max_steps": 24, "save_steps": 2, "learning_rate": 1e-4, "logging_steps": 1,
        "output_dir": str(output_dir), "resume_from_checkpoint": "auto",
        "trl": {"num_generations": 4, "max_completion_length": 4, "reward_funcs": ["interrupt_rewards.r"]}})


# SFT with synchronous saves is in none of these on its own: its save and resume are the DPO and GRPO runs' (the same
# checkpoint code), its data cursor the async-saves run's, and test_checkpoints.py stops it at each kind of signal
@pytest.mark.parametrize("method", ["sft-async-saves", "sft-streamed", "dpo", "grpo"])
def test_random_ctrl_c_and_kill_resume_to_the_uninterrupted_run(method, request, tmp_path, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)  # the GRPO reward module is found from the working directory
    monkeypatch.syspath_prepend(str(tmp_path))
    if method == "sft-async-saves":  # save_steps: 2, so that a signal often lands while a checkpoint is being written
        def make(out):
            return _sft(tmp_path, request.getfixturevalue("tiny_model_dir"), request.getfixturevalue("addition_files"), out,
                        save_mode="async", save_steps=2)
    elif method == "sft-streamed":
        def make(out):
            return _streamed(tmp_path, request.getfixturevalue("tiny_model_dir"), request.getfixturevalue("addition_files"),
                             out)
    else:
        warm = request.getfixturevalue("warm_model")
        def make(out):
            return (_dpo if method == "dpo" else _grpo)(tmp_path, warm, out)
    straight, faulty = tmp_path / "straight", tmp_path / "faulty"
    assert cli("train", make(straight)) == 0
    codes = _run_with_faults(make(faulty), faulty, seed=sum(map(ord, method)))
    assert codes, "no signal reached the run while it trained"
    print("interrupted attempts:", codes)

    expected, got = _losses(straight), _losses(faulty)
    assert [step for step, _ in got] == [step for step, _ in expected]  # every step logged once, none repeated
    assert got == expected
    assert len({loss for _, loss in expected}) > 1
    a, b = _weights(straight), _weights(faulty)
    assert a.keys() == b.keys() and a
    for name in a:
        assert torch.equal(a[name], b[name]), name
    for line in (faulty / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda name: pytest.fail(f"metrics.jsonl holds {name}"))  # strict JSON


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_finishes_the_step_and_a_second_one_stops_at_once(presses, warm_model, tmp_path):
    """A slow reward function holds step 2 open. One Ctrl-C: step 2 finishes and is saved. Two: it stops inside
    step 2 and names checkpoint-1, which stays the newest and resumes."""
    from rlft.train.checkpoint import resolve_resume

    calls, out = tmp_path / "calls", tmp_path / "out"
    config = _grpo(tmp_path, warm_model, out)
    (tmp_path / "interrupt_rewards.py").write_text(  # replaces _grpo's reward function with a slow one
        "import time\n"
        f"def r(completions, answer, **kwargs):\n    open({str(calls)!r}, 'a').write('x')\n    time.sleep(2)\n"
        "    return [float(c.strip() == a) for c, a in zip(completions, answer)]\n")
    config.write_text(config.read_text().replace("save_steps: 2", "save_steps: 1").replace("max_steps: 24", "max_steps: 6"))
    process = subprocess.Popen([sys.executable, "-m", "rlft.cli", "train", str(config)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=tmp_path,
                               env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(tmp_path)))
    try:
        deadline = time.time() + 180
        while time.time() < deadline and not (calls.exists() and len(calls.read_text()) >= 2):  # inside step 2
            time.sleep(0.05)
        assert process.poll() is None, "the run ended before step 2"
        for _ in range(presses):
            time.sleep(0.3)
            process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    err = " ".join(err.split())
    assert process.returncode == 130 and "Traceback" not in err, err
    assert "Ctrl-C: finishing this step, then saving a checkpoint" in err
    if presses == 1:
        assert f"interrupted at step 2/6: checkpoint saved to {out / 'checkpoint-2'}" in err
        assert resolve_resume("auto", out) == out / "checkpoint-2"
    else:
        assert f"stopped at once during step 2/6, nothing more saved; the last good checkpoint is {out / 'checkpoint-1'}" in err
        assert resolve_resume("auto", out) == out / "checkpoint-1" and not (out / "checkpoint-2").exists()
