"""Calling one reward function as TRL does, and checking what it returned.

Calling convention (TRL `GRPOTrainer._calculate_rewards`, https://github.com/huggingface/trl)::

    fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)

* `prompts[i]` is the prompt of completion i (each prompt repeated once per completion);
* `completions[i]` is the decoded text, or `[{"role": "assistant", "content": text}]` when the
  prompt is a message list (conversational data);
* `completion_ids[i]` is the list of sampled token ids;
* `columns` are every other dataset column (all but prompt, completion, completion_ids), one entry
  per completion. TRL's `trainer_state`, `log_extra` and `log_metric` are not passed (as in
  Axolotl's reward workers).

The function returns one score per completion; `None` (or NaN) means "cannot score this one" and
becomes NaN, which the NaN-aware aggregation skips, as in TRL.

In this process the per-call `timeout` is enforced by `_time_limit`: `signal.setitimer(ITIMER_REAL)`
+ SIGALRM when called on the main thread of the main interpreter on a platform that has them (the
previous handler and timer are restored). Elsewhere (another thread, Windows) there is no timeout
in-process: use workers. In-process, a function that uses `signal.alarm` itself overrides the timer.
"""

from __future__ import annotations

import asyncio
import inspect
import signal
import threading
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Callable

RESERVED_ARGUMENTS = ("prompts", "completions", "completion_ids")
# Dataset columns that never reach reward functions as keywords (TRL drops the first three).
EXCLUDED_COLUMNS = ("prompt", "completion", "completion_ids") + RESERVED_ARGUMENTS
EXAMPLE_CHARS = 200


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



def completion_text(completion: Any) -> str:
    """The model's text of one completion: the string, or the joined `content` of its assistant messages (an episode's
    tool results are not the model's words, and a scorer that read them would credit the tool's answer)."""
    if isinstance(completion, list):
        return "".join(str(m.get("content") or "") if isinstance(m, Mapping) else str(m)
                       for m in completion if not isinstance(m, Mapping) or m.get("role", "assistant") == "assistant")
    return str(completion)


def is_conversational_prompt(prompt: Any) -> bool:
    """A prompt is conversational when it is a list of {role, content} messages (TRL `is_conversational`)."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], Mapping) and "role" in prompt[0]


def as_trl_completions(prompts: list, completions: list) -> list:
    """Completion texts as TRL passes them: `[{"role": "assistant", "content": text}]` for conversational prompts."""
    if not prompts or not is_conversational_prompt(prompts[0]):
        return list(completions)
    return [[{"role": "assistant", "content": c}] if isinstance(c, str) else c for c in completions]
