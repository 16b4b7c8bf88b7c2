"""HTTP to a rollout server, watched: the part that rlft's own server and a stock vLLM server share.

Every call has a timeout, and a long call (generation, a weight update) is watched: while it runs, `/health` is
asked every ~2 s, and after 3 unanswered checks in a row the call fails with a RolloutError, so a dead or hung
server is noticed within ~10 s instead of at the next timeout; a server that says its engine is dead (a 503 from
/health) fails the call at the first check. Several calls can run at once under one watch (`_watched_all`).
The calls run on daemon threads, so a hung call never keeps the trainer from exiting.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any, Callable

import httpx

from rlft.errors import RolloutError

TOKEN_ENV = "RLFT_SERVER_TOKEN"
_GONE = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


class ServerRefused(RolloutError):
    """The server answered a call with an HTTP error: `status` is its code, `reason` its message."""

    def __init__(self, message: str, status: int, reason: Any):
        super().__init__(message)
        self.status, self.reason = status, reason


class ServerUnreachable(RolloutError):
    """No answer from the server: nothing listens yet, or it stopped answering (died or hangs)."""


class WatchedServer:
    """The HTTP side of a rollout engine that samples on a server. Subclasses define `health()` and may override
    `start_hint` (how to start such a server, for messages) and `_dead_engine` (what a 503 from /health means)."""

    start_hint = "`rlft vllm-serve CONFIG` (its vllm.host / vllm.port, or --host / --port)"
    parallel_calls = 64  # most calls of one `_watched_all` in flight at once

    def __init__(self, host: str = "127.0.0.1", port: int = 8000, token: str | None = None, timeout: float = 3600.0, *,
                 health_interval: float = 2.0, health_failures: int = 3, health_timeout: float = 1.5):
        """`timeout`: the longest a generation or weight update may take while the server keeps answering /health
        (a dead or hung server is noticed within ~10 s regardless); short calls time out after 5 x `health_timeout`."""
        self.host = "127.0.0.1" if host in ("0.0.0.0", "", None) else host  # 0.0.0.0 is where a server listens, not an address
        self.port = port
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self.base_url = f"http://{shown}:{port}"
        self.timeout = timeout
        self.health_interval, self.health_failures, self.health_timeout = health_interval, health_failures, health_timeout
        token = token or os.environ.get(TOKEN_ENV) or None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        limits = httpx.Limits(max_connections=self.parallel_calls + 4)
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=httpx.Timeout(timeout, connect=10.0),
                                  limits=limits)
        # one client for the liveness probes of watched calls (making a client costs ~20 ms: not once per call)
        self._probe = httpx.Client(base_url=self.base_url, timeout=health_timeout)
        self._answered = False  # whether the server ever answered: a refused connection before that means "not started"

    def health(self) -> dict[str, Any]:
        raise NotImplementedError

    def wait_until_ready(self, timeout: float = 240.0, on_progress: Callable[[float], None] | None = None) -> dict[str, Any]:
        """Poll `health()` every second until the server answers; raise saying what to start when it never does."""
        start = time.monotonic()
        while True:
            try:
                return self.health()
            except ServerUnreachable:
                pass  # an answer with an error is raised: waiting would not help
            elapsed = time.monotonic() - start
            if elapsed >= timeout:
                raise RolloutError(f"no rollout server answered at {self.base_url}/health after {timeout:.0f} s: start one with "
                                   f"{self.start_hint}, listening on {self.host}:{self.port}, or point the trainer's "
                                   "trl.vllm_server_host / trl.vllm_server_port at the server")
            if on_progress is not None:
                on_progress(elapsed)
            time.sleep(min(1.0, max(timeout - elapsed, 0.0)))

    def close(self) -> None:
        self._http.close()
        self._probe.close()

    # ---------------------------------------------------------------- HTTP

    def _died(self) -> RolloutError:
        return ServerUnreachable(f"the rollout server at {self.host}:{self.port} stopped answering (it died or hangs): restart it "
                            f"with {self.start_hint}; the last checkpoint is kept")

    def _dead_engine(self, probe: httpx.Response) -> RolloutError | None:
        """The error a /health answer of 503 means, or None when it may be a passing state (a proxy's 503)."""
        return None

    def _call(self, method: str, path: str, timeout: float | None = None, **kwargs) -> Any:
        try:
            response = self._http.request(method, path, timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT, **kwargs)
        except httpx.ConnectError:
            if not self._answered:
                raise ServerUnreachable(f"no rollout server at {self.base_url}: start one with {self.start_hint}") from None
            raise self._died() from None
        except (*_GONE, httpx.TimeoutException):
            raise self._died() from None
        return self._answer(response, path)

    def _answer(self, response: httpx.Response, path: str) -> Any:
        self._answered = True
        if response.status_code == 401:
            raise ServerRefused(f"the rollout server refused {path} (401): the token is wrong or missing: set vllm.api_key in "
                                f"the trainer's config or the {TOKEN_ENV} environment variable to the server's token", 401, None)
        try:
            payload = response.json()
        except ValueError:
            payload = {"error": response.text[:300]}
        if response.status_code >= 400:
            reason = payload.get("error", payload) if isinstance(payload, dict) else payload
            reason = reason.get("message", reason) if isinstance(reason, dict) else reason  # the /v1/ routes' OpenAI form
            raise ServerRefused(f"the rollout server refused {path} ({response.status_code}): {reason}", response.status_code, reason)
        return payload

    def _watched(self, method: str, path: str, **kwargs) -> Any:
        """A long call, with /health checked every `health_interval` s on the side: a dead server fails it within ~10 s."""
        return self._watched_all([(method, path, kwargs)])[0]

    def _watched_all(self, calls: list[tuple[str, str, dict[str, Any]]]) -> list[Any]:
        """Several long calls at once (up to `parallel_calls` in flight) under one watch; their answers in order. The
        first call that failed raises, once every call has ended."""
        results: list[Any] = [None] * len(calls)
        pending: queue.SimpleQueue[int] = queue.SimpleQueue()
        for index in range(len(calls)):
            pending.put(index)

        def run() -> None:
            while True:
                try:
                    index = pending.get_nowait()
                except queue.Empty:
                    return
                method, path, kwargs = calls[index]
                try:
                    results[index] = self._http.request(method, path, **kwargs)
                except BaseException as exc:  # noqa: BLE001 - handed to the caller below
                    results[index] = exc

        name = f"rlft-remote{calls[0][1]}" if calls else "rlft-remote"
        workers = [threading.Thread(target=run, name=name, daemon=True)  # daemon: a hung call never blocks exit
                   for _ in range(min(len(calls), self.parallel_calls))]
        for worker in workers:
            worker.start()
        failures, next_probe = 0, time.monotonic() + self.health_interval
        while True:
            alive = [worker for worker in workers if worker.is_alive()]
            if not alive:
                break
            alive[0].join(max(next_probe - time.monotonic(), 0.0))
            if time.monotonic() < next_probe:
                continue
            next_probe = time.monotonic() + self.health_interval  # a slow probe does not stretch the schedule
            try:
                probe = self._probe.get("/health")
                dead = self._dead_engine(probe) if probe.status_code == 503 else None
                if dead is not None:  # its engine is dead: waiting will not help
                    raise dead
                probe.raise_for_status()
                failures = 0
            except httpx.ConnectError:
                raise self._died() from None  # refused: the process is gone
            except httpx.HTTPError:
                failures += 1
                if failures >= self.health_failures:
                    raise self._died() from None
        answers = []
        for (_, path, _), result in zip(calls, results):
            if isinstance(result, (*_GONE, httpx.TimeoutException)):
                raise self._died() from None
            if isinstance(result, BaseException):
                raise result
            answers.append(self._answer(result, path))
        return answers
