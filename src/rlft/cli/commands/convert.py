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
    if out.is_dir():
        example = out / Path(args.config).with_suffix(".yaml").name
        raise ConfigError(f"-o {out} is a folder: give the file to write, e.g. -o {example}")
    if not out.parent.is_dir():
        fix = "is a file, not a folder" if out.parent.exists() else f"does not exist: create it (mkdir -p {out.parent})"
        raise ConfigError(f"-o {out}: {out.parent} {fix}, or write the YAML elsewhere")
    if out.exists() and not args.force:
        raise ConfigError(f"{out} exists: pick another file, or add --force to replace it")
    try:
        out.write_text(text)
    except OSError as exc:  # no permission, a full disk: the system's reason, without a traceback
        raise ConfigError(f"-o {out}: cannot write it ({exc.strerror}): pick a file you can write") from None
    console.print(f"wrote {out}", markup=False, highlight=False, soft_wrap=True)
    return 0
