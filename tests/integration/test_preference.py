"""Preference methods and reward models through the real CLI: they learn, and bad input is explained."""

import json
import math

import pytest
import torch
import yaml

from metric_utils import trained_values
from rlft.config.settings import resolve
from rlft.config.settings.model import model_settings
from rlft.train.metrics import read_metrics

pytestmark = pytest.mark.slow
REPO_EXAMPLES = "examples/preference"


@pytest.fixture(scope="session")
def clear_preferences(tmp_path_factory):
    """Pairs whose preference a weak model learns in a few steps: the right sum against "no idea"."""
    folder = tmp_path_factory.mktemp("clear")
    rows = [(f"{a}+{b}=", str(a + b)) for a in range(0, 40, 3) for b in range(0, 40, 4)]
    files = {}
    for name, part in (("train", rows[:120]), ("eval", rows[120:])):
        pairs = folder / f"pairs-{name}.jsonl"
        pairs.write_text("".join(json.dumps({"prompt": p, "chosen": c, "rejected": "no idea"}) + "\n" for p, c in part))
        kto = folder / f"kto-{name}.jsonl"
        kto.write_text("".join(json.dumps({"prompt": p, "completion": c if i % 2 == 0 else "no idea", "label": i % 2 == 0}) + "\n"
                               for i, (p, c) in enumerate(part)))
        files[name] = {"pairs": pairs, "kto": kto}
    return files


def _evals(output_dir):
    return [m for m in read_metrics(output_dir / "metrics.jsonl") if any(k.startswith("eval/") for k in m)]


def _data_overrides(files, kind):
    return [f"--datasets=[{{path: {files['train'][kind]}}}]", f"--test_datasets=[{{path: {files['eval'][kind]}}}]"]


@pytest.mark.parametrize("example", ["dpo", "dpo-lora", "ipo", "orpo", "simpo", "kto"])
def test_example_trains_and_margins_grow(example, warm_model, tiny_model_dir, clear_preferences, cli, tmp_path, monkeypatch,
                                        repo_root):
    """Each shipped example's method settings, on data with an unambiguous preference, through the CLI."""
    monkeypatch.chdir(repo_root)
    out = tmp_path / example
    kind = "kto" if example == "kto" else "pairs"
    # ORPO is SFT and preference at once, meant to start from a base model: from random weights here
    start = [f"--base_model={tiny_model_dir}", "--random_init=true"] if example == "orpo" else [f"--base_model={warm_model}"]
    assert cli("train", f"{REPO_EXAMPLES}/{example}.yaml", *start, f"--output_dir={out}",
               "--max_steps=30", "--eval_steps=30", "--micro_batch_size=8", *_data_overrides(clear_preferences, kind)) == 0
    first, last = _evals(out)[0], _evals(out)[-1]
    assert (first["step"], last["step"]) == (0, 30)
    assert last["eval/rewards/margins"] > first["eval/rewards/margins"] + 0.05, (first, last)
    if "eval/rewards/accuracies" in last:
        assert last["eval/rewards/accuracies"] >= first["eval/rewards/accuracies"]
        assert last["eval/rewards/accuracies"] > 0.9
    logged = [m for m in read_metrics(out / "metrics.jsonl") if "loss" in m]
    names = {"rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected"}
    if example != "kto":
        names |= {"rewards/accuracies", "logits/chosen", "logits/rejected"}
    else:
        names |= {"kl"}
    assert names <= set(logged[-1]), set(logged[-1])


def test_reward_model_learns_and_scores(warm_model, clear_preferences, cli, tmp_path, monkeypatch, repo_root, capsys):
    monkeypatch.chdir(repo_root)
    out = tmp_path / "rm"
    assert cli("train", f"{REPO_EXAMPLES}/reward-model.yaml", f"--base_model={warm_model}", f"--output_dir={out}",
               "--max_steps=40", "--eval_steps=40", "--micro_batch_size=8", *_data_overrides(clear_preferences, "pairs")) == 0
    first, last = _evals(out)[0], _evals(out)[-1]
    assert last["eval/accuracy"] > 0.9 > first["eval/accuracy"] and last["eval/margin"] > first["eval/margin"] + 0.5, (first, last)
    logged = [m for m in read_metrics(out / "metrics.jsonl") if "loss" in m][-1]
    assert {"accuracy", "margin", "rewards/min", "rewards/mean", "rewards/max"} <= set(logged)
    capsys.readouterr()
    assert cli("score", out, "--text", "7+5=12", "--text", "7+5=no idea") == 0
    scores = [float(line.split()[0]) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(scores) == 2 and scores[0] > scores[1]


def _pair_config(tmp_path, warm_model, rows, **settings):
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {"base_model": str(warm_model), "rl": "dpo", "datasets": [{"path": str(data)}], "sequence_len": 32,
              "micro_batch_size": 4, "max_steps": 2, "learning_rate": 1e-4, "output_dir": str(tmp_path / "out"), **settings}
    path = tmp_path / "dpo.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _pairs(count, offset=0):
    return [{"prompt": f"{i}+{offset}=", "chosen": str(i + offset), "rejected": str(i + offset + 1)} for i in range(count)]


def test_lora_reference_is_the_policy_without_adapter(warm_model, tmp_path):
    from accelerate import Accelerator
    from rich.console import Console

    from rlft.config import load_config
    from rlft.models.loading import load_tokenizer
    from rlft.train.methods import pair_setup

    for adapter, expect_copy in ((None, True), ("lora", False)):
        extra = {"adapter": "lora", "lora_r": 4, "lora_alpha": 8, "lora_target_linear": True, "lora_dropout": 0.2} if adapter else {}
        cfg = load_config(_pair_config(tmp_path, warm_model, _pairs(8), **extra))
        tokenizer = load_tokenizer(model_settings(cfg))
        model, recipe, _ = pair_setup(cfg, resolve(cfg), tokenizer, Accelerator(cpu=True), None, Console(quiet=True))
        assert (recipe.reference.model is not None) == expect_copy
        dropouts = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]
        assert all(p == 0.0 for p in dropouts)  # disable_dropout (default): policy and reference agree
        if adapter:
            assert dropouts  # LoRA's dropout modules exist and were switched off


def test_precomputed_reference_is_cached_reused_and_refreshed(warm_model, cli, tmp_path, capsys):
    config = _pair_config(tmp_path, warm_model, _pairs(16), precompute_ref_log_probs=True)
    assert cli("train", config) == 0
    assert "computed for 16 rows" in capsys.readouterr().out
    cache = sorted((tmp_path / "out" / "ref_logps").glob("*.json"))
    assert len(cache) == 1
    first_loss = [m for m in read_metrics(tmp_path / "out" / "metrics.jsonl") if "loss" in m][0]["loss"]
    assert first_loss == pytest.approx(0.693147, abs=1e-5)  # policy == reference at step 1

    assert cli("train", config, "--max_steps=4", "--resume_from_checkpoint=auto") == 0
    assert "reused" in capsys.readouterr().out

    changed = _pair_config(tmp_path, warm_model, _pairs(16, offset=1), precompute_ref_log_probs=True)
    assert cli("train", changed, "--max_steps=6", "--resume_from_checkpoint=auto") == 0
    assert "computed for 16 rows" in capsys.readouterr().out  # a changed dataset is never served stale values
    assert len(sorted((tmp_path / "out" / "ref_logps").glob("*.json"))) == 2


def test_precomputed_and_live_reference_give_the_same_losses(warm_model, cli, tmp_path):
    losses = []
    for precompute in (False, True):
        out = tmp_path / f"out-{precompute}"
        config = _pair_config(tmp_path, warm_model, _pairs(16), precompute_ref_log_probs=precompute, output_dir=str(out), max_steps=3)
        assert cli("train", config) == 0
        losses.append([m["loss"] for m in read_metrics(out / "metrics.jsonl") if "loss" in m])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5, abs=1e-6)


@pytest.mark.compile
def test_a_compiled_run_compiles_its_reference_copy_and_trains_what_precomputed_values_train(warm_model, cli, tmp_path,
                                                                                            monkeypatch):
    """`torch_compile: true` runs the reference copy of a full fine-tune through torch.compile too (a graph without
    gradients), and not a reference that only precomputes its values before training (the policy's own eager forward,
    once): the two runs train the same losses, so the compiled reference gives the reference's values. aot_eager:
    dynamo captures the graphs inductor would compile, without the C++ code generation."""
    import rlft.train.policy as policy
    from rlft.models.frozen import FrozenPolicy

    compiled = []
    monkeypatch.setattr(policy, "compiled_forward", lambda settings, model, _f=policy.compiled_forward:
                        compiled.append(model) or _f(settings, model))
    seen = []
    view = FrozenPolicy.view
    monkeypatch.setattr(FrozenPolicy, "view", lambda self, model: seen.append(type(self.runs).__name__) or view(self, model))
    losses = {}
    for precompute in (False, True):
        compiled.clear(), seen.clear()
        out = tmp_path / f"precompute-{precompute}"
        config = _pair_config(tmp_path, warm_model, _pairs(16), output_dir=str(out), max_steps=3, torch_compile=True,
                              torch_compile_backend="aot_eager", precompute_ref_log_probs=precompute)
        assert cli("train", config) == 0
        losses[precompute] = [m["loss"] for m in read_metrics(out / "metrics.jsonl") if "loss" in m]
        if precompute:  # the policy itself gives the values, once, before training
            assert not compiled and set(seen) == {"LlamaForCausalLM"}, (compiled, seen)
        else:
            assert len(compiled) == 1 and set(seen) == {"OptimizedModule"}, (compiled, seen)
    assert losses[False][0] == pytest.approx(math.log(2), abs=1e-6)  # policy == reference at step 1
    assert losses[False] == pytest.approx(losses[True], rel=1e-5, abs=1e-6)


def test_dpo_on_an_moe_model_adds_the_router_loss_and_learns(tiny_moe_dir, cli, tmp_path):
    """model_config: {output_router_logits: true} on a Mixtral: every step logs the load-balancing loss, and the
    preference is learnt (the loss falls from ln 2, the chosen answers' margin grows)."""
    config = _pair_config(tmp_path, tiny_moe_dir, _pairs(16), random_init=True, max_steps=30, learning_rate=3e-3,
                          logging_steps=1, model_config={"output_router_logits": True})
    assert cli("train", config) == 0
    steps = [m for m in read_metrics(tmp_path / "out" / "metrics.jsonl") if "loss" in m]
    assert len(steps) == 30 and all(m["aux_loss"] > 0 for m in steps)
    coef = 0.02  # the fixture's router_aux_loss_coef: the first step's loss is ln 2 + coef x aux_loss
    assert steps[0]["loss"] == pytest.approx(math.log(2) + coef * steps[0]["aux_loss"], abs=1e-4)
    first, last = steps[:5], steps[-5:]
    mean = lambda rows, key: sum(m[key] for m in rows) / len(rows)  # noqa: E731
    assert mean(last, "loss") < mean(first, "loss") - 0.04 and mean(last, "rewards/margins") > 0.1
    assert mean(last, "rewards/accuracies") == 1.0


def test_identical_pairs_are_dropped_with_a_warning(warm_model, cli, tmp_path, capsys):
    rows = _pairs(8) + [{"prompt": "1+1=", "chosen": "2", "rejected": "2"}] * 3
    assert cli("train", _pair_config(tmp_path, warm_model, rows)) == 0
    out = capsys.readouterr().out
    assert "3 pairs have chosen == rejected and were dropped" in out
    assert "8/11 rows kept" in out


def test_empty_chosen_names_the_row(warm_model, cli, tmp_path, capsys):
    rows = _pairs(3) + [{"prompt": "1+1=", "chosen": " ", "rejected": "3"}]
    assert cli("train", _pair_config(tmp_path, warm_model, rows)) == 1
    err = capsys.readouterr().err
    assert "line 4: field 'chosen' is empty" in err


def test_kto_with_one_label_class_is_explained(warm_model, cli, tmp_path, capsys):
    data = tmp_path / "kto.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "completion": str(i + 1), "label": True}) + "\n" for i in range(8)))
    config = _pair_config(tmp_path, warm_model, _pairs(2), rl="kto", datasets=[{"path": str(data)}])
    assert cli("train", config) == 1
    err = capsys.readouterr().err
    assert "8 desirable and 0 undesirable" in err and "Traceback" not in err


def test_reference_with_another_vocabulary_is_refused(warm_model, cli, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    other = tmp_path / "other-ref"
    tokenizer = AutoTokenizer.from_pretrained(warm_model)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|extra|>"]})
    model = AutoModelForCausalLM.from_pretrained(warm_model)
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(other)
    tokenizer.save_pretrained(other)
    assert cli("train", _pair_config(tmp_path, warm_model, _pairs(8), ref_model=str(other))) == 1
    assert "different tokenizer vocabulary" in capsys.readouterr().err


@pytest.mark.parametrize("rows", ["spare", "added tokens"])
def test_a_reference_of_the_same_folder_has_the_policys_embedding_rows(rows, warm_model, cli, tmp_path):
    """Models ship more embedding rows than their tokenizer has tokens (Qwen: 151,936 for 151,665), and `tokens:` adds
    rows the policy initialises. `ref_model: <the same folder>` must end with the policy's rows: every row counts in
    log-softmax's normaliser, so a reference cut to the tokenizer's length, or with rows of its own, would give
    non-zero rewards before any update."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    padded, settings = tmp_path / "padded", {}
    tokenizer = AutoTokenizer.from_pretrained(warm_model)
    model = AutoModelForCausalLM.from_pretrained(warm_model)
    if rows == "spare":
        model.resize_token_embeddings(len(tokenizer) + 20)
        with torch.no_grad():  # the spare rows as a trained model has them: not zeros
            model.get_input_embeddings().weight[len(tokenizer):] = torch.randn(20, model.config.hidden_size)
    else:
        settings = {"tokens": ["<|tool|>", "<|end_tool|>"]}
    model.save_pretrained(padded)
    tokenizer.save_pretrained(padded)
    config = _pair_config(tmp_path, padded, _pairs(8), ref_model=str(padded), max_steps=1, logging_steps=1, **settings)
    assert cli("train", config) == 0
    first = next(m for m in read_metrics(tmp_path / "out" / "metrics.jsonl") if m.get("step") == 1 and "loss" in m)
    assert first["rewards/chosen"] == first["rewards/rejected"] == 0.0, first
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-6)


def test_dpo_resume_is_exact_including_loss_state(warm_model, cli, tmp_path):
    """bco_pair keeps a running reward mean: it travels in the checkpoint, so 2 + resume + 2 == 4 steps."""
    import shutil

    settings = dict(dpo_loss_type=["sigmoid", "bco_pair"], max_steps=4, save_steps=2, micro_batch_size=2)
    straight = _pair_config(tmp_path, warm_model, _pairs(12), output_dir=str(tmp_path / "a"), **settings)
    assert cli("train", straight) == 0
    (tmp_path / "b").mkdir()
    shutil.copytree(tmp_path / "a" / "checkpoint-2", tmp_path / "b" / "checkpoint-2")
    resumed = _pair_config(tmp_path, warm_model, _pairs(12), output_dir=str(tmp_path / "b"), resume_from_checkpoint="auto", **settings)
    assert cli("train", resumed) == 0
    first = {m["step"]: m["loss"] for m in read_metrics(tmp_path / "a" / "metrics.jsonl") if "loss" in m}
    second = {m["step"]: m["loss"] for m in read_metrics(tmp_path / "b" / "metrics.jsonl") if "loss" in m}
    assert [first[3], first[4]] == [second[3], second[4]]
    state = json.loads((tmp_path / "a" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["recipe_state"]["bco_count"] == 8  # 2 steps x 2 pairs x (chosen + rejected)


def test_orpo_sequence_span_takes_the_nll_over_the_prompt_too(warm_model, cli, tmp_path):
    """TRL's span (orpo_nll_span: sequence): the prompt tokens join the NLL, which changes nll_loss and the loss."""
    def run(span):
        out = tmp_path / span
        config = _pair_config(tmp_path, warm_model, _pairs(8), rl="orpo", max_steps=1, logging_steps=1,
                              orpo_nll_span=span, output_dir=str(out))
        assert cli("train", config) == 0
        return next(m for m in read_metrics(out / "metrics.jsonl") if "loss" in m)

    answer, sequence = run("answer"), run("sequence")
    assert answer["log_odds_ratio"] == sequence["log_odds_ratio"]  # the odds term is the answers' either way
    assert answer["nll_loss"] != sequence["nll_loss"] and answer["loss"] != sequence["loss"]


@pytest.mark.parametrize("rl", ["dpo", "reward_model", "kto"])
def test_pad_to_sequence_len_pads_pair_batches_without_changing_the_loss(warm_model, cli, tmp_path, rl):
    """Axolotl's reward-model example sets pad_to_sequence_len: every batch is sequence_len wide, the losses are the same;
    and so with widths rounded up to a multiple (pad_to_multiple_of, 64 by default on a GPU)."""
    from rlft.data.preference import kto_batch, pair_batch

    rows = _pairs(16) if rl != "kto" else [{"prompt": p["prompt"], "completion": p["chosen"], "label": i % 2 == 0}
                                           for i, p in enumerate(_pairs(16))]
    losses = []
    for index, padding in enumerate(({}, {"pad_to_sequence_len": True}, {"pad_to_multiple_of": 48})):
        out = tmp_path / f"{rl}-{index}"
        extra = {"num_labels": 1, "model_type": "AutoModelForSequenceClassification"} if rl == "reward_model" else {}
        config = _pair_config(tmp_path, warm_model, rows, rl=None if rl == "reward_model" else rl, reward_model=rl == "reward_model",
                              output_dir=str(out), max_steps=2, **padding, **extra)
        assert cli("train", config) == 0
        losses.append([m["loss"] for m in read_metrics(out / "metrics.jsonl") if "loss" in m])
    assert losses[1] == pytest.approx(losses[0], rel=1e-5, abs=1e-6) and losses[2] == pytest.approx(losses[0], rel=1e-5, abs=1e-6)
    example = {"prompt_ids": [1, 2], "chosen_ids": [3], "rejected_ids": [4, 5], "completion_ids": [3], "kl_completion_ids": [4],
               "label": True}
    assert pair_batch([example], 0, 32)["input_ids"].shape == (2, 32)
    assert kto_batch([example], 0, 32)["kl_input_ids"].shape == (1, 32)


@pytest.mark.parametrize("example", ["dpo", "dpo-lora", "kto"])
def test_a_real_size_vocabulary_trains_through_the_output_layer(example, tiny_model_dir, clear_preferences, cli, tmp_path,
                                                                 monkeypatch, repo_root):
    """With an output layer of a real tokenizer's size, sequence log-probs (policy and reference) come from the output
    layer applied to the completion positions (rlft.losses.linear_ce); the run trains what the model's own (B, T, V)
    logits train, metrics included."""
    from transformers import AutoConfig, LlamaForCausalLM

    from rlft.models import head
    from rlft.train.recipes import preference

    monkeypatch.chdir(repo_root)
    model = tmp_path / "wide"
    config = AutoConfig.from_pretrained(tiny_model_dir)
    config.vocab_size = 8192
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(model)
    for file in tiny_model_dir.iterdir():  # the byte tokenizer
        if file.name != "config.json":
            (model / file.name).write_bytes(file.read_bytes())
    calls = []
    monkeypatch.setattr(preference, "forward_hidden", lambda *a, _f=head.forward_hidden: calls.append(1) or _f(*a))
    kind = "kto" if example == "kto" else "pairs"
    runs = {}
    for fused in (True, False):
        monkeypatch.setattr(head, "MIN_VOCAB", 4096 if fused else 10**9)
        out = tmp_path / f"{example}-{fused}"
        assert cli("train", f"{REPO_EXAMPLES}/{example}.yaml", f"--base_model={model}", f"--output_dir={out}",
                   "--max_steps=6", "--eval_steps=6", "--logging_steps=1", "--micro_batch_size=8",
                   *_data_overrides(clear_preferences, kind)) == 0
        runs[fused] = [m for m in read_metrics(out / "metrics.jsonl") if "loss" in m or "eval/loss" in m]
        assert bool(calls) is fused
        calls.clear()
    assert len(runs[True]) == len(runs[False]) > 6
    for got, expected in zip(runs[True], runs[False]):
        assert got.keys() == expected.keys()
        for key in trained_values(expected):
            assert got[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-4), (key, got[key], expected[key])


@pytest.mark.parametrize("example", ["dpo", "kto"])
def test_dpo_padding_free_trains_what_padded_pairs_train(example, warm_model, clear_preferences, cli, tmp_path, monkeypatch,
                                                         repo_root):
    """`dpo_padding_free: true` on a CPU: each micro-batch's rows (and KTO's mismatched rows) as one sequence without
    padding, SDPA with a block-diagonal mask; every logged metric and evaluation is the padded run's, and it learns."""
    from rlft.train.recipes import preference

    monkeypatch.chdir(repo_root)
    flattened = []
    monkeypatch.setattr(preference, "flatten_rows", lambda *a, _f=preference.flatten_rows: flattened.append(a[-1]) or _f(*a))
    kind = "kto" if example == "kto" else "pairs"
    runs = {}
    for flat in (False, True):
        out = tmp_path / f"{example}-{flat}"
        assert cli("train", f"{REPO_EXAMPLES}/{example}.yaml", f"--base_model={warm_model}", f"--output_dir={out}",
                   "--max_steps=6", "--eval_steps=6", "--logging_steps=1", "--micro_batch_size=8",
                   f"--dpo_padding_free={str(flat).lower()}", *_data_overrides(clear_preferences, kind),
                   *([] if example == "kto" else ["--share_prompts=false"])) == 0  # shared prompts: the next test
        runs[flat] = [m for m in read_metrics(out / "metrics.jsonl") if "loss" in m or "eval/loss" in m]
    assert set(flattened) == ({"", "kl_"} if example == "kto" else {""})
    assert len(runs[True]) == len(runs[False]) > 6
    for got, expected in zip(runs[True], runs[False]):
        assert got.keys() == expected.keys()
        tie = abs(expected.get("eval/rewards/margins", expected.get("rewards/margins", 1.0))) < 1e-4
        for key in trained_values(expected).keys() - ({"rewards/accuracies", "eval/rewards/accuracies"} if tie else set()):  # 0 vs 1e-7: a tie
            # float32 sums in another order: losses agree to 1e-6; Adam's normalised steps carry it into grad_norm at 1e-4
            tolerance = 1e-3 if key == "grad_norm" else 1e-4
            assert got[key] == pytest.approx(expected[key], rel=tolerance, abs=1e-4), (key, got[key], expected[key])
    evals = [m["eval/loss"] for m in runs[True] if "eval/loss" in m]
    assert evals[-1] < evals[0] - 0.01  # it learns


@pytest.mark.parametrize("example", ["dpo", "orpo"])
def test_shared_prompts_train_what_padded_pairs_train(example, warm_model, clear_preferences, cli, tmp_path, monkeypatch,
                                                      repo_root, capsys):
    """`share_prompts` (on by default for a Llama with SDPA): each pair's prompt once and both answers after it, one
    sequence per pair (also with dpo_padding_free on SDPA, whose flattened rows need no mask) or, with dpo_padding_free
    under eager attention, every pair of the micro-batch in one sequence. Every logged metric and evaluation is the
    run's with the prompt twice (share_prompts: false), the plan says which, and it learns."""
    from rlft.train.recipes import preference

    monkeypatch.chdir(repo_root)
    shared = []
    monkeypatch.setattr(preference, "shared_pair_inputs", lambda *a, _f=preference.shared_pair_inputs: shared.append(a[3]) or _f(*a))
    runs, plans = {}, {}
    for name, keys in (("twice", ["--share_prompts=false"]), ("once", []), ("once-flat", ["--dpo_padding_free=true"]),
                       ("once-flat-eager", ["--dpo_padding_free=true", "--eager_attention=true"])):
        out = tmp_path / f"{example}-{name}"
        assert cli("train", f"{REPO_EXAMPLES}/{example}.yaml", f"--base_model={warm_model}", f"--output_dir={out}",
                   "--max_steps=6", "--eval_steps=6", "--logging_steps=1", "--micro_batch_size=8", "--mfu_peak_flops=1", *keys,
                   *_data_overrides(clear_preferences, "pairs")) == 0
        runs[name] = [m for m in read_metrics(out / "metrics.jsonl") if "loss" in m or "eval/loss" in m]
        printed = capsys.readouterr().out.splitlines()
        plans[name] = next(line for line in printed if line.startswith("│ prompts "))
        assert "1e-12 TFLOP/s" in (peak := next(line for line in printed if line.startswith("│ MFU peak "))), peak
        assert "per device (mfu_peak_flops)" in peak, peak  # the user's peak, not the probe's
        assert bool(shared) is (name != "twice") and (True in shared) is (name == "once-flat-eager")  # True: one sequence
        shared.clear()
    assert "twice per pair (share_prompts: false)" in plans["twice"]
    assert "once per pair, both answers after it" in plans["once"]
    for name in ("once", "once-flat", "once-flat-eager"):
        assert len(runs[name]) == len(runs["twice"]) > 6
        for got, expected in zip(runs[name], runs["twice"]):
            assert got.keys() == expected.keys()
            for key in trained_values(expected):
                tolerance = 1e-3 if key == "grad_norm" else 1e-4  # float32 sums in another order, as above
                assert got[key] == pytest.approx(expected[key], rel=tolerance, abs=1e-4), (name, key, got[key], expected[key])
    margins = [m["eval/rewards/margins"] for m in runs["once"] if "eval/rewards/margins" in m]
    assert margins[-1] > margins[0] + 0.01  # it learns
    # MFU counts the tokens the forward computed: a shared prompt once (mfu_peak_flops 1: mfu x step time is FLOPs),
    # while `tokens` counts it in both rows, as in the run with the prompt twice
    computed = lambda m: m["mfu"] * m["step_time_s"] / m["tokens"]  # noqa: E731  (FLOPs per token, times computed/trained)
    for once, twice in zip(*(([m for m in runs[name] if "mfu" in m]) for name in ("once", "twice"))):
        assert once["tokens"] == twice["tokens"] and 0.5 < computed(once) / computed(twice) < 0.9


def test_a_reward_model_with_shared_prompts_trains_what_padded_pairs_train(warm_model, clear_preferences, cli, tmp_path,
                                                                           monkeypatch, repo_root, capsys):
    """`share_prompts` for a Bradley-Terry reward model: each pair's prompt once, both answers' scores read at their
    last tokens; every logged metric and evaluation (accuracy, margins, score extremes) is the prompt-twice run's."""
    monkeypatch.chdir(repo_root)
    runs, plans = {}, {}
    for name, keys in (("twice", ["--share_prompts=false"]), ("once", [])):
        out = tmp_path / name
        assert cli("train", f"{REPO_EXAMPLES}/reward-model.yaml", f"--base_model={warm_model}", f"--output_dir={out}",
                   "--max_steps=6", "--eval_steps=6", "--logging_steps=1", "--micro_batch_size=8", "--mfu_peak_flops=1", *keys,
                   *_data_overrides(clear_preferences, "pairs")) == 0
        runs[name] = [m for m in read_metrics(out / "metrics.jsonl") if "loss" in m or "eval/loss" in m]
        plans[name] = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("│ prompts "))
    assert "once per pair, both answers after it" in plans["once"] and "twice per pair" in plans["twice"]
    assert len(runs["once"]) == len(runs["twice"]) > 6
    for got, expected in zip(runs["once"], runs["twice"]):
        assert got.keys() == expected.keys()
        for key in trained_values(expected):
            tolerance = 1e-3 if key == "grad_norm" else 1e-4
            assert got[key] == pytest.approx(expected[key], rel=tolerance, abs=1e-4), (key, got[key], expected[key])
    computed = lambda m: m["mfu"] * m["step_time_s"] / m["tokens"]  # noqa: E731  (mfu_peak_flops 1: MFU counts a prompt once)
    for once, twice in zip(*(([m for m in runs[name] if "mfu" in m]) for name in ("once", "twice"))):
        assert once["tokens"] == twice["tokens"] and 0.5 < computed(once) / computed(twice) < 0.9


def test_a_pissa_reference_is_the_initial_adapter_not_a_copy(warm_model, cli, tmp_path):
    """PiSSA rewrites the base, so the reference is the policy with its initial adapter (no second model): it trains
    what a copy of the model as reference trains (rl_adapter_ref_model: true), and a resume keeps it."""
    import shutil

    from accelerate import Accelerator
    from rich.console import Console

    from rlft.config import load_config
    from rlft.models.loading import load_tokenizer
    from rlft.train.methods import pair_setup

    pissa = dict(adapter="lora", lora_r=4, lora_alpha=8, lora_target_linear=True, peft_init_lora_weights="pissa",
                 max_steps=4, save_steps=2, micro_batch_size=2, learning_rate=1e-3)
    cfg = load_config(_pair_config(tmp_path, warm_model, _pairs(12), **pissa))
    _, recipe, _ = pair_setup(cfg, resolve(cfg), load_tokenizer(model_settings(cfg)), Accelerator(cpu=True), None, Console(quiet=True))
    assert recipe.reference.model is None and recipe.reference.initial
    losses = {}
    for copy in (False, True):
        out = tmp_path / f"copy-{copy}"
        assert cli("train", _pair_config(tmp_path, warm_model, _pairs(12), output_dir=str(out), rl_adapter_ref_model=copy, **pissa)) == 0
        losses[copy] = [m["loss"] for m in read_metrics(out / "metrics.jsonl") if "loss" in m]
    assert losses[False][0] == pytest.approx(0.693147, abs=1e-5)  # policy == reference at step 1
    assert losses[False] == pytest.approx(losses[True], rel=1e-4, abs=1e-5)
    assert all(abs(loss - 0.693147) > 1e-3 for loss in losses[False][1:])  # a reference that followed the policy: ln 2
    (tmp_path / "resumed").mkdir()
    shutil.copytree(tmp_path / "copy-False" / "checkpoint-2", tmp_path / "resumed" / "checkpoint-2")
    assert cli("train", _pair_config(tmp_path, warm_model, _pairs(12), output_dir=str(tmp_path / "resumed"),
                                     resume_from_checkpoint="auto", **pissa)) == 0
    resumed = [m["loss"] for m in read_metrics(tmp_path / "resumed" / "metrics.jsonl") if "loss" in m]
    assert resumed[-2:] == pytest.approx(losses[False][-2:], rel=1e-5, abs=1e-6)
