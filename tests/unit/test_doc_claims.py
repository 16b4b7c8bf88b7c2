"""What the README and docs/ say about configs holds against the code.

* Every ```yaml block is an rlft config that validates: a whole config when it has `base_model`, otherwise a fragment
  merged onto a small base config (`BASE`). A block meant to be refused follows a `<!-- refused -->` line; a YAML block
  that is not an rlft config (an accelerate or DeepSpeed file, a dataset row) follows `<!-- not a config -->`.
* Every paragraph, list item or table row that says something is "not built" or that rlft "refuses" it carries a
  `<!-- refused: FLOW-YAML -->` marker: the keys that show it, merged onto `BASE`. The test checks that `rlft train` refuses them before it loads anything (`rlft validate`'s checks, then
  `refuse_unbuilt`), so a claim of that kind cannot outlive the code that makes it true. A marker `cosmos: {...}` holds
  Cosmos-RL keys instead (docs/cosmos-rl.md), merged onto a small Cosmos-RL GRPO file (`COSMOS_BASE`): `rlft train`
  refuses its translation or one of its keys.
"""

from __future__ import annotations

import re
from pathlib import Path

import importlib.util
import typing

import pytest
import yaml
from pydantic import BaseModel

from rlft.config import RlftConfig
from rlft.config.cosmos.front import refuse_cosmos, translated
from rlft.config.loading import build_config, deep_merge
from rlft.config.settings import resolve
from rlft.errors import ConfigError, NotImplementedYet
from rlft.train.unbuilt import refuse_unbuilt

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
BASE = {"base_model": "./model", "datasets": [{"path": "data.jsonl"}], "output_dir": "out", "micro_batch_size": 8}
CLAIM = re.compile(r"\bnot built\b|\brefus(?:e|es|ed|al)\b", re.IGNORECASE)
MARKER = re.compile(r"<!--\s*refused:\s*(.*?)\s*-->", re.DOTALL)


def relative(path: Path) -> str:
    return str(path.relative_to(REPO))


def yaml_blocks() -> list[tuple[str, str, str]]:
    """(where, tag, body) of every ```yaml block; tag is the HTML comment on the line above it, if any."""
    blocks = []
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"^```yaml\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
            line = text.count("\n", 0, match.start()) + 1
            above = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
            tag = above[4:-3].strip() if above.startswith("<!--") and above.endswith("-->") else ""
            blocks.append((f"{relative(page)}:{line}", tag, match.group(1)))
    return blocks


def units(text: str) -> list[tuple[int, str]]:
    """(line, text) of each paragraph, list item and table row, fenced code left out."""
    found: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):  # a heading holds no claim; the units under it do
            if current:
                found.append((start, "\n".join(current)))
            current = []
            continue
        if line.startswith("```"):
            fenced = not fenced
            if current:
                found.append((start, "\n".join(current)))
            current = []
            continue
        if fenced:
            continue
        new_unit = not line.strip() or line.startswith("|") or re.match(r"\s*(?:[*-]|\d+\.)\s", line) or line.startswith("#")
        if new_unit and current:
            found.append((start, "\n".join(current)))
            current = []
        if line.strip():
            if not current:
                start = number
            current.append(line)
    if current:
        found.append((start, "\n".join(current)))
    return found


def claims() -> list[tuple[str, str, list[str]]]:
    """(where, text, markers) of every unit that says 'not built' or 'refuse(s|d)' outside code spans."""
    found = []
    for page in PAGES:
        text = re.sub(r"(<!-- BEGIN [\w-]+ -->\n).*?(?=<!-- END [\w-]+ -->)", lambda m: m.group(1) + "\n" * m.group(0).count("\n"),
                      page.read_text(), flags=re.DOTALL)  # generated tables: checked below; their line numbers kept
        for line, unit in units(text):
            words = re.sub(r"`[^`\n]*`|<!--.*?-->|\]\([^)]*\)", "", unit, flags=re.DOTALL)
            if CLAIM.search(words):
                found.append((f"{relative(page)}:{line}", unit, MARKER.findall(unit)))
    return found


SCAFFOLD = {"rl", "trl", "reward_funcs", "base_model", "datasets", "path", "micro_batch_size", "output_dir", "m.r", "grpo",
            "cosmos"}
COSMOS_BASE = {"policy": {"model_name_or_path": "./model"},
               "train": {"train_policy": {"type": "grpo", "dataset": {"name": "data.jsonl"}}}}


def leaves(data, key: str = "") -> list[str]:
    """The keys and scalar values of a marker but the scaffolding a method needs: what a refusal should name."""
    if isinstance(data, dict):
        return [w for k, v in data.items() for w in ([str(k)] if k not in SCAFFOLD else []) + leaves(v, k)]
    if isinstance(data, list):
        return [w for item in data for w in leaves(item, key)]
    return [] if str(data) in SCAFFOLD else [str(data).lower() if isinstance(data, bool) else str(data)]


def check(data: dict) -> None:
    """What `rlft train` runs on a config before it loads anything; raises when it refuses."""
    cfg = build_config(data, source="example")
    refuse_unbuilt(cfg, processes=1)
    resolve(cfg)


def check_cosmos(data: dict) -> None:
    """What `rlft train` runs on a Cosmos-RL file before it loads anything; raises when it refuses."""
    translation = translated(Path("example.toml"), deep_merge(COSMOS_BASE, data))
    refuse_cosmos(translation, "example.toml")
    check(translation.rlft)


def refused(data: dict) -> str | None:
    try:
        check_cosmos(data["cosmos"]) if "cosmos" in data else check(data)
    except (ConfigError, NotImplementedYet) as exc:
        return str(exc)
    return None


def as_config(body: str) -> dict:
    data = yaml.safe_load(body) or {}
    assert isinstance(data, dict), "a YAML block that is not a mapping: mark it <!-- not a config -->"
    return data if "base_model" in data else deep_merge(dict(BASE), data)


BLOCKS = yaml_blocks()
CLAIMS = claims()


@pytest.mark.parametrize("where,tag,body", BLOCKS, ids=[where for where, _, _ in BLOCKS])
def test_yaml_examples_are_configs_that_validate(where, tag, body):
    if tag == "not a config":
        return
    assert tag in ("", "refused"), f"{where}: unknown tag <!-- {tag} --> (use 'refused' or 'not a config')"
    data = as_config(body)
    message = refused(data)
    if tag == "refused":
        assert message, f"{where}: the docs say this config is refused, and rlft accepts it"
    else:
        assert message is None, f"{where}: this example does not validate:\n{message}"


@pytest.mark.parametrize("where,text,markers", CLAIMS, ids=[where for where, _, _ in CLAIMS])
def test_refusal_claims_hold(where, text, markers):
    assert markers, (
        f"{where}: says something is not built or refused, without a <!-- refused: KEYS --> marker to check it:\n{text}")
    for marker in markers:
        data = yaml.safe_load("{" + marker + "}" if not marker.lstrip().startswith("{") else marker)
        assert isinstance(data, dict), f"{where}: the marker is not a YAML mapping: {marker}"
        message = refused(deep_merge(dict(BASE), data))
        assert message, f"{where}: rlft train accepts {marker}, which the text says it refuses"
        named = [word for word in leaves(data) if word in message]
        assert named, f"{where}: rlft train refuses {marker} for another reason than its keys:\n{message}"


def test_the_base_config_validates():
    assert refused(dict(BASE)) is None


def generator():
    spec = importlib.util.spec_from_file_location("gen_config_tables", REPO / "docs" / "gen_config_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_tables_are_current():
    gen = generator()
    stale = [relative(doc) for doc, tables in gen.PAGES.items() if doc.read_text() != gen.rendered(doc, tables)]
    assert not stale, f"{stale}: the generated key tables differ from the schema; run `PYTHONPATH=src .venv/bin/python docs/gen_config_tables.py`"


def planned_fields(model: type[BaseModel] = RlftConfig, prefix: str = ""):
    for name, info in model.model_fields.items():
        sections = [a for a in typing.get_args(info.annotation) + (info.annotation,) if isinstance(a, type) and issubclass(a, BaseModel)]
        if sections:
            yield from planned_fields(sections[0], f"{prefix}{name}.")
        elif isinstance(info.json_schema_extra, dict) and "planned" in info.json_schema_extra:
            yield prefix + name, info


def other_value(info):
    """A valid value other than the field's default."""
    default = info.get_default(call_default_factory=True)
    kinds = set(typing.get_args(info.annotation)) | {info.annotation}
    if bool in kinds:
        return not default
    if int in kinds:
        return (default or 0) + 2
    if float in kinds:
        return (default or 0.0) + 0.5
    return "example"


PLANNED = list(planned_fields())


@pytest.mark.parametrize("key,info", PLANNED, ids=[key for key, _ in PLANNED])
def test_keys_the_reference_calls_not_built_are_refused(key, info):
    data: dict = {"rl": "grpo", "trl": {"reward_funcs": ["examples.grpo.arithmetic.exact_match"]}}
    *sections, name = key.split(".")
    target = data
    for section in sections:
        target = target.setdefault(section, {})
    target[name] = other_value(info)
    if key.startswith("ebft."):
        data = {"rl": "ebft", "ebft": {**data["ebft"], "feature_layers": [0.5]}}
    if key == "balance_dp_token":  # Cosmos-RL's SFT key: a GRPO config is sent to trl.balance_dp_token instead
        data = {name: data[name]}
    message = refused(deep_merge(dict(BASE), data))
    assert message, f"{key}: the reference says it is not built, and rlft train accepts {data}"
    assert key in message and info.json_schema_extra["planned"] in message, message


EXAMPLE_CONFIGS = sorted(path for path in (REPO / "examples").rglob("*.yaml") if "configs" not in path.parts)  # (a Gym server's own config)


@pytest.mark.parametrize("path", EXAMPLE_CONFIGS, ids=lambda p: str(p.relative_to(REPO)))
def test_example_configs_pass_what_rlft_train_checks_first(path, monkeypatch):
    monkeypatch.chdir(REPO)  # the examples' paths are relative to the repository root, where the docs run them
    message = refused(yaml.safe_load(path.read_text()))
    assert message is None, f"{relative(path)}:\n{message}"


def test_example_files_the_texts_name_exist():
    named = {m for page in PAGES for m in re.findall(r"examples/[\w/.-]+\.(?:yaml|py|jsonl)", page.read_text())}
    missing = sorted(name for name in named if not (REPO / name).exists())
    assert not missing, f"the README or docs name example files that do not exist: {missing}"
