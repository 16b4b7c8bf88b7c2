"""Streamed SFT through the real CLI: `pretraining_dataset` (Axolotl's streaming pretraining) and `streaming: true`."""

import json

from rlft.train.metrics import read_metrics


def _addition_text(path, rows):
    """Addition sums as raw text, one per row ("12+34=46"): what the held-out addition rows test."""
    lines = [json.loads(line) for line in rows.read_text().splitlines()]
    path.write_text("".join(json.dumps({"text": f"{row['prompt']}{row['completion']}", "id": i}) + "\n"
                            for i, row in enumerate(lines)))
    return path


def _evals(out):
    return [m["eval/loss"] for m in read_metrics(out / "metrics.jsonl") if "eval/loss" in m]


def test_pretraining_from_a_stream_learns_and_says_how_it_reads(make_config, cli, addition_files, tmp_path, capsys):
    corpus = _addition_text(tmp_path / "sums.jsonl", addition_files["train"])
    config = make_config(datasets=[], pretraining_dataset=[{"path": str(corpus), "type": "pretrain", "text_column": "text"}],
                         test_datasets=[{"path": str(addition_files["heldout"])}], sample_packing=True,
                         streaming_multipack_buffer_size=500, max_steps=60, eval_steps=30, micro_batch_size=4,
                         logging_steps=10)
    assert cli("train", config) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())  # the plan's table, its cells' lines joined
    assert "streamed / 64" in out and "60 (max_steps: a stream has no epochs, packed rows)" in out
    assert "500 rows read at a time, packed into rows of 32 tokens, shuffled within each buffer" in out
    evals = _evals(tmp_path / "out")
    assert len(evals) == 3 and evals[-1] < 0.6 * evals[0], evals  # the held-out sums, before and after
    state = json.loads((tmp_path / "out" / "checkpoint-60" / "trainer_state.json").read_text())
    stream = state["recipe_state"]["stream"]
    assert stream["counts"]["rows"] >= 500 and stream["counts"]["dropped"] == 0, stream
    steps = [m for m in read_metrics(tmp_path / "out" / "metrics.jsonl") if "loss" in m]
    assert all("time/data" in m and "time/prepare" not in m for m in steps)  # reading the stream is the data phase


def test_streaming_true_reads_an_axolotl_sft_dataset_as_it_trains(make_config, cli, tmp_path, capsys):
    """Axolotl's examples/streaming/sft.yaml shape: alpaca rows, `streaming: true`, packing, a buffer size."""
    from rlft.models.tiny import write_tiny_model

    model = write_tiny_model(tmp_path / "model", "XS", max_positions=512)  # alpaca's prompt is 200 bytes
    rows = tmp_path / "alpaca.jsonl"
    rows.write_text("".join(json.dumps({"instruction": "Add the numbers.", "input": f"{a} {b}", "output": str(a + b)}) + "\n"
                            for a in range(20) for b in range(20)))
    config = make_config(base_model=str(model), datasets=[{"path": str(rows), "type": "alpaca"}], streaming=True,
                         sample_packing=True, sequence_len=512, streaming_multipack_buffer_size=100, max_steps=24,
                         micro_batch_size=2)
    assert cli("train", config, "--debug") == 0
    losses = [m["loss"] for m in read_metrics(tmp_path / "out" / "metrics.jsonl") if "loss" in m]
    assert len(losses) == 24 and sum(losses[-3:]) < 0.7 * sum(losses[:3]), losses
    assert cli("preprocess", config, "--debug") == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "its first 100 rows (streaming_multipack_buffer_size): 100 kept, 0 dropped, 0 truncated" in out


def test_a_wrong_column_stops_before_the_model_loads_and_a_switch_to_streaming_on_resume_is_said(
        make_config, cli, addition_files, tmp_path, capsys):
    corpus = _addition_text(tmp_path / "sums.jsonl", addition_files["train"])
    wrong = make_config(datasets=[], pretraining_dataset=[{"path": str(corpus), "text_column": "body"}])
    assert cli("train", wrong) == 1
    captured = capsys.readouterr()
    assert "line 1: no text in column 'body' (the row's columns: id, text); set text_column" in " ".join(captured.err.split())
    assert "rlft train: sft" not in captured.out  # no plan: the model was never loaded
    assert cli("train", make_config(max_steps=2, save_steps=2)) == 0  # rows read whole
    streamed = make_config(datasets=[], pretraining_dataset=[{"path": str(corpus)}], max_steps=4, save_steps=2,
                           resume_from_checkpoint="auto")
    capsys.readouterr()
    assert cli("train", streamed) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "the checkpoint was written by a run that did not stream its data: the stream starts at its first row" in out
