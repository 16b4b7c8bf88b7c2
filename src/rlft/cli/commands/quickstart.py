"""`rlft quickstart`: the offline demo, a tiny model learning addition, accuracy before and after."""

from __future__ import annotations

import argparse
from pathlib import Path

from rlft.cli.config_file import load_run_config
from rlft.cli.consoles import console
from rlft.cli.exit import CommandState, stop_on_sigterm
from rlft.quickstart import quickstart_config, run_quickstart


def quickstart(args: argparse.Namespace, state: CommandState) -> int:
    cfg = quickstart_config(Path(args.config), args.overrides, load_run_config)  # a --config file is read as `train` reads it
    state.weights_only = cfg.save_only_model  # as `train` does
    with stop_on_sigterm(state):
        run_quickstart(cfg, console)
    return 0
