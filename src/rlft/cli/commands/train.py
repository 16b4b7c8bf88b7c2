"""`rlft train`: in this process, or as N launched processes."""

from __future__ import annotations

import argparse
import os

from rich.console import Console

from rlft.cli.config_file import load_run_config
from rlft.cli.consoles import console
from rlft.cli.exit import CommandState, resume_hint, stop_on_sigterm
from rlft.config.parallel import launched
from rlft.errors import ConfigError
from rlft.heap import collector_paused
from rlft.train.launch import check_devices, launch_arguments, run_launched
from rlft.train.parallel import check_layer_classes
from rlft.train.unbuilt import refuse_unbuilt


def train(args: argparse.Namespace, state: CommandState) -> int:
    cfg = load_run_config(args.config, args.overrides)  # a bad config stops here, before any process starts
    state.weights_only = cfg.save_only_model  # what the lines for a run stopped from outside say of its checkpoints

    if args.num_processes > 1 or args.nnodes > 1:
        refuse_unbuilt(cfg, args.num_processes)  # said once, before any process starts
        check_devices(args.num_processes // max(1, args.nnodes))
        check_layer_classes(cfg)

        if "WORLD_SIZE" in os.environ:
            raise ConfigError("--num-processes inside an already launched process (torchrun / accelerate launch set "
                              "WORLD_SIZE): use one launcher, e.g. `rlft train CONFIG --num-processes N` alone")
        return run_launched(launch_arguments(args.config, args.overrides, args.num_processes, args.nnodes, args.node_rank,
                                             args.main_ip, args.main_port, args.debug), resume_hint(state))
    # imported here, with the collector paused: the training code brings transformers, datasets and the models
    # (seconds), which the launching process above never needs, since it only checks the config
    with collector_paused():
        from rlft.train.run import train as run_training

    with stop_on_sigterm(state):
        # rank 0 reports for all; every rank's errors reach stderr
        run_training(cfg, console if launched()[0] == 0 else Console(quiet=True))
    return 0
