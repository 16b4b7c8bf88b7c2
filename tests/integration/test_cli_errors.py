"""Bad input through the CLI: one clear line naming the place and the fix, exit code 1, no traceback."""

import json

import pytest


def test_missing_config_file(cli, capsys, tmp_path):
    assert cli("train", tmp_path / "nope.yaml") == 1
    err = capsys.readouterr().err
    assert "config file not found" in err and "nope.yaml" in err and "Traceback" not in err


def test_yaml_syntax_error_names_the_line(cli, capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("base_model: x\ndatasets:\n  - path: a\n   type: b: c\n")
    assert cli("validate", bad) == 1
    assert "line 4" in capsys.readouterr().err


def test_validate_lists_every_problem(cli, capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("base_model: x\ndatasets: [{path: a}]\nlerning_rate: 1\nmicro_batch_size: two\ntrl: {num_generaitons: 3}\n")
    assert cli("validate", bad) == 1
    err = capsys.readouterr().err
    assert "3 problem(s)" in err
    assert "did you mean 'learning_rate'" in err and "did you mean 'num_generations'" in err
    assert "expected a whole number, got 'two'" in err


def test_validate_ok_and_explain(cli, capsys, make_config):
    assert cli("validate", make_config()) == 0
    assert capsys.readouterr().out.strip() == "OK"
    assert cli("validate", "--explain", "vllm.serve_module") == 0
    assert "not built: custom vLLM server code" in capsys.readouterr().out


@pytest.mark.parametrize("argument", ["missing.yaml", "configs/grpo"])
def test_explain_given_a_missing_config_file_says_so(cli, capsys, argument):
    assert cli("validate", "--explain", argument) == 1
    err = capsys.readouterr().err
    assert f"config file not found: {argument}" in err and "no section" not in err and "Traceback" not in err


def test_missing_base_model_folder(cli, capsys, make_config, tmp_path):
    assert cli("train", make_config(base_model=str(tmp_path / "no-such-model"))) == 1
    assert "does not exist" in capsys.readouterr().err


def test_hub_id_offline(cli, capsys, make_config):
    assert cli("train", make_config(base_model="Qwen/Qwen2.5-0.5B", random_init=False)) == 1
    assert "HF_HUB_OFFLINE=1" in capsys.readouterr().err


def test_missing_dataset_file(cli, capsys, make_config, tmp_path):
    assert cli("train", make_config(datasets=[{"path": str(tmp_path / "missing.jsonl")}])) == 1
    err = capsys.readouterr().err
    assert "datasets[0]" in err and "missing.jsonl" in err


def test_row_missing_field(cli, capsys, make_config, tmp_path):
    data = tmp_path / "chat.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n{"conversation": []}\n')
    assert cli("train", make_config(datasets=[{"path": str(data), "type": "chat_template"}])) == 1
    err = capsys.readouterr().err
    assert "datasets[0]" in err and "line 2" in err and "'messages'" in err


def test_everything_dropped(cli, capsys, make_config):
    assert cli("train", make_config(sequence_len=4)) == 1
    err = capsys.readouterr().err
    assert "no training rows left" in err and "too long" in err


@pytest.mark.parametrize("settings, words", [
    # (max_completion_length 16: the config's sequence_len of 32 must leave room for prompts, or validation refuses first)
    ({"rl": "grpo", "trl": {"num_generations": 4, "loss_type": "sapo", "reward_funcs": ["r.f"], "max_completion_length": 16}},
     "trl.loss_type 'sapo' is not implemented yet"),
    ({"rl": "grpo", "vllm": {"serve_module": "my.server"}, "trl": {"num_generations": 4, "reward_funcs": ["r.f"], "max_completion_length": 16}},
     "vllm.serve_module (not built: custom vLLM server code"),
    ({"deepspeed": "ds.json"}, "ds.json does not exist"),
    ({"flex_attention": True}, "flex_attention cannot train on CPU"),
    ({"liger_rope": True, "liger_rms_norm": True}, "liger_rope, liger_rms_norm: Liger Kernel's kernels are Triton kernels for CUDA GPUs"),
    ({"fp16": True}, "fp16: true needs a CUDA GPU"),
    ({"adapter": "qlora", "load_in_4bit": True}, "need a CUDA GPU and the bitsandbytes package"),
])
def test_refusals_say_why(cli, capsys, make_config, settings, words):
    assert cli("train", make_config(**settings)) == 1
    assert words in capsys.readouterr().err


def test_version(capsys):
    import pytest

    from rlft import __version__
    from rlft.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.strip() == f"rlft {__version__}"


def test_the_command_ignores_a_ctrl_c_after_main_has_returned(monkeypatch):
    """A SIGINT that lands while the interpreter shuts down (torch's atexit hooks) would print a traceback after the
    run's summary; `rlft` ignores SIGINT once main() has returned, and exits with main()'s code."""
    import signal

    import rlft.cli

    monkeypatch.setattr(rlft.cli, "main", lambda argv, state: 3)
    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as exit_:
            rlft.cli.run_command()
        assert exit_.value.code == 3
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("where", ["as SIGINT is being ignored", "twice as SIGINT is being ignored", "in main()'s last line"])
def test_a_ctrl_c_in_the_instant_the_command_ends_prints_no_traceback(where, monkeypatch, capsys):
    """The Ctrl-C lands after main() has returned 0 but before SIGINT is ignored (seen in a CI run: a traceback from
    inside signal.signal), or escapes main() itself: main()'s code in the first case, 130 and main()'s one line for a
    Ctrl-C outside the training steps in the second."""
    import signal

    import rlft.cli

    real, calls = signal.signal, []

    presses = 2 if where.startswith("twice") else 1

    def pressed(sig, handler):
        calls.append(handler)
        if len(calls) <= presses:
            raise KeyboardInterrupt
        return real(sig, handler)

    def interrupted_main(argv, state):
        raise KeyboardInterrupt

    ignoring = "SIGINT is being ignored" in where
    monkeypatch.setattr(rlft.cli, "main", (lambda argv, state: 0) if ignoring else interrupted_main)
    previous = signal.getsignal(signal.SIGINT)
    # as in a terminal: Python's own handler, whatever this test process inherited (a shell's background job ignores
    # SIGINT, and then no press could be "in the instant before SIGINT is ignored")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if ignoring:
            monkeypatch.setattr(signal, "signal", pressed)
        try:
            with pytest.raises(SystemExit) as exit_:
                rlft.cli.run_command()
        except KeyboardInterrupt:  # not through pytest: it would stop the whole session
            pytest.fail("the Ctrl-C escaped run_command")
        monkeypatch.undo()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capsys.readouterr().err
    if ignoring:
        assert exit_.value.code == 0 and calls == [signal.SIG_IGN] * (presses + 1) and err == ""
    else:
        assert exit_.value.code == 130 and "interrupted outside the training steps" in err


def test_a_ctrl_c_during_set_up_that_a_library_swallows_still_stops_the_run(make_config, cli, tmp_path, monkeypatch, capsys):
    """A Ctrl-C before the training loop raises KeyboardInterrupt at once; when something on the way swallows it (a
    bare `except:`, a `__del__` that was running), the loop raises it again before its first step instead of
    training on: exit code 130, no step trained, and Python's Ctrl-C handler back afterwards."""
    import os
    import signal
    import time

    from rlft.train import run

    setup = run._setup

    def swallowing_setup(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs in this thread before os.kill returns to Python code
            time.sleep(0.1)
        except BaseException:  # noqa: BLE001 - what a careless library does
            pass
        return setup(*args, **kwargs)

    monkeypatch.setattr(run, "_setup", swallowing_setup)
    previous = signal.getsignal(signal.SIGINT)
    assert cli("train", make_config(max_steps=3)) == 130
    assert signal.getsignal(signal.SIGINT) is previous
    assert not (tmp_path / "out" / "metrics.jsonl").exists() or \
        not [line for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    monkeypatch.setattr(run, "_setup", setup)
    assert cli("train", make_config(max_steps=1)) == 0  # the next run in the same process is not stopped by the old one


class _LibraryError(BaseException):  # as torch's CheckpointException
    pass


@pytest.mark.parametrize("wrapper", [RuntimeError, _LibraryError], ids=["exception", "base-exception"])
def test_sigterm_that_a_library_turns_into_its_own_error_is_still_reported_as_sigterm(make_config, cli, monkeypatch, capsys,
                                                                                       wrapper):
    """SIGTERM raises Terminated; a library that catches it and raises an error of its own (torch's checkpoint writer
    turns it into a CheckpointException, a BaseException) must not turn the stop into a traceback: the one SIGTERM
    line, exit 143, and Python's SIGTERM handling back afterwards."""
    import os
    import signal
    import time

    from rlft.train import run

    setup = run._setup

    def wrapping_setup(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs in this thread before os.kill returns to Python code
            time.sleep(0.1)
        except BaseException as exc:  # noqa: BLE001 - what such a library does
            raise wrapper(f"the writer failed: {exc!r}") from None
        return setup(*args, **kwargs)

    monkeypatch.setattr(run, "_setup", wrapping_setup)
    previous = signal.getsignal(signal.SIGTERM)
    assert cli("train", make_config(max_steps=3)) == 143
    err = capsys.readouterr().err
    assert "error: stopped by SIGTERM" in err and "Traceback" not in err and "the writer failed" not in err, err
    assert signal.getsignal(signal.SIGTERM) is previous
    monkeypatch.setattr(run, "_setup", setup)
    assert cli("train", make_config(max_steps=1)) == 0  # the next run in the same process is not reported as stopped


@pytest.mark.parametrize("weights_only", [False, True])
def test_a_quickstart_stopped_by_sigterm_says_what_its_checkpoints_allow(cli, monkeypatch, capsys, tmp_path, weights_only):
    """`rlft quickstart` stops on SIGTERM as `train` does (one line, exit 143), and an override `--save_only_model=true`
    reaches that line: such checkpoints cannot resume."""
    import os
    import signal

    from rlft.train import run

    setup = run._setup

    def terminated_setup(*args, **kwargs):
        # without rlft's handler the signal would end pytest itself
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None), "quickstart runs without its SIGTERM handler"
        os.kill(os.getpid(), signal.SIGTERM)
        return setup(*args, **kwargs)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run, "_setup", terminated_setup)
    assert cli("quickstart", "--max_steps=2", f"--save_only_model={str(weights_only).lower()}") == 143
    err = " ".join(capsys.readouterr().err.split())
    assert "error: stopped by SIGTERM" in err and "Traceback" not in err, err
    assert ("none can resume" in err) is weights_only and ("--resume_from_checkpoint=auto" in err) is not weights_only


def test_quickstart_refuses_a_config_without_held_out_rows(cli, capsys, tmp_path, tiny_model_dir):
    """The quickstart measures accuracy on test_datasets: a config without them gets the fix, not a traceback."""
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1=", "completion": "2"}\n' * 8)
    config = tmp_path / "sft.yaml"
    config.write_text(json.dumps({"base_model": str(tiny_model_dir), "datasets": [{"path": str(data)}]}))
    assert cli("quickstart", "--config", config) == 1
    err = capsys.readouterr().err
    assert "this config has none: add test_datasets" in err and f"rlft train {config}" in err and "Traceback" not in err
