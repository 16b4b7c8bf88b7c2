"""Fixtures of the unit tests: config dicts, configs, problems of a bad config, the byte tokenizer, data files."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest

from rlft.config import RlftConfig, build_config, deep_merge
from rlft.errors import ConfigError

MINIMAL = {"base_model": "tiny-model", "datasets": [{"path": "train.jsonl"}]}


def minimal_config_dict(**overrides: Any) -> dict[str, Any]:
    """A config mapping that validates (base_model + one dataset), deep-merged with `overrides`."""
    return deep_merge(MINIMAL, overrides)


@pytest.fixture
def config_dict() -> Callable[..., dict[str, Any]]:
    return minimal_config_dict


@pytest.fixture
def config() -> Callable[..., RlftConfig]:
    """`config(**overrides)` -> a validated RlftConfig built on the minimal config."""
    return lambda **overrides: build_config(minimal_config_dict(**overrides))


@pytest.fixture
def config_problems() -> Callable[..., list[tuple[str, str]]]:
    """`config_problems(**overrides)` -> ConfigError.problems of a config that must fail."""

    def problems(**overrides: Any) -> list[tuple[str, str]]:
        with pytest.raises(ConfigError) as caught:
            build_config(minimal_config_dict(**overrides))
        return caught.value.problems

    return problems


@pytest.fixture(scope="session")
def tok():
    from rlft.data.tokenizer import byte_tokenizer

    return byte_tokenizer()


@pytest.fixture
def write_jsonl(tmp_path) -> Callable[[list[dict[str, Any]], str], Path]:
    """`write_jsonl(rows, name)` -> path of a JSON-lines file in tmp_path."""

    def write(rows: list[dict[str, Any]], name: str = "rows.jsonl") -> Path:
        path = tmp_path / name
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return path

    return write


@pytest.fixture
def data_config() -> Callable[..., RlftConfig]:
    """`data_config(*dataset_entries, **top_level)` -> an SFT config over those datasets."""

    def make(*datasets: dict[str, Any], **top_level: Any) -> RlftConfig:
        return build_config({"base_model": "tiny-model", "datasets": list(datasets), **top_level})

    return make


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """tmp_path as the working directory; `write(name, source)` creates the module name.py there (dedented)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # loading puts the working directory on sys.path
    written: list[str] = []

    def write(name: str, source: str) -> None:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        sys.modules.pop(name, None)
        written.append(name)

    yield write
    for name in written:
        sys.modules.pop(name, None)
