"""`rlft validate`: check a config, or describe its keys, without loading models or data.

A Cosmos-RL file validates when Cosmos-RL's schema and rlft's rules take its translation; what `rlft train` would
refuse of it (hardware rlft does not drive, unknown keys) and the keys rlft does not read are listed after `OK`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rlft.cli.consoles import console, err_console
from rlft.cli.exit import CommandState
from rlft.config import explain
from rlft.config.cosmos.report import explain_cosmos_key, explain_file, notes
from rlft.config.cosmos.schema import unknown_path
from rlft.config.loading import load_translated
from rlft.config.settings import resolve
from rlft.errors import ConfigError


def validate(args: argparse.Namespace, state: CommandState) -> int:
    keys = [key for key in args.explain or [] if key]
    every_key = "" in (args.explain or [])  # `--explain` without a KEY: each key the config sets
    config = args.config
    if not config and keys and Path(keys[-1]).is_file():  # `--explain FILE`: the file, every key of it
        config, keys, every_key = keys[-1], keys[:-1], True
    for key in keys:
        if _is_config_path(key) and not Path(key).is_file():  # a config file's name, not a key: the file is missing
            raise ConfigError(f"config file not found: {key} (check the path; it is relative to {Path.cwd()})")
    for key in keys:
        console.print(_describe(key), markup=False, highlight=False, soft_wrap=True)
    if not config:
        if keys:
            return 0
        raise ConfigError("validate needs a CONFIG file (or --explain KEY)")
    try:
        cfg, translation = load_translated(config, args.overrides)
        resolve(cfg)  # the settings `rlft train` builds: a config that validates builds them
    except ConfigError as exc:
        err_console.print(str(exc), style="red", markup=False, highlight=False, soft_wrap=True)
        return 1
    if every_key:
        text = explain_file(translation, config) if translation else _explain_rlft(cfg)
        console.print(text, markup=False, highlight=False, soft_wrap=True)
    for line in notes(translation, config) if translation else []:
        err_console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.print("OK")
    return 0


def _is_config_path(argument: str) -> bool:
    """A config file's name (a .yaml, .yml or .toml suffix, or a folder in it); keys are dotted names (trl.beta)."""
    return Path(argument).suffix in (".yaml", ".yml", ".toml") or "/" in argument or os.sep in argument


def _describe(key: str) -> str:
    """An rlft key, else a Cosmos-RL key (train.train_policy.kl_beta): rlft's unknown-key message where it is neither."""
    try:
        return explain(key)
    except ConfigError:
        described = explain_cosmos_key(key)
        if described is not None:
            return described
        unknown = unknown_path(key)
        if unknown is not None:
            raise ConfigError(f"{key}: {unknown}") from None
        raise


def _explain_rlft(cfg) -> str:
    """Each top-level key (and trl: key) an rlft config sets, described."""
    keys = [name for name in type(cfg).model_fields if name in cfg.model_fields_set and name != "trl"]
    keys += [f"trl.{name}" for name in type(cfg.trl).model_fields if name in cfg.trl.model_fields_set]
    return "\n".join(explain(key) for key in keys)
