"""SFT through the real CLI: held-out loss falls, outputs are complete and loadable."""

import json
import re
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlft.config.settings.model import model_settings
from rlft.train.metrics import read_metrics

pytestmark = pytest.mark.slow

STEP_KEYS = {"loss", "learning_rate", "grad_norm", "tokens_per_s", "step_time_s", "mfu", "peak_memory_mb",
             "time/forward_backward", "time/optimizer", "time/data", "epoch", "tokens"}


def test_sft_learns_addition_and_writes_everything(make_config, cli, addition_files, tmp_path, capsys):
    config = make_config(max_steps=60, micro_batch_size=32, eval_steps=20, save_steps=20, save_total_limit=2,
                         logging_steps=10, test_datasets=[{"path": str(addition_files["heldout"])}])
    assert cli("train", config) == 0
    out = tmp_path / "out"
    metrics = read_metrics(out / "metrics.jsonl")
    evals = [m["eval/loss"] for m in metrics if "eval/loss" in m]
    assert [m["step"] for m in metrics if "eval/loss" in m] == [0, 20, 40, 60]  # baseline, periodic, final
    assert evals[0] > 4.0  # random init: about ln(260) = 5.6 nats per token
    assert evals[-1] < 0.4 * evals[0], evals
    assert evals[-1] < evals[1]
    logged = [m for m in metrics if "loss" in m]
    assert [m["step"] for m in logged] == [10, 20, 30, 40, 50, 60]
    assert STEP_KEYS <= set(logged[-1])
    assert all(m["tokens_per_s"] > 0 and 0 < m["mfu"] < 1 for m in logged)

    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-40", "checkpoint-60"]  # save_total_limit
    state = json.loads((out / "checkpoint-60" / "trainer_state.json").read_text())
    assert state["global_step"] == 60
    model = AutoModelForCausalLM.from_pretrained(out)  # the final model loads with plain transformers
    assert model.config.hidden_size == 64

    printed = capsys.readouterr().out
    assert "effective batch" in printed and "32 = 32 micro x 1 accumulation" in printed
    assert "checkpoint-60" in printed and "final loss" in printed
    # the plan and the summary name MFU's peak and where it came from: on a CPU, this machine's matmul probe (this
    # start's, or the best an earlier start measured, read from the cache)
    flat = " ".join(printed.replace("│", " ").split())
    probe = r"[\d.]+ TFLOP/s fp32 per device \((measured by a|the best a) matmul probe"
    assert re.search(rf"MFU peak {probe}", flat) and re.search(rf"mean MFU [\d.e-]+ against {probe}", flat), flat


def test_input_output_rows_learn_their_trained_segments(make_config, cli, addition_files, tmp_path):
    """Axolotl's template-free rows (`type: input_output`) through the CLI: the sums' answers, the only trained
    segments, are learnt (held-out loss on them falls well below the random-init baseline)."""
    def segments(source, target):
        rows = [json.loads(line) for line in source.read_text().splitlines()]
        target.write_text("".join(json.dumps({"segments": [{"text": r["prompt"], "label": False},
                                                            {"text": r["completion"] + "\n", "label": True}]}) + "\n"
                                  for r in rows))
        return {"path": str(target), "type": "input_output"}

    config = make_config(max_steps=40, micro_batch_size=32, eval_steps=40, logging_steps=10,
                         datasets=[segments(addition_files["train"], tmp_path / "train.jsonl")],
                         test_datasets=[segments(addition_files["heldout"], tmp_path / "heldout.jsonl")])
    assert cli("train", config) == 0
    evals = [m["eval/loss"] for m in read_metrics(tmp_path / "out" / "metrics.jsonl") if "eval/loss" in m]
    assert len(evals) == 2 and evals[-1] < 0.5 * evals[0], evals


def test_sample_packing_trains(make_config, cli, tmp_path):
    assert cli("train", make_config(sample_packing=True, sequence_len=64, micro_batch_size=2, max_steps=3)) == 0
    logged = [m for m in read_metrics(tmp_path / "out" / "metrics.jsonl") if "loss" in m]
    # packed rows hold several 7-10 token documents each
    assert logged[0]["tokens"] > 2 * 20


def test_lora_checkpoint_generates_and_merges(make_config, cli, tmp_path, capsys):
    config = make_config(adapter="lora", lora_r=4, lora_alpha=8, lora_target_modules=["q_proj", "v_proj"], max_steps=3)
    assert cli("train", config) == 0
    out = tmp_path / "out"
    assert (out / "adapter_model.safetensors").exists() and not (out / "model.safetensors").exists()
    capsys.readouterr()
    assert cli("generate", out, "--prompt", "1+2=", "--max-new-tokens", "3") == 0
    assert "1+2=" in capsys.readouterr().out
    for flags, words in ((("--num-samples", "2"), "same answer 2 times: add --temperature 0.8"),
                         (("--max-new-tokens", "0"), "--max-new-tokens 0: give at least 1"),
                         (("--top-p", "0"), "top-p in (0, 1]")):  # transformers' tracebacks before
        assert cli("generate", out, "--prompt", "1+2=", *flags) == 1
        assert words in capsys.readouterr().err
    assert cli("merge-lora", out / "checkpoint-3", tmp_path / "merged") == 0
    capsys.readouterr()
    assert cli("merge-lora", out / "checkpoint-3", tmp_path / "merged") == 1  # an existing output is not overwritten
    assert "exists and is not empty" in capsys.readouterr().err
    assert cli("merge-lora", out / "checkpoint-3", tmp_path / "merged", "--force") == 0
    _assert_merged_is_the_adapter(out, tmp_path / "merged", "12+7=")


def test_revision_of_model_trains_that_revision_and_the_adapter_names_it(make_config, cli, tmp_path, two_revisions):
    """base_model as a hub id in the local cache, at tag v2 (1 layer; main has 2): the model, its config and its
    tokenizer come from v2's snapshot, and the saved adapter's base is that snapshot; a local folder is refused."""
    main, v2 = two_revisions
    config = make_config(base_model="someorg/tiny", revision_of_model="v2", random_init=False, max_steps=2, adapter="lora",
                         lora_r=4, lora_alpha=8, lora_target_modules=["q_proj", "v_proj"])
    assert cli("train", config) == 0
    out = tmp_path / "out"
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(v2)
    assert AutoTokenizer.from_pretrained(out).chat_template == "{{ 'revision v2' }}"  # v2's tokenizer, not main's
    peft_model, _ = _assert_merged_is_the_adapter(out, _merged(cli, out, tmp_path), "12+7=")
    assert peft_model.config.num_hidden_layers == 1
    assert cli("train", make_config(base_model=str(main), revision_of_model="v2")) == 1


def _merged(cli, out, tmp_path):
    assert cli("merge-lora", out, tmp_path / "merged") == 0
    return tmp_path / "merged"


def _assert_merged_is_the_adapter(out, merged_dir, prompt):
    """`rlft merge-lora`'s model gives the logits of the adapter loaded on its base."""
    from rlft.models.loading import load_for_inference

    peft_model, tokenizer = load_for_inference(str(out))
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(peft_model(ids).logits, merged(ids).logits, atol=1e-5, rtol=1e-4)
    return peft_model, tokenizer


def test_lora_on_moe_experts_trains_only_the_experts_adapters_and_merges(make_config, cli, tmp_path, tiny_moe_dir):
    """Axolotl's MoE examples adapt the experts with lora_target_parameters (transformers 5 holds each layer's experts
    in one 3D tensor, which no module name reaches): PEFT's LoRA on parameters, saved, loaded and merged."""
    from safetensors.torch import load_file

    config = make_config(base_model=str(tiny_moe_dir), adapter="lora", lora_r=4, lora_alpha=8, learning_rate=0.05, max_steps=20,
                         lora_target_parameters=["experts.gate_up_proj", "experts.down_proj"], eval_steps=None)
    assert cli("train", config) == 0
    out = tmp_path / "out"
    trained = [m["loss"] for m in read_metrics(out / "metrics.jsonl") if "loss" in m]
    assert trained[-1] < trained[0] - 0.25, trained  # from random weights, the experts alone: 5.58 to 5.23
    names = list(load_file(out / "adapter_model.safetensors"))
    assert names and all(".experts." in name for name in names), names  # the experts' adapters, nothing else
    assert {name.split(".experts.")[1].split(".")[0] for name in names} >= {"lora_A", "base_layer"}
    assert cli("merge-lora", out / "checkpoint-20", tmp_path / "merged") == 0
    _assert_merged_is_the_adapter(out, tmp_path / "merged", "12+7=")


def test_a_lora_run_that_resized_the_embeddings_loads_for_generation_and_merges(make_config, cli, tmp_path, capsys):
    """tokens: and resize_token_embeddings_to_32x grow the embeddings; PEFT saves them with the adapter, and the base
    is grown to match before the adapter loads (a size mismatch before)."""
    config = make_config(adapter="lora", lora_r=4, lora_alpha=8, lora_target_modules=["q_proj", "v_proj"], max_steps=2,
                         tokens=["<|calc|>"], resize_token_embeddings_to_32x=True, eval_steps=None)
    assert cli("train", config) == 0
    out = tmp_path / "out"
    capsys.readouterr()
    assert cli("generate", out, "--prompt", "<|calc|>1+2=", "--max-new-tokens", "2") == 0
    assert "1+2=" in capsys.readouterr().out
    assert cli("merge-lora", out / "checkpoint-2", tmp_path / "merged") == 0
    model, tokenizer = _assert_merged_is_the_adapter(out, tmp_path / "merged", "<|calc|>12+7=")
    assert model.get_input_embeddings().num_embeddings == -(-len(tokenizer) // 32) * 32 > len(tokenizer) - 1


@pytest.mark.parametrize("init, extra", [("gaussian", {}), ("pissa", {}), ("olora", {}),
                                         ("pissa_niter_2", {"lora_modules_to_save": ["lm_head"], "save_mode": "async"})])
def test_lora_init_options_give_adapters_that_load_on_the_original_base(make_config, cli, tmp_path, init, extra):
    """The final model and every checkpoint's model/ load as they are on the untouched base and give the trained model
    (PiSSA and OLoRA adapters converted to plain LoRAs, modules_to_save kept; checkpoint-2 written in the background
    for the last); a resume continues the same run."""
    from transformers import set_seed

    from rlft.config import load_config
    from rlft.models.base_changing import resume_weights
    from rlft.models.loading import load_for_inference, load_model, load_tokenizer
    from rlft.train.checkpoint import load_weights

    settings = dict(adapter="lora", lora_r=4, lora_alpha=8, lora_target_linear=True, peft_init_lora_weights=init,
                    max_steps=4, save_steps=2, eval_steps=None, **extra)
    config = make_config(**settings)
    assert cli("train", config) == 0
    out = tmp_path / "out"
    cfg = load_config(config)
    tokenizer = load_tokenizer(model_settings(cfg))
    ids = tokenizer("12+7=", return_tensors="pt")["input_ids"]
    for step, folder in ((2, out / "checkpoint-2" / "model"), (4, out)):
        set_seed(cfg.seed)  # as `rlft train` does before the model is built: the same (randomised) init
        trained = load_model(model_settings(cfg), tokenizer, "cpu", init_base_dir=out / "init-base")  # base + init, then trained weights
        load_weights(trained, resume_weights(out / f"checkpoint-{step}"))
        loaded, _ = load_for_inference(str(folder))  # what a user loads: the base from disk + the saved adapter
        with torch.no_grad():
            torch.testing.assert_close(loaded(ids).logits, trained.eval()(ids).logits, atol=1e-4, rtol=1e-4)
    # portable: a plain LoRA on the untouched base (vLLM and merges do not run PiSSA/OLoRA init again)
    saved = json.loads((out / "adapter_config.json").read_text())
    assert saved["init_lora_weights"] in (True, "gaussian")
    assert saved["r"] == (4 if init == "gaussian" else 8)  # the conversion doubles the rank
    assert (out / "checkpoint-2" / "adapter-as-trained").is_dir() == (init != "gaussian")
    # resumed from checkpoint-2 (the adapter as trained, on the residual base rebuilt from the seed): the same steps
    resumed = tmp_path / "resumed"
    shutil.copytree(out / "checkpoint-2", resumed / "checkpoint-2")
    assert cli("train", make_config(**settings, output_dir=str(resumed)), "--resume_from_checkpoint=auto") == 0
    losses = [[m["loss"] for m in read_metrics(folder / "metrics.jsonl") if "loss" in m] for folder in (out, resumed)]
    assert losses[1] == pytest.approx(losses[0][2:], abs=1e-6)


def test_gradient_checkpointing_gives_the_same_losses(make_config, cli, tmp_path):
    losses = []
    for flag in (False, True):
        out = tmp_path / f"gc-{flag}"
        assert cli("train", make_config(output_dir=str(out), gradient_checkpointing=flag, max_steps=3)) == 0
        losses.append([m["loss"] for m in read_metrics(out / "metrics.jsonl") if "loss" in m])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_activation_offloading_trains_the_same_steps(make_config, cli, tmp_path, monkeypatch, capsys):
    """On a CPU nothing moves and the plan says so. With the offload made to run here (the layers' inputs copied out by
    a stand-in for `save_on_cpu`, which pins memory and needs an accelerator), the run trains the same losses."""
    import torch

    from rlft.models import checkpointing

    def run(name: str) -> list[float]:
        out = tmp_path / name
        assert cli("train", make_config(output_dir=str(out), gradient_checkpointing=True, max_steps=3,
                                        activation_offloading=name != "kept")) == 0
        return [m["loss"] for m in read_metrics(out / "metrics.jsonl") if "loss" in m]

    kept, on_cpu = run("kept"), run("cpu")
    assert "activation_offloading: without a CUDA GPU nothing is moved" in " ".join(capsys.readouterr().out.split())
    copies = []

    def copying(pin_memory=False, device_type="cuda"):
        return torch.autograd.graph.saved_tensors_hooks(lambda t: copies.append(t.shape) or t.clone(), lambda t: t)

    monkeypatch.setattr("transformers.modeling_utils.save_on_cpu", copying)
    monkeypatch.setattr("rlft.models.loading.enable_checkpointing",
                        lambda model, cfg, device_type: checkpointing.enable_checkpointing(model, cfg, "cuda"))
    offloaded = run("offloaded")
    assert copies and len(kept) == 3
    assert on_cpu == kept and offloaded == kept


def test_a_step_the_fp16_scaler_skipped_leaves_the_schedule_where_it_was(make_config, cli, tmp_path, monkeypatch):
    """A step that fp16's loss scaler skipped (overflow) does not advance the learning-rate schedule, as in
    transformers' Trainer: the next step trains at the same rate. (fp16 needs a GPU; the skip is reported here as
    accelerate's optimizer reports it, `tests/unit/test_optim.py`.)"""
    from rlft.train import trainer

    rates = {}
    for skip in (False, True):
        calls = []
        monkeypatch.setattr(trainer, "step_was_skipped", lambda optimizer: calls.append(1) or (skip and len(calls) == 2))
        out = tmp_path / f"skip-{skip}"
        assert cli("train", make_config(output_dir=str(out), max_steps=4, warmup_steps=0, lr_scheduler="linear")) == 0
        rates[skip] = [m["learning_rate"] for m in read_metrics(out / "metrics.jsonl") if "loss" in m]
    assert rates[False] == sorted(rates[False], reverse=True) and len(set(rates[False])) == 4  # linear decay
    assert rates[True] == [rates[False][0], rates[False][1], rates[False][1], rates[False][2]]  # step 2 skipped


@pytest.mark.compile
def test_torch_compile_trains_the_same_losses(make_config, cli, tmp_path, capsys):
    """Axolotl's `torch_compile: true`: the forward is compiled (its first step pays for it), and the run trains
    what the eager run trains."""
    from torch._dynamo.utils import counters

    runs, graphs = {}, {}
    for flag in (False, True):
        out = tmp_path / f"compile-{flag}"
        counters.clear()
        assert cli("train", make_config(output_dir=str(out), torch_compile=flag, max_steps=3, eval_steps=None)) == 0
        runs[flag] = [m for m in read_metrics(out / "metrics.jsonl") if "loss" in m]
        graphs[flag] = counters["stats"]["unique_graphs"]
    assert graphs[False] == 0 and graphs[True] > 0, graphs  # the compiled run did go through dynamo
    flat = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert flat.count("the first steps compile") == 1, flat  # said once, in the plan's compile row
    assert ("compile rlft's torch.compile of the training forward (torch_compile: true; inductor, mode default); the first "
            "steps compile (seconds to a minute), then run faster") in flat, flat
    assert [m["loss"] for m in runs[True]] == pytest.approx([m["loss"] for m in runs[False]], abs=1e-4)


@pytest.mark.parametrize("flag", [pytest.param(True, marks=pytest.mark.compile), False], ids=["compiled", "eager"])
def test_accelerates_dynamo_variable_neither_compiles_on_top_nor_overrides_torch_compile(flag, make_config, cli, tmp_path,
                                                                                        capsys, monkeypatch):
    """`accelerate launch` sets ACCELERATE_DYNAMO_BACKEND from a dynamo backend in `accelerate config`, with which
    accelerate's `prepare` compiles the model: on top of torch_compile's compile (the recipe then met a compiled
    function where it looked for the model) or despite torch_compile: false. The run compiles once, as torch_compile
    says, and the plan's compile line says so."""
    from accelerate.state import AcceleratorState, GradientState
    from torch._dynamo.utils import counters

    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "INDUCTOR")
    AcceleratorState._reset_state(True)  # as in a new process: accelerate reads the variable when its state is made
    counters.clear()
    try:  # aot_eager: dynamo traces the forward (what the two compiles would stack) without inductor's kernels
        assert cli("train", make_config(max_steps=2, eval_steps=None, torch_compile=flag, torch_compile_backend="aot_eager")) == 0
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    assert (counters["stats"]["unique_graphs"] > 0) is flag  # torch_compile: false compiles nothing
    flat = " ".join(capsys.readouterr().out.replace("│", " ").split())
    if flag:
        assert ("compile rlft's torch.compile of the training forward (torch_compile: true; aot_eager, mode default); "
                "ACCELERATE_DYNAMO_BACKEND=INDUCTOR (accelerate's compile, from `accelerate config`) is not applied on "
                "top: the model is compiled once; the first steps compile (seconds to a minute), then run faster") in flat, flat
    else:
        assert ("compile none (torch_compile: false); ACCELERATE_DYNAMO_BACKEND=INDUCTOR (accelerate's compile, from "
                "`accelerate config`) is not applied") in flat, flat


def test_quickstart_runs_from_another_directory(cli, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the repository root: the clone's quickstart files are found all the same
    assert cli("quickstart", "--max_steps=20", "--eval_steps=20", "--save_steps=20", "--logging_steps=10") == 0
    out = capsys.readouterr().out
    assert "held-out exact match before training" in out and "held-out exact match after training" in out
    assert (tmp_path / "outputs" / "quickstart" / "model.safetensors").exists()


def test_evaluate_gives_the_final_eval_of_the_trained_model_and_trains_nothing(make_config, cli, capsys, tmp_path):
    import json

    config = make_config(val_set_size=64)
    assert cli("train", config) == 0
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    final = [m for m in metrics if "eval/loss" in m][-1]["eval/loss"]
    before = (tmp_path / "out" / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert cli("evaluate", config, f"--base_model={tmp_path / 'out'}", "--random_init=false") == 0
    printed = dict(line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("eval/"))
    assert abs(float(printed["eval/loss"]) - final) < 1e-4, (printed, final)
    assert (tmp_path / "out" / "metrics.jsonl").read_text() == before  # nothing written


def test_evaluate_without_eval_data_says_so(make_config, cli, capsys):
    assert cli("evaluate", make_config()) == 1
    assert "nothing to evaluate: give eval data with val_set_size or test_datasets" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [{}, {"adapter": "lora", "lora_r": 4, "lora_alpha": 8, "lora_target_linear": True,
                                    "learning_rate": 0.02},
                                   # compiled: what dynamo traces of the forward that returns hidden states is the point;
                                   # inductor's kernels for this model are checked by test_torch_compile_trains_the_same_losses
                                   pytest.param({"torch_compile": True, "torch_compile_backend": "aot_eager"},
                                                marks=pytest.mark.compile)], ids=["full", "lora", "compiled"])
def test_a_real_size_vocabulary_trains_through_the_output_layer_in_the_loss(extra, make_config, cli, tmp_path, monkeypatch):
    """With an output layer of a real tokenizer's size the SFT loss applies it to the target positions itself
    (rlft.losses.linear_ce); the run trains what the model's own (B, T, V) logits train, and learns."""
    import json

    from rlft.models import head
    from rlft.models.tiny import write_tiny_model
    from rlft.train.recipes import sft

    model = write_tiny_model(tmp_path / "wide", "XS", max_positions=128)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "vocab_size": 8192}))
    calls = []
    monkeypatch.setattr(sft, "forward_hidden", lambda *a, _f=head.forward_hidden: calls.append(1) or _f(*a))
    runs = {}
    for fused in (True, False):
        monkeypatch.setattr(head, "MIN_VOCAB", 4096 if fused else 10**9)
        out = tmp_path / f"fused-{fused}"
        assert cli("train", make_config(base_model=str(model), output_dir=str(out), max_steps=8, eval_steps=None,
                                        **extra)) == 0
        runs[fused] = [m["loss"] for m in read_metrics(out / "metrics.jsonl") if "loss" in m]
        assert bool(calls) is fused
        calls.clear()
    assert runs[True] == pytest.approx(runs[False], abs=1e-4)
    assert runs[True][-1] < runs[True][0] - 0.5  # it learns (from about log 8192 = 9.0)


@pytest.mark.parametrize("vocab, path", [(8192, "rlft'schunkedoutput-layerlossover8,192entries"),
                                         (None, "themodel'sownlogits:itsoutputlayerhas")])
def test_axolotls_cut_cross_entropy_plugin_runs_and_the_plan_names_the_loss_path(vocab, path, make_config, cli, tmp_path,
                                                                                 capsys):
    """Axolotl's examples list the Cut Cross-Entropy plugin (its key defaults to on): rlft trains with its own chunked
    output-layer loss, which never builds the logits block, and the plan says so, or why the model's logits run."""
    import json

    from rlft.models.tiny import write_tiny_model

    model = write_tiny_model(tmp_path / "model", "XS", max_positions=128)
    if vocab:
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, "vocab_size": vocab}))
    plugin = "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"
    assert cli("train", make_config(base_model=str(model), max_steps=2, eval_steps=None, plugins=[plugin])) == 0
    printed = "".join(c for c in capsys.readouterr().out if not c.isspace() and c not in "│|")
    assert f"losscut_cross_entropy:{path}" in printed, printed


def _windowed_model(folder):
    """A tiny Gemma 3 (a 4-token sliding window on its first layer, full attention on its second) with the byte
    tokenizer: the addition rows (8-11 tokens) are longer than its window."""
    from transformers import Gemma3TextConfig

    from rlft.data.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=4,
                     layer_types=["sliding_attention", "full_attention"], pad_token_id=tokenizer.pad_token_id,
                     eos_token_id=tokenizer.eos_token_id, bos_token_id=None).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("model", ["llama", "gemma3-window-4"])
def test_batch_flattening_trains_what_padded_batches_train(make_config, cli, tmp_path, monkeypatch, model):
    """`batch_flattening: true` (no sample_packing): each micro-batch's rows run as one sequence without padding, each
    attending to itself (within its sliding window, on a model with one); the losses and evaluations are the padded
    batches' (same rows, same order), and it learns."""
    from rlft.train.recipes import sft

    flattened = []
    monkeypatch.setattr(sft, "packed_batch", lambda packs, *a, _f=sft.packed_batch: flattened.append(len(packs)) or _f(packs, *a))
    base = {} if model == "llama" else {"base_model": str(_windowed_model(tmp_path / "gemma3"))}
    runs = {}
    for flat in (False, True):
        out = tmp_path / f"flat-{flat}"
        assert cli("train", make_config(output_dir=str(out), max_steps=8, eval_steps=8, val_set_size=0.05,
                                        batch_flattening=flat, **base)) == 0
        runs[flat] = [m for m in read_metrics(out / "metrics.jsonl") if "loss" in m or "eval/loss" in m]
    assert [sorted(m) for m in runs[True]] == [sorted(m) for m in runs[False]]
    for got, expected in zip(runs[True], runs[False]):
        for key in ("loss", "eval/loss", "grad_norm"):
            if key in expected:
                assert got[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-5), (key, got[key], expected[key])
    assert flattened and set(flattened) == {1}  # the flat run's batches were one row each; the padded run made none
    losses = [m["loss"] for m in runs[True] if "loss" in m]
    assert losses[-1] < losses[0] - 0.5


def test_group_by_length_trains_on_batches_of_similar_lengths(make_config, cli, tmp_path):
    """`group_by_length: true`: the same run learns, on micro-batches that hold fewer padding tokens per step than
    random batches (the rows are 8 to 11 tokens, so the difference is small here but always in the same direction)."""
    runs = {}
    for grouped in (False, True):
        out = tmp_path / f"grouped-{grouped}"
        assert cli("train", make_config(output_dir=str(out), max_steps=20, group_by_length=grouped)) == 0
        runs[grouped] = [m for m in read_metrics(out / "metrics.jsonl") if "loss" in m]
    assert runs[True][-1]["loss"] < runs[True][0]["loss"] - 0.5
    assert runs[True][0]["loss"] != runs[False][0]["loss"]  # other rows in the first batch: the grouping took effect


CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Germany": "Berlin", "Japan": "Tokyo", "Egypt": "Cairo"}


def test_mistral_common_tokenizer_trains_its_own_chat_encoding_and_generates(cli, tmp_path, capsys):
    """`tokenizer_use_mistral_common: true` with mistral-common's real v7 tokenizer file in the model folder: SFT on chat
    rows learns the answers, the output keeps the tokenizer file, and `rlft generate --chat` prompts with its ids."""
    import random
    import shutil

    import yaml
    from transformers import LlamaConfig

    from tests.conftest import _tokenizer_file

    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(_tokenizer_file("mistral-common-v7/tokenizer.model.v7"), model)
    LlamaConfig(vocab_size=32768, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=128, max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                tie_word_embeddings=True).save_pretrained(model)
    rng = random.Random(0)
    rows = []
    for index in range(120):
        country = rng.choice(sorted(CAPITALS))
        system = [{"role": "system", "content": "Answer with one word."}] if index % 2 else []
        rows.append({"messages": system + [{"role": "user", "content": f"Capital of {country}?"},
                                           {"role": "assistant", "content": CAPITALS[country]}]})
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "base_model": str(model), "random_init": True, "tokenizer_use_mistral_common": True, "seed": 0,
        "datasets": [{"path": str(tmp_path / "chat.jsonl"), "type": "chat_template"}], "sequence_len": 32,
        "micro_batch_size": 8, "num_epochs": 15, "learning_rate": 3e-3, "logging_steps": 15,
        "output_dir": str(tmp_path / "out")}))
    assert cli("preprocess", config, "--debug") == 0
    printed = capsys.readouterr().out
    assert "'[INST]'(3)" in printed and "'[/INST]'(4)" in printed  # control tokens as single ids, not text pieces
    assert cli("train", config) == 0
    plan = capsys.readouterr().out
    assert "│ tokenizer " in plan and "│ mistral-common: each chat" in plan
    losses = [m["loss"] for m in read_metrics(tmp_path / "out" / "metrics.jsonl") if "loss" in m]
    assert losses[0] > 5.0 and losses[-1] < 0.1, losses  # random init over 32768 ids, then the answers known
    assert (tmp_path / "out" / "tokenizer.model.v7").exists()
    capsys.readouterr()
    assert cli("generate", tmp_path / "out", "--chat", "--max-new-tokens", "4",
               *[arg for country in CAPITALS for arg in ("--prompt", f"Capital of {country}?")]) == 0
    answers = capsys.readouterr().out.splitlines()
    assert answers == [f"Capital of {country}?{capital}" for country, capital in CAPITALS.items()], answers


def test_qat_trains_with_rounded_weights_from_its_step_and_saves_a_plain_model(make_config, cli, tmp_path, capsys):
    """`qat:` (int4 weights in groups of 32, int8 activations) from step 5: steps 1-4 are the plain run's, later steps
    differ; the run learns; the final model is the float model under its usual names, loaded by plain transformers."""
    plain = make_config(max_steps=12, output_dir=str(tmp_path / "plain"))
    qat = make_config(max_steps=12, output_dir=str(tmp_path / "qat"), save_steps=3,
                      qat={"activation_dtype": "int8", "weight_dtype": "int4", "group_size": 32, "fake_quant_after_n_steps": 4})
    assert cli("train", plain) == 0 and cli("train", qat) == 0
    assert "│ qat " in capsys.readouterr().out
    got, expected = ({m["step"]: m["loss"] for m in read_metrics(tmp_path / name / "metrics.jsonl") if "loss" in m}
                     for name in ("qat", "plain"))
    assert all(got[step] == expected[step] for step in range(1, 5)), (got, expected)
    assert all(abs(got[step] - expected[step]) > 1e-6 for step in range(5, 13)), (got, expected)
    assert got[12] < got[1] - 1.0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "qat")
    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "plain")
    assert type(model.model.layers[0].mlp.up_proj) is torch.nn.Linear
    assert sorted(model.state_dict()) == sorted(reference.state_dict())
    # resumed from step 3 (before the rounding starts), the run takes the same steps
    import shutil

    (tmp_path / "resumed").mkdir()
    shutil.copytree(tmp_path / "qat" / "checkpoint-3", tmp_path / "resumed" / "checkpoint-3")
    resumed = make_config(max_steps=12, output_dir=str(tmp_path / "resumed"), resume_from_checkpoint="auto",
                          qat={"activation_dtype": "int8", "weight_dtype": "int4", "group_size": 32, "fake_quant_after_n_steps": 4})
    assert cli("train", resumed) == 0
    again = {m["step"]: m["loss"] for m in read_metrics(tmp_path / "resumed" / "metrics.jsonl") if "loss" in m}
    assert {step: again[step] for step in range(4, 13)} == {step: got[step] for step in range(4, 13)}
