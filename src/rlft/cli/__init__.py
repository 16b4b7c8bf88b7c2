"""`rlft` command line: train | evaluate | validate | convert | preprocess | vllm-serve | generate | score | merge-lora |
quickstart.

`run_command` is the console script; `main` runs one command and returns its exit code (tests call it in-process).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import signal
import sys

from rlft.cli.environment import prepare_environment
from rlft.cli.exit import (CommandState, end_training_process, interrupted_outside_the_steps, report_error,
                           report_peer_failure, stopped_by_sigterm)
from rlft.cli.parser import OVERRIDE_COMMANDS, build_parser
from rlft.config.parallel import launched
from rlft.errors import RlftError, Terminated
from rlft.heap import collector_paused, release_heap


def main(argv: list[str] | None = None, state: CommandState | None = None) -> int:
    state = CommandState() if state is None else state
    prepare_environment()
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    args, extra = parser.parse_known_args([a for a in argv if a != "--debug"])
    args.debug = debug
    if extra and args.command not in OVERRIDE_COMMANDS:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.overrides = extra
    try:
        module, function = args.handler
        # only the command that runs is imported (parser's docstring), as start-up: with the collector paused
        with collector_paused():
            handler = getattr(importlib.import_module(f"rlft.cli.commands.{module}"), function)
        return handler(args, state)
    except RlftError as exc:
        if args.debug:
            raise
        return report_error(exc, state)
    except Terminated:
        return stopped_by_sigterm(state)
    except KeyboardInterrupt:  # outside the training steps (loading, final export, summary): the loop saves its own
        return interrupted_outside_the_steps(state)
    except BaseException as exc:  # torch's CheckpointException is one: it wraps what failed while a checkpoint was written
        # rlft.train.parallel brings torch.distributed: imported only for a failure, so that `rlft --help` and
        # `rlft validate` stay fast
        from rlft.train.parallel import peer_failure

        if state.sigterm_seen and not args.debug:
            return stopped_by_sigterm(state)
        if args.debug or not peer_failure(exc):
            raise
        return report_peer_failure(exc)
    finally:
        release_heap()  # for a caller that goes on (tests); the command itself exits next


def run_command() -> None:
    """The `rlft` command: main(), then exit with its code. A Ctrl-C that lands after main() has returned (while the
    interpreter shuts down torch's libraries) is ignored: the run is over and its result printed, and Python would
    otherwise print a traceback from an atexit hook. One that lands in the instant before SIGINT is ignored keeps
    main()'s code; one that escapes main() itself (before its handling begins, or in its last line) is answered as
    main() answers a Ctrl-C outside the training steps: no traceback."""
    code = None
    state = CommandState()
    try:
        code = main(None, state)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt:
        while signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # pressed again in the instant before it took
            with contextlib.suppress(KeyboardInterrupt):
                signal.signal(signal.SIGINT, signal.SIG_IGN)
        if code is None:
            code = interrupted_outside_the_steps(state)
    if launched()[1] > 1:
        end_training_process(code)
    gc.freeze()  # the interpreter's last collections would walk every object left for nothing (0.8 s with torch loaded)
    sys.exit(code)
