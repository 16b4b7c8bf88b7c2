"""The stock vLLM server's engine: its requests and its reading of vLLM's answers, against JSON recorded from vLLM
0.32's OpenAI server (tests/integration/test_stock_vllm.py runs it against a real one)."""

from __future__ import annotations

import copy
import math

import pytest

from rlft.errors import RolloutError
from rlft.rollout.types import SamplingParams, prompt_seed
from rlft.rollout.vllm_openai import (VLLMServerEngine, completion_body, needs_processed_logprobs, newest_adapter,
                                      parse_completion)
from rlft.rollout.watched_http import ServerRefused

# /v1/completions with n=2, logprobs=0, return_token_ids and return_tokens_as_token_ids (vLLM 0.32, some keys left out)
ANSWER = {"id": "cmpl-943643e9198131c0", "object": "text_completion", "model": "rlft-v1-abc123-1", "choices": [
    {"index": 0, "text": "", "logprobs": {"text_offset": [0, 12, 24], "token_logprobs": [-0.5, -1.25, -0.125],
                                          "tokens": ["token_id:223", "token_id:40", "token_id:259"],
                                          "top_logprobs": [{"token_id:223": -0.5}, {"token_id:40": -1.25}, {"token_id:259": -0.125}]},
     "finish_reason": "stop", "stop_reason": 259, "token_ids": [223, 40, 259], "prompt_token_ids": [49, 43, 50, 61]},
    {"index": 1, "text": "", "logprobs": {"text_offset": [0, 12, 24, 36], "token_logprobs": [-2.0, -0.25, -3.5, -0.75],
                                          "tokens": ["token_id:7", "token_id:8", "token_id:9", "token_id:10"],
                                          "top_logprobs": [{"token_id:7": -2.0}, {"token_id:8": -0.25}, {"token_id:9": -3.5},
                                                           {"token_id:10": -0.75}]},
     "finish_reason": "length", "stop_reason": None, "token_ids": [7, 8, 9, 10], "prompt_token_ids": [49, 43, 50, 61]}],
    "system_fingerprint": "vllm-0.32.0-83760136", "usage": {"prompt_tokens": 4, "total_tokens": 11, "completion_tokens": 7}}
# /v1/models with an adapter loaded (vLLM 0.32; permission lists left out)
MODELS = {"object": "list", "data": [
    {"id": "/tmp/svx/model", "object": "model", "owned_by": "vllm", "root": "/tmp/svx/model", "parent": None, "max_model_len": 64},
    {"id": "rlft-v1-abc123-1", "object": "model", "owned_by": "vllm", "root": "/out/lora_sync/v1", "parent": "/tmp/svx/model",
     "max_model_len": None}]}
ROUTE_MISSING = ServerRefused("404", 404, {"detail": "Not Found"})  # FastAPI's answer: VLLM_ALLOW_RUNTIME_LORA_UPDATING unset
LORA_OFF = ServerRefused("500", 500, "Call to add_lora method failed: LoRA is not enabled. Use --enable-lora to enable LoRA.")
NOT_FOUND = ServerRefused("404", 404, "Loading lora rlft-probe failed: No adapter found for /nonexistent/rlft-probe")


def _engine(monkeypatch, models=MODELS, answers=None):
    """An engine whose HTTP calls are answered here; `sent` records (path, body) of each."""
    engine = VLLMServerEngine("127.0.0.1", 9, timeout=1)
    sent = []

    def call(method, path, timeout=None, json=None, **kwargs):
        sent.append((path, json))
        if path == "/v1/models":
            return copy.deepcopy(models)
        if path == "/version":
            return {"version": "0.32.0"}
        answer = (answers or {}).get(path)
        if isinstance(answer, Exception):
            raise answer
        return answer(json) if callable(answer) else answer

    monkeypatch.setattr(engine, "_call", call)
    monkeypatch.setattr(engine, "_watched", lambda method, path, **kwargs: call(method, path, **kwargs))
    monkeypatch.setattr(engine, "_watched_all", lambda calls: [call(method, path, **kwargs) for method, path, kwargs in calls])
    return engine, sent


def test_a_completion_request_asks_for_ids_and_sampled_logprobs_and_stops_where_rlft_engines_stop():
    params = SamplingParams(max_new_tokens=50, temperature=0.7, top_k=0, top_p=0.9, min_p=0.05, repetition_penalty=1.1,
                            stop_token_ids=(259, 7), stop_strings=("\n\n",))
    body = completion_body("rlft-v3-abc-2", [49, 43, 50, 61], params, 4, 17, max_model_len=64)
    assert body["prompt"] == [49, 43, 50, 61] and body["model"] == "rlft-v3-abc-2" and body["n"] == 4 and body["seed"] == 17
    assert body["ignore_eos"] is True and body["stop_token_ids"] == [259, 7] and body["stop"] == ["\n\n"]
    assert body["logprobs"] == 0 and body["return_token_ids"] is True and body["return_tokens_as_token_ids"] is True
    assert (body["temperature"], body["top_k"], body["top_p"], body["min_p"], body["repetition_penalty"]) == (0.7, -1, 0.9, 0.05, 1.1)
    assert body["presence_penalty"] == body["frequency_penalty"] == 0.0  # not the model's generation_config defaults
    assert body["max_tokens"] == 50
    assert completion_body("m", [1] * 40, params, 1, None, max_model_len=64)["max_tokens"] == 24  # cut to what is left
    with pytest.raises(RolloutError, match="leaves no room under the vLLM server's max_model_len 64.*--max-model-len"):
        completion_body("m", [1] * 64, params, 1, None, max_model_len=64)


def test_an_answer_is_read_in_sample_order_with_its_stop_token_and_truncation():
    shuffled = {**ANSWER, "choices": ANSWER["choices"][::-1]}
    ids, logprobs, truncated = parse_completion(shuffled, 2, "rlft-v1-abc123-1")
    assert ids == [[223, 40, 259], [7, 8, 9, 10]]
    assert logprobs == [[-0.5, -1.25, -0.125], [-2.0, -0.25, -3.5, -0.75]]
    assert truncated == [False, True]


@pytest.mark.parametrize("change,message", [
    (lambda a: a.update(model="rlft-v0-abc123-1"), "not the adapter 'rlft-v1-abc123-1'"),
    (lambda a: a["choices"].pop(), "answered 1 completions where 2 were asked for"),
    (lambda a: a["choices"][0].pop("token_ids"), "lacks its token ids"),
    (lambda a: a["choices"][1]["logprobs"]["token_logprobs"].pop(), "lacks its token ids or their log-probs"),
    (lambda a: a["choices"][1]["logprobs"]["token_logprobs"].__setitem__(2, None), "held NaN while sampling"),
    (lambda a: a["choices"][1]["logprobs"]["token_logprobs"].__setitem__(2, math.nan), "held NaN while sampling"),
], ids=["other_model", "missing_choice", "no_ids", "short_logprobs", "null", "nan"])
def test_an_answer_without_what_was_asked_for_stops_the_run(change, message):
    answer = copy.deepcopy(ANSWER)
    change(answer)
    with pytest.raises(RolloutError, match=message):
        parse_completion(answer, 2, "rlft-v1-abc123-1")


def test_generate_sends_each_prompt_alone_with_its_own_seed_and_returns_rows_prompt_major(monkeypatch):
    def complete(body):
        first = 100 * body["prompt"][0]
        return {"model": body["model"], "choices": [
            {"index": k, "token_ids": [first + k], "logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "stop"}
            for k in range(body["n"])]}

    engine, sent = _engine(monkeypatch, answers={"/v1/completions": complete})
    out = engine.generate([[1, 9], [2, 9], [3, 9]], SamplingParams(max_new_tokens=8), 2, seed=5)
    bodies = [body for path, body in sent if path == "/v1/completions"]
    assert [body["prompt"] for body in bodies] == [[1, 9], [2, 9], [3, 9]]
    assert [body["seed"] for body in bodies] == [prompt_seed(5, index, 2) for index in range(3)]
    assert len({body["seed"] for body in bodies}) == 3 and all(body["model"] == "/tmp/svx/model" for body in bodies)
    assert out.completion_ids == [[100], [101], [200], [201], [300], [301]]
    assert out.prompt_ids == [[1, 9], [1, 9], [2, 9], [2, 9], [3, 9], [3, 9]] and out.weight_versions == [0] * 6
    assert prompt_seed(None, 3, 2) is None


def test_an_adapter_load_is_checked_in_the_listing_and_the_one_before_is_unloaded(monkeypatch, tmp_path):
    listing = copy.deepcopy(MODELS)
    listing["data"] = listing["data"][:1]

    def load(body):
        listing["data"].append({"id": body["lora_name"], "root": body["lora_path"], "parent": "/tmp/svx/model"})
        return {"error": "Success: LoRA adapter added successfully."}  # vLLM answers plain text

    def unload(body):
        listing["data"] = [card for card in listing["data"] if card["id"] != body["lora_name"]]
        return {"error": "Success"}

    answers = {"/v1/load_lora_adapter": load, "/v1/unload_lora_adapter": unload}
    engine, sent = _engine(monkeypatch, listing, answers)
    engine.load_adapter(tmp_path / "v0", 0)
    engine.load_adapter(tmp_path / "v1", 1)
    assert engine.version == 1 and engine.health()["version"] == 1
    names = [body["lora_name"] for path, body in sent if path == "/v1/load_lora_adapter"]
    assert names == [f"rlft-v0-{engine.tag}-1", f"rlft-v1-{engine.tag}-2"]  # a fresh name per load
    assert [body["lora_path"] for path, body in sent if path == "/v1/load_lora_adapter"] == [str(tmp_path / "v0"), str(tmp_path / "v1")]
    assert ("/v1/unload_lora_adapter", {"lora_name": names[0]}) in sent
    assert [card["id"] for card in listing["data"]] == ["/tmp/svx/model", names[1]]
    answers["/v1/load_lora_adapter"] = lambda body: load({**body, "lora_path": str(tmp_path / "elsewhere")})
    with pytest.raises(RolloutError, match="does not list adapter rlft-v2-.* from .*v2 after loading it"):
        engine.load_adapter(tmp_path / "v2", 2)
    assert engine.version == 1


def test_the_version_is_that_of_the_newest_adapter_of_this_client():
    cards = {"data": [{"id": "base"}, {"id": "rlft-v7-abc-3"}, {"id": "rlft-v9-abc-12"}, {"id": "rlft-v8-abc-4"},
                      {"id": "rlft-v99-fff-40"}, {"id": "my-adapter"}]}
    assert newest_adapter(cards, "abc")["version"] == 9  # loaded last (12th load), whatever the order of the listing
    assert newest_adapter(cards, "ddd") is None and newest_adapter({"data": []}, "abc") is None


@pytest.mark.parametrize("refusal,fix", [(ROUTE_MISSING, "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"), (LORA_OFF, "--enable-lora"),
                                         (ServerRefused("400", 400, "LoRA rank 64 is greater than max_lora_rank 16."),
                                          "--max-lora-rank")], ids=["no_runtime_updating", "no_enable_lora", "rank"])
def test_a_server_that_cannot_load_adapters_is_named_with_the_flag_to_add(monkeypatch, refusal, fix):
    engine, _ = _engine(monkeypatch, answers={"/v1/load_lora_adapter": refusal})
    with pytest.raises(RolloutError, match=fix):
        engine.check_lora_support()
    with pytest.raises(RolloutError, match=fix):
        engine.load_adapter("/out/lora_sync/v0", 0)


def test_a_server_that_loads_adapters_passes_the_probe(monkeypatch):
    engine, sent = _engine(monkeypatch, answers={"/v1/load_lora_adapter": NOT_FOUND})
    engine.check_lora_support()
    assert sent[-1][1]["lora_path"].startswith("/nonexistent/")


@pytest.mark.parametrize("served,processed", [([0.0, -0.0, 0.0, 0.0], True), ([-4.76, -4.75, -4.76, -4.78], False)],
                         ids=["processed_logprobs", "raw_logprobs"])
def test_the_logprobs_mode_is_measured_and_raw_logprobs_stop_a_run_that_filters(monkeypatch, served, processed):
    def complete(body):
        assert body["top_k"] == 1 and body["temperature"] == 1.0
        return {"model": body["model"], "choices": [{"index": 0, "token_ids": [5] * len(served),
                                                     "logprobs": {"token_logprobs": served}, "finish_reason": "length"}]}

    engine, _ = _engine(monkeypatch, answers={"/v1/completions": complete})
    engine.check_logprobs_mode(SamplingParams(max_new_tokens=8))  # temperature 1, no filter: raw equals processed
    assert engine.processed_logprobs is processed
    filtered = SamplingParams(max_new_tokens=8, temperature=0.7)
    if processed:
        engine.check_logprobs_mode(filtered)
    else:
        with pytest.raises(RolloutError, match="restart it with --logprobs-mode processed_logprobs"):
            engine.check_logprobs_mode(filtered)
    assert [needs_processed_logprobs(SamplingParams(1, **change)) for change in (
        {}, {"temperature": 0.7}, {"top_k": 5}, {"top_p": 0.9}, {"min_p": 0.1}, {"repetition_penalty": 1.2})] == [
        False, True, True, True, True, True]


def test_the_served_model_must_be_the_trained_base_model(monkeypatch, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    models = {"data": [{"id": "Qwen/Qwen3-0.6B", "root": str(folder), "parent": None, "max_model_len": 64}]}
    engine, _ = _engine(monkeypatch, models)
    engine.check_serves("Qwen/Qwen3-0.6B")  # by its served name
    engine.check_serves(str(folder))  # by its folder
    engine.check_serves(str(tmp_path / "." / "model"))  # the same folder, written otherwise
    with pytest.raises(RolloutError, match="serves Qwen/Qwen3-0.6B .*not the trained base_model other/model.*--served-model-name"):
        engine.check_serves("other/model")


def test_a_server_that_is_neither_rlfts_nor_vllms_is_named_as_such(monkeypatch):
    engine, _ = _engine(monkeypatch)
    monkeypatch.setattr(engine, "_call", lambda *args, **kwargs: (_ for _ in ()).throw(ServerRefused("404", 404, "no")))
    with pytest.raises(RolloutError, match="neither rlft's rollout server .* nor a vLLM OpenAI server"):
        engine.describe()
    engine, _ = _engine(monkeypatch)
    assert engine.describe()["version"] == "0.32.0" and engine.describe()["max_model_len"] == 64
    engine, _ = _engine(monkeypatch)
    monkeypatch.setattr(engine, "_models", lambda: (_ for _ in ()).throw(ServerRefused("the token is wrong", 401, None)))
    with pytest.raises(RolloutError, match="the token is wrong"):  # vLLM with --api-key guards /v1/, not /version
        engine.describe()


def test_full_weights_are_refused_by_the_engine():
    engine = VLLMServerEngine("127.0.0.1", 9)
    with pytest.raises(RolloutError, match="cannot take full weights.*vllm_lora_sync: true.*rlft vllm-serve CONFIG"):
        engine.load_weights({}, 1)
    engine.close()


GRPO = {"base_model": "tiny", "datasets": [{"path": "x.jsonl"}], "rl": "grpo", "micro_batch_size": 4,
        "trl": {"num_generations": 4, "reward_funcs": ["r.f"], "use_vllm": True}}


@pytest.mark.parametrize("change,message", [
    ({}, "this run trains every weight: train a LoRA adapter synced as a folder"),
    ({"adapter": "lora"}, "without trl.vllm_lora_sync the adapter is sent merged into full weights: set trl.vllm_lora_sync"),
    ({"adapter": "lora", "trl": {"vllm_lora_sync": True}, "random_init": True}, "random_init trains from other ones"),
    ({"adapter": "lora", "trl": {"vllm_lora_sync": True, "reward_funcs": ["rlft.rollout.envs.nemo_gym.reward_env"]},
      "nemo_gym_enabled": True, "nemo_gym_auto_start": False, "nemo_gym_datasets": [{"path": "t", "server_name": "s"}],
      "nemo_gym_multi_turn": True}, "NeMo Gym's agents need the token ids and weight version of every turn"),
    ({"adapter": "lora", "trl": {"vllm_lora_sync": True, "vllm_group_port": 51216}}, "forms no weight group: remove "
     "trl.vllm_group_port"),
    ({"adapter": "lora", "trl": {"vllm_lora_sync": True}}, None),
    ({"adapter": "qlora", "load_in_4bit": True, "trl": {"vllm_lora_sync": True}}, None),
], ids=["full", "lora_merged", "random_init", "nemo_gym_multi_turn", "group_port", "lora_sync", "qlora_sync"])
def test_a_run_a_stock_server_cannot_serve_stops_with_the_fix(change, message):
    from rlft.config import build_config, deep_merge
    from rlft.config.settings import resolve
    from rlft.train.engines import stock_vllm_refusal

    cfg = build_config(deep_merge(GRPO, change))
    if message is None:
        stock_vllm_refusal(cfg, resolve(cfg), "http://127.0.0.1:8000")
        return
    with pytest.raises(RolloutError, match=f"127.0.0.1:8000 is a stock vLLM OpenAI server, .*{message}.*rlft vllm-serve CONFIG"):
        stock_vllm_refusal(cfg, resolve(cfg), "http://127.0.0.1:8000")


class AdapterOnlyEngine:
    """Takes adapters, refuses full weights: what WeightSync sees of a stock vLLM server."""

    base_fixed = True

    def __init__(self):
        self.loaded: list[tuple[str, int]] = []

    def load_weights(self, weights, version):
        raise AssertionError("a base_fixed engine was sent full weights")

    def load_adapter(self, folder, version):
        assert (folder / "adapter_model.safetensors").exists()
        self.loaded.append((folder.name, version))

    def health(self):
        return {"ok": True, "version": self.loaded[-1][1] if self.loaded else None}


def test_weight_sync_sends_a_base_fixed_engine_the_adapter_only(tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlft.models.tiny import write_tiny_model
    from rlft.train.weight_sync import WeightSync

    write_tiny_model(tmp_path / "model", "XS")
    policy = get_peft_model(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path / "model")),
                            LoraConfig(r=4, target_modules=["q_proj"]))
    engine = AdapterOnlyEngine()
    sync = WeightSync(engine, plain=True, lora_folder=tmp_path / "lora_sync")
    sync.reset(policy, 3)
    sync.prepare(policy, 4)()
    assert engine.loaded == [("v3", 3), ("v4", 4)]
    assert sorted(path.name for path in (tmp_path / "lora_sync").iterdir()) == ["v4"]  # read by the server: older ones go
