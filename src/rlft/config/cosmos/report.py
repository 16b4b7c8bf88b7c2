"""What rlft says about a Cosmos-RL file: each key and what it became (`rlft validate --explain FILE`), the short notes
of `rlft validate` and `rlft train`, a Cosmos-RL key described (`--explain train.train_policy.kl_beta`), and the rlft
YAML `rlft convert` writes."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import yaml

from rlft.config.cosmos.schema import all_keys, find
from rlft.config.cosmos.translate import Outcome, Translation, row_for

# the converted file's first keys, in this order; the rest follow as the rows wrote them
FIRST = ("base_model", "revision_of_model", "rl", "datasets", "test_datasets", "val_set_size", "sequence_len", "output_dir")


def shown(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (bool, str, list, dict)) or value is None else repr(value)


def outcome_line(outcome: Outcome) -> str:
    head = f"{outcome.path} = {shown(outcome.value)}"
    if outcome.kind == "mapped":
        became = ", ".join(f"{key}: {shown(value)}" for key, value in outcome.rlft.items())
        return f"{head}\n    -> {became or 'nothing to set: ' + (outcome.detail or 'what rlft does anyway')}"
    label = {"refused": "refused by rlft train", "unused": "not used by rlft", "unknown": "unknown"}[outcome.kind]
    return f"{head}\n    {label}: {outcome.detail}"


def explain_file(translation: Translation, source: str) -> str:
    lines = [f"{source}: a Cosmos-RL config ({translation.method.upper()}); each key it sets and what it became in rlft:"]
    lines += [outcome_line(outcome) for outcome in translation.outcomes]
    if translation.carried:
        lines.append("Cosmos-RL's defaults of keys the file leaves out, where rlft's own differ:")
        lines += [f"{o.path} (default {shown(o.value)}) -> " + ", ".join(f"{k}: {shown(v)}" for k, v in o.rlft.items())
                  for o in translation.carried]
    return "\n".join(lines)


def notes(translation: Translation, source: str) -> list[str]:
    """The lines `rlft validate` and `rlft train` print for a Cosmos-RL file: what is not used, refused or unknown."""
    found = []
    unused = translation.of("unused")
    if unused:
        found.append(f"not used by rlft ({len(unused)} Cosmos-RL keys): {', '.join(o.path for o in unused)}; "
                     f"`rlft validate --explain {source}` says why for each")
    for outcome in translation.of("refused"):
        found.append(f"rlft train refuses {outcome.path} = {shown(outcome.value)}: {outcome.detail}")
    for outcome in translation.of("unknown"):
        found.append(f"{outcome.path}: {outcome.detail} (Cosmos-RL ignores it; rlft train refuses it)")
    return found


def explain_cosmos_key(path: str, method: str | None = None) -> str | None:
    """A Cosmos-RL key described: type, default, description, and its row of the translation; None if not one."""
    key = find(path, method)
    if key is None or key.is_section:
        return None
    row = row_for(path, method or "grpo") or row_for(path, "sft")
    became = ", ".join(row.targets) if row and row.targets else "no rlft key"
    why = row.unused if row and row.convert is None and isinstance(row.unused, str) else ""
    later = " (a key of later Cosmos-RL versions)" if key.later else ""
    lines = [f"{path} (Cosmos-RL{later})", f"  type: {key.type_text()}", f"  default: {shown(key.default)}",
             f"  {key.description}", f"  in rlft: {became}"]
    if row and row.note:
        lines.append(f"  {row.note}")
    if why:
        lines.append(f"  not used by rlft: {why}")
    return "\n".join(lines)


def converted_yaml(translation: Translation, source: str) -> str:
    """The rlft YAML of a Cosmos-RL file: a comment header (where it comes from, what was not converted), then the keys."""
    ordered = {key: translation.rlft[key] for key in FIRST if key in translation.rlft}
    ordered.update({key: value for key, value in translation.rlft.items() if key not in ordered})
    header = [f"# rlft config converted by `rlft convert` from the Cosmos-RL config {source}.",
              "# The keys below are rlft's (docs/config.md); docs/cosmos-rl.md maps each Cosmos-RL key."]
    refused = translation.of("refused") + translation.of("unknown")
    if refused:
        header.append("# Not converted, and refused by `rlft train` in the original file:")
        header += [f"#   {o.path} = {shown(o.value)}: {o.detail}" for o in refused]
    unused = translation.of("unused")
    if unused:
        header += textwrap.wrap("Not used by rlft: " + ", ".join(o.path for o in unused), 116, initial_indent="# ",
                                subsequent_indent="#   ")
    return "\n".join(header) + "\n" + yaml.safe_dump(ordered, sort_keys=False, allow_unicode=True, width=120)


def mapping_table() -> str:
    """The translation table as Markdown (docs/cosmos-rl.md, made by docs/gen_config_tables.py): each Cosmos-RL key,
    its default, the rlft keys it becomes and what to know about it."""
    lines = ["| Cosmos-RL key | default | rlft | notes |", "|---|---|---|---|"]
    collapsed, seen = False, set()
    for key in all_keys():
        if key.is_section and not key.entry.get("nullable"):
            continue
        if key.path.startswith("distillation.") and key.path != "distillation.enable":
            if not collapsed:
                lines.append("| `distillation.*` (the rest) | | | settings of distillation (distillation.enable) |")
            collapsed = True
            continue
        method = {"SFTDataConfig": "sft", "GrpoConfig": "grpo"}.get(key.section)
        row = row_for(key.path, method or "grpo")
        if row is None or id(row) in seen:
            continue  # a key both policy types share (dataset.*, mini_batch): listed once
        seen.add(id(row))
        label = f"`{key.path}`" + {"sft": " (SFT)", "grpo": " (GRPO)"}.get(row.method or "", "")
        targets = ", ".join(f"`{t}`" for t in row.targets) or "—"
        notes = row.note or (row.unused if isinstance(row.unused, str) else "")
        cells = (label, f"`{shown(key.default)}`", targets, notes.replace("|", "\\|"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
