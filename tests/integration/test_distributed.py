"""Several training processes on CPU (gloo), through the real launcher: `rlft train CONFIG --num-processes 2`.

The same global batch on 1 and on 2 processes (micro_batch_size x accumulation x processes) must give the
same losses, for plain data parallelism (DDP), FSDP2 and DeepSpeed ZeRO-2/3; checkpoints written by 2 processes
resume on 1; a run whose rank dies stops whole and resumes exactly; two "nodes" on localhost train like one.
These run SFT; test_distributed_methods.py runs GRPO, DPO and EBFT (two files, so that `make test` runs them side by
side).
"""

import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from distributed_utils import (FSDP, STRATEGIES, assert_same_evals, evals, free_port, losses, start, stop, train,
                               train_here, wait_for_lines, write)
from rlft.train.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


@pytest.fixture(scope="module")
def sft(tmp_path_factory, tiny_model_dir, addition_files):
    """An SFT config maker, and the 1-process run with 4 micro-batches of 8 per step: the reference."""
    folder = tmp_path_factory.mktemp("sft")

    def config(name: str, accumulation: int, **extra) -> Path:
        return write(folder / f"{name}.yaml", {
            "base_model": str(tiny_model_dir), "random_init": True, "datasets": [{"path": str(addition_files["train"])}],
            "sequence_len": 32, "micro_batch_size": 8, "gradient_accumulation_steps": accumulation, "max_steps": 10,
            "learning_rate": 3e-3, "warmup_steps": 1, "logging_steps": 1, "seed": 3, "output_dir": str(folder / name),
            "test_datasets": [{"path": str(addition_files["heldout"])}], "eval_steps": 5, **extra})

    train_here(config("one", 4))
    return config, losses(folder / "one"), folder


# DDP: test_prepared_data_is_written_by_the_nodes_first_process_and_read_by_the_other, the same run with its data prepared
@pytest.mark.parametrize("strategy", ["fsdp", "zero2", "zero3"])
def test_sft_two_processes_equal_one(sft, strategy, monkeypatch):
    config, expected, folder = sft
    extensions = folder / f"torch-extensions-{strategy}"  # DeepSpeed on a CPU compiles no op (its shm collectives: 45 s)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(extensions))
    out = train(config(strategy, 2, save_steps=5, **STRATEGIES[strategy]))
    assert not list(extensions.rglob("*.so")), list(extensions.rglob("*"))
    assert "8 micro x 2 accumulation x 2 process(es)" in out
    got = losses(folder / strategy)
    assert got.keys() == expected.keys() == set(range(1, 11))
    assert max(abs(got[s] - expected[s]) for s in got) < 1e-5, (got, expected)
    assert_same_evals(evals(folder / strategy), evals(folder / "one"))
    checkpoint = folder / strategy / "checkpoint-10"
    assert {p.name for p in checkpoint.glob("rng-*.pt")} == {"rng-0.pt", "rng-1.pt"}
    shards = "zero-*.safetensors" if strategy.startswith("zero") else "*.distcp"
    assert len(list((checkpoint / "optimizer").glob(shards))) == 2  # each process wrote its part
    assert json.loads((checkpoint / "trainer_state.json").read_text())["world_size"] == 2
    if strategy in ("fsdp", "zero3"):  # the sharded weights were gathered: the final model loads whole, with the trained values
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder / strategy)
        assert sum(p.numel() for p in model.parameters()) > 100_000


@pytest.mark.parametrize("strategy", ["fsdp", "zero2"])  # DDP writes through DCP as FSDP does
def test_async_saves_on_two_processes_write_what_sync_saves_write(sft, strategy):
    """save_mode: async on 2 processes: each writes its part on a background thread (its collectives on a gloo group of
    their own), and rank 0 renames the folder once both have. checkpoint-5, written while steps 6-10 train, holds what
    the synchronous run's does (the gathered weights, each process's optimizer shard and RNG), and the steps are the
    same."""
    config, _, folder = sft
    if not (folder / strategy / "checkpoint-10").exists():
        train(config(strategy, 2, save_steps=5, **STRATEGIES[strategy]))
    background = folder / f"{strategy}-async"
    train(config(background.name, 2, save_steps=5, save_mode="async", **STRATEGIES[strategy]))
    assert losses(background) == losses(folder / strategy)
    for step in (5, 10):
        written, expected = background / f"checkpoint-{step}", folder / strategy / f"checkpoint-{step}"
        names = {str(p.relative_to(written)) for p in written.rglob("*") if p.is_file()}
        assert names == {str(p.relative_to(expected)) for p in expected.rglob("*") if p.is_file()}
        assert {"rng-0.pt", "rng-1.pt"} <= names and len([n for n in names if n.endswith((".distcp", "safetensors"))
                                                          and n.startswith("optimizer/")]) == 2
        for name in names - {"trainer_state.json", "optimizer/.metadata"}:  # the step times and DCP's save id differ
            assert (written / name).read_bytes() == (expected / name).read_bytes(), name


def test_prepared_data_is_written_by_the_nodes_first_process_and_read_by_the_other(sft):
    """With dataset_prepared_path the first process of a node tokenises and writes the entry, the others wait for it
    and read it (tests/unit/test_cache.py tests the waiting); the run (DDP) trains and evaluates what one process does,
    and its checkpoint holds each process's RNG and optimizer part."""
    config, expected, folder = sft
    work = folder / "prepared-work"
    work.mkdir()
    # a transform that leaves the rows as they are and notes each process that prepares them
    (work / "counting.py").write_text("import os\n\ndef rows(cfg, dataset_idx=0):\n"
                                      "    with open('prepared-by.txt', 'a') as out:\n"
                                      "        out.write(os.environ.get('RANK', '0') + '\\n')\n"
                                      "    return lambda row: {'prompt': row['prompt'], 'completion': row['completion']}\n")
    base = yaml.safe_load(config("prepared", 2).read_text())
    dataset = {**base["datasets"][0], "type": "counting.rows"}
    out = train(config("prepared", 2, datasets=[dataset], dataset_prepared_path=str(folder / "prepared-data"), save_steps=5),
                cwd=work)
    assert (work / "prepared-by.txt").read_text().split() == ["0"]  # one process prepared; the other read its entry
    assert "8 micro x 2 accumulation x 2 process(es)" in out
    got = losses(folder / "prepared")
    assert got.keys() == expected.keys() == set(range(1, 11))
    assert max(abs(got[s] - expected[s]) for s in expected) < 1e-5
    assert_same_evals(evals(folder / "prepared"), evals(folder / "one"))
    checkpoint = folder / "prepared" / "checkpoint-10"
    assert {p.name for p in checkpoint.glob("rng-*.pt")} == {"rng-0.pt", "rng-1.pt"}
    assert len(list((checkpoint / "optimizer").glob("*.distcp"))) == 2  # each process wrote its part
    assert json.loads((checkpoint / "trainer_state.json").read_text())["world_size"] == 2
    entries = list((folder / "prepared-data").iterdir())
    assert len(entries) == 1 and (entries[0] / "reports.json").is_file(), entries


def test_a_streamed_run_on_two_processes_equals_one(sft, addition_files):
    """`pretraining_dataset`: every process reads every row, and each trains its share of the micro-batches one
    process trains in turn (rlft.data.stream): the 1-process losses and evaluations."""
    config, _, folder = sft
    corpus = folder / "sums.jsonl"
    rows = [json.loads(line) for line in addition_files["train"].read_text().splitlines()]
    corpus.write_text("".join(json.dumps({"text": row["prompt"] + row["completion"]}) + "\n" for row in rows))
    streamed = {"datasets": [], "pretraining_dataset": [{"path": str(corpus)}], "sample_packing": True,
                "streaming_multipack_buffer_size": 30, "max_steps": 6, "micro_batch_size": 2, "eval_steps": 3}
    train_here(config("streamed-one", 4, **streamed))
    out = train(config("streamed-two", 2, **streamed))
    assert "each of the 2 processes reads every row and trains its share" in " ".join(out.replace("│", " ").split())
    got, expected = losses(folder / "streamed-two"), losses(folder / "streamed-one")
    assert got.keys() == expected.keys() == set(range(1, 7))
    assert max(abs(got[s] - expected[s]) for s in got) < 1e-5, (got, expected)
    assert_same_evals(evals(folder / "streamed-two"), evals(folder / "streamed-one"))


@pytest.mark.parametrize("strategy", ["fsdp", "zero3"])
def test_lora_under_sharding_equals_one_process(sft, strategy):
    """Only the adapter trains; FSDP2 and ZeRO-3 shard frozen and trained weights alike; the saved adapter is gathered
    whole."""
    from safetensors.torch import load_file

    config, _, folder = sft
    lora = {"adapter": "lora", "lora_r": 8, "lora_alpha": 16, "lora_target_linear": True, "max_steps": 6}
    if not (folder / "lora-one" / "adapter_model.safetensors").exists():
        train_here(config("lora-one", 4, **lora))
    train(config(f"lora-{strategy}", 2, **lora, **STRATEGIES[strategy]))
    got, expected = losses(folder / f"lora-{strategy}"), losses(folder / "lora-one")
    assert got.keys() == expected.keys() == set(range(1, 7))
    assert max(abs(got[s] - expected[s]) for s in got) < 1e-5, (got, expected)
    one, two = (load_file(folder / name / "adapter_model.safetensors") for name in ("lora-one", f"lora-{strategy}"))
    assert sorted(one) == sorted(two) and all("lora_" in name for name in one)
    assert max(float((one[k] - two[k]).abs().max()) for k in one) < 1e-5


def test_qat_under_fsdp_equals_one_process(sft):
    """Axolotl's QAT examples train under FSDP2: torchao's fake-quantized layers sharded over 2 processes give the
    1-process losses (after a few steps a weight at a rounding boundary may round the other way: 2e-3)."""
    config, _, folder = sft
    qat = {"qat": {"activation_dtype": "int8", "weight_dtype": "int4", "group_size": 32}, "max_steps": 6}
    train_here(config("qat-one", 4, **qat))
    out = train(config("qat-fsdp", 2, **qat, **FSDP))
    assert "torchao fake quantization" in out
    got, expected = losses(folder / "qat-fsdp"), losses(folder / "qat-one")
    assert got.keys() == expected.keys() == set(range(1, 7))
    assert max(abs(got[s] - expected[s]) for s in range(1, 4)) < 1e-5, (got, expected)
    assert max(abs(got[s] - expected[s]) for s in got) < 2e-3, (got, expected)
    assert max(abs(got[s] - losses(folder / "one")[s]) for s in got) > 1e-4  # the rounding is on


@pytest.mark.parametrize("strategy, then", [("fsdp", "ddp"), ("zero3", "zero2")])
def test_sharded_checkpoint_resumes_on_one_process(sft, strategy, then):
    """Written by 2 FSDP (ZeRO-3) processes at step 5, continued by 1 process (twice the accumulation), the DeepSpeed
    one under ZeRO-2: the same steps 6-10. A DeepSpeed checkpoint does not resume without DeepSpeed, and says why."""
    import shutil

    config, expected, folder = sft
    source = folder / strategy / "checkpoint-5"
    if not source.exists():
        train(config(strategy, 2, save_steps=5, **STRATEGIES[strategy]))
    resumed = f"resumed-{strategy}"
    shutil.rmtree(folder / resumed, ignore_errors=True)
    (folder / resumed).mkdir()
    shutil.copytree(source, folder / resumed / "checkpoint-5")
    out = train(config(resumed, 4, resume_from_checkpoint="auto", **STRATEGIES[then]), processes=1)
    assert "written by 2 processes, continued by 1" in " ".join(out.split())
    got = losses(folder / resumed)
    assert set(got) == {6, 7, 8, 9, 10}
    assert max(abs(got[s] - expected[s]) for s in got) < 1e-5, (got, expected)
    if strategy == "zero3":
        refused = start(config("plain", 4, resume_from_checkpoint=str(source)), processes=1)
        output, _ = refused.communicate(timeout=120)
        assert refused.returncode == 1 and "Traceback" not in output, output[-3000:]
        assert "was written with DeepSpeed and this run is not under DeepSpeed" in " ".join(output.split())


def test_an_epoch_run_resumed_with_a_smaller_global_batch_ends_with_the_epoch(sft):
    """num_epochs: 1 over 12 micro-batches, written by 2 processes at step 2 (4 consumed), continued by 1 process with
    the same accumulation (half the global batch): the 8 micro-batches left take steps 3-10, and the run ends with
    the epoch, not 2 steps into the next one (the step count of one process from the start)."""
    import shutil

    config, _, folder = sft
    rows = folder / "rows.jsonl"
    source = Path(yaml.safe_load(config("probe", 1).read_text())["datasets"][0]["path"])
    rows.write_text("".join(source.read_text().splitlines(keepends=True)[:96]))
    epoch = {"datasets": [{"path": str(rows)}], "max_steps": None, "num_epochs": 1, "test_datasets": None,
             "eval_steps": None, "warmup_steps": 0}
    train(config("epoch-two", 1, save_steps=2, **epoch))
    assert set(losses(folder / "epoch-two")) == set(range(1, 7))
    shutil.rmtree(folder / "epoch-one", ignore_errors=True)
    (folder / "epoch-one").mkdir()
    shutil.copytree(folder / "epoch-two" / "checkpoint-2", folder / "epoch-one" / "checkpoint-2")
    out = " ".join(train(config("epoch-one", 1, resume_from_checkpoint="auto", **epoch), processes=1).split())
    assert "written by 2 processes, continued by 1" in out and "10 steps in all" in out, out[-3000:]
    metrics = [m for m in read_metrics(folder / "epoch-one" / "metrics.jsonl") if "loss" in m]
    assert [m["step"] for m in metrics] == list(range(3, 11))
    assert metrics[-1]["epoch"] == 1.0


def test_two_nodes_on_localhost(sft):
    """--nnodes 2, one process each, meeting at node 0's address: the same run as one process. DDP's options (Axolotl's
    ddp_* keys) change how gradients are reduced, not their values."""
    config, expected, folder = sft
    ddp = {"ddp_find_unused_parameters": True, "ddp_bucket_cap_mb": 1, "ddp_broadcast_buffers": False}
    path, port = config("nodes", 2, **ddp), str(free_port())
    nodes = [start(path, "--num-processes", "2", "--nnodes", "2", "--node-rank", str(rank), "--main-process-ip",
                   "127.0.0.1", "--main-process-port", port, processes=1) for rank in (0, 1)]
    try:
        outputs = [node.communicate(timeout=300)[0] for node in nodes]
    finally:
        for node in nodes:
            stop(node)
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    plan = "".join(c for c in outputs[0] if not c.isspace() and c not in "│|")
    assert "2:dataparallel(DDP:looksforunusedparameters,1MiBgradientbuckets,nobufferbroadcast)" in plan, outputs[0]
    got = losses(folder / "nodes")
    assert max(abs(got[s] - expected[s]) for s in got) < 1e-5, (got, expected)


def test_a_vision_tower_without_gradients_needs_ddp_find_unused_parameters(tmp_path, addition_files):
    """AutoModelForCausalLM loads a Gemma 3 checkpoint with its vision tower, which text-only rows never reach: DDP
    stops at the second step and names the key (as Axolotl's Gemma 3 examples set it), and with the key it trains."""
    from transformers import Gemma3Config, SiglipVisionConfig
    from transformers.models.gemma3 import Gemma3TextConfig

    from rlft.data.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    text = Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16, pad_token_id=tokenizer.pad_token_id,
                            eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    vision = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                image_size=28, patch_size=14)
    Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4).save_pretrained(tmp_path / "gemma3")
    tokenizer.save_pretrained(tmp_path / "gemma3")
    runs = {}
    for find in (False, True):
        path = write(tmp_path / f"find-{find}.yaml", {
            "base_model": str(tmp_path / "gemma3"), "random_init": True, "datasets": [{"path": str(addition_files["train"])}],
            "sequence_len": 32, "micro_batch_size": 4, "max_steps": 3, "learning_rate": 1e-3, "seed": 0,
            "output_dir": str(tmp_path / f"out-{find}"), **({"ddp_find_unused_parameters": True} if find else {})})
        process = start(path)
        try:
            runs[find] = (process.communicate(timeout=300)[0], process.returncode)
        finally:
            stop(process)
    out, code = runs[False]
    assert code == 1 and "Traceback" not in out, out[-4000:]
    assert "got no gradient in the last step" in out and "set ddp_find_unused_parameters: true" in out, out[-4000:]
    assert "(PyTorch: parameter indices which did not receive grad for rank 0: " in " ".join(out.split()), out[-4000:]
    out, code = runs[True]
    assert code == 0, out[-4000:]
    assert len(losses(tmp_path / "out-True")) == 3


def test_a_rank_that_dies_stops_the_run_and_it_resumes_exactly(sft):
    """Rank 1 is killed mid-run: the run stops as a whole, saying which rank failed; no partial checkpoint is left,
    and `auto` resumes from the last whole one with the losses of an uninterrupted run (constant learning rate: the
    schedule does not depend on max_steps; the uninterrupted run is the same global batch on one process, which
    test_sft_two_processes_equal_one shows trains what two do)."""
    import psutil

    from rlft.train.checkpoint import checkpoint_problem

    config, _, folder = sft
    constant = {"lr_scheduler": "constant", "warmup_steps": 0, "save_steps": 2}
    process = start(config("killed", 2, max_steps=1000, **constant))
    try:
        deadline = time.time() + 240
        saved = lambda: [int(p.name.split("-")[1]) for p in (folder / "killed").glob("checkpoint-*")]  # noqa: E731
        while time.time() < deadline and max(saved(), default=0) < 4:  # (checkpoint-4 itself may be pruned meanwhile)
            time.sleep(0.2)
        assert max(saved(), default=0) >= 4, "no checkpoint-4 or later in time"
        rank1 = [p for p in psutil.Process(process.pid).children(recursive=True) if p.environ().get("RANK") == "1"]
        assert rank1, "rank 1 not found"
        rank1[0].kill()
        output, _ = process.communicate(timeout=120)  # the others stop too, long before the run's end
    finally:
        stop(process)
    assert process.returncode != 0
    assert "rank      : 1" in output and "the training processes" in output, output[-3000:]
    # rank 0 says once why it stopped, in one line, whichever came first: the broken collective or the launcher's SIGTERM
    said = [line for line in output.splitlines() if line.startswith("error (rank 0 of 2):")]
    assert len(said) == 1 and ("another training process stopped first" in said[0] or "stopped by SIGTERM" in said[0]), \
        output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    # killed mid-save, a .tmp-checkpoint-N may be left: never a checkpoint-N that is not whole
    saved = list((folder / "killed").glob("checkpoint-*"))
    assert saved and all(checkpoint_problem(p) is None for p in saved)
    done = max(int(p.name.split("-")[1]) for p in saved)
    assert 4 <= done < 1000
    train(config("killed", 2, max_steps=done + 3, resume_from_checkpoint="auto", **constant))
    assert not list((folder / "killed").glob(".tmp-checkpoint-*"))  # removed at the start
    train_here(config("straight", 4, max_steps=done + 3, **constant))
    first, second = losses(folder / "straight"), losses(folder / "killed")
    for step in range(done + 1, done + 4):
        assert abs(first[step] - second[step]) < 1e-5, (step, first[step], second[step])


def test_sigterm_to_the_command_alone_stops_every_process(sft):
    """`kill PID` of `rlft train --num-processes 2` (not its process group): the launcher gets the SIGTERM and stops
    both ranks, each says so in one line, the command exits 143, and no process of the run is left."""
    import psutil

    config, _, folder = sft
    process = start(config("sigterm", 2, max_steps=100000))
    try:
        wait_for_lines(folder / "sigterm" / "metrics.jsonl", 3)
        ranks = psutil.Process(process.pid).children(recursive=True)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=120)
        _, alive = psutil.wait_procs(ranks, timeout=30)
    finally:
        stop(process)
    assert process.returncode == 143, output[-3000:]
    assert not alive, alive
    for rank in (0, 1):
        assert output.count(f"error (rank {rank} of 2): stopped by SIGTERM") == 1, output[-3000:]
    assert "error: stopped by SIGTERM" in output and "Traceback" not in output, output[-3000:]


def test_ctrl_c_stops_every_process_after_the_same_step_with_a_checkpoint(sft):
    """Ctrl-C reaches the launcher and every process; they agree on the step to stop after and save together."""
    from rlft.train.checkpoint import checkpoint_problem

    config, _, folder = sft
    process = start(config("ctrl-c", 2, max_steps=100000))
    try:
        wait_for_lines(folder / "ctrl-c" / "metrics.jsonl", 3)
        os.killpg(process.pid, signal.SIGINT)
        output, _ = process.communicate(timeout=120)
    finally:
        stop(process)
    assert process.returncode == 130, output[-3000:]
    saved = [p for p in (folder / "ctrl-c").glob("checkpoint-*")]
    assert len(saved) == 1 and checkpoint_problem(saved[0]) is None
    assert f"checkpoint saved to {saved[0]}" in " ".join(output.split())
    assert output.count("interrupted at step") == 1  # said once, by rank 0


def test_missing_fsdp_layer_class_names_the_models_layers(sft, cli, capsys):
    """Checked on the model's meta-device copy before any process starts, so said once and at once."""
    config, _, _ = sft
    path = config("badwrap", 2, fsdp=["full_shard", "auto_wrap"],
                  fsdp_config={"fsdp_transformer_layer_cls_to_wrap": "Qwen2DecoderLayer"})
    assert cli("train", path, "--num-processes", "2") == 1
    err = capsys.readouterr().err
    assert "Qwen2DecoderLayer is not a layer of LlamaForCausalLM; its layer classes: LlamaDecoderLayer" in err
    assert not (path.parent / "badwrap").exists()  # nothing started


def test_under_fsdp_the_final_model_is_the_best_checkpoint(sft):
    """load_best_model_at_end on 2 processes (tests/integration/test_cli_best_model.py: one): one row trained on and
    held-out sums evaluated, so eval/loss dips; the evaluation is split and gathered, so both processes agree on the
    best, and the final model is its gathered weights. A PiSSA adapter's too: checkpoints hold it converted to load on
    the original base, so the best one is copied as it is."""
    from safetensors.torch import load_file

    from rlft.tasks.addition import write_jsonl

    config, _, folder = sft
    write_jsonl([{"prompt": "1+1=", "completion": "2"}] * 64, folder / "one-row.jsonl")
    overfit = {"datasets": [{"path": str(folder / "one-row.jsonl")}], "max_steps": 8, "learning_rate": 1e-2,
               "lr_scheduler": "constant", "eval_steps": 2, "save_steps": 2, "save_total_limit": 1,
               "load_best_model_at_end": True, **FSDP}
    output = train(config("best-fsdp", 1, **overfit))
    out = folder / "best-fsdp"
    scores = {step: values["eval/loss"] for step, values in evals(out).items()}
    best = min((2, 4, 6, 8), key=scores.get)
    assert best != 8 and f"checkpoint-{best}:besteval/loss" in "".join(output.split()).replace("│", "")  # the summary
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{best}", "checkpoint-8"]
    final, chosen = load_file(out / "model.safetensors"), load_file(out / f"checkpoint-{best}" / "model" / "model.safetensors")
    assert final.keys() == chosen.keys() and all((final[k] == chosen[k]).all() for k in final)

    train(config("pissa-fsdp", 1, **overfit, adapter="lora", lora_r=4, lora_alpha=8, lora_target_linear=True,
                 peft_init_lora_weights="pissa"))
    out = folder / "pissa-fsdp"
    scores = {step: values["eval/loss"] for step, values in evals(out).items()}
    best = min((2, 4, 6, 8), key=scores.get)
    assert best != 8
    final = load_file(out / "adapter_model.safetensors")
    chosen = load_file(out / f"checkpoint-{best}" / "model" / "adapter_model.safetensors")
    assert final.keys() == chosen.keys() and all((final[k] == chosen[k]).all() for k in final)
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 8  # converted: twice the rank
    assert (out / f"checkpoint-{best}" / "adapter-as-trained" / "adapter_model.safetensors").exists()
