"""`rlft validate`: check a config, or describe its keys, without loading models or data."""

from __future__ import annotations

import argparse

from rlft.cli.consoles import console, err_console
from rlft.cli.exit import CommandState
from rlft.config import explain, load_config
from rlft.config.settings import resolve
from rlft.errors import ConfigError


def validate(args: argparse.Namespace, state: CommandState) -> int:
    if args.explain:
        for key in args.explain:
            console.print(explain(key), markup=False, highlight=False)
        if not args.config:
            return 0
    if not args.config:
        raise ConfigError("validate needs a CONFIG file (or --explain KEY)")
    try:
        resolve(load_config(args.config, args.overrides))  # the settings `rlft train` builds: a config that validates builds them
    except ConfigError as exc:
        err_console.print(str(exc), style="red", markup=False, highlight=False)
        return 1
    console.print("OK")
    return 0
