"""The rollout server's HTTP application: training endpoints, verified weight and adapter sync, and the
OpenAI-compatible routes (`openai_routes.py`).

Every route answers errors as `{"error": message}` with a 4xx for a bad request, never a traceback.
Slow work (decoding a bucket, hashing weights, generating) runs off the event loop, so `/health`
answers while a batch is being generated. Routes exist with and without a trailing slash, since
TRL and Axolotl clients call `/health/` and `/generate/`.
"""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from rlft.rollout.server.openai_routes import add_openai_routes
from rlft.rollout.server.protocol import ServerError, ServingBackend, dtype_name
from rlft.rollout.server.requests import GenerateBody, LoadAdapterBody, WeightsPathBody, generation_request
from rlft.rollout.server.security import token_guard
from rlft.rollout.server.transfer import (BucketedTransfer, check_against_model, read_adapter_folder, read_weights_path,
                                          verify_checksum)


def _json(payload) -> str:
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
            return JSONResponse({"error": f"internal error in {path}: {type(exc).__name__}: {exc}"}, status_code=500)
        if isinstance(payload, Response):  # a status of its own (/health of a dead engine)
            return payload
        # off the event loop: a batch of 512 long completions takes seconds to write, and /health must answer meanwhile
        return Response(await asyncio.to_thread(_json, payload), media_type="application/json")

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


def build_app(backend: ServingBackend, *, model_name: str, token: str | None, ends: tuple[int, ...]) -> FastAPI:
    """`ends`: the token ids that end an answer (`rlft.data.tokenizer.end_ids` of the served model)."""
    app = FastAPI(title="rlft rollout server", redirect_slashes=False)
    guard = token_guard(token)
    transfer = BucketedTransfer()
    _add_error_handlers(app)

    def weight_state() -> dict[str, Any]:
        return {"weight_version": backend.weight_version, "weight_checksum": backend.weight_checksum}

    async def health() -> dict[str, Any] | Response:
        state = {"model": model_name, "backend": backend.name, **weight_state(), "dtype": dtype_name(backend.dtype)}
        if reason := backend.dead():  # 503, as Axolotl's server answers for dead workers: a trainer stops at once
            return JSONResponse({"status": "unhealthy", "error": f"the engine is dead: {reason}",
                                 **state}, status_code=503)
        return {"status": "ok", **state}

    async def weight_info() -> dict[str, Any]:
        return {**weight_state(), "dtype": dtype_name(backend.dtype), "lora_dtype": dtype_name(backend.lora_dtype),
                "architecture": backend.architecture, "lora": backend.lora, "max_lora_rank": backend.max_lora_rank,
                "max_model_len": backend.max_model_len, "model": model_name, "backend": backend.name,
                "base_updated": backend.base_updated}

    async def generate(body: GenerateBody) -> dict[str, Any]:
        request = generation_request(
            backend, body.prompt_ids, n=body.n, max_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p,
            top_k=body.top_k, min_p=body.min_p, repetition_penalty=body.repetition_penalty,
            stop_token_ids=body.stop_token_ids, stop=body.stop, seed=body.seed)
        out = await backend.generate(request)
        return {"completion_ids": out.completion_ids, "logprobs": out.logprobs, "truncated": out.truncated,
                "weight_version": out.weight_version, "weight_checksum": out.weight_checksum}

    async def load_checked(tensors, claimed: str | None, version: int) -> dict[str, Any]:
        received = await asyncio.to_thread(verify_checksum, tensors, claimed, "weights")
        check_against_model(tensors, backend.parameter_shapes())
        loaded = await backend.load_weights(tensors, version)
        return {"weight_version": version, "weight_checksum": loaded, "received_checksum": received}

    async def update_weights(request: Request, version: int, checksum: str, bucket: int = 0, buckets: int = 1) -> dict[str, Any]:
        body = await request.body()
        tensors = await asyncio.to_thread(transfer.add, body, version, bucket, buckets)
        if tensors is None:
            return {"received": bucket, "buckets": buckets, "weight_version": backend.weight_version}
        return await load_checked(tensors, checksum, version)

    async def update_weights_from_path(body: WeightsPathBody) -> dict[str, Any]:
        tensors = await asyncio.to_thread(read_weights_path, body.path)
        return await load_checked(tensors, body.checksum, body.version)

    async def load_adapter(body: LoadAdapterBody, version: int) -> dict[str, Any]:
        adapter = await asyncio.to_thread(read_adapter_folder, body.lora_path, backend.max_lora_rank)
        if body.checksum and adapter.checksum != body.checksum:
            raise ServerError(400, f"transfer corrupted: the adapter in {adapter.folder} has checksum {adapter.checksum[:16]}..., "
                                   f"the sender computed {body.checksum[:16]}... (a partly written folder?); nothing was loaded")
        loaded = await backend.load_adapter(adapter, version)
        return {"weight_version": version, "weight_checksum": loaded, "received_checksum": adapter.checksum, "lora": backend.lora}

    async def load_lora_adapter(body: LoadAdapterBody) -> dict[str, Any]:
        if body.version is None:
            raise ServerError(400, "load_lora_adapter needs a version (int): the weight version the adapter carries")
        return await load_adapter(body, body.version)

    async def vllm_load_lora_adapter(body: LoadAdapterBody) -> dict[str, Any]:  # vLLM's {lora_name, lora_path}
        return await load_adapter(body, backend.weight_version + 1)

    async def set_lora_adapter(body: LoadAdapterBody) -> dict[str, Any]:  # Axolotl's {lora_name, lora_int_id, lora_path}
        version = body.lora_int_id if body.lora_int_id is not None else backend.weight_version + 1
        return await load_adapter(body, version)

    async def reset_prefix_cache() -> dict[str, Any]:
        await backend.reset_prefix_cache()
        return {"status": "ok"}

    add_route(app, "/health", health, ["GET"])
    add_route(app, "/weight_info", weight_info, ["GET"])
    add_route(app, "/generate", generate, ["POST"])
    add_route(app, "/update_weights", update_weights, ["POST"], guard)
    add_route(app, "/update_weights_from_path", update_weights_from_path, ["POST"], guard)
    add_route(app, "/load_lora_adapter", load_lora_adapter, ["POST"], guard)
    add_route(app, "/v1/load_lora_adapter", vllm_load_lora_adapter, ["POST"], guard)
    add_route(app, "/set_lora_adapter", set_lora_adapter, ["POST"], guard)
    add_route(app, "/reset_prefix_cache", reset_prefix_cache, ["POST"], guard)
    add_openai_routes(app, backend, model_name, ends)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServerError)
    async def server_error(request: Request, exc: ServerError) -> JSONResponse:
        return JSONResponse({"error": exc.message}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for error in exc.errors()[:3]:
            where = ".".join(str(part) for part in error.get("loc", ()) if part not in ("body", "query"))
            problems.append(f"{where or 'body'}: {error.get('msg')}")
        return JSONResponse({"error": f"bad request to {request.url.path}: " + "; ".join(problems)}, status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = "no such endpoint" if exc.status_code == 404 else str(exc.detail)
        return JSONResponse({"error": f"{request.method} {request.url.path}: {message}"}, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": f"internal error in {request.url.path}: {type(exc).__name__}: {exc}"}, status_code=500)
