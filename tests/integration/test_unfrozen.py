"""unfrozen_parameters through the real CLI: an SFT run from saved weights trains the matched parameters (and rows)
and leaves every other weight exactly as it was."""

from __future__ import annotations

import pytest
import torch
import yaml
from safetensors.torch import load_file


@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_model_dir):
    """The XS model with seeded random weights saved: the run's starting point, to compare with."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path_factory.mktemp("unfrozen") / "base"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model_dir)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
    return folder


def _run(cli, tmp_path, base, addition_files, patterns, name, **extra):
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump({
        "base_model": str(base), "datasets": [{"path": str(addition_files["train"])}], "sequence_len": 32,
        "micro_batch_size": 16, "max_steps": 4, "learning_rate": 1e-2, "lr_scheduler": "constant", "seed": 3,
        "output_dir": str(tmp_path / name), "unfrozen_parameters": patterns, **extra}))
    assert cli("train", config) == 0
    return load_file(base / "model.safetensors"), load_file(tmp_path / name / "model.safetensors")


def test_only_matched_parameters_move(cli, capsys, tmp_path, base, addition_files):
    before, after = _run(cli, tmp_path, base, addition_files, ["^model.layers.1.", "^model.norm.weight$", "^model.nope."],
                         "layers", gradient_checkpointing=True)
    printed = capsys.readouterr().out
    assert "warning: unfrozen_parameters '^model.nope.' matches no parameter name" in " ".join(printed.split())
    moved = {name for name in before if not torch.equal(before[name], after[name])}
    trained = {name for name in before if name.startswith("model.layers.1.") or name == "model.norm.weight"}
    assert moved == trained  # every matched tensor moved (norms too), nothing else did


def test_a_row_range_moves_those_rows_only(cli, tmp_path, base, addition_files):
    before, after = _run(cli, tmp_path, base, addition_files, ["^model.embed_tokens.weight$[48:58]"], "rows")
    moved_rows = (before["model.embed_tokens.weight"] != after["model.embed_tokens.weight"]).any(dim=1)
    assert set(moved_rows.nonzero().flatten().tolist()) <= set(range(48, 58))  # the digits "0".."9" are bytes 48-57
    assert moved_rows[48:58].sum() >= 5  # the digits the sums use moved
    assert all(torch.equal(before[k], after[k]) for k in before if k != "model.embed_tokens.weight")
