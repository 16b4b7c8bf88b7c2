"""Regenerate the reference tables of docs/config.md (and the option table of docs/ebft.md) from the schema, and the
Cosmos-RL key table of docs/cosmos-rl.md from the translation table (rlft.config.cosmos).

    PYTHONPATH=src .venv/bin/python docs/gen_config_tables.py

Rewrites the text between `<!-- BEGIN name -->` and `<!-- END name -->` markers in those pages,
so the tables always say exactly what the code accepts; `tests/unit/test_doc_claims.py` fails when a page
differs from what this script would write.
"""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path

from pydantic import BaseModel

from rlft.config import DatasetConfig, RlftConfig, UserDefinedType
from rlft.config.cosmos.report import mapping_table
from rlft.config.sections.datasets import PretrainingDatasetConfig
from rlft.config.sections.ebft import EBFTConfig
from rlft.config.sections.nemo_gym import NemoGymDataset, NemoGymFields
from rlft.config.sections.preference import PreferenceFields
from rlft.config.sections.profiler import ProfilerConfig, SubProfilerConfig
from rlft.config.sections.qat import QATConfig
from rlft.config.sections.trl import TRLConfig
from rlft.config.sections.validation import ValidationConfig
from rlft.config.sections.trl_multi_turn import MultiTurnConfig
from rlft.config.sections.vllm import VLLMConfig

DOC = Path(__file__).with_name("config.md")
EBFT_DOC = Path(__file__).with_name("ebft.md")
COSMOS_DOC = Path(__file__).with_name("cosmos-rl.md")
MODEL_NAMES = {"DatasetConfig": "dataset entry", "PretrainingDatasetConfig": "dataset entry", "UserDefinedType": "mapping", "NemoGymDataset": "Gym dataset entry"}


def type_name(annotation) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is typing.Literal:
        return " \\| ".join(str(a).lower() if isinstance(a, bool) else str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        # sorted: typing caches a union by its set of members, so their order is that of whichever spelling came first
        text = " or ".join(sorted(type_name(a) for a in members))
        return f"{text} or null" if len(members) < len(args) else text
    if origin in (list, typing.List):
        return f"list[{type_name(args[0])}]" if args else "list"
    if origin in (dict, typing.Dict):
        return f"mapping[{type_name(args[0])}, {type_name(args[1])}]" if args else "mapping"
    if annotation is typing.Any:
        return "any"
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return MODEL_NAMES.get(annotation.__name__, "section")
        return {"str": "string", "int": "int", "float": "float", "bool": "bool", "dict": "mapping"}.get(
            annotation.__name__, annotation.__name__
        )
    return str(annotation).replace("typing.", "")


def default_text(info) -> str:
    if info.is_required():
        return "required"
    default = info.get_default(call_default_factory=True)
    if isinstance(default, BaseModel):
        return "(section)"
    if default is None:
        return "null"
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, str):
        return f"`{default}`" if default else '`""`'
    return f"`{default}`"


def table(model: type[BaseModel], names: list[str] | None = None, prefix: str = "") -> str:
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for name, info in model.model_fields.items():
        if names is not None and name not in names:
            continue
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if "axolotl_only" in extra:  # listed by category in their own table
            continue
        description = (info.description or "").replace("|", "\\|")
        if "planned" in extra:
            description = f"**Not built ({extra['planned']}).** {description}"
        rows.append(f"| `{prefix}{name}` | {type_name(info.annotation)} | {default_text(info)} | {description} |")
    return "\n".join(rows)


def own_fields(model: type[BaseModel], *exclude: type[BaseModel]) -> list[str]:
    inherited = {name for base in exclude for name in base.model_fields}
    return [name for name in model.model_fields if name not in inherited]


def axolotl_only() -> str:
    """The Axolotl keys rlft knows but does not run, by reason (config/axolotl_keys.py)."""
    from rlft.config.axolotl_tables import DATASET, REASONS, SPECIFIC, TOP_LEVEL, TRL, VLLM

    groups: dict[str, list[str]] = {}
    for prefix, table_ in (("", TOP_LEVEL), ("datasets[].", DATASET), ("trl.", TRL), ("vllm.", VLLM)):
        for key, (category, _) in table_.items():
            groups.setdefault(category, []).append(f"`{prefix}{key}`")
    rows = ["| why `train` refuses them when set | keys |", "|---|---|"]
    for category, keys in groups.items():
        rows.append(f"| {REASONS[category]} | {', '.join(sorted(keys))} |")
    rows += ["", "Keys with a reason of their own: " + "; ".join(f"`{k}`: {why}" for k, why in SPECIFIC.items()) + "."]
    return "\n".join(rows)


TABLES = {
    "top-level": lambda: table(RlftConfig, own_fields(RlftConfig, PreferenceFields, NemoGymFields)),
    "dataset": lambda: table(DatasetConfig),
    "pretraining-dataset": lambda: table(PretrainingDatasetConfig, ["type", "text_column", "skip"]),
    "user-defined": lambda: table(UserDefinedType),
    "preference": lambda: table(PreferenceFields),
    "trl": lambda: table(TRLConfig, prefix="trl."),
    "validation": lambda: table(ValidationConfig, prefix="validation."),
    "multi-turn": lambda: table(MultiTurnConfig, prefix="trl.multi_turn_config."),
    "ebft": lambda: table(EBFTConfig, prefix="ebft."),
    "qat": lambda: table(QATConfig, prefix="qat."),
    "vllm": lambda: table(VLLMConfig, prefix="vllm."),
    "profiler": lambda: table(ProfilerConfig, ["enable_profiler", "enable_nsys"], prefix="profiler.") + "\n" +
    table(SubProfilerConfig, prefix="profiler.sub_profiler_config.").split("\n", 2)[2],
    "nemo-gym": lambda: table(NemoGymFields),
    "nemo-gym-dataset": lambda: table(NemoGymDataset),
    "axolotl-only": axolotl_only,
}


PAGES = {DOC: TABLES, EBFT_DOC: {"ebft": TABLES["ebft"]}, COSMOS_DOC: {"cosmos-keys": mapping_table}}


def rendered(doc: Path, tables: dict) -> str:
    """The page with every generated table made anew from the schema."""
    text = doc.read_text()
    for name, make in tables.items():
        pattern = re.compile(rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"{doc}: no markers for table {name!r}")
        text = pattern.sub(lambda m: m.group(1) + make() + "\n" + m.group(2), text)
    return text


def main() -> None:
    for doc, tables in PAGES.items():
        doc.write_text(rendered(doc, tables))
        print(f"rewrote {len(tables)} table(s) in {doc}")


if __name__ == "__main__":
    main()
