"""`rlft evaluate`: the eval metrics of the config's model on its eval data, without training."""

from __future__ import annotations

import argparse

from rlft.cli.config_file import load_run_config
from rlft.cli.consoles import console
from rlft.cli.exit import CommandState
from rlft.train.run import evaluate as run_evaluation


def evaluate(args: argparse.Namespace, state: CommandState) -> int:
    run_evaluation(load_run_config(args.config, args.overrides), console)
    return 0
