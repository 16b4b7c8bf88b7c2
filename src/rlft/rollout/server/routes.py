"""How the rollout server's routes are registered and answer: with and without a trailing slash, the returned dict
written as JSON off the event loop, an error as `{"error": message}`, or on the OpenAI routes (`/v1/...`) in OpenAI's
form, `{"error": {"message", "type", "param", "code"}}`, which OpenAI's clients read the message from."""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any, Callable

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from rlft.rollout.server.protocol import ServerError


ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError", 404: "NotFoundError",
               409: "ConflictError", 422: "UnprocessableEntityError", 503: "ServiceUnavailableError"}


def error_response(path: str, message: str, status: int) -> JSONResponse:
    """The answer to a request that failed: its message in the form the route's clients read."""
    if path.startswith("/v1/"):
        kind = ERROR_TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
        return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}}, status_code=status)
    return JSONResponse({"error": message}, status_code=status)


def json_text(payload) -> str:
    try:
        return json.dumps(payload, separators=(",", ":"), allow_nan=False)
    except ValueError:  # a log-prob of -inf (a top alternative the filters dropped): JSON has no infinity
        return json.dumps(_finite(payload), separators=(",", ":"), allow_nan=False)


def add_route(app: FastAPI, path: str, endpoint: Callable, methods: list[str], guard=None) -> None:
    """`path` and `path/`, so every client's spelling reaches the same handler.

    The endpoint's dict is written with `json.dumps` directly: FastAPI's own encoder walks every element of a
    response (~25 ms for one batch of 512 completions' ids and log-probs, on the engine's critical path)."""
    dependencies = [Depends(guard)] if guard is not None else None

    @functools.wraps(endpoint)  # FastAPI reads the wrapped signature: body models and parameters stay as declared
    async def json_endpoint(*args, **kwargs) -> Response:
        try:
            payload = await endpoint(*args, **kwargs)
        except (ServerError, HTTPException):
            raise
        except Exception as exc:  # answered here: past the app's handlers Starlette re-raises, and uvicorn prints a traceback
            return error_response(path, f"internal error in {path}: {type(exc).__name__}: {exc}", 500)
        if isinstance(payload, Response):  # a status of its own (/health of a dead engine)
            return payload
        # off the event loop: a batch of 512 long completions takes seconds to write, and /health must answer meanwhile
        return Response(await asyncio.to_thread(json_text, payload), media_type="application/json")

    for spelling in (path, path + "/"):
        app.add_api_route(spelling, json_endpoint, methods=methods, dependencies=dependencies, response_model=None,
                          include_in_schema=spelling == path)


def _finite(value: Any) -> Any:
    """`value` with -inf / inf as -9999.0 / 9999.0 (OpenAI's floor for impossible tokens) and NaN as null."""
    if isinstance(value, float):
        return None if value != value else max(-9999.0, min(9999.0, value))
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value
