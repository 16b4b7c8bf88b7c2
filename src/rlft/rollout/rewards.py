"""Reward functions for online RL: loading `trl.reward_funcs`, calling them as TRL does, workers, timeouts.

Calling convention (TRL `GRPOTrainer._calculate_rewards`, spec axolotl-rl.md §D)::

    fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)

* `prompts[i]` is the prompt of completion i (each prompt repeated once per completion);
* `completions[i]` is the decoded text, or `[{"role": "assistant", "content": text}]` when the
  prompt is a message list (conversational data);
* `completion_ids[i]` is the list of sampled token ids;
* `columns` are every other dataset column (all but prompt, completion, completion_ids), one entry
  per completion. TRL's `trainer_state`, `log_extra` and `log_metric` are not passed (as in
  Axolotl's reward workers, spec §A11).

The function returns one score per completion; `None` (or NaN) means "cannot score this one" and
becomes NaN, which the NaN-aware aggregation skips, as in TRL.

What rlft adds (a reward function that raises or hangs must not kill the run silently):

* a call that raises, times out, returns something that is not a list, or crashes its worker is
  scored `failure_score` on the rows it was given (NaN when `failure_score` is None), counted in
  `rewards/<name>/failures`, returned in `RewardScores.failures` with its input, and logged once
  per function per call on the `rlft.rewards` logger; a non-numeric or infinite element fails
  just its row;
* a list of the wrong length is a bug in the function and raises `RolloutError` at once;
* `num_workers == 1` runs the functions in this process, with `timeout` enforced by
  `signal.setitimer(ITIMER_REAL)` + SIGALRM when called on the main thread of the main interpreter
  on a platform that has them (the previous handler and timer are restored). Elsewhere (another
  thread, Windows) there is no timeout in-process: use workers. In-process, a function that uses
  `signal.alarm` itself overrides the timer; with workers it runs on its own main thread.
* `num_workers > 1` splits the rows into contiguous chunks scored by a persistent pool of
  "spawn" worker processes (torch may be loaded here: fork is unsafe), each importing the user
  modules once. The parent enforces the per-call timeout: a hung worker is terminated and
  replaced, a crashed one replaced, and the functions it had not reached yet are re-sent.
  Reward models (and functions that cannot be imported by name) always run in this process.
"""

from __future__ import annotations

import asyncio
import atexit
import difflib
import importlib
import importlib.util
import inspect
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rlft.errors import ConfigError, ModelError, RolloutError

logger = logging.getLogger("rlft.rewards")

RESERVED_ARGUMENTS = ("prompts", "completions", "completion_ids")
# Dataset columns that never reach reward functions as keywords (TRL drops the first three).
EXCLUDED_COLUMNS = ("prompt", "completion", "completion_ids") + RESERVED_ARGUMENTS
EXAMPLE_CHARS = 200
WORKER_BOOT_TIMEOUT_S = 120.0  # spawn + import torch/user modules on a slow machine
WORKER_STOP_TIMEOUT_S = 5.0
POLL_S = 1.0  # how often a wait without a deadline re-checks for a dead worker


# ---------------------------------------------------------------------------------------------
# Loading


@dataclass
class RewardFunction:
    """One entry of `trl.reward_funcs`: `fn` is called with the TRL keywords (see module docstring).

    `name` is used in metrics (`rewards/<name>/mean`); `import_path` ("module.fn") lets worker
    processes import it themselves, None keeps it in this process (reward models)."""

    name: str
    weight: float
    source: str
    fn: Callable[..., Any]
    module_file: str | None = None
    import_path: str | None = None
    required_columns: tuple[str, ...] = ()

    def __call__(self, prompts: list, completions: list, completion_ids: list, **columns: Any) -> Any:
        return _invoke(self.fn, prompts, completions, completion_ids, columns)

    @property
    def where(self) -> str:
        return f"{self.source} ({self.module_file})" if self.module_file else self.source


def load_reward_functions(names: list[str], weights: list[float] | None = None, device: str = "cpu") -> list[RewardFunction]:
    """Resolve `trl.reward_funcs` (+ `trl.reward_weights`): `module.fn` from the working directory, or
    a trained reward-model folder (scored on prompt + completion text). Raises ConfigError with the fix."""
    names = list(names or [])
    if not names:
        raise ConfigError("trl.reward_funcs is empty: give at least one `module.fn` or reward-model folder",
                          [("trl.reward_funcs", "empty")])
    if weights is None:
        weights = [1.0] * len(names)
    weights = list(weights)
    if len(weights) != len(names):
        message = (
            f"trl.reward_weights has {len(weights)} value(s) but trl.reward_funcs has {len(names)} ({', '.join(names)}): "
            "give one weight per reward function, in the same order, or drop reward_weights (all 1.0)"
        )
        raise ConfigError(message, [("trl.reward_weights", message)])
    for index, weight in enumerate(weights):
        if not isinstance(weight, (int, float)) or not math.isfinite(weight):
            message = f"trl.reward_weights[{index}] = {weight!r} is not a finite number"
            raise ConfigError(message, [(f"trl.reward_weights[{index}]", message)])
    functions = [_load_one(name, float(weight), index, device) for index, (name, weight) in enumerate(zip(names, weights))]
    _make_names_unique(functions)
    return functions


def _make_names_unique(functions: list[RewardFunction]) -> None:
    """Two functions with the same `fn` name would share metric keys: use the full source for those."""
    counts: dict[str, int] = {}
    for function in functions:
        counts[function.name] = counts.get(function.name, 0) + 1
    seen: set[str] = set()
    for function in functions:
        if counts[function.name] > 1:
            function.name = function.source
        while function.name in seen:
            function.name += "_"
        seen.add(function.name)


def _load_one(name: str, weight: float, index: int, device: str) -> RewardFunction:
    key = f"trl.reward_funcs[{index}]"
    folder = Path(name).expanduser()
    if folder.is_dir():
        return _reward_model_function(name, folder, weight, key, device)
    looks_like_path = "/" in name or os.sep in name or name.startswith((".", "~"))
    module_name, _, attr = name.rpartition(".")
    if looks_like_path or not module_name or not attr:
        if looks_like_path:  # a hub id (org/name) or a folder that does not exist: the loader says which
            return _reward_model_function(name, folder, weight, key, device)
        _fail(key, f"{name!r} is neither `module.fn` (a function in a .py file of {Path.cwd()}) nor a reward-model "
                   f"folder: write it as e.g. `rewards.my_reward` for my_reward in rewards.py")
    module = _import_user_module(module_name, name, key)
    module_file = getattr(module, "__file__", None)
    if not hasattr(module, attr):
        _fail(key, _missing_attribute_message(module, module_name, attr, name, module_file))
    fn = getattr(module, attr)
    if not callable(fn):
        _fail(key, f"{name!r}: {module_name}.{attr} in {module_file} is a {type(fn).__name__}, not a function; "
                   f"a reward function is `def {attr}(completions, **kwargs) -> list[float]`")
    required = _check_signature(fn, name, module_file, key)
    return RewardFunction(name=attr, weight=weight, source=name, fn=fn, module_file=module_file,
                          import_path=name, required_columns=required)


def _fail(key: str, message: str) -> None:
    raise ConfigError(f"{key}: {message}", [(key, message)])


def _import_user_module(module_name: str, name: str, key: str):
    """Import `module_name` with the working directory first on sys.path (as Axolotl does)."""
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    importlib.invalidate_caches()  # a file written after the last import of this directory
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            top = module_name.split(".")[0]
            _fail(key, f"{name!r}: no module {module_name!r}: looked for {top}.py (or a {top}/ package) in the working "
                       f"directory {cwd} and on sys.path. Run rlft from the folder that holds {top}.py, fix the name "
                       f"(`file_name.function_name`), or give the path of a reward-model folder")
        _fail(key, f"{name!r}: module {module_name} ({_module_file(module_name)}) failed to import: "
                   f"ModuleNotFoundError: {exc}. Install the missing package `{missing}` in this environment")
    except Exception as exc:  # SyntaxError, ImportError, anything the module raises at import time
        _fail(key, f"{name!r}: module {module_name} ({_module_file(module_name)}) failed to import: "
                   f"{type(exc).__name__}: {exc}. Fix the module; `python -c 'import {module_name}'` in {cwd} shows the error")


def _module_file(module_name: str) -> str:
    try:
        spec = importlib.util.find_spec(module_name)
    except Exception:  # noqa: BLE001 - a broken parent package: the name is all we have
        spec = None
    return spec.origin if spec is not None and spec.origin else f"{module_name}.py"


def _missing_attribute_message(module, module_name: str, attr: str, name: str, module_file: str | None) -> str:
    functions = sorted(n for n, value in vars(module).items() if callable(value) and not n.startswith("_")
                       and getattr(value, "__module__", None) == module.__name__)
    close = difflib.get_close_matches(attr, functions, n=1)
    hint = f" Did you mean {module_name}.{close[0]}?" if close else ""
    listed = f" It defines: {', '.join(functions)}." if functions else " It defines no functions."
    if attr == "py":
        hint = " Write `file_name.function_name`, not the file name."
    return f"{name!r}: module {module_name} ({module_file}) has no function {attr!r}.{hint}{listed}"


def _check_signature(fn: Callable, name: str, module_file: str | None, key: str) -> tuple[str, ...]:
    """Refuse signatures TRL's call cannot bind; return the required parameters that must be dataset columns."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check
        return ()
    parameters = list(signature.parameters.values())
    convention = ("rlft calls reward functions as TRL does: fn(prompts=..., completions=..., completion_ids=..., "
                  "<every other dataset column>=...), so a reward function is `def f(completions, **kwargs)` "
                  "(named columns such as `answer` may be listed before **kwargs)")
    where = f"{name!r} ({module_file})" if module_file else repr(name)
    positional_only = [p.name for p in parameters if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if positional_only:
        _fail(key, f"{where}{signature}: parameter(s) {', '.join(positional_only)} are positional-only and cannot receive "
                   f"keywords. {convention}")
    if not any(p.kind is p.VAR_KEYWORD for p in parameters):
        _fail(key, f"{where}{signature} has no **kwargs, so the call fails on the keywords it does not name "
                   f"(TRL also requires at least 2 parameters). {convention}: add **kwargs")
    return tuple(p.name for p in parameters
                 if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty
                 and p.name not in RESERVED_ARGUMENTS)


class RewardModelScorer:
    """A trained sequence-classification reward model as a reward function: scores prompt + completion.

    The text matches reward-model training (rlft.data.preference): the chat-templated prompt with the
    generation prompt (or the plain prompt string), then the completion; `score_texts` appends EOS."""

    def __init__(self, model, tokenizer, batch_size: int = 32):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float]:
        from rlft.models.reward import score_texts

        texts = [self._prompt_text(p) + _completion_text(c) for p, c in zip(prompts, completions)]
        return score_texts(self.model, self.tokenizer, texts, batch_size=self.batch_size)

    def _prompt_text(self, prompt: Any) -> str:
        if isinstance(prompt, list):
            if getattr(self.tokenizer, "chat_template", None):
                return self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
            return "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, Mapping))
        return str(prompt)


def _completion_text(completion: Any) -> str:
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) if isinstance(m, Mapping) else str(m) for m in completion)
    return str(completion)


def _reward_model_function(name: str, folder: Path, weight: float, key: str, device: str) -> RewardFunction:
    if folder.is_dir():
        model_folder = folder / "model" if (folder / "model").is_dir() else folder
        if not any((model_folder / f).exists() for f in ("adapter_config.json", "config.json")):
            _fail(key, f"{name!r} is a folder ({folder.resolve()}) but holds no config.json or adapter_config.json, so it is "
                       "not a reward model; give a trained reward-model folder or a `module.fn` reward function")
    from rlft.models.reward import load_reward_for_scoring

    try:
        model, tokenizer = load_reward_for_scoring(name, device=device)
    except ModelError as exc:
        _fail(key, f"{name!r} is not an importable `module.fn` and cannot be loaded as a reward model: {exc}")
    except (OSError, ValueError) as exc:
        local = "" if folder.exists() else f" (there is no folder {folder.resolve()}, so it was read as a hub id)"
        _fail(key, f"{name!r}: loading it as a reward model (sequence classification, 1 label) failed{local}: {exc}")
    label = folder.name if folder.name not in ("", ".", "model") else Path(name).resolve().name
    return RewardFunction(name=label or name, weight=weight, source=name, fn=RewardModelScorer(model, tokenizer),
                          module_file=str(folder.resolve()) if folder.exists() else None)


# ---------------------------------------------------------------------------------------------
# Calling one function and checking what it returned


def _invoke(fn: Callable, prompts: list, completions: list, completion_ids: list, columns: Mapping[str, Any]) -> Any:
    output = fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
    if inspect.isawaitable(output):  # `async def` reward functions, as TRL allows

        async def wait_for():
            return await output

        output = asyncio.run(wait_for())
    return output


class BadReturn(Exception):
    """The function returned something that is not a list of scores (scored as a failure)."""


def coerce_scores(output: Any) -> list[float | None | str]:
    """The returned scores as a list of float / None / str (the repr of a non-numeric element)."""
    if output is None:
        raise BadReturn("returned None instead of a list of scores (a missing `return`?)")
    if hasattr(output, "tolist") and not isinstance(output, (list, tuple)):  # torch / numpy arrays
        output = output.tolist()
    if isinstance(output, Iterator):
        output = list(output)
    if isinstance(output, (str, bytes, Mapping, set, frozenset)) or not isinstance(output, Sequence):
        raise BadReturn(f"returned a {type(output).__name__} ({_short(output, 80)}) instead of a list with one score "
                        "per completion")
    scores: list[float | None | str] = []
    for value in output:
        if value is None:
            scores.append(None)
        elif isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
            scores.append(_short(repr(value), 80))
        else:
            try:
                scores.append(float(value))
            except (TypeError, ValueError):  # e.g. a tensor with several elements
                scores.append(_short(repr(value), 80))
    return scores


def describe_exception(exc: BaseException) -> str:
    """`Type: message (at file:line in function)`, the frame being the innermost one of the traceback."""
    text = f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    if frames:
        last = frames[-1]
        text += f" (at {last.filename}:{last.lineno} in {last.name})"
    return text


def _short(value: Any, limit: int = EXAMPLE_CHARS) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _RewardTimeout(BaseException):
    """Raised by the SIGALRM handler; a BaseException so `except Exception` in user code cannot swallow it."""


def _alarm_available() -> bool:
    return hasattr(signal, "setitimer") and hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()


@contextmanager
def _time_limit(seconds: float | None):
    """Raise _RewardTimeout in this (main) thread after `seconds`; restores the previous handler and timer."""
    if seconds is None or not _alarm_available():
        yield
        return
    armed = {"on": True}

    def on_alarm(signum, frame):
        if armed["on"]:
            raise _RewardTimeout()

    try:
        previous = signal.signal(signal.SIGALRM, on_alarm)
    except ValueError:  # not the main interpreter: no timeout here
        yield
        return
    started = time.monotonic()
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        armed["on"] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if old_delay > 0:  # someone else's timer was running: give it back what is left
            signal.setitimer(signal.ITIMER_REAL, max(old_delay - (time.monotonic() - started), 1e-3), old_interval)


# ---------------------------------------------------------------------------------------------
# Worker processes


def _import_target(target: str) -> Callable:
    module_name, _, attr = target.rpartition(".")
    return getattr(importlib.import_module(module_name), attr)


def _worker_main(conn, cwd: str, targets: list[tuple[int, str]]) -> None:
    """A reward worker: import the functions once, then score (call_id, indices, rows...) messages until None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it stops us
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        os.chdir(cwd)
    except OSError:
        pass
    functions: dict[int, Callable] = {}
    problems: dict[int, str] = {}
    for index, target in targets:
        try:
            functions[index] = _import_target(target)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which runs it itself
            problems[index] = describe_exception(exc)
    conn.send(("ready", os.getpid(), problems))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if message is None:
            return
        call_id, indices, prompts, completions, completion_ids, columns = message
        for index in indices:
            try:
                output = _invoke(functions[index], prompts, completions, completion_ids, columns)
                reply = (call_id, index, "ok", coerce_scores(output))
            except BadReturn as exc:
                reply = (call_id, index, "error", f"BadReturn: {exc}")
            except BaseException as exc:  # noqa: BLE001 - SystemExit from user code is a failure too
                reply = (call_id, index, "error", describe_exception(exc))
            conn.send(reply)


@dataclass
class _Worker:
    process: Any
    conn: Any


@dataclass
class _Job:
    """Rows [start, stop) on one worker; `indices` are the functions not answered yet, the first one running."""

    start: int
    stop: int
    indices: list[int]
    payload: tuple
    deadline: float = math.inf


class _WorkerPool:
    def __init__(self, size: int, cwd: str, targets: list[tuple[int, str]]):
        self.context = multiprocessing.get_context("spawn")
        self.cwd = cwd
        self.targets = targets
        self.workers: list[_Worker | None] = [None] * size
        self.unavailable: dict[int, str] = {}
        for slot in range(size):  # start all, then wait: they boot in parallel
            self.workers[slot] = self._start(slot)
        deadline = time.monotonic() + WORKER_BOOT_TIMEOUT_S
        for slot in range(size):
            self._await_ready(slot, deadline)

    def _start(self, slot: int) -> _Worker:
        parent_conn, child_conn = self.context.Pipe(duplex=True)
        process = self.context.Process(target=_worker_main, args=(child_conn, self.cwd, self.targets),
                                       name=f"rlft-reward-worker-{slot}", daemon=True)
        process.start()
        child_conn.close()
        return _Worker(process, parent_conn)

    def _await_ready(self, slot: int, deadline: float) -> None:
        worker = self.workers[slot]
        assert worker is not None
        message = None
        while message is None and time.monotonic() < deadline:
            ready = multiprocessing.connection.wait([worker.conn, worker.process.sentinel],
                                                    timeout=max(deadline - time.monotonic(), 0.0))
            if worker.conn in ready or worker.conn.poll():
                try:
                    message = worker.conn.recv()
                except (EOFError, OSError):
                    break
            elif ready:  # the process ended without a word
                break
        if not message or message[0] != "ready":
            worker.process.join(1.0)
            exitcode = worker.process.exitcode
            self._stop(worker)
            self.workers[slot] = None
            state = (f"exited with code {exitcode} while starting (its traceback is printed above)" if exitcode is not None
                     else f"did not start within {WORKER_BOOT_TIMEOUT_S:g}s")
            raise RolloutError(
                f"reward worker process {state}. Workers are started with 'spawn', which re-imports the main script: "
                "a script that starts training must do so under `if __name__ == '__main__':`. "
                "Or set trl.reward_num_workers: 1 to score in this process"
            )
        for index, problem in message[2].items():
            if index not in self.unavailable:
                logger.warning("reward function %s cannot be imported in a worker process (%s): it runs in the main process",
                               dict(self.targets)[index], problem)
            self.unavailable[index] = problem

    def ensure(self, slot: int) -> _Worker:
        if self.workers[slot] is None or not self.workers[slot].process.is_alive():
            if self.workers[slot] is not None:
                self._stop(self.workers[slot])
            self.workers[slot] = self._start(slot)
            self._await_ready(slot, time.monotonic() + WORKER_BOOT_TIMEOUT_S)
        return self.workers[slot]

    def replace(self, slot: int) -> _Worker:
        if self.workers[slot] is not None:
            self._stop(self.workers[slot])
            self.workers[slot] = None
        return self.ensure(slot)

    @property
    def pids(self) -> list[int | None]:
        return [w.process.pid if w is not None else None for w in self.workers]

    @staticmethod
    def _stop(worker: _Worker, polite: bool = False) -> None:
        process = worker.process
        if polite and process.is_alive():
            try:
                worker.conn.send(None)
            except (OSError, ValueError):
                pass
            process.join(WORKER_STOP_TIMEOUT_S)
        if process.is_alive():
            process.terminate()
            process.join(1.0)
        if process.is_alive():
            process.kill()
            process.join(1.0)
        try:
            worker.conn.close()
        except OSError:
            pass

    def close(self) -> None:
        workers, self.workers = [w for w in self.workers if w is not None], [None] * len(self.workers)
        for worker in workers:  # ask all first, so they stop in parallel
            try:
                worker.conn.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + WORKER_STOP_TIMEOUT_S
        for worker in workers:
            worker.process.join(max(deadline - time.monotonic(), 0.0))
            self._stop(worker)


# ---------------------------------------------------------------------------------------------
# The runner


@dataclass
class RewardScores:
    """`values` (N, K) float32: NaN = unscorable (None/NaN returned) or failed with failure_score None."""

    values: Any
    failures: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)


@dataclass
class _CallState:
    """What one `score` call has gathered so far (plain Python: the tensor is built at the end)."""

    rows: int
    width: int
    prompts: list
    completions: list
    values: list[list[float]] = field(init=False)
    unscorable: list[int] = field(init=False)
    failed_rows: list[int] = field(init=False)
    failure_events: list[list[tuple[int, str, int]]] = field(init=False)  # per function: (first row, error, rows)
    fatal: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.values = [[math.nan] * self.width for _ in range(self.rows)]
        self.unscorable = [0] * self.width
        self.failed_rows = [0] * self.width
        self.failure_events = [[] for _ in range(self.width)]


class RewardRunner:
    """Scores completions with every reward function; see the module docstring for the rules.

    `timeout` is seconds per function call (None = no limit); `failure_score` is the score of the
    rows of a call that failed (None = NaN, unscorable). Use as a context manager or call `close()`."""

    def __init__(self, functions: list[RewardFunction], num_workers: int = 1, timeout: float | None = 60.0,
                 failure_score: float | None = 0.0):
        if not functions:
            raise ConfigError("no reward functions: set trl.reward_funcs", [("trl.reward_funcs", "empty")])
        if num_workers < 1:
            raise ConfigError(f"trl.reward_num_workers must be >= 1, got {num_workers}", [("trl.reward_num_workers", ">= 1")])
        if timeout is not None and timeout <= 0:
            raise ConfigError(f"trl.reward_timeout must be > 0 seconds or null, got {timeout}", [("trl.reward_timeout", "> 0")])
        self.functions = list(functions)
        self.num_workers = num_workers
        self.timeout = timeout
        self.failure_score = failure_score
        self.cwd = str(Path.cwd())
        self._pool: _WorkerPool | None = None
        self._call_id = 0
        self._closed = False

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.functions]

    @property
    def weights(self):
        import torch

        return torch.tensor([f.weight for f in self.functions], dtype=torch.float32)

    @property
    def worker_pids(self) -> list[int | None]:
        """Process ids of the reward workers (empty before the first call or with one worker)."""
        return self._pool.pids if self._pool is not None else []

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker processes (idempotent)."""
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
        try:
            atexit.unregister(self.close)
        except Exception:  # noqa: BLE001 - interpreter shutting down
            pass

    # -- scoring --------------------------------------------------------------------------------

    def score(self, prompts: list, completions: list, completion_ids: list[list[int]],
              columns: Mapping[str, list] | None = None) -> RewardScores:
        """Call every function on all N rows; `values` is (N, K) in row order, K = functions in config order."""
        import torch

        rows = len(completions)
        columns = self._check_inputs(prompts, completions, completion_ids, columns)
        completions = as_trl_completions(prompts, completions)
        for function in self.functions:
            self._check_columns(function, columns)
        state = _CallState(rows, len(self.functions), list(prompts), list(completions))
        self._call_id += 1
        if rows:
            local = list(range(len(self.functions)))
            jobs: dict[int, _Job] = {}
            if self.num_workers > 1:
                pool = self._ensure_pool()
                remote = [k for k, f in enumerate(self.functions) if f.import_path and k not in pool.unavailable]
                local = [k for k in local if k not in remote]
                if remote:
                    jobs = self._dispatch(pool, remote, prompts, completions, completion_ids, columns)
            try:
                for k in local:  # while the workers score theirs
                    self._run_local(k, state, prompts, completions, completion_ids, columns)
            except BaseException:
                self._abandon(jobs)
                raise
            if jobs:
                self._collect(jobs, state)
        if state.fatal:
            raise RolloutError("; ".join(state.fatal))
        values = torch.tensor(state.values, dtype=torch.float32).reshape(rows, len(self.functions))
        failures = self._report_failures(state)
        return RewardScores(values=values, failures=failures, metrics=self._metrics(values, state), names=self.names)

    def _check_inputs(self, prompts, completions, completion_ids, columns) -> dict[str, list]:
        rows = len(completions)
        if len(prompts) != rows or len(completion_ids) != rows:
            raise RolloutError(f"reward scoring got {len(prompts)} prompts, {rows} completions and {len(completion_ids)} "
                               "completion_ids: give one prompt (repeated per completion) and one id list per completion")
        kept = {}
        for key, values in (columns or {}).items():
            if key in EXCLUDED_COLUMNS:
                continue
            if len(values) != rows:
                raise RolloutError(f"reward scoring: column {key!r} has {len(values)} values for {rows} completions; "
                                   "repeat each row's value once per completion")
            kept[key] = list(values)
        return kept

    @staticmethod
    def _check_columns(function: RewardFunction, columns: Mapping[str, list]) -> None:
        missing = [name for name in function.required_columns if name not in columns]
        if not missing:
            return
        available = sorted(columns)
        hints = []
        for name in missing:
            close = difflib.get_close_matches(name, available, n=1)
            if close:
                hints.append(f"did you mean {close[0]!r}?")
        have = ", ".join(map(repr, available)) or "no columns besides the prompt"
        hint = f" ({' '.join(hints)})" if hints else ""
        raise RolloutError(
            f"reward function {function.where} needs dataset column(s) {', '.join(map(repr, missing))}, but the rows have "
            f"{have}{hint}: "
            "return that column from the dataset transform, or rename the function's parameter"
        )

    def _ensure_pool(self) -> _WorkerPool:
        if self._closed:
            raise RolloutError("RewardRunner.score called after close()")
        if self._pool is None:
            targets = [(k, f.import_path) for k, f in enumerate(self.functions) if f.import_path]
            self._pool = _WorkerPool(self.num_workers, self.cwd, targets)
            atexit.register(self.close)  # daemon workers die with us anyway; this stops them politely
        return self._pool

    # -- in-process --------------------------------------------------------------------------------

    def _run_local(self, k: int, state: _CallState, prompts, completions, completion_ids, columns) -> None:
        function = self.functions[k]
        try:
            with _time_limit(self.timeout):
                output = function(prompts, completions, completion_ids, **columns)
            outcome = ("ok", coerce_scores(output))
        except _RewardTimeout:
            outcome = ("error", f"TimeoutError: no result after {self.timeout:g}s (trl.reward_timeout)")
        except BadReturn as exc:
            outcome = ("error", f"BadReturn: {exc}")
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - a reward function must not end the run
            outcome = ("error", describe_exception(exc))
        self._record(state, k, 0, state.rows, outcome)

    # -- workers ------------------------------------------------------------------------------------

    def _dispatch(self, pool: _WorkerPool, indices: list[int], prompts, completions, completion_ids, columns) -> dict[int, _Job]:
        rows = len(completions)
        parts = min(len(pool.workers), rows)
        bounds = [rows * part // parts for part in range(parts + 1)]
        jobs: dict[int, _Job] = {}
        for slot in range(parts):
            start, stop = bounds[slot], bounds[slot + 1]
            payload = (prompts[start:stop], completions[start:stop], completion_ids[start:stop],
                       {key: values[start:stop] for key, values in columns.items()})
            jobs[slot] = _Job(start, stop, list(indices), payload)
            self._send(pool, slot, jobs[slot])
        return jobs

    def _send(self, pool: _WorkerPool, slot: int, job: _Job) -> None:
        worker = pool.ensure(slot)
        try:
            worker.conn.send((self._call_id, list(job.indices)) + job.payload)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:  # pickled whole before anything is sent
            raise RolloutError(f"the rows cannot be sent to reward worker processes ({type(exc).__name__}: {exc}); "
                               "keep dataset columns picklable or set trl.reward_num_workers: 1") from exc
        job.deadline = time.monotonic() + self.timeout if self.timeout is not None else math.inf

    def _collect(self, jobs: dict[int, _Job], state: _CallState) -> None:
        pool = self._pool
        assert pool is not None
        try:
            while jobs:
                now = time.monotonic()
                waitables = []
                for slot in jobs:
                    worker = pool.workers[slot]
                    waitables += [worker.conn, worker.process.sentinel]
                wait_s = min(min(job.deadline for job in jobs.values()) - now, POLL_S)
                multiprocessing.connection.wait(waitables, timeout=max(wait_s, 0.0))
                for slot in list(jobs):
                    self._advance(pool, slot, jobs, state)
        finally:
            self._abandon(jobs)

    def _abandon(self, jobs: dict[int, _Job]) -> None:
        """Interrupted (Ctrl-C, an error): workers still busy with this call's work are stopped; fresh ones
        start at the next call, so no stale result can reach it."""
        pool = self._pool
        if pool is None:
            return
        for slot in list(jobs):
            if pool.workers[slot] is not None:
                pool._stop(pool.workers[slot])
                pool.workers[slot] = None
        jobs.clear()

    def _advance(self, pool: _WorkerPool, slot: int, jobs: dict[int, _Job], state: _CallState) -> None:
        job = jobs[slot]
        worker = pool.workers[slot]
        ended = False
        while job.indices and worker.conn.poll():  # poll() is also true at end-of-file: recv tells which
            try:
                call_id, index, status, result = worker.conn.recv()
            except (EOFError, OSError):
                ended = True
                break
            if call_id != self._call_id or index not in job.indices:
                continue
            job.indices.remove(index)
            self._record(state, index, job.start, job.stop, (status, result))
            job.deadline = time.monotonic() + self.timeout if self.timeout is not None else math.inf
        if not job.indices:
            del jobs[slot]
            return
        running = job.indices[0]
        if ended or not worker.process.is_alive():
            worker.process.join(1.0)
            error = f"WorkerCrashed: the reward worker process died (exit code {worker.process.exitcode}) while scoring"
        elif time.monotonic() >= job.deadline:
            error = (f"TimeoutError: no result after {self.timeout:g}s (trl.reward_timeout); "
                     "the worker was terminated and replaced")
        else:
            return
        job.indices.pop(0)
        self._record(state, running, job.start, job.stop, ("error", error))
        pool.replace(slot)
        if job.indices:  # the functions it had not reached yet run on the new worker
            self._send(pool, slot, job)
        else:
            del jobs[slot]

    # -- results ------------------------------------------------------------------------------------

    def _record(self, state: _CallState, k: int, start: int, stop: int, outcome: tuple[str, Any]) -> None:
        status, result = outcome
        failure = self.failure_score if self.failure_score is not None else math.nan
        if status != "ok":
            for row in range(start, stop):
                state.values[row][k] = failure
            state.failed_rows[k] += stop - start
            state.failure_events[k].append((start, str(result), stop - start))
            return
        scores = result
        expected = stop - start
        if len(scores) != expected:
            function = self.functions[k]
            part = f" (rows {start}-{stop - 1} of {state.rows}, one worker's share)" if expected != state.rows else ""
            state.fatal.append(
                f"reward function {function.name!r} from {function.where} returned {len(scores)} values for {expected} "
                f"completions{part}: expected {expected}, got {len(scores)}. A reward function must return exactly one score "
                "per completion, in order (None for one it cannot score)"
            )
            return
        bad_rows: list[tuple[int, str]] = []
        for offset, score in enumerate(scores):
            row = start + offset
            if score is None or (isinstance(score, float) and math.isnan(score)):
                state.values[row][k] = math.nan
                state.unscorable[k] += 1
            elif isinstance(score, str) or math.isinf(score):
                state.values[row][k] = failure
                bad_rows.append((row, score if isinstance(score, str) else repr(score)))
            else:
                state.values[row][k] = score
        if bad_rows:
            state.failed_rows[k] += len(bad_rows)
            first_row, value = bad_rows[0]
            kind = "a non-numeric" if not value.lstrip("-").startswith("inf") else "an infinite"
            state.failure_events[k].append(
                (first_row, f"BadScore: returned {kind} score {value} (scores must be finite numbers or None)", len(bad_rows)))

    def _report_failures(self, state: _CallState) -> list[dict[str, Any]]:
        failures = []
        for k, events in enumerate(state.failure_events):
            if not events:
                continue
            function = self.functions[k]
            first_row, error, _ = min(events)
            distinct = sorted({e[1] for e in events})
            record = {
                "function": function.name,
                "source": function.where,
                "error": error,
                "rows": state.failed_rows[k],
                "example": {"row": first_row, "prompt": _short(state.prompts[first_row]),
                            "completion": _short(state.completions[first_row])},
            }
            if len(distinct) > 1:
                record["other_errors"] = [e for e in distinct if e != error]
            failures.append(record)
            score = "NaN (unscorable)" if self.failure_score is None else f"{self.failure_score:g}"
            logger.warning(
                "reward function %s failed on %d of %d completions (scored %s): %s\n  example row %d:\n    prompt: %s\n"
                "    completion: %s", function.where, record["rows"], state.rows, score, error, first_row,
                record["example"]["prompt"], record["example"]["completion"],
            )
        return failures

    def _metrics(self, values, state: _CallState) -> dict[str, float]:
        import torch

        metrics: dict[str, float] = {}
        for k, function in enumerate(self.functions):
            column = values[:, k]
            valid = column[~torch.isnan(column)]
            mean = float(valid.mean()) if valid.numel() else math.nan
            std = float(valid.std(unbiased=True)) if valid.numel() > 1 else math.nan  # TRL's nanstd (Bessel)
            prefix = f"rewards/{function.name}"
            metrics[f"{prefix}/mean"] = mean
            metrics[f"{prefix}/std"] = std
            metrics[f"{prefix}/failures"] = float(state.failed_rows[k])
            metrics[f"{prefix}/unscorable"] = float(state.unscorable[k])
        return metrics


def is_conversational_prompt(prompt: Any) -> bool:
    """A prompt is conversational when it is a list of {role, content} messages (TRL `is_conversational`)."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], Mapping) and "role" in prompt[0]


def as_trl_completions(prompts: list, completions: list) -> list:
    """Completion texts as TRL passes them: `[{"role": "assistant", "content": text}]` for conversational prompts."""
    if not prompts or not is_conversational_prompt(prompts[0]):
        return list(completions)
    return [[{"role": "assistant", "content": c}] if isinstance(c, str) else c for c in completions]
