"""RewardRunner: scores completions with every reward function (a function that raises or hangs
must not kill the run silently).

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

The calling convention is in rlft.rollout.rewards.calling, the worker processes in
rlft.rollout.rewards.workers.
"""

from __future__ import annotations

import atexit
import difflib
import logging
import math
import multiprocessing.connection
import pickle
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlft.errors import ConfigError, RolloutError, Terminated
from rlft.rollout.rewards.calling import (
    EXCLUDED_COLUMNS,
    BadReturn,
    _RewardTimeout,
    _short,
    _time_limit,
    as_trl_completions,
    coerce_scores,
    describe_exception,
)
from rlft.rollout.rewards.loading import RewardFunction
from rlft.rollout.rewards.workers import _Job, _WorkerPool
from rlft.rollout.scoring import column_stats
from rlft.rollout.types import RewardFailure

logger = logging.getLogger("rlft.rewards")

POLL_S = 1.0  # how often a wait without a deadline re-checks for a dead worker


@dataclass
class RewardScores:
    """`values` (N, K) float32: NaN = unscorable (None/NaN returned) or failed with failure_score None."""

    values: Any
    failures: list[RewardFailure] = field(default_factory=list)
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
        except (KeyboardInterrupt, Terminated):  # the user's or the launcher's stop, not the function's failure
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

    def _report_failures(self, state: _CallState) -> list[RewardFailure]:
        failures = []
        for k, events in enumerate(state.failure_events):
            if not events:
                continue
            function = self.functions[k]
            first_row, error, _ = min(events)
            distinct = sorted({e[1] for e in events})
            record: RewardFailure = {
                "function": function.name,
                "source": function.where,
                "error": error,
                "rows": state.failed_rows[k],
                "example": {"row": first_row, "prompt": _short(state.prompts[first_row]),
                            "completion": _short(state.completions[first_row])},
            }
            if len(distinct) > 1:
                record["other_errors"] = [e for e in distinct if e != error]
            score = "NaN (unscorable)" if self.failure_score is None else f"{self.failure_score:g}"
            record["summary"] = (f"reward function {function.where} failed on {record['rows']} of {state.rows} completions "
                                 f"(scored {score}): {error}\n  example row {first_row}:\n    prompt: "
                                 f"{record['example']['prompt']}\n    completion: {record['example']['completion']}")
            failures.append(record)
            logger.warning("%s", record["summary"])
        return failures

    def _metrics(self, values, state: _CallState) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for k, function in enumerate(self.functions):
            prefix = f"rewards/{function.name}"
            metrics[f"{prefix}/mean"], metrics[f"{prefix}/std"] = column_stats(values[:, k])  # TRL's nanmean / nanstd
            metrics[f"{prefix}/failures"] = float(state.failed_rows[k])
            metrics[f"{prefix}/unscorable"] = float(state.unscorable[k])
        return metrics

