"""The rollout server as users run it: `rlft vllm-serve CONFIG` in a subprocess, driven over HTTP and by RemoteEngine."""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import threading
import time

import httpx
import pytest
import torch
import yaml
from transformers import AutoConfig, AutoModelForCausalLM

from rlft.errors import RolloutError
from rlft.models.tiny import write_tiny_model
from rlft.data.tokenizer import byte_tokenizer
from rlft.models.weights import architecture_digest, weights_checksum
from rlft.rollout.local import LocalEngine
from rlft.rollout.remote import RemoteEngine
from rlft.rollout.types import SamplingParams
from server_utils import free_port, kill_group, run_cli, saved_tiny_model, wait_for_health

pytestmark = [pytest.mark.slow, pytest.mark.server]
TOKEN = "test-token"
PROMPTS = [[49, 43, 50, 61], [55, 43, 56, 43, 57, 61]]  # "1+2=", "7+8+9="


def _model_folder(folder, max_positions: int):
    return saved_tiny_model(folder, "XS", max_positions)


def _config(folder, path, **vllm):
    path.write_text(yaml.safe_dump({"base_model": str(folder), "datasets": [{"path": "unused.jsonl"}],
                                    "vllm": {"host": "127.0.0.1", **vllm}}))
    return path


def _local(folder, state=None):
    """An in-process engine built as every engine is (the server's, `LocalEngine.from_policy`'s): weights without
    gradients. (torch's matmul takes another kernel for the prefill's last position when the weight requires grad, and
    the log-probs would differ from the server's in the last float bits.)"""
    model = AutoModelForCausalLM.from_pretrained(folder)
    if state is not None:
        model.load_state_dict(state)
    tokenizer = byte_tokenizer()
    return LocalEngine(model.requires_grad_(False), tokenizer.pad_token_id, tokenizer)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("server")
    folder = _model_folder(root / "model", 128)
    port = free_port()
    config = _config(folder, root / "serve.yaml", api_key=TOKEN, max_lora_rank=8, gpu_memory_utilization=0.5)
    log = root / "server.log"
    process = run_cli("vllm-serve", str(config), "--port", str(port), log=log)
    try:
        wait_for_health(process, port, log)
        yield {"port": port, "folder": folder, "root": root, "process": process, "log": log, "config": config,
               "url": f"http://127.0.0.1:{port}"}
    finally:
        kill_group(process)


@pytest.fixture
def remote(server):
    engine = RemoteEngine("0.0.0.0", server["port"], token=TOKEN, timeout=120)
    yield engine
    engine.close()


def test_health_answers_while_a_batch_is_generated(server):
    health = httpx.get(server["url"] + "/health/").json()
    assert health == {"status": "ok", "model": str(server["folder"]), "backend": "transformers", "weight_version": 0,
                      "weight_checksum": None, "dtype": "float32"}
    body = {"prompt_ids": [PROMPTS[0]], "n": 256, "max_tokens": 120}
    worker = threading.Thread(target=lambda: httpx.post(server["url"] + "/generate", json=body, timeout=120))
    worker.start()
    answered_while_busy = 0
    while worker.is_alive():  # a health answer counts when the batch was still being generated after it came back
        answered = httpx.get(server["url"] + "/health", timeout=2.0)
        answered_while_busy += answered.status_code == 200 and worker.is_alive()
        time.sleep(0.02)
    worker.join()
    assert answered_while_busy >= 1


def test_vllm_only_keys_are_named_as_unused_by_the_transformers_backend(server):
    assert ("note: vllm.gpu_memory_utilization apply to the vllm backend only; the transformers backend does not use "
            "them") in server["log"].read_text()


def test_weight_info_names_the_architecture(server):
    info = httpx.get(server["url"] + "/weight_info").json()
    base = AutoModelForCausalLM.from_pretrained(server["folder"])
    assert info["architecture"] == architecture_digest(base)
    assert (info["max_model_len"], info["max_lora_rank"], info["lora"], info["dtype"]) == (128, 8, None, "float32")


def test_openai_routes_tokenize_and_shapes(server):
    url = server["url"]
    models = httpx.get(url + "/v1/models").json()
    assert models["data"][0]["id"] == str(server["folder"]) and models["data"][0]["max_model_len"] == 128
    tokens = httpx.post(url + "/tokenize", json={"prompt": "1+2="}).json()
    assert tokens == {"tokens": PROMPTS[0], "count": 4, "max_model_len": 128}
    chat_tokens = httpx.post(url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()["tokens"]

    done = httpx.post(url + "/v1/completions", json={"prompt": [PROMPTS[0], PROMPTS[1]], "n": 2, "max_tokens": 5, "logprobs": 2,
                                                     "return_tokens_as_token_ids": True, "seed": 3}).json()
    assert len(done["choices"]) == 4 and done["usage"]["completion_tokens"] == sum(len(c["generation_token_ids"]) for c in done["choices"])
    for index, choice in enumerate(done["choices"]):
        assert choice["prompt_token_ids"] == PROMPTS[index // 2] and choice["finish_reason"] in ("stop", "length")
        assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["generation_token_ids"]]
        assert choice["logprobs"]["token_logprobs"] == choice["generation_log_probs"]
        assert all(len(step) <= 2 for step in choice["logprobs"]["top_logprobs"])

    chat = httpx.post(url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi", "extra_key": 1}], "max_completion_tokens": 4, "logprobs": True,
        "top_logprobs": 3, "return_tokens_as_token_ids": True, "tools": None}).json()
    choice = chat["choices"][0]
    assert choice["prompt_token_ids"] == chat_tokens and choice["message"]["role"] == "assistant"
    content = choice["logprobs"]["content"]
    assert [c["token"] for c in content] == [f"token_id:{t}" for t in choice["generation_token_ids"]]
    assert [c["logprob"] for c in content] == choice["generation_log_probs"]
    for step in content:  # the sampled token's log-prob is at most the best alternative's
        assert len(step["top_logprobs"]) == 3 and step["logprob"] <= step["top_logprobs"][0]["logprob"] + 1e-6
    assert chat["usage"] == {"prompt_tokens": len(chat_tokens), "completion_tokens": len(content),
                             "total_tokens": len(chat_tokens) + len(content)}


def test_an_answer_sent_back_with_its_sampled_ids_is_put_back_as_those_ids(server):
    """Token in, token out (what NeMo Gym's model server relies on): the next prompt extends the ids the model saw and
    wrote, even when the chat template renders the answer differently (here: other spacing than was sampled)."""
    from rlft.data.tokenizer import byte_tokenizer

    url, tokenizer = server["url"], byte_tokenizer()  # the served model's tokenizer
    first = httpx.post(url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}],
                                               "add_generation_prompt": True}).json()["tokens"]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    written = list("  Hello   there ".encode()) + [end]  # byte tokenizer: ids 0-255 are bytes
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "Hello there", "prompt_token_ids": first, "generation_token_ids": written},
                {"role": "user", "content": "and?"}]
    chat = httpx.post(url + "/v1/chat/completions", json={"messages": messages, "max_completion_tokens": 2}).json()
    prompt = chat["choices"][0]["prompt_token_ids"]
    assert prompt[: len(first) + len(written)] == first + written
    rest = tokenizer.decode(prompt[len(first) + len(written):])
    assert rest == "\n<|im_start|>user\nand?<|im_end|>\n<|im_start|>assistant\n"


def test_bad_requests_get_json_errors(server):
    url = server["url"]
    too_long = httpx.post(url + "/generate", json={"prompt_ids": [[65] * 130], "n": 1})
    assert too_long.status_code == 400 and "vllm.max_model_len is 128" in too_long.json()["error"]
    none = httpx.post(url + "/generate", json={"prompt_ids": [[65]], "n": 0, "unknown_field": 1})
    assert none.status_code == 400 and "n=0" in none.json()["error"]
    malformed = httpx.post(url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert malformed.status_code == 400 and "error" in malformed.json()
    # an empty stop string is no stop (it would end every completion after its first token)
    empty_stop = httpx.post(url + "/generate", json={"prompt_ids": [[65]], "n": 1, "max_tokens": 5, "stop": [""], "seed": 1,
                                                      "temperature": 1.0})
    assert empty_stop.status_code == 200 and len(empty_stop.json()["completion_ids"][0]) == 5
    # OpenAI's and vLLM's servers read a null as the default
    nulls = httpx.post(url + "/v1/completions", json={"prompt": [PROMPTS[0]], "max_tokens": 2, "temperature": None,
                                                      "top_p": None, "n": None, "top_k": None})
    assert nulls.status_code == 200 and len(nulls.json()["choices"]) == 1, nulls.text
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x", "prompt_token_ids": ["a"],
                                                  "generation_token_ids": [1]}, {"role": "user", "content": "more"}]
    bad_ids = httpx.post(url + "/v1/chat/completions", json={"messages": turns, "max_tokens": 2})
    assert bad_ids.status_code == 400 and "must be lists of token ids" in bad_ids.json()["error"]["message"]  # OpenAI's form
    assert "Traceback" not in server["log"].read_text()


def test_generation_equals_local_engine_with_the_same_seed(server, remote):
    params = SamplingParams(max_new_tokens=12, temperature=0.8, top_p=0.9, top_k=50, repetition_penalty=1.1,
                            stop_token_ids=(259,))
    served = remote.generate(PROMPTS, params, num_samples=3, seed=7)
    torch.manual_seed(7)
    local = _local(server["folder"]).generate(PROMPTS, params, 3)
    assert served.completion_ids == local.completion_ids
    assert served.logprobs == local.logprobs and served.truncated == local.truncated
    assert served.weight_versions == [0] * 6 and served.prompt_ids[3] == PROMPTS[1]


def test_full_sync_is_verified_and_served(server, remote):
    base = AutoModelForCausalLM.from_pretrained(server["folder"])
    trained = copy.deepcopy(base)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in trained.parameters():  # tied embeddings appear once here, twice in the state dict
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    state = trained.state_dict()
    remote.bucket_bytes = 64 * 1024  # several buckets
    remote.check_serves(trained)
    remote.load_weights(state, version=1)
    info = remote.weight_info()
    assert info["weight_version"] == 1 and info["weight_checksum"] == weights_checksum(state)
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    served = remote.generate(PROMPTS, params, num_samples=2, seed=11)
    torch.manual_seed(11)
    local = _local(server["folder"], state).generate(PROMPTS, params, 2)
    assert (served.completion_ids, served.logprobs) == (local.completion_ids, local.logprobs)
    assert served.weight_versions == [1] * 4


def _specs(model, dtype="float32"):
    from rlft.rollout.weight_group import TensorSpec

    return [TensorSpec(name, tuple(t.shape), dtype) for name, t in sorted(model.state_dict().items())]


def _trained(folder, seed: int):
    model = AutoModelForCausalLM.from_pretrained(folder)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return model


def test_collective_sync_is_verified_served_and_falls_back_to_http_when_the_group_breaks(server, remote):
    """Full weights as gloo broadcasts (several buckets, the embedding alone and received in place), served exactly as
    sent; then a group broken on the trainer's side: the update goes over HTTP, with a note."""
    trained = _trained(server["folder"], 31)
    notes = []
    remote.on_note = notes.append
    assert remote.open_group(free_port(), _specs(trained), timeout=5) == "gloo"
    remote.group.bucket_bytes = 64 * 1024  # several buckets; the 66 KB embedding goes alone
    state = trained.state_dict()
    remote.load_weights(state, version=41)
    info = remote.weight_info()
    assert (info["weight_version"], info["weight_checksum"]) == (41, weights_checksum(state))
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    served = remote.generate(PROMPTS, params, num_samples=2, seed=17)
    torch.manual_seed(17)
    local = _local(server["folder"], state).generate(PROMPTS, params, 2)
    assert (served.completion_ids, served.logprobs, served.weight_versions) == (local.completion_ids, local.logprobs, [41] * 4)

    class BrokenEnd:  # the trainer's end of the group breaks (and the real one is freed: its connections close)
        source = 1

        def broadcast(self, tensor):
            raise RuntimeError("Connection reset by peer")

    again = _trained(server["folder"], 32).state_dict()
    remote.group.group = BrokenEnd()
    remote.load_weights(again, version=42)
    assert remote.group is None and "weights go to the rollout server over HTTP from now on" in notes[0]
    info = remote.weight_info()
    assert (info["weight_version"], info["weight_checksum"]) == (42, weights_checksum(again))

    remote.relabel(43)  # a step that changed nothing: the version moves on, no weights travel
    info = remote.weight_info()
    assert (info["weight_version"], info["weight_checksum"]) == (43, weights_checksum(again))
    assert remote.generate(PROMPTS, params, num_samples=1, seed=3).weight_versions == [43, 43]
    stale = httpx.post(server["url"] + "/set_weight_version", json={"from_version": 41, "version": 44},
                       headers={"Authorization": f"Bearer {TOKEN}"})
    assert stale.status_code == 409 and "serves weight version 43, not 41: send the weights instead" in stale.json()["error"]


def test_weight_group_handshake_refuses_another_shape_a_taken_port_and_a_missing_token(server, remote, tmp_path):
    import socket

    other = tmp_path / "other"
    write_tiny_model(other, "S", max_positions=128)
    wider = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(other))
    with pytest.raises(RolloutError, match=r"different shapes: tensor 'lm_head.weight' has shape \(260, 128\) in the "
                                           r"trainer and \(260, 64\) in the served model"):
        remote.open_group(free_port(), _specs(wider))
    base = AutoModelForCausalLM.from_pretrained(server["folder"])
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(RolloutError, match=f"the weight group's port {port} on the server's machine is in use"):
            remote.open_group(port, _specs(base))
    anonymous = RemoteEngine("127.0.0.1", server["port"], token=None, timeout=30)
    with pytest.raises(RolloutError, match="401.*token is wrong or missing"):
        anonymous.open_group(free_port(), _specs(base))
    wrong = httpx.post(server["url"] + "/init_weight_group", json={"port": free_port(), "tensors": []},
                       headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401


def _adapter(folder, base_folder, rank: int):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(rank)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_folder),
                           LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    model.save_pretrained(folder)
    return model


def test_lora_sync_is_verified_and_a_rank_above_the_limit_refused(server, remote):
    from safetensors.torch import load_file

    saved = server["folder"] / "model.safetensors"  # back to the base weights, read from a shared path
    remote.load_weights_from_path(saved, version=2, checksum=weights_checksum(load_file(str(saved))))
    folder = server["root"] / "adapter-r4"
    adapted = _adapter(folder, server["folder"], 4)
    checksum = weights_checksum(load_file(str(folder / "adapter_model.safetensors")))
    remote.load_adapter(folder, version=3, checksum=checksum)
    info = remote.weight_info()
    assert info["lora"] == {"rank": 4, "version": 3} and info["weight_version"] == 3
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    served = remote.generate(PROMPTS, params, num_samples=2, seed=5)
    torch.manual_seed(5)
    tokenizer = byte_tokenizer()
    local = LocalEngine(adapted, tokenizer.pad_token_id, tokenizer).generate(PROMPTS, params, 2)
    assert (served.completion_ids, served.logprobs) == (local.completion_ids, local.logprobs)

    _adapter(server["root"] / "adapter-r16", server["folder"], 16)
    with pytest.raises(RolloutError, match=r"LoRA rank 16 is above vllm.max_lora_rank=8: raise vllm.max_lora_rank or lower lora_r"):
        remote.load_adapter(server["root"] / "adapter-r16", version=4)
    assert remote.weight_info()["weight_version"] == 3  # nothing changed

    # an adapter of the same shape refused half-way (a tensor missing): the one served before is served unchanged
    from safetensors.torch import save_file

    broken = server["root"] / "adapter-r4-broken"
    _adapter(broken, server["folder"], 4)
    tensors = load_file(str(broken / "adapter_model.safetensors"))
    save_file(dict(list(tensors.items())[1:]), str(broken / "adapter_model.safetensors"))
    with pytest.raises(RolloutError):
        remote.load_adapter(broken, version=5)
    info = remote.weight_info()
    assert info["lora"] == {"rank": 4, "version": 3} and info["weight_version"] == 3
    again = remote.generate(PROMPTS, params, num_samples=2, seed=5)
    assert (again.completion_ids, again.logprobs) == (local.completion_ids, local.logprobs)

    # an adapter of another shape that PEFT cannot wrap (modules the model lacks): the same, not the bare base
    import json

    foreign = server["root"] / "adapter-r2-foreign"
    _adapter(foreign, server["folder"], 2)
    config = json.loads((foreign / "adapter_config.json").read_text())
    (foreign / "adapter_config.json").write_text(json.dumps({**config, "target_modules": ["no_such_proj"]}))
    with pytest.raises(RolloutError, match="cannot be applied to the served model"):
        remote.load_adapter(foreign, version=6)
    info = remote.weight_info()
    assert info["lora"] == {"rank": 4, "version": 3} and info["weight_version"] == 3
    again = remote.generate(PROMPTS, params, num_samples=2, seed=5)
    assert (again.completion_ids, again.logprobs) == (local.completion_ids, local.logprobs)


@pytest.mark.parametrize("lora_sync", [False, True])
def test_a_new_runs_first_push_replaces_everything_the_server_held(server, remote, tmp_path, lora_sync):
    """The server still holds the previous test's adapter (or the previous run's weights): a run's reset must leave it
    serving exactly the new policy (plain weights, merged or base + adapter), never old layers or an old adapter."""
    from peft import LoraConfig, get_peft_model

    from rlft.train.weight_sync import WeightSync

    remote.load_adapter(*_held_adapter(server), version=20)  # something of "another run" on top
    torch.manual_seed(21)
    policy = AutoModelForCausalLM.from_pretrained(server["folder"])
    with torch.no_grad():
        for parameter in policy.parameters():  # a different base than the served one, in every layer
            parameter.add_(torch.randn(parameter.shape) * 0.05)
    policy = get_peft_model(policy, LoraConfig(r=2, target_modules=["k_proj"], init_lora_weights=False))
    WeightSync(remote, plain=True, lora_folder=tmp_path if lora_sync else None).reset(policy, 0)
    info = remote.weight_info()
    assert info["weight_version"] == 0 and info["lora"] == ({"rank": 2, "version": 0} if lora_sync else None)
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    served = remote.generate(PROMPTS, params, num_samples=2, seed=13)
    torch.manual_seed(13)
    tokenizer = byte_tokenizer()
    local = LocalEngine(policy.eval(), tokenizer.pad_token_id, tokenizer).generate(PROMPTS, params, 2)
    assert served.completion_ids == local.completion_ids
    assert torch.allclose(torch.tensor(sum(served.logprobs, [])), torch.tensor(sum(local.logprobs, [])), atol=1e-5)


def _held_adapter(server):
    folder = server["root"] / "adapter-r4"
    if not folder.exists():
        _adapter(folder, server["folder"], 4)
    return (folder,)


def test_corrupted_transfer_is_refused(server, remote, monkeypatch):
    from safetensors.torch import save

    weights = {name: tensor.clone() for name, tensor in AutoModelForCausalLM.from_pretrained(server["folder"]).state_dict().items()
               if "layers.0." in name}
    before = remote.weight_info()
    body = bytearray(save(weights))
    body[-8:] = bytes(255 - b for b in body[-8:])  # flip bytes of the last tensor's data, keep the claimed checksum
    answer = httpx.post(server["url"] + "/update_weights", content=bytes(body), headers={"Authorization": f"Bearer {TOKEN}"},
                        params={"version": 9, "checksum": weights_checksum(weights), "bucket": 0, "buckets": 1})
    assert answer.status_code == 400 and answer.json()["error"].startswith("transfer corrupted")

    from rlft.rollout import wire

    encode = wire.encode

    def corrupting_encode(tensors):  # the sender's encoding damages the last tensor's bytes
        chunks, size = encode(tensors)
        last = bytearray(chunks[-1])
        last[-4:] = bytes(255 - b for b in last[-4:])
        return [*chunks[:-1], bytes(last)], size

    monkeypatch.setattr(wire, "encode", corrupting_encode)
    with pytest.raises(RolloutError, match="transfer corrupted"):
        remote.load_weights(weights, version=9)
    after = remote.weight_info()
    assert (after["weight_version"], after["weight_checksum"]) == (before["weight_version"], before["weight_checksum"])


def test_weight_changes_need_the_token(server):
    url = server["url"]
    missing = httpx.post(url + "/reset_prefix_cache")
    assert missing.status_code == 401 and "vllm.api_key" in missing.json()["error"]
    wrong = httpx.post(url + "/load_lora_adapter", json={"lora_path": "/nowhere", "version": 1},
                       headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "wrong token" in wrong.json()["error"]
    assert httpx.post(url + "/reset_prefix_cache", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    anonymous = RemoteEngine("127.0.0.1", server["port"], token=None, timeout=30)
    with pytest.raises(RolloutError, match="token is wrong or missing.*RLFT_SERVER_TOKEN"):
        anonymous.load_weights({"model.norm.weight": torch.ones(64)}, version=5)


def test_port_in_use_is_a_clear_error(server, tmp_path):
    log = tmp_path / "second.log"
    process = run_cli("vllm-serve", str(server["config"]), "--port", str(server["port"]), log=log)
    try:
        assert process.wait(timeout=120) == 1
    finally:
        kill_group(process)
    text = log.read_text()
    assert f"port {server['port']} on 127.0.0.1 is in use: stop the other server or set vllm.port / --port" in text
    assert "Traceback" not in text and "loading" not in text


def test_wait_until_ready_names_the_command_to_start():
    port = free_port()
    engine = RemoteEngine("127.0.0.1", port)
    seen = []
    start = time.monotonic()
    with pytest.raises(RolloutError, match=rf"no rollout server answered at http://127.0.0.1:{port}/health.*`rlft vllm-serve CONFIG`"):
        engine.wait_until_ready(timeout=2.0, on_progress=seen.append)
    assert time.monotonic() - start < 10 and seen


@contextlib.contextmanager
def _own_server(tmp_path, max_positions: int):
    """A server of the test's own (it gets stopped, hung or killed): (its process, a RemoteEngine, the model folder)."""
    folder = _model_folder(tmp_path / "model", max_positions)
    port = free_port()
    log = tmp_path / "server.log"
    process = run_cli("vllm-serve", str(_config(folder, tmp_path / "serve.yaml")), "--port", str(port), log=log)
    try:
        wait_for_health(process, port, log)
        yield process, RemoteEngine("127.0.0.1", port, timeout=300), folder, (port, log)
    finally:
        kill_group(process)


def test_a_dead_or_hung_server_is_noticed_within_10_seconds(tmp_path):
    with _own_server(tmp_path, 4096) as (process, engine, _, (port, log)):
        engine.health()
        params = SamplingParams(max_new_tokens=4000, temperature=1.0)

        def outcome(stop):
            result = {}

            def call():
                try:
                    engine.generate([PROMPTS[0]] * 8, params)
                except RolloutError as exc:
                    result["error"], result["at"] = exc, time.monotonic()

            worker = threading.Thread(target=call)
            worker.start()
            time.sleep(1.5)
            stopped = time.monotonic()
            stop()
            worker.join(30)
            return result, result.get("at", float("inf")) - stopped

        hung, waited = outcome(lambda: os.killpg(process.pid, signal.SIGSTOP))
        assert "stopped answering (it died or hangs)" in str(hung.get("error")) and waited < 10
        os.killpg(process.pid, signal.SIGCONT)
        wait_for_health(process, port, log)
        dead, waited = outcome(lambda: os.killpg(process.pid, signal.SIGKILL))
        assert "rlft vllm-serve CONFIG" in str(dead.get("error")) and waited < 10


def test_a_server_that_hangs_or_dies_mid_broadcast_stops_the_trainer_within_10_seconds(tmp_path):
    with _own_server(tmp_path, 128) as (process, engine, folder, _):
        trained = _trained(folder, 5)
        engine.open_group(free_port(), _specs(trained), timeout=120)  # longer than the wait allowed: health decides
        os.killpg(process.pid, signal.SIGSTOP)  # hung: the broadcast and the update call wait on it
        began = time.monotonic()
        with pytest.raises(RolloutError, match="stopped answering .it died or hangs.*the last checkpoint is kept"):
            engine.load_weights(trained.state_dict(), version=1)
        assert time.monotonic() - began < 10
        os.killpg(process.pid, signal.SIGKILL)
        began = time.monotonic()
        with pytest.raises(RolloutError, match="rlft vllm-serve CONFIG"):
            engine.load_weights(trained.state_dict(), version=2)
        assert time.monotonic() - began < 10


def test_sigterm_stops_the_server_cleanly(server):
    process = server["process"]
    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    assert "rollout server stopped (SIGTERM)" in server["log"].read_text()


@pytest.mark.compile
def test_a_compiled_server_samples_as_the_eager_engine_before_and_after_a_weight_push(tmp_path):
    """`torch_compile: true` serves through the compiled decode step (static KV cache), as in-process runs do: the same
    tokens as the eager engine at the same seed, log-probs within float rounding, and after a full weight push the new
    weights (a compiled step that kept the old ones as constants would go on sampling from them). The server's wiring
    is what this checks, with aot_eager (dynamo's graphs, no C++ build); inductor's decode step, weights loaded later
    included, is tests/unit/test_engine.py's."""
    folder = _model_folder(tmp_path / "model", 128)
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump({"base_model": str(folder), "datasets": [{"path": "unused.jsonl"}], "torch_compile": True,
                                      "torch_compile_backend": "aot_eager", "vllm": {"host": "127.0.0.1", "api_key": TOKEN}}))
    trained = AutoModelForCausalLM.from_pretrained(folder)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in trained.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    port, log = free_port(), tmp_path / "server.log"
    process = run_cli("vllm-serve", str(config), "--port", str(port), log=log)
    try:
        wait_for_health(process, port, log)
        assert "decode step compiled (torch_compile)" in log.read_text()
        remote = RemoteEngine("127.0.0.1", port, token=TOKEN, timeout=300)
        params = SamplingParams(max_new_tokens=10, temperature=1.0)
        for version, state in ((0, None), (1, trained.state_dict())):
            if state is not None:
                remote.load_weights(state, version=version)
            served = remote.generate(PROMPTS, params, num_samples=2, seed=11)
            torch.manual_seed(11)
            local = _local(folder, state).generate(PROMPTS, params, 2)
            assert served.completion_ids == local.completion_ids, version
            assert max(abs(a - b) for got, want in zip(served.logprobs, local.logprobs) for a, b in zip(got, want)) < 1e-4
            assert served.weight_versions == [version] * 4
        remote.close()
    finally:
        kill_group(process)
