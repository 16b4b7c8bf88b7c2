"""`rlft convert`: the rlft YAML of a Cosmos-RL config, to move a run over for good."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlft.cli.consoles import console, err_console
from rlft.cli.exit import CommandState
from rlft.config.cosmos.report import converted_yaml
from rlft.config.loading import load_translated
from rlft.errors import ConfigError


def convert(args: argparse.Namespace, state: CommandState) -> int:
    _, translation = load_translated(args.config)  # the translation validates as an rlft config, or this stops
    if translation is None:
        raise ConfigError(f"{args.config} is an rlft config already (no Cosmos-RL sections such as [train] or [policy]): "
                          "there is nothing to convert")
    text = converted_yaml(translation, Path(args.config).name)
    refused = translation.of("refused") + translation.of("unknown")
    if refused:
        err_console.print(f"not converted ({len(refused)} keys rlft train refuses; listed at the top of the YAML): "
                          + ", ".join(o.path for o in refused), markup=False, highlight=False, soft_wrap=True)
    if not args.output:
        sys.stdout.write(text)
        return 0
    out = Path(args.output)
    if out.exists() and not args.force:
        raise ConfigError(f"{out} exists: pick another file, or add --force to replace it")
    out.write_text(text)
    console.print(f"wrote {out}", markup=False, highlight=False, soft_wrap=True)
    return 0
