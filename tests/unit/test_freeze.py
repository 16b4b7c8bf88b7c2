"""unfrozen_parameters: Axolotl's pattern rules and what freezing leaves to train (rlft.models.freeze)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlft.config.unfrozen import parse_pattern
from rlft.models.freeze import freeze_except


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                                        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False))


def test_patterns_read_as_axolotl_reads_them():
    layer_1 = parse_pattern("^model.layers.1.")
    assert layer_1.regex.match("model.layers.1.mlp.up_proj.weight") and not layer_1.regex.match("model.layers.10.mlp")
    assert not layer_1.regex.match("modelXlayers.1.mlp")  # a dot is a literal dot...
    assert parse_pattern("layers.[0-9]+.mlp").regex.match("layers.12.mlp.down_proj.weight")  # ...unless a + follows
    assert not parse_pattern("mlp").regex.match("model.layers.0.mlp.up_proj.weight")  # matched from the start
    assert parse_pattern("^lm_head.weight$").regex.match("lm_head.weight")
    assert parse_pattern("^model.embed_tokens.weight$[:20]").rows == (0, 20)
    assert parse_pattern("embed_tokens.weight$[5:]").rows == (5, None)
    assert parse_pattern("embed_tokens.weight$[7]").rows == (7, 8)
    assert parse_pattern("^model.norm.weight$").rows is None
    for bad, message in (("^model.(", "is not a regular expression"), ("x$[4:2]", "ends at or before its start"),
                         ("x$[]", "an empty row range")):
        with pytest.raises(ValueError, match=message):
            parse_pattern(bad)


def test_only_the_matched_parameters_train():
    model = _model()
    frozen = freeze_except(model, ["^model.layers.1.", "^lm_head.weight$", "^model.vision_tower."])
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trained == set(frozen.trained) and "lm_head.weight" in trained
    assert trained - {"lm_head.weight"} == {n for n, _ in model.named_parameters() if n.startswith("model.layers.1.")}
    assert frozen.unmatched == ["^model.vision_tower."]
    with pytest.raises(ValueError, match=r"matches no parameter of LlamaForCausalLM, .* named like model.embed_tokens.weight"):
        freeze_except(_model(), ["^layers.1."])


def test_a_row_range_trains_those_rows_only():
    model = _model()
    frozen = freeze_except(model, ["^model.embed_tokens.weight$[:10]", "^model.embed_tokens.weight$[20:24]"])
    assert frozen.trained == {"model.embed_tokens.weight": [(0, 10), (20, 24)]}
    ids = torch.arange(32).view(2, 16)
    model(ids, labels=ids).loss.backward()
    grad = model.model.embed_tokens.weight.grad
    rows = grad.abs().sum(dim=1) > 0
    assert rows[:10].all() and rows[20:24].all() and not rows[10:20].any() and not rows[24:].any()
    for bad in ("[30:40]", "[40:]"):
        with pytest.raises(ValueError, match=r"model.embed_tokens.weight has 32 rows, the range is \[(30:40|40:32)\]"):
            freeze_except(_model(), ["^model.embed_tokens.weight$" + bad])


def test_impossible_combinations_are_refused(config_problems):
    text = " ".join(what for _, what in config_problems(unfrozen_parameters=["^model.layers.1."], adapter="qlora",
                                                        load_in_4bit=True))
    assert text.startswith("unfrozen_parameters with adapter: qlora: with an adapter only the adapter trains here")
    assert "a pattern that starts with ^model. matches nothing and every weight, the adapter's too, is frozen" in text
    ranged = ["^model.embed_tokens.weight$[:10]"]
    text = " ".join(what for _, what in config_problems(unfrozen_parameters=ranged, weight_decay=0.1))
    assert "weight_decay 0.1 would still shrink those rows: set weight_decay: 0" in text
    text = " ".join(what for _, what in config_problems(unfrozen_parameters=ranged, deepspeed="deepspeed_configs/zero2.json"))
    assert "row ranges are built for one process and DDP" in text
