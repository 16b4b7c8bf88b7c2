"""Rollout-server pieces without a server: backend choice, tokens, bucket order, adapter folders, checksums,
and the vLLM backend (skipped where vLLM or CUDA is missing)."""

import asyncio
import importlib.util
import json

import pytest
import torch
from safetensors.torch import save

from rlft.config.settings.rollout import server_settings
from rlft.errors import ConfigError
from rlft.models.weights import architecture_digest, weights_checksum
from rlft.rollout.server.backends import choose_backend
from rlft.rollout.server.protocol import UNKNOWN_VERSION, Generated, GenerationRequest, ServerError
from rlft.rollout.types import SamplingParams
from rlft.rollout.server.security import is_loopback, resolve_token
from rlft.rollout.server.engine_thread import EngineThread, ThreadedBackend
from rlft.rollout.server.transfer import StreamedTransfer, body_digest, read_adapter_folder

HAS_VLLM = importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="the vllm backend needs the vllm package and a CUDA GPU")


def test_auto_backend_is_transformers_without_vllm_or_cuda():
    if HAS_VLLM:
        pytest.skip("vllm and CUDA are present here")
    assert choose_backend("auto") == "transformers" and choose_backend("transformers") == "transformers"
    with pytest.raises(ConfigError, match="--backend transformers"):
        choose_backend("vllm")


def test_a_token_is_generated_only_beyond_loopback(monkeypatch):
    monkeypatch.delenv("RLFT_SERVER_TOKEN", raising=False)
    assert all(is_loopback(host) for host in ("127.0.0.1", "127.3.4.5", "::1", "localhost", "[::1]"))
    assert not any(is_loopback(host) for host in ("0.0.0.0", "10.0.0.2", "::", "myhost"))
    assert resolve_token(None, "127.0.0.1") == (None, False)
    token, generated = resolve_token(None, "0.0.0.0")
    assert generated and len(token) >= 32
    assert resolve_token("mine", "0.0.0.0") == ("mine", False)
    monkeypatch.setenv("RLFT_SERVER_TOKEN", "from-env")
    assert resolve_token(None, "0.0.0.0") == ("from-env", False)


def test_checksums_see_every_bit_and_dtype():
    weights = {"b": torch.arange(6.0).reshape(2, 3), "a": torch.ones(2, dtype=torch.bfloat16)}
    assert weights_checksum(weights) == weights_checksum(dict(reversed(list(weights.items()))))
    changed = dict(weights, b=weights["b"].clone())
    changed["b"][1, 2] = torch.nextafter(changed["b"][1, 2], torch.tensor(100.0))
    assert weights_checksum(changed) != weights_checksum(weights)
    assert weights_checksum({"b": weights["b"].double(), "a": weights["a"]}) != weights_checksum(weights)
    assert architecture_digest(weights) == architecture_digest({"a": torch.zeros(2), "b": torch.zeros(2, 3)})


class _DictBackend(ThreadedBackend):
    """A backend whose model is a dict of tensors, and whose generation reports the weights it saw."""

    def __init__(self, **tensors):
        self.weights = {name: tensor.clone() for name, tensor in tensors.items()}
        self._shapes = {name: (tuple(t.shape), t.dtype) for name, t in tensors.items()}
        self.weight_version, self.weight_checksum, self.base_updated = 0, None, False
        self._thread = EngineThread(self._run_batch)

    def _write_weights(self, tensors):
        for name, tensor in tensors.items():
            self.weights[name].copy_(tensor)
        return {name: self.weights[name] for name in tensors}

    def _run_batch(self, requests):
        seen = float(sum(t.sum() for t in self.weights.values()))
        return [Generated([[0]], [[seen]], [False], None, self.weight_version, self.weight_checksum) for _ in requests]


async def _add(transfer, tensors, body=None, **where):
    body = body if body is not None else save(tensors)
    where.setdefault("digest", body_digest(body))
    where.setdefault("checksum", None)
    return await transfer.add(body, **where)


def test_streamed_buckets_load_as_they_arrive_in_order_and_verified():
    backend = _DictBackend(x=torch.zeros(2), y=torch.zeros(3))
    transfer = StreamedTransfer(backend)
    first, second = {"x": torch.ones(2)}, {"y": torch.full((3,), 2.0)}
    whole = weights_checksum({**first, **second})

    async def scenario():
        assert await _add(transfer, first, version=1, bucket=0, buckets=2) is None
        await transfer.loading
        assert torch.equal(backend.weights["x"], torch.ones(2)) and backend.weight_version == UNKNOWN_VERSION  # not served
        with pytest.raises(ServerError, match="resend the transfer from bucket 0"):
            await _add(transfer, second, version=2, bucket=1, buckets=2)
        assert await _add(transfer, first, version=1, bucket=0, buckets=2) is None
        done = await _add(transfer, second, version=1, bucket=1, buckets=2, checksum=whole)
        assert done == {"weight_version": 1, "weight_checksum": whole, "received_checksum": whole}
        assert (backend.weight_version, backend.weight_checksum) == (1, whole)

        with pytest.raises(ServerError, match="transfer corrupted"):  # not safetensors: nothing loaded
            await _add(transfer, {}, body=b"not safetensors", version=3, bucket=0, buckets=1)
        damaged = bytearray(save({"x": torch.full((2,), 5.0)}))
        digest = body_digest(bytes(damaged))
        damaged[-1] ^= 0xFF
        with pytest.raises(ServerError, match="transfer corrupted: bucket 0 of version 3 arrived with digest"):
            await _add(transfer, {}, body=bytes(damaged), version=3, bucket=0, buckets=2, digest=digest)  # damaged on the way
        with pytest.raises(ServerError, match="transfer corrupted: the weights received"):  # one bucket: its checksum too
            await _add(transfer, {"x": torch.full((2,), 5.0)}, version=3, bucket=0, buckets=1, checksum=whole)
        assert backend.weight_version == 1 and torch.equal(backend.weights["x"], torch.ones(2))
        assert await _add(transfer, second, version=3, bucket=0, buckets=2) is None
        with pytest.raises(ServerError, match="comes after 'y': buckets must hold the tensors in name order"):
            await _add(transfer, first, version=3, bucket=1, buckets=2)
        assert backend.weight_version == UNKNOWN_VERSION  # the first bucket was loaded: neither version is served
        with pytest.raises(ServerError, match="has shape"):
            await _add(transfer, {"x": torch.ones(4)}, version=4, bucket=0, buckets=1)

    asyncio.run(scenario())
    backend.close()


def test_generation_waits_for_the_last_bucket_and_a_stalled_sender_leaves_no_version():
    backend = _DictBackend(x=torch.zeros(2), y=torch.zeros(3))
    transfer = StreamedTransfer(backend)
    request = GenerationRequest([[1]], 1, SamplingParams(max_new_tokens=1))

    async def during_transfer():
        assert await transfer.add(save({"x": torch.ones(2)}), version=1, bucket=0, buckets=2, digest=None,
                                  checksum=None) is None
        waiting = asyncio.ensure_future(backend.generate(request))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # held: the weights are half new
        await transfer.add(save({"y": torch.ones(3)}), version=1, bucket=1, buckets=2, digest=None, checksum=None)
        return await waiting

    generated = asyncio.run(during_transfer())
    assert generated.logprobs == [[5.0]] and generated.weight_version == 1

    async def stalled():
        await backend.on_engine(lambda: backend.begin_now(2, stall_timeout=0.2))  # as a first bucket does; no more come
        return await backend.generate(request)

    generated = asyncio.run(asyncio.wait_for(stalled(), 10))
    assert generated.weight_version == UNKNOWN_VERSION
    backend.close()


def test_adapter_folders_are_read_from_safetensors_only(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 64}))
    (tmp_path / "adapter_model.bin").write_bytes(b"pickle")
    with pytest.raises(ServerError, match="adapter_model.bin .a pickle., which the server never reads"):
        read_adapter_folder(str(tmp_path), max_lora_rank=64)
    (tmp_path / "adapter_model.safetensors").write_bytes(save({"w.lora_A.weight": torch.ones(64, 4)}))
    with pytest.raises(ServerError, match="LoRA rank 64 is above vllm.max_lora_rank=32: raise vllm.max_lora_rank or lower lora_r"):
        read_adapter_folder(str(tmp_path), max_lora_rank=32)
    adapter = read_adapter_folder(str(tmp_path), max_lora_rank=64)
    assert adapter.rank == 64 and adapter.checksum == weights_checksum(adapter.tensors)


@needs_vllm
def test_vllm_backend_generates_and_loads_weights(tmp_path):
    import asyncio

    from transformers import AutoConfig, AutoModelForCausalLM

    from rlft.config import build_config
    from rlft.models.tiny import write_tiny_model
    from rlft.rollout.server.backends.vllm import VLLMBackend
    from rlft.rollout.server.requests import generation_request

    folder = write_tiny_model(tmp_path / "m", "S", max_positions=256)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).to(torch.bfloat16)
    model.save_pretrained(folder)
    cfg = build_config({"base_model": str(folder), "datasets": [{"path": "unused.jsonl"}],
                        "vllm": {"gpu_memory_utilization": 0.2, "enforce_eager": True, "dtype": "bfloat16"}})
    backend = VLLMBackend.from_config(server_settings(cfg))
    try:
        request = generation_request(backend, [[49, 43, 50, 61]], n=3, max_tokens=8, temperature=1.0, top_p=0.9, top_k=20,
                                     min_p=0.0, repetition_penalty=1.0, stop_token_ids=[], stop=[], seed=1)
        out = asyncio.run(backend.generate(request))
        assert len(out.completion_ids) == 3 and all(len(ids) == 8 for ids in out.completion_ids)
        assert all(lp <= 0 for row in out.logprobs for lp in row) and out.truncated == [True] * 3
        state = {name: tensor.clone() for name, tensor in model.state_dict().items() if name != "lm_head.weight"}
        assert asyncio.run(backend.load_weights(state, 1)) == weights_checksum(state)
        assert asyncio.run(backend.generate(request)).weight_version == 1
    finally:
        backend.close()


def test_a_generated_token_is_kept_for_the_same_user_only(tmp_path, monkeypatch):
    import stat

    from rlft.rollout.server.security import local_token, save_generated_token

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert local_token(8123) is None
    path = save_generated_token("abc", 8123)
    assert local_token(8123) == "abc" and local_token(8124) is None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_colocated_engine_loads_verified_weights_and_adapters_in_process(tmp_path):
    """vllm_mode: colocate wraps the server's backend without HTTP; exercised here with the transformers backend (the
    vLLM one needs a GPU): generation carries the version, loads are verified, a bad adapter is a RolloutError."""
    import pytest
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlft.errors import RolloutError
    from rlft.models.tiny import write_tiny_model
    from rlft.data.tokenizer import byte_tokenizer
    from rlft.rollout.server.backends.transformers import TransformersBackend
    from rlft.rollout.server.colocated import ColocatedEngine
    from rlft.rollout.types import SamplingParams

    write_tiny_model(tmp_path / "m", "XS")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path / "m"))
    backend = TransformersBackend(model, byte_tokenizer(), model_name="m", dtype=torch.float32, max_model_len=64, max_lora_rank=4)
    engine = ColocatedEngine(backend, version=3)
    try:
        rollout = engine.generate([[49, 43, 50, 61]], SamplingParams(max_new_tokens=3), 2, seed=0)
        assert rollout.weight_versions == [3, 3] and len(rollout.completion_ids) == 2
        changed = {name: p.detach() + 0.01 for name, p in model.named_parameters() if "layers.0" in name}
        engine.load_weights(changed, 4)
        assert engine.health()["version"] == 4
        adapter = get_peft_model(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path / "m")),
                                 LoraConfig(r=8, target_modules=["q_proj"]))
        adapter.save_pretrained(tmp_path / "lora", safe_serialization=True)
        with pytest.raises(RolloutError, match="max_lora_rank"):
            engine.load_adapter(tmp_path / "lora", 5)
        with pytest.raises(RolloutError, match="refused the weights"):
            engine.load_weights({"no.such.weight": torch.zeros(1)}, 6)
    finally:
        engine.close()


def test_a_pissa_adapter_pushed_with_its_residual_base_gives_the_trainer_s_model(tmp_path):
    """A PiSSA run's lora sync sends the residual base, then the adapter as trained, whose config still names the
    init: the server must not run that init again on the residual."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlft.models.tiny import write_tiny_model
    from rlft.data.tokenizer import byte_tokenizer
    from rlft.models.weights import plain_state_dict
    from rlft.rollout.server.backends.transformers import TransformersBackend
    from rlft.rollout.server.colocated import ColocatedEngine

    write_tiny_model(tmp_path / "m", "XS")
    torch.manual_seed(0)
    policy = get_peft_model(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path / "m")),
                            LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights="pissa_niter_2"))
    with torch.no_grad():
        for parameter in policy.parameters():
            if parameter.requires_grad:
                parameter.add_(0.05)
    policy.save_pretrained(tmp_path / "lora", safe_serialization=True)
    torch.manual_seed(1)
    served = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path / "m"))  # other weights, replaced below
    engine = ColocatedEngine(TransformersBackend(served, byte_tokenizer(), model_name="m", dtype=torch.float32,
                                                 max_model_len=64, max_lora_rank=4), version=0)
    try:
        engine.load_weights(plain_state_dict(policy), 1)
        engine.load_adapter(tmp_path / "lora", 2)
        ids = torch.tensor([[49, 43, 50, 61]])
        with torch.no_grad():
            torch.testing.assert_close(engine.backend._engine.model(ids).logits, policy.eval()(ids).logits)
    finally:
        engine.close()


def test_vllm_only_keys_exist_in_the_vllm_section():
    from rlft.config.sections.vllm import VLLMConfig
    from rlft.rollout.server.launch import VLLM_ONLY

    assert VLLM_ONLY <= set(VLLMConfig.model_fields)


def test_a_sampled_turn_replaces_its_rendering_and_keeps_what_follows_its_end_marker():
    from rlft.rollout.server.openai_routes import splice_sampled_turn

    END = 99
    head = [1, 2, 10, 11, END, 7]  # prompt 1 2, answer rendered as 10 11, end marker, newline
    rendered = head + [3, 4]  # then the next user turn
    sampled = [1, 2, 12, 13, 14, END]  # the answer as it was sampled: other ids
    assert splice_sampled_turn(rendered, head, sampled, {END}) == [1, 2, 12, 13, 14, END, 7, 3, 4]


def test_a_turn_that_was_cut_off_or_does_not_match_is_left_as_rendered():
    from rlft.rollout.server.openai_routes import splice_sampled_turn

    END, head = 99, [1, 2, 10, 99, 7]
    assert splice_sampled_turn(head + [3], head, [1, 2, 10, 11], {END}) == head + [3]  # cut off: no end marker
    assert splice_sampled_turn([5] + head, head, [1, 2, 10, END], {END}) == [5] + head  # head is not a prefix
    assert splice_sampled_turn(head + [3], head, [], {END}) == head + [3]


def test_an_adapter_on_base_weights_in_an_unknown_state_is_refused():
    """After a full update failed part-way the server serves version -1 (its samples are refused); an adapter loaded
    on top must not give it a valid version again: only a full update does."""
    import asyncio

    from rlft.rollout.server.engine_thread import ThreadedBackend

    class Backend(ThreadedBackend):
        def dead(self):  # no engine thread here; an alive one
            return None

        def _load_adapter(self, adapter, version):
            raise AssertionError("must not be reached")

    backend = Backend()
    backend.weight_version = -1
    with pytest.raises(ServerError, match="unknown state .* send a full update") as refused:
        asyncio.run(backend.load_adapter(None, 3))
    assert refused.value.status == 409


def test_a_request_the_engine_refuses_fails_alone():
    """A batch that fails as a whole is run again request by request: the refused one gets its error, the others
    their results (a vLLM batch fails whole for one bad request)."""
    from concurrent.futures import Future

    from rlft.rollout.server.engine_thread import EngineThread

    calls = []

    def run_batch(requests):
        calls.append(list(requests))
        if "bad" in requests:
            raise ValueError("the engine refuses 'bad'")
        return [f"out-{request}" for request in requests]

    thread = EngineThread(run_batch)
    futures = [Future() for _ in range(3)]
    try:
        thread._flush(list(zip(["a", "bad", "c"], futures)))
    finally:
        thread.stop()
    assert [f.result() for f in (futures[0], futures[2])] == ["out-a", "out-c"]
    with pytest.raises(ValueError, match="refuses 'bad'"):
        futures[1].result()
    assert calls == [["a", "bad", "c"], ["a"], ["bad"], ["c"]]


def test_a_dead_engine_answers_503_and_fails_the_trainers_call_at_once(tmp_path):
    """The engine dies (vLLM's engine core exits, or the engine thread ends): /health says so with 503, a generation
    waiting on it fails at the trainer's next health check with the server's reason (not after ~10 s of unanswered
    checks, or never), and later work is refused with 503 at once."""
    import threading
    import time

    import httpx
    import uvicorn
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlft.errors import RolloutError
    from rlft.models.tiny import write_tiny_model
    from rlft.data.tokenizer import byte_tokenizer
    from rlft.rollout.remote import RemoteEngine
    from rlft.rollout.server.app import build_app
    from rlft.rollout.server.backends.transformers import TransformersBackend
    from rlft.rollout.types import SamplingParams

    write_tiny_model(tmp_path / "m", "XS")
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path / "m"))
    backend = TransformersBackend(model, byte_tokenizer(), model_name="m", dtype=torch.float32, max_model_len=64, max_lora_rank=4)
    server = uvicorn.Server(uvicorn.Config(build_app(backend, model_name="m", token=None, ends=(0,)), host="127.0.0.1",
                                           port=0, log_level="error"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    engine = RemoteEngine("127.0.0.1", port, timeout=60, health_interval=0.2)
    gate = threading.Event()
    try:
        assert engine.health()["ok"]
        assert len(engine.generate([[49, 43, 50, 61]], SamplingParams(max_new_tokens=2)).completion_ids) == 1
        run_batch = backend._thread._run_batch
        backend._thread._run_batch = lambda requests: (gate.wait(), run_batch(requests))[1]  # the next batch hangs...
        reason: list[str] = []
        backend.dead = lambda: reason[0] if reason else None
        waiting: list[httpx.Response] = []  # a client without the trainer's probe (an OpenAI route, NeMo Gym)
        other = threading.Thread(target=lambda: waiting.append(httpx.post(
            f"http://127.0.0.1:{port}/v1/completions", json={"model": "m", "prompt": [49, 43], "max_tokens": 2}, timeout=20)))
        other.start()
        threading.Timer(0.5, reason.append, ["its engine core has exited"]).start()  # ...and the engine dies under it
        started = time.monotonic()
        with pytest.raises(RolloutError, match="the engine is dead: its engine core has exited"):  # the probe, or the
            engine.generate([[49, 43, 50, 61]], SamplingParams(max_new_tokens=2))  # server's own check of the batch
        assert time.monotonic() - started < 5
        answer = httpx.get(f"http://127.0.0.1:{port}/health/", timeout=5)
        assert answer.status_code == 503 and answer.json()["status"] == "unhealthy"
        assert answer.json()["error"] == "the engine is dead: its engine core has exited"
        other.join(5)  # answered by the server's own check, not left waiting on the batch
        assert waiting and waiting[0].status_code == 503 and "its engine core has exited" in waiting[0].json()["error"]["message"]
        gate.set()
        del backend.dead  # the thread itself ends: the base check sees it
        backend._thread.stop()
        assert "its engine thread has stopped" in httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()["error"]
        with pytest.raises(RolloutError, match=r"refused /generate \(503\): the engine is dead"):
            engine.generate([[49, 43, 50, 61]], SamplingParams(max_new_tokens=2))
    finally:
        gate.set()
        engine.close()
        server.should_exit = True


def test_wire_bytes_are_safetensors_both_ways():
    from safetensors.torch import load

    from rlft.rollout import wire

    tensors = {"b": torch.arange(6, dtype=torch.bfloat16).view(2, 3), "a": torch.ones(3), "empty": torch.zeros(0, 4),
               "flag": torch.tensor([True, False])}
    chunks, size = wire.encode(tensors)
    body = b"".join(bytes(chunk) for chunk in chunks)
    assert len(body) == size
    for read in (load(body), wire.decode(body), wire.decode(save(tensors))):  # the library reads ours; we read its
        assert set(read) == set(tensors) and all(torch.equal(read[name], tensors[name]) for name in tensors)
    def with_offsets(offsets) -> bytes:
        header = json.dumps({"t": {"dtype": "F32", "shape": [1], "data_offsets": offsets}}).encode()
        return len(header).to_bytes(8, "little") + header + b"\x00" * 4

    assert wire.decode(with_offsets([0, 4]))["t"].tolist() == [0.0]
    for bad, reason in ((body[:5], "shorter than its 8-byte header"), (b"\xff" * 8 + body[8:], "runs past the end"),
                        (body[:-1], "do not hold a"), (with_offsets(["0", "4"]), "not a dtype, shape and data_offsets"),
                        (with_offsets([0.0, 4.0]), "not a dtype, shape and data_offsets")):
        with pytest.raises(ValueError, match=reason):
            wire.decode(bad)
    with pytest.raises(ValueError, match="contiguous CPU tensor"):
        wire.encode({"t": torch.ones(4, 4).t()})


def test_bucket_plan_sends_large_tensors_alone_and_groups_small_ones_in_name_order():
    from rlft.rollout.weight_group import TensorSpec, bucket_plan

    specs = [TensorSpec("b.norm", (256,), "float32"), TensorSpec("a.big", (1024, 256), "float32"),
             TensorSpec("c.norm", (256,), "float32"), TensorSpec("d.norm", (256,), "bfloat16"),
             TensorSpec("e.small", (512, 256), "float32")]
    plan = [[spec.name for spec in bucket] for bucket in bucket_plan(specs, bucket_bytes=4096, alone_bytes=2**20)]
    # 1 MiB: alone; the norms together up to 4 KiB; a dtype change or a full bucket starts another
    assert plan == [["a.big"], ["b.norm", "c.norm"], ["d.norm"], ["e.small"]]
    assert [name for bucket in plan for name in bucket] == sorted(spec.name for spec in specs)


def test_weights_on_disk_are_checked_from_the_headers_then_read_in_parts(tmp_path):
    from safetensors.torch import save_file

    from rlft.rollout.server.transfer import WeightsOnDisk

    tensors = {"a": torch.randn(3, 4), "b": torch.arange(5, dtype=torch.bfloat16), "c": torch.zeros(0)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    shapes = {name: (tuple(t.shape), t.dtype) for name, t in tensors.items()}
    parts = list(WeightsOnDisk(str(tmp_path), shapes).parts(part_bytes=8))
    assert len(parts) == 3 and [name for part in parts for name in part] == ["a", "b", "c"]  # 8 bytes: a part each
    assert all(torch.equal(part[name], tensors[name]) for part in parts for name in part)
    with pytest.raises(ServerError, match=r"weight 'a' has shape \(3, 4\), the served model's is \(3, 5\)"):
        WeightsOnDisk(str(tmp_path), {**shapes, "a": ((3, 5), torch.float32)})
    save_file({"a": tensors["a"]}, str(tmp_path / "again.safetensors"))
    with pytest.raises(ServerError, match="tensor 'a' is in both .*: keep one copy"):
        WeightsOnDisk(str(tmp_path), shapes)
    (tmp_path / "again.safetensors").unlink()
    (tmp_path / "broken.safetensors").write_bytes(b"\x10" + b"\x00" * 7 + b"{not json")
    with pytest.raises(ServerError, match="broken.safetensors as safetensors: .*header"):
        WeightsOnDisk(str(tmp_path), shapes)


def test_a_weight_group_port_held_by_an_uncollected_earlier_store_is_reopened_and_a_taken_one_refused():
    """A group left after a failed broadcast can stay referenced in a reference cycle (the failure's traceback), and
    its rendezvous store then keeps the port until the cycle is collected: the next trainer's handshake reopens it."""
    import gc
    import socket

    from rlft.rollout.server.collective import reopened_store
    from rlft.rollout.weight_group import host_store

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    gc.disable()  # no collection but the one the reopening runs
    try:
        cycle = {"store": host_store(port, 5)}
        cycle["self"] = cycle
        del cycle  # unreachable, not yet collected: the port is still bound
        with pytest.raises(OSError):
            host_store(port, 5)
        store = reopened_store(port, 5)
    finally:
        gc.enable()
    with pytest.raises(OSError):  # a port a live store holds stays refused
        reopened_store(port, 5, tries=2)
    del store
