"""RemoteEngine's own checks of what a server answers, without a server (the integration tests use a real one)."""

import pytest

from rlft.errors import RolloutError
from rlft.rollout.remote import RemoteEngine
from rlft.rollout.types import SamplingParams


def _engine(monkeypatch, answer):
    engine = RemoteEngine("127.0.0.1", 9, timeout=1)
    sent = []
    monkeypatch.setattr(engine, "_watched", lambda method, path, json=None, **kw: (sent.append((path, json)), answer)[1])
    monkeypatch.setattr(engine, "_check_served", lambda *args: None)
    return engine, sent


def test_a_non_finite_log_prob_from_the_server_is_the_diverged_message_not_a_type_error(monkeypatch):
    """vLLM passes NaN on, and JSON carries it as null: the trainer would fail in torch.tensor([None, ...])."""
    engine, _ = _engine(monkeypatch, {"weight_version": 0, "completion_ids": [[5, 6]], "logprobs": [[-0.1, None]],
                                      "truncated": [False]})
    with pytest.raises(RolloutError, match="held NaN while sampling"):
        engine.generate([[1, 2]], SamplingParams(max_new_tokens=2))
    engine.close()


def test_weight_folders_are_sent_as_absolute_paths(monkeypatch, tmp_path):
    """The server may run in another working directory: a relative output_dir would be read there."""
    monkeypatch.chdir(tmp_path)
    engine, sent = _engine(monkeypatch, {"received_checksum": "c", "weight_version": 1, "weight_checksum": "c"})
    engine.load_adapter("model-out/lora_sync/v0", version=1, checksum="c")
    engine.load_weights_from_path("model-out/full/v1", version=1, checksum="c")
    assert [json.get("lora_path") or json.get("path") for _, json in sent] == [
        str(tmp_path / "model-out/lora_sync/v0"), str(tmp_path / "model-out/full/v1")]
    engine.close()


def test_wire_tensors_convert_each_storage_once_and_tied_names_share_it(monkeypatch):
    import torch

    engine = RemoteEngine("127.0.0.1", 9, timeout=1)
    monkeypatch.setattr(engine, "weight_info", lambda refresh=True: {"dtype": "bfloat16"})
    embedding, norm = torch.randn(4, 3), torch.ones(3)
    wire = engine.wire_tensors({"embed.weight": embedding, "lm_head.weight": embedding, "norm.weight": norm})
    assert all(t.dtype == torch.bfloat16 and t.device.type == "cpu" for t in wire.values())
    assert wire["embed.weight"] is wire["lm_head.weight"] and torch.equal(wire["embed.weight"], embedding.bfloat16())
    assert wire["norm.weight"].data_ptr() != wire["embed.weight"].data_ptr()
    engine.close()
