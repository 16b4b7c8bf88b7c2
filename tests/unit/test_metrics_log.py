"""metrics.jsonl stays usable: strict JSON (a non-finite value is null, named under `nonfinite`), and a resumed run
drops what was logged after its checkpoint instead of repeating those steps."""

from __future__ import annotations

import json
import math

from rlft.train.metrics import MetricsLog, read_metrics


def _strict(path):
    return [json.loads(line, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
            for line in path.read_text().splitlines()]


def test_non_finite_values_are_written_as_null_and_named(config, tmp_path):
    log = MetricsLog(config(), tmp_path)
    log.write(1, {"loss": math.nan, "grad_norm": math.inf, "reward": -math.inf, "tokens": 12, "ok": True})
    log.write(2, {"loss": 0.5})
    first, second = _strict(tmp_path / "metrics.jsonl")
    assert first == {"step": 1, "loss": None, "grad_norm": None, "reward": None, "tokens": 12, "ok": True,
                     "nonfinite": ["loss", "grad_norm", "reward"]}
    assert second == {"step": 2, "loss": 0.5}  # on file as each write returns, the log still open
    log.close_file()
    log.write(3, {"loss": 0.25})  # a line after the file was closed opens it again, appending
    log.close()
    assert [m["step"] for m in _strict(tmp_path / "metrics.jsonl")] == [1, 2, 3]


def test_truncate_after_keeps_the_checkpoint_step_and_drops_later_and_cut_lines(config, tmp_path):
    log = MetricsLog(config(), tmp_path)
    for step in (0, 1, 2, 3, 4, 5):
        log.write(step, {"loss": float(step)})
    with open(log.path, "a") as handle:
        handle.write('{"step": 6, "lo')  # killed mid-write
    log.truncate_after(3)
    assert [m["step"] for m in read_metrics(log.path)] == [0, 1, 2, 3]
    log.write(4, {"loss": 4.5})
    assert [(m["step"], m["loss"]) for m in read_metrics(log.path)][-2:] == [(3, 3.0), (4, 4.5)]
    log.truncate_after(10)  # nothing after: the file is left as it is
    assert len(read_metrics(log.path)) == 5
    log.close()


def test_phase_times_wait_for_the_gpu_once_cuda_is_in_use(monkeypatch):
    """CUDA kernels run asynchronously: a phase's clock reads wait for the queued work (torch.cuda.synchronize) at its
    start and end, so its GPU time is its own; on a CPU, or before CUDA is initialised, nothing waits."""
    import time

    import torch

    from rlft.train import metrics

    waits = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: waits.append(time.perf_counter()))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    timer = metrics.PhaseTimer()
    with timer("forward_backward"):
        pass
    assert waits == []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with timer("forward_backward"):
        time.sleep(0.01)
    assert len(waits) == 2 and waits[1] - waits[0] >= 0.01
    assert timer.pop()["time/forward_backward"] >= 0.01


def test_mfu_counts_an_input_embedding_only_when_the_output_layer_uses_it():
    """N for MFU: an input embedding is a lookup (no FLOPs), so an untied one is left out; a tied one is the output
    layer's weight and counts once. N_trainable follows requires_grad."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlft.train.metrics import flop_parameters

    def model(tied: bool):
        torch.manual_seed(0)
        return LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                            num_key_value_heads=1, intermediate_size=32, tie_word_embeddings=tied))

    tied, untied = model(True), model(False)
    everything = sum(p.numel() for p in untied.parameters())
    assert flop_parameters(untied) == (everything - 100 * 16, everything - 100 * 16)
    assert flop_parameters(tied) == (sum(p.numel() for p in tied.parameters()),) * 2 == (everything - 100 * 16,) * 2
    untied.model.layers.requires_grad_(False)
    frozen = sum(p.numel() for p in untied.model.layers.parameters())
    assert flop_parameters(untied) == (everything - 1600, everything - 1600 - frozen)


def test_a_step_line_is_written_whole_as_rich_would_print_it():
    """`plain_line` writes what rich's `print` writes for the line (markup, highlighting, emoji and wrapping off) on a
    console that is no terminal, also past the console's width; a quiet console writes nothing, a recording one records."""
    import io

    from rich.console import Console

    from rlft.train.metrics import plain_line

    line = "step 3/40 | loss 0.6931 | lr 5.00e-04 | 12345 tok/s | grad_norm 0.123 [bold]not markup[/] :smile: " + "x" * 120
    printed, plain = Console(file=io.StringIO(), width=60), Console(file=io.StringIO(), width=60)
    printed.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)
    plain_line(plain, line)
    assert plain.file.getvalue() == printed.file.getvalue() == line + "\n"
    quiet = Console(file=io.StringIO(), quiet=True)
    plain_line(quiet, line)
    assert quiet.file.getvalue() == ""
    recording = Console(file=io.StringIO(), record=True, width=60)
    plain_line(recording, line)
    assert recording.export_text() == line + "\n"
