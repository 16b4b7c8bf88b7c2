"""Turn the text extraction of Cosmos-RL's configuration schema into src/rlft/config/cosmos/schema.json.

    PYTHONPATH=src .venv/bin/python docs/gen_cosmos_schema.py SCHEMA.txt

SCHEMA.txt is the JSON schema of Cosmos-RL's `Config` (https://github.com/nvidia-cosmos/cosmos-rl,
cosmos_rl/policy/config, `Config.model_json_schema()`) flattened to text, one cell per line: each model of its
`$defs`, then each property with its title, description, type(s) and default. The extraction keeps the titles
("Kl Beta") but not the names of properties that are sections (`"$ref"`), and loses a few defaults that are not
plain values: `SECTION_NAMES`, `PATCHES` and `EXTRA` below give them, from Cosmos-RL's own config module. The
script runs once per schema version; its output is committed, and rlft reads only the JSON.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "rlft" / "config" / "cosmos" / "schema.json"
KEYWORDS = {"type", "default", "anyOf", "oneOf", "const", "items", "maxItems", "minItems", "additionalProperties",
            "properties", "$defs"}
TYPES = {"string", "integer", "number", "boolean", "array", "object", "null"}
# the name of each property whose value is a section (the extraction keeps only the `$ref`)
SECTION_NAMES = {
    ("Config", "TrainingConfig"): "train", ("Config", "RolloutConfig"): "rollout", ("Config", "PolicyConfig"): "policy",
    ("Config", "LoggingConfig"): "logging", ("Config", "ProfilerConfig"): "profiler",
    ("Config", "ValidationConfig"): "validation",
    ("GrpoConfig", "DatasetConfig"): "dataset", ("GrpoConfig", "OverlongRewardConfig"): "overlong_reward",
    ("SFTDataConfig", "DatasetConfig"): "dataset", ("ValidationConfig", "DatasetConfig"): "dataset",
    ("PolicyConfig", "ParallelismConfig"): "parallelism", ("PolicyConfig", "LoraConfig"): "lora",
    ("RolloutConfig", "RolloutParallelismConfig"): "parallelism", ("RolloutConfig", "SamplingConfig"): "sampling_config",
    ("RolloutConfig", "MultiTurnRolloutConfig"): "multi_turn_config",
    ("ProfilerConfig", "SubProfilerConfig"): "sub_profiler_config",
    ("TrainingConfig", "FP8Config"): "fp8", ("TrainingConfig", "FP4Config"): "fp4",
    ("TrainingConfig", "CheckpointConfig"): "ckpt",
}
# what the flat text cannot hold or lost: defaults made by a factory or lost as an empty cell, a tuple's item type,
# a description the extraction garbled, and the `choices` Cosmos-RL's fields declare (json_schema_extra, dropped)
PATCHES = {
    ("Config", "custom"): {"default": {}},
    ("GrpoConfig", "reward_function"): {"default": ["single_choice"]},
    ("GrpoConfig", "filter_reward_metric"): {"default": []},
    ("SubProfilerConfig", "rank_filter"): {"default": []},
    ("ValidationConfig", "reward_function"): {"default": []},
    ("LoggingConfig", "logger"): {"default": []},
    ("LoraConfig", "target_modules"): {"default": None},
    ("LoraConfig", "modules_to_save"): {"default": None},
    ("TrainingConfig", "optm_betas"): {"default": [0.9, 0.999], "items": ["number"]},
    ("DatasetConfig", "revision"): {"description": "Dataset git revision if exist, can be a branch name, a tag, or a "
                                                   "commit hash."},
    ("CheckpointConfig", "save_mode"): {"choices": ["async", "sync"]},
    ("GrpoConfig", "variant"): {"choices": ["grpo", "gspo", "dapo"]},
    ("GrpoConfig", "loss_type"): {"choices": ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]},
    ("FP8Config", "fp8_recipe"): {"choices": ["dynamic_scaling", "delayed_scaling"]},
    ("FP8Config", "quant_recipe"): {"choices": ["rowwise", "tensorwise"]},
    ("FP4Config", "fp4_recipe"): {"choices": ["dynamic_scaling", "delayed_scaling"]},
    ("FP4Config", "quant_recipe"): {"choices": ["rowwise", "tensorwise"]},
    ("TrainingConfig", "optm_name"): {"choices": ["AdamW", "Adam"]},
    ("TrainingConfig", "optm_impl"): {"choices": ["fused", "foreach", "for-loop"]},
    ("TrainingConfig", "optm_decay_type"): {"choices": ["sqrt", "cosine", "linear", "none"]},
    ("TrainingConfig", "master_dtype"): {"choices": ["bfloat16", "float16", "float32"]},
    ("TrainingConfig", "param_dtype"): {"choices": ["bfloat16", "float16", "float32"]},
    ("TrainingConfig", "transfer_dtype"): {"choices": ["bfloat16", "float16", "float32"]},
    ("TrainingConfig", "fsdp_reduce_dtype"): {"choices": ["float32"]},
    ("TrainingConfig", "fsdp_reshard_after_forward"): {"choices": ["always", "never", "default"]},
    ("TrainingConfig", "fa_version"): {"choices": [2, 3]},
    ("RolloutConfig", "quantization"): {"choices": ["none", "fp8"]},
    ("RolloutConfig", "backend"): {"choices": ["vllm", "trtllm"]},
}
# properties that Cosmos-RL's schema hides from its docs (`hide_in_doc`): the launcher's, and one of logging
EXTRA = {
    "LoggingConfig": {
        "report_mfu": {"types": ["boolean"], "default": False,
                       "description": "Whether to report the MFU (Model FLOPs Utilization) to wandb."},
    },
    "Config": {
        "redis": {"types": ["string"], "default": "", "description": "Redis server address port, format: port"},
        "eth_ips": {"types": ["string"], "default": "", "description": "List of eth ip addresses, format: ip1;ip2;ip3"},
    },
}


# keys of later Cosmos-RL versions (commit 89f2e5b5 of https://github.com/nvidia-cosmos/cosmos-rl) that its public
# example configs set and the schema above lacks; marked "later", with descriptions in rlft's words
def _key(types: list[str], default, description: str, **extra) -> dict:
    return {"types": types, "default": default, "description": description, "later": True, **extra}


_DTYPES = ["bfloat16", "float16", "float32"]
LATER = {
    "Config": {
        "distillation": {"section": "DistillationConfig", "nullable": False, "later": True,
                         "description": "On-policy distillation: a teacher model's per-token log-probs guide the student."},
        "mode": _key(["string"], "disaggregated", "Where rollouts run: disaggregated (own GPUs), colocated or "
                     "colocated_separated (on the policy's GPUs).",
                     choices=["disaggregated", "colocated", "colocated_separated"]),
    },
    "DistillationConfig": {
        "enable": _key(["boolean"], False, "Turn distillation from the teacher model on."),
        "parallelism": {"section": "ParallelismConfig", "nullable": False, "later": True,
                        "description": "How the teacher model is split over GPUs."},
        "model_name_or_path": _key(["string"], "Qwen/Qwen2.5-VL-7B-Instruct", "The teacher model: a hub id or a local folder."),
        "model_revision": _key(["string", "null"], None, "The teacher model's revision."),
        "compile": _key(["boolean"], True, "torch.compile the teacher model."),
        "master_dtype": _key(["string"], "float32", "The teacher's master weight dtype.", choices=_DTYPES),
        "param_dtype": _key(["string"], "bfloat16", "The teacher's forward dtype.", choices=_DTYPES),
        "logprob_dtype": _key(["string"], "float32", "The dtype of the teacher's log-probs.", choices=_DTYPES),
        "fsdp_reduce_dtype": _key(["string"], "float32", "The teacher's FSDP reduction dtype.", choices=["float32"]),
        "fsdp_offload": _key(["boolean"], False, "Offload the teacher model to the CPU under FSDP."),
        "fsdp_reshard_after_forward": _key(["string"], "never", "Reshard the teacher's parameters after its forward under "
                                           "FSDP.", choices=["always", "never", "default"]),
        "batch_size_per_replica": _key(["integer"], 8, "Teacher batch size per replica."),
        "max_token_len_per_mini_batch": _key(["integer", "null"], None, "Token budget of a teacher mini-batch."),
        "sequence_packing": _key(["boolean"], False, "Pack the teacher's input sequences."),
        "mini_batch": _key(["integer"], 1, "Teacher mini-batch size per replica."),
        "seed": _key(["integer", "null"], None, "The teacher's random seed."),
        "kl_penalty_coef": _key(["number"], 1.0, "Weight of the KL penalty to the teacher."),
        "kl_discount_factor": _key(["number"], 0.0, "Discount factor of the KL penalty."),
        "include_prompt": _key(["boolean"], False, "Include the prompt tokens in the teacher KL."),
        "top_k": _key(["integer"], 0, "Top-k of the teacher's logits before the KL; above 0, a generalized Jensen-Shannon "
                      "divergence."),
        "jsd_beta": _key(["number"], 0.5, "Interpolation of the generalized Jensen-Shannon divergence: 0 is the KL, 1 the "
                         "reverse KL."),
        "trainer_token_ids_from_teacher": _key(["boolean"], True, "The trainer takes the top-k token ids from the teacher."),
        "rollout_top_k_recompute": _key(["boolean"], False, "Recompute the top-k log-probs after generation."),
    },
    "ParallelismConfig": {
        "pp_schedule": _key(["string"], "Interleaved1F1B", "Pipeline schedule: 1F1B, GPipe or Interleaved1F1B."),
        "pp_layers_per_stage": _key(["integer"], 2, "Weighted layers per pipeline stage (multi-stage schedules)."),
    },
    "GrpoConfig": {
        "trainer_type": _key(["string"], "grpo", "The GRPO trainer class, by its registered name."),
        "use_rollout_logprobs_for_loss": _key(["boolean"], False, "Use the rollout engine's log-probs as the old "
                                              "log-probs of the importance ratio."),
    },
    "SFTDataConfig": {"trainer_type": _key(["string"], "sft", "The SFT trainer class, by its registered name.")},
    "TrainingConfig": {"force_use_hf": _key(["boolean", "null"], False, "Load the dataset from the hub even where a local "
                                            "copy exists.")},
    "ValidationConfig": {"val_before_train": _key(["boolean"], False, "Validate once before training starts.")},
}


def cells(text: str) -> list[str]:
    """The non-empty cells in order; a property starts after an empty cell (`|`), which is kept as ''."""
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped == "|":
            out.append("")
        elif stripped.strip("|"):
            out.append(stripped.removesuffix("|").strip())
    return out


def snake(title: str) -> str:
    return re.sub(r"\W+", "_", title.strip()).lower()


def value(token: str, types: list[str], item_types: list[str]) -> object:
    if token == "None":
        return None
    if token in ("True", "False") and "boolean" in types:
        return token == "True"
    for kind, cast in (("integer", int), ("number", float)):
        if kind in types or kind in item_types:
            try:
                return cast(token)
            except ValueError:
                pass
    return token


def parse_property(section: str, tokens: list[str]) -> tuple[str, dict]:
    """One property's cells -> (name, {types, items, values, default, description} or {section, ...})."""
    head, rest = tokens[0], tokens[1:]
    entry: dict = {"types": [], "items": [], "values": []}
    refs = [t.removeprefix("#/$defs/") for t in tokens if t.startswith("#/$defs/")]
    title = None
    if head.startswith("#/$defs/"):
        rest = tokens
    elif rest and rest[0] not in KEYWORDS and not rest[0].startswith("#/$defs/"):
        title, entry["description"], rest = head, rest[0], rest[1:]
    else:
        title = head
    default_tokens, reading, i = None, None, 0
    while i < len(rest):
        token, following = rest[i], rest[i + 1] if i + 1 < len(rest) else None
        if reading == "default" and (token not in KEYWORDS or (token == "default" and not default_tokens)):
            default_tokens.append(token)
        elif token == "default":
            default_tokens, reading = [], "default"
        elif token == "const":
            entry["const"], i = following, i + 1
        elif token == "type" and following in TYPES:
            target = {"items": entry["items"], "values": entry["values"]}.get(reading, entry["types"])
            if following not in target:
                target.append(following)
            reading, i = None, i + 1
        elif token == "items":
            reading = "items"
        elif token == "additionalProperties":
            reading = "values"
            if following == "True":
                reading, i = None, i + 1
        elif token in ("maxItems", "minItems"):
            reading, i = None, i + 1
        elif token in ("anyOf", "oneOf"):
            reading = None
        i += 1
    if refs:
        name = SECTION_NAMES[(section, refs[0])]
        return name, {"section": refs[0], "nullable": "null" in entry["types"],
                      "description": entry.get("description") or title or ""}
    name = snake(title)
    if "const" in entry:
        entry["types"], entry["default"] = ["string"], entry.pop("const")
        entry["const"] = True
    elif default_tokens is not None:
        converted = [value(t, entry["types"], entry["items"]) for t in default_tokens]
        if not converted:
            entry["default"] = ""
        elif "array" in entry["types"] and not ({"string", "integer", "number"} & set(entry["types"])):
            entry["default"] = converted
        else:
            entry["default"] = converted[0]
    entry.update(PATCHES.get((section, name), {}))
    entry.setdefault("description", "")
    for key in ("items", "values"):
        if not entry[key]:
            del entry[key]
    return name, entry


def parse(text: str) -> dict[str, dict[str, dict]]:
    tokens = cells(text)
    models: dict[str, dict[str, dict]] = {}
    starts = [i for i, t in enumerate(tokens)
              if re.fullmatch(r"(?:[A-Z]\w*)?Config", t) and tokens[i + 1:i + 3] == ["type", "object"]]
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(tokens)
        body = tokens[start + 1:end]
        name = tokens[start]
        if name == "Config":  # the top level: its `$defs` follow its own properties
            body = body[:body.index("$defs")]
        props = body[body.index("properties") + 1:]
        groups: list[list[str]] = []
        for token in props:
            if token == "":
                groups.append([])
            elif groups:
                groups[-1].append(token)
        fields = {}
        for group in filter(None, groups):
            if name == "TrainingConfig" and group[0] == "Train Policy":
                fields["train_policy"] = {"sections": ["SFTDataConfig", "GrpoConfig"], "section": "GrpoConfig",
                                          "discriminator": "type",
                                          "description": "The training method's settings: `type = \"grpo\"` (GrpoConfig) or "
                                                         "`type = \"sft\"` (SFTDataConfig)."}
                continue
            key, entry = parse_property(name, group)
            fields[key] = entry
        fields.update(EXTRA.get(name, {}))
        fields.update(LATER.get(name, {}))
        models[name] = fields
    for name in LATER.keys() - models.keys():
        models[name] = LATER[name]
    if "RolloutParallelismConfig" in models:  # it extends ParallelismConfig in Cosmos-RL
        models["RolloutParallelismConfig"].update(LATER["ParallelismConfig"])
    return models


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    models = parse(Path(sys.argv[1]).read_text())
    OUT.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for n, (section, fields) in enumerate(models.items()):  # one line per key, for a readable diff
        keys = [f"  {json.dumps(key)}: {json.dumps(entry, ensure_ascii=False)}" for key, entry in fields.items()]
        lines.append(f" {json.dumps(section)}: {{\n" + ",\n".join(keys) + "\n }" + ("," if n < len(models) - 1 else ""))
    OUT.write_text("{\n" + "\n".join(lines) + "\n}\n")
    assert json.loads(OUT.read_text()) == models
    print(f"wrote {OUT}: {len(models)} sections, {sum(len(f) for f in models.values())} keys")


if __name__ == "__main__":
    main()
