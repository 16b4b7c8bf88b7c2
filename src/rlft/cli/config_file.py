"""The config file of a command that runs something (train, preprocess, evaluate, serve)."""

from __future__ import annotations

import os
from pathlib import Path

from rlft.cli.consoles import console
from rlft.config import RlftConfig
from rlft.config.cosmos.front import refuse_cosmos
from rlft.config.cosmos.report import notes
from rlft.config.loading import load_translated


def load_run_config(path: str | Path, overrides: list[str] | None) -> RlftConfig:
    """The validated config of `path` with `overrides`. A Cosmos-RL file stops here on any key rlft does not run or
    does not know (a misspelt key would otherwise be lost), and the keys rlft does not read are listed, once, by the
    command the user ran (a launched process, with WORLD_SIZE set, stays quiet)."""
    cfg, cosmos = load_translated(path, overrides)
    if cosmos is not None:
        refuse_cosmos(cosmos, str(path))
        if "WORLD_SIZE" not in os.environ:
            for line in notes(cosmos, str(path)):
                console.print(line, markup=False, highlight=False, soft_wrap=True)
    return cfg
