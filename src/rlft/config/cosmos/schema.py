"""Cosmos-RL's configuration schema as data, and the check of a Cosmos-RL file against it.

`schema.json` holds every section of Cosmos-RL's `Config` (https://github.com/nvidia-cosmos/cosmos-rl): each key's
type(s), default and description, generated once by docs/gen_cosmos_schema.py from Cosmos-RL's JSON schema. Keys of
later Cosmos-RL versions that its public example configs set are there too, marked `later`.

`check` walks a file: a value of the wrong type is a problem (named with the expected type), a section that is not a
table is a problem, and an unknown key is reported apart with the closest valid key, since Cosmos-RL itself accepts
and ignores unknown keys (its models keep pydantic's default, `extra="ignore"`). `effective` fills every key the file
leaves out with Cosmos-RL's default: the configuration Cosmos-RL would run.
"""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA: dict[str, dict[str, dict[str, Any]]] = json.loads(Path(__file__).with_name("schema.json").read_text())
TOP = "Config"
POLICY_TYPES = {"grpo": "GrpoConfig", "sft": "SFTDataConfig"}
# Cosmos-RL's rule for a train_policy without `type`: GRPO when one of these is set, else SFT (Config.preprocess)
GRPO_MARKERS = ("temperature", "epsilon_low", "epsilon_high", "kl_beta")
TYPE_WORDS = {"string": "a string", "integer": "a whole number", "number": "a number", "boolean": "true or false",
              "array": "a list", "object": "a table (mapping)", "null": "nothing (null)"}


@dataclass(frozen=True)
class Key:
    """One key of one section: its dotted path in a file, type(s), default and description."""

    path: str
    section: str
    name: str
    entry: dict[str, Any]

    @property
    def is_section(self) -> bool:
        return "section" in self.entry

    @property
    def default(self) -> Any:
        return copy.deepcopy(self.entry.get("default"))

    @property
    def description(self) -> str:
        return self.entry.get("description", "")

    @property
    def later(self) -> bool:
        return bool(self.entry.get("later"))

    def type_text(self) -> str:
        return type_words(self.entry)


@dataclass(frozen=True)
class Finding:
    """A problem (`unknown` False: the file is wrong for Cosmos-RL too) or an unknown key, at a dotted path."""

    path: str
    message: str
    unknown: bool = False


def type_words(entry: dict[str, Any]) -> str:
    if "section" in entry:
        return "a table" + (" or nothing" if entry.get("nullable") else "")
    words = []
    for kind in entry.get("types", []):
        if kind == "array" and entry.get("items"):
            words.append(f"a list of {' or '.join(TYPE_WORDS[i].removeprefix('a ') + 's' for i in entry['items'])}")
        elif kind == "object" and entry.get("values"):
            words.append(f"a table of {' or '.join(TYPE_WORDS[v].removeprefix('a ') + 's' for v in entry['values'])}")
        else:
            words.append(TYPE_WORDS[kind])
    return " or ".join(words) or "any value"


def policy_section(policy: Any) -> str | None:
    """The section a train_policy table is read as: its `type`, else Cosmos-RL's guess from its keys. None (a file
    without the table) is Cosmos-RL's default, a GRPO policy (TrainingConfig.train_policy)."""
    if policy is None:
        return POLICY_TYPES["grpo"]
    if not isinstance(policy, dict):
        return None
    kind = policy.get("type")
    if kind is None:
        kind = "grpo" if any(key in policy for key in GRPO_MARKERS) else "sft"
    return POLICY_TYPES.get(kind) if isinstance(kind, str) else None


def section_of(entry: dict[str, Any], value: Any) -> str | None:
    if "sections" in entry:  # train_policy: GRPO or SFT
        return policy_section(value)
    return entry.get("section")


def policy_type(data: dict[str, Any]) -> str:
    """The method a whole file trains: `grpo` or `sft`, from its train_policy table (GRPO without one)."""
    train = data.get("train")
    policy = train.get("train_policy") if isinstance(train, dict) else None
    return "sft" if policy_section(policy) == POLICY_TYPES["sft"] else "grpo"


def _fits(kind: str, value: Any, entry: dict[str, Any]) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "null":
        return value is None
    if kind == "array":
        items = entry.get("items")
        return isinstance(value, list) and (not items or all(any(_fits(i, v, {}) for i in items) for v in value))
    if kind == "object":
        kinds = entry.get("values")
        return isinstance(value, dict) and (not kinds or all(any(_fits(k, v, {}) for k in kinds) for v in value.values()))
    return True


def closest(word: str, options: list[str]) -> str | None:
    found = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return found[0] if found else None


def _unknown(path: str, key: str, section: str) -> str:
    names = list(SCHEMA[section])
    guess = closest(key, names)
    elsewhere = [known.path for known in all_keys() if known.name == key and known.path != path]
    if guess:
        hint = f"did you mean {'.'.join(path.split('.')[:-1] + [guess])!r}?"
    elif elsewhere:
        hint = f"it belongs under {' or '.join(sorted({p.rsplit('.', 1)[0] for p in elsewhere}))}"
    else:
        hint = "not a key of Cosmos-RL's schema (`rlft validate --explain FILE` lists what each key becomes)"
    return f"unknown Cosmos-RL key {key!r}: {hint}"


def check(data: dict[str, Any], section: str = TOP, prefix: str = "") -> list[Finding]:
    """Every problem and unknown key of `data`, read as `section`."""
    found: list[Finding] = []
    fields = SCHEMA[section]
    for key, value in data.items():
        path = f"{prefix}{key}"
        entry = fields.get(key)
        if entry is None:
            found.append(Finding(path, _unknown(path, key, section), unknown=True))
            continue
        if "section" in entry:
            if value is None and entry.get("nullable"):
                continue
            if not isinstance(value, dict):
                found.append(Finding(path, f"expected a table ([{path}] in TOML, a mapping in YAML), got {value!r}"))
                continue
            inner = section_of(entry, value)
            if inner is None:
                found.append(Finding(f"{path}.type", f"{value.get('type')!r} is not a Cosmos-RL policy type: "
                                                     f"{' or '.join(POLICY_TYPES)}"))
                continue
            found.extend(check(value, inner, f"{path}."))
            continue
        if entry.get("const") and value != entry.get("default"):
            found.append(Finding(path, f"expected {entry['default']!r}, got {value!r}"))
        elif not any(_fits(kind, value, entry) for kind in entry.get("types", [])) and entry.get("types"):
            found.append(Finding(path, f"expected {type_words(entry)}, got {value!r} ({type(value).__name__})"))
    return found


def effective(data: dict[str, Any], section: str = TOP) -> dict[str, Any]:
    """`data` with every key it leaves out at Cosmos-RL's default, sections included (a `lora` left out stays None)."""
    out: dict[str, Any] = {}
    for key, entry in SCHEMA[section].items():
        value = data.get(key) if key in data else None
        if "section" in entry:
            if value is None and entry.get("nullable"):
                out[key] = None
                continue
            given = value if isinstance(value, dict) else {}
            inner = section_of(entry, value if isinstance(value, dict) else None)
            out[key] = effective(given, inner or entry["section"])
            continue
        out[key] = copy.deepcopy(value) if key in data else copy.deepcopy(entry.get("default"))
    for key, value in data.items():  # unknown keys stay, to be reported
        out.setdefault(key, value)
    return out


def all_keys(section: str = TOP, prefix: str = "") -> list[Key]:
    """Every key reachable from `section`, in schema order; train_policy's keys once per policy type."""
    return list(_walk(section, prefix))


def _walk(section: str, prefix: str) -> Iterator[Key]:
    for name, entry in SCHEMA[section].items():
        path = f"{prefix}{name}"
        yield Key(path, section, name, entry)
        for inner in entry.get("sections", [entry["section"]] if "section" in entry else []):
            yield from _walk(inner, f"{path}.")


def leaves(data: dict[str, Any], section: str = TOP, prefix: str = "") -> Iterator[tuple[str, Any, Key | None]]:
    """(dotted path, value, its Key or None when unknown) of every value the file sets; tables are walked into."""
    fields = SCHEMA.get(section, {})
    for key, value in data.items():
        path = f"{prefix}{key}"
        entry = fields.get(key)
        if entry is not None and "section" in entry and isinstance(value, dict):
            inner = section_of(entry, value)
            if inner is not None:
                yield from leaves(value, inner, f"{path}.")
                continue
        yield path, value, Key(path, section, key, entry) if entry is not None else None


def unknown_path(path: str) -> str | None:
    """The unknown-key message for a dotted path under one of Cosmos-RL's sections, or None where the path is a key or
    does not start with a Cosmos-RL section."""
    parts = path.split(".")
    if parts[0] not in SCHEMA[TOP] or find(path) is not None:
        return None
    for n in range(len(parts) - 1, 0, -1):
        parent = find(".".join(parts[:n]))
        if parent is not None and parent.is_section:
            inner = parent.entry.get("sections", [parent.entry["section"]])[-1]
            return _unknown(".".join(parts[:n + 1]), parts[n], inner)
    return None


def find(path: str, policy: str | None = None) -> Key | None:
    """The Key at a dotted path; train_policy keys are looked up in `policy`'s section (grpo or sft), else GRPO's, then
    SFT's."""
    parts = path.split(".")
    sections = [TOP]
    for n, part in enumerate(parts):
        for section in sections:
            entry = SCHEMA[section].get(part)
            if entry is not None:
                break
        else:
            return None
        if n == len(parts) - 1:
            return Key(path, section, part, entry)
        if "sections" in entry:
            sections = [POLICY_TYPES[policy]] if policy in POLICY_TYPES else list(entry["sections"])[::-1]
        elif "section" in entry:
            sections = [entry["section"]]
        else:
            return None
    return None
