"""`rlft quickstart`: the offline demo, a tiny model learning addition, accuracy before and after."""

from __future__ import annotations

import argparse
from pathlib import Path

from rlft.cli.consoles import console
from rlft.cli.exit import CommandState, stop_on_sigterm
from rlft.quickstart import quickstart_config, run_quickstart


def quickstart(args: argparse.Namespace, state: CommandState) -> int:
    state.weights_only = quickstart_config(Path(args.config), args.overrides).save_only_model  # as `train` does
    with stop_on_sigterm(state):
        run_quickstart(Path(args.config), args.overrides, console)
    return 0
