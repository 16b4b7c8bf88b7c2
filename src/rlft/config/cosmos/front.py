"""Cosmos-RL files as rlft configs: telling one from an rlft YAML, reading it, and what `rlft train` refuses of it.

A file is a Cosmos-RL config when it is TOML (Cosmos-RL's format), or YAML whose top level holds Cosmos-RL's
sections (`train`, `rollout`, `policy`, `logging`, `validation`, `custom`, ...). A file that mixes those with rlft's
(Axolotl's) top-level keys is refused, naming which keys are which. Overrides on the command line use either
language: `--train.max_num_steps=2` changes the Cosmos-RL file before it is translated, `--max_steps=2` the rlft
config after. Under a section both languages have (`validation`, `profiler`), an override is Cosmos-RL's where
Cosmos-RL's schema has the key and rlft's where only rlft's has it (`--validation.pass_threshold=0.5`).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from rlft.config.cosmos.schema import SCHEMA, TOP, find
from rlft.config.cosmos.targets import rlft_has, set_path
from rlft.config.cosmos.translate import Translation, translate
from rlft.config.schema import RlftConfig
from rlft.errors import ConfigError, NotImplementedYet

COSMOS_TOP = set(SCHEMA[TOP])


def _rlft_top() -> set[str]:
    names = set()
    for name, info in RlftConfig.model_fields.items():
        names.add(info.alias or name)
        alias = info.validation_alias
        names.update(getattr(alias, "choices", None) or ([alias] if isinstance(alias, str) else []))
    return names


RLFT_TOP = _rlft_top()
SHARED = COSMOS_TOP & RLFT_TOP  # validation and profiler: rlft's sections hold Cosmos-RL's keys, and some of their own
COSMOS_ONLY = COSMOS_TOP - RLFT_TOP


def read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        text = str(exc)
        where = re.search(r"\(at line (\d+), column (\d+)\)", text)
        place = f"line {where.group(1)}, column {where.group(2)}" if where else "an unknown position"
        problem = re.sub(r"\s*\(at line \d+, column \d+\)", "", text) or "invalid TOML"
        raise ConfigError(f"{path}: TOML syntax error at {place}: {problem}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a text file ({exc.reason} at byte {exc.start}): a config is TOML or YAML text") from None


def is_cosmos(path: Path, data: dict[str, Any]) -> bool:
    """Whether `data` (read from `path`) is a Cosmos-RL config; raises when it mixes the two languages."""
    cosmos = sorted(key for key in data if key in COSMOS_ONLY)
    toml = path.suffix.lower() == ".toml"
    if not cosmos and not toml:
        return False
    rlft = sorted(key for key in data if key in RLFT_TOP and key not in COSMOS_TOP)
    if rlft and (cosmos or toml):
        if not cosmos:
            raise ConfigError(f"{path}: a TOML config is a Cosmos-RL config, and {', '.join(rlft)} are rlft (Axolotl) keys: "
                              "write an rlft config as YAML, or this one with Cosmos-RL's sections ([train], [policy], "
                              "[rollout], ...)")
        raise ConfigError(f"{path}: mixes two config languages: {', '.join(cosmos)} are Cosmos-RL sections, "
                          f"{', '.join(rlft)} are rlft (Axolotl) keys. Write one: the Cosmos-RL file as it is (rlft "
                          "translates it), or an rlft YAML (`rlft convert FILE` writes one from a Cosmos-RL file)")
    return True


def split_overrides(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Cosmos-RL overrides, rlft overrides): a key under one of Cosmos-RL's top-level names is Cosmos-RL's, but for a
    key of a section both have (`SHARED`) that only rlft's schema holds."""
    cosmos: dict[str, Any] = {}
    rlft: dict[str, Any] = {}
    for key, value in overrides.items():
        if key in SHARED:
            _split_shared(key, value, cosmos, rlft)
        else:
            (cosmos if key in COSMOS_TOP else rlft)[key] = value
    return cosmos, rlft


def _split_shared(path: str, value: Any, cosmos: dict[str, Any], rlft: dict[str, Any]) -> None:
    """Walk a shared section's override down Cosmos-RL's tables; each value goes to rlft where Cosmos-RL has no such key
    and rlft has one, else to Cosmos-RL (whose check names an unknown key)."""
    key = find(path)
    if key is not None and key.is_section and isinstance(value, dict):
        for name, inner in value.items():
            _split_shared(f"{path}.{name}", inner, cosmos, rlft)
        return
    set_path(rlft if key is None and rlft_has(path) else cosmos, path, value)


def translated(path: Path, data: dict[str, Any]) -> Translation:
    """The translation of a Cosmos-RL file; a value of the wrong type or a section that is not a table stops it."""
    translation = translate(data)
    if translation.problems:
        lines = "\n".join(f"  - {finding.path}: {finding.message}" for finding in translation.problems)
        raise ConfigError(f"{path}: {len(translation.problems)} problem(s) for Cosmos-RL's schema\n{lines}",
                          [(finding.path, finding.message) for finding in translation.problems])
    return translation


def with_origins(exc: ConfigError, translation: Translation) -> ConfigError:
    """rlft's problems with a translated config, each naming the Cosmos-RL keys its rlft key came from; then the keys
    `rlft train` refuses, which the translation leaves out (a refused train_batch_per_replica leaves rlft's batch
    keys at their defaults, which can be the problem above)."""
    lines = []
    for where, what in exc.problems:
        named = set(re.findall(r"[\w.\[\]]+", f"{where} {what}")) & translation.written()
        keys = sorted({origin for part in named for origin in translation.origin(part)})
        lines.append(f"  - {where}: {what}" + (f" (from Cosmos-RL's {', '.join(keys)})" if keys else ""))
    if not lines:
        return exc
    head = str(exc).splitlines()[0]
    refused = [f"  - {o.path} = {_shown(o.value)}: {o.detail}" for o in translation.of("refused")]
    after = "\nCosmos-RL keys that rlft train refuses, left out of the translation:\n" + "\n".join(refused) if refused else ""
    return ConfigError(f"{head} (the file's rlft translation; `rlft validate --explain FILE` shows it)\n" + "\n".join(lines)
                       + after, exc.problems)


def refuse_cosmos(translation: Translation, source: str) -> None:
    """What `rlft train` refuses of a Cosmos-RL file: each key that needs what rlft does not build, and each unknown key."""
    refused = translation.of("refused")
    unknown = translation.of("unknown")
    if not refused and not unknown:
        return
    lines = [f"  - {o.path} = {_shown(o.value)}: {o.detail}" for o in refused]
    lines += [f"  - {o.path}: {o.detail} (Cosmos-RL ignores unknown keys; rlft stops so that a misspelt key is not lost: "
              "fix or remove it)" for o in unknown]
    raise NotImplementedYet(f"{source}: rlft does not run these Cosmos-RL settings; change or remove them "
                            f"(`rlft validate --explain {source}` shows every key):\n" + "\n".join(lines))


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value)
