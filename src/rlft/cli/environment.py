"""The process settings every command starts with: quiet libraries, no progress bars in logs."""

from __future__ import annotations

import logging
import os
import sys

from rlft.heap import collector_paused


def prepare_environment() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # our own progress bar is the one to watch
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # torch is imported here, after the settings above and with the collector paused (rlft.heap), not when this
    # module is: importing it takes a second or more, which the pause shortens
    with collector_paused():
        import torch

    if not torch.cuda.is_available():  # said, so that DeepSpeed (imported by transformers when installed) does not warn
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    logging.getLogger("rlft.rewards").propagate = False  # the recipe prints reward failures on the run's console
    # torchao, which transformers and PEFT import when it is installed (rlft[qat]), logs that its CUDA kernels do not
    # load on a machine without CUDA, and torch notes its Enum registrations: lines before every run that mean nothing
    logging.getLogger("torchao").setLevel(logging.ERROR)
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    logging.getLogger("rlft.rewards").addHandler(logging.NullHandler())
    if not sys.stderr.isatty():  # progress bars in logs are only carriage-return noise
        if "datasets" in sys.modules:
            from datasets.utils.logging import disable_progress_bar  # datasets is already imported: costs nothing

            disable_progress_bar()
        else:  # read when datasets is imported: importing it here would cost a second to commands that never use it
            os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
