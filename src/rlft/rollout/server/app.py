"""The rollout server's HTTP application: training endpoints, verified weight and adapter sync (streamed HTTP
buckets, shared paths, adapter folders, and a collective group: `collective.py`), and the OpenAI-compatible routes
(`openai_routes.py`).

Every route answers errors as `{"error": message}` with a 4xx for a bad request, never a traceback.
Slow work (decoding a bucket, hashing weights, generating) runs off the event loop, so `/health`
answers while a batch is being generated. Routes exist with and without a trailing slash, since
TRL and Axolotl clients call `/health/` and `/generate/`.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from rlft.rollout.server.collective import GroupUpdateBody, InitGroupBody, WeightGroupEndpoint
from rlft.rollout.server.openai_routes import add_openai_routes
from rlft.rollout.server.protocol import ServerError, ServingBackend, dtype_name
from rlft.rollout.server.requests import GenerateBody, LoadAdapterBody, VersionBody, WeightsPathBody, generation_request
from rlft.rollout.server.routes import add_route, error_response
from rlft.rollout.server.security import TOKEN_ENV
from rlft.rollout.server.transfer import StreamedTransfer, WeightsOnDisk, load_from_disk, read_adapter_folder


LARGE_BODY = 128 * 2**20  # a bucket this large waits for the one before to load (one tensor alone, an embedding)


def token_guard(token: str | None):
    """A FastAPI dependency that refuses a request without `Authorization: Bearer <token>` (when one is in force)."""

    async def require_token(request: Request) -> None:
        if token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise ServerError(401, f"{request.url.path} changes the served weights and needs `Authorization: Bearer <token>`: "
                                   f"the token is vllm.api_key in the config, the {TOKEN_ENV} environment variable, "
                                   "or the one the server printed at start (a trainer on the same machine reads that one "
                                   "from ~/.cache/rlft/)")
        if not secrets.compare_digest(given.strip().encode(), token.encode()):
            raise ServerError(401, f"{request.url.path}: wrong token: use the server's vllm.api_key, its {TOKEN_ENV} "
                                   "environment variable, or the token it printed at start")

    return require_token


def build_app(backend: ServingBackend, *, model_name: str, token: str | None, ends: tuple[int, ...]) -> FastAPI:
    """`ends`: the token ids that end an answer (`rlft.data.tokenizer.end_ids` of the served model)."""
    app = FastAPI(title="rlft rollout server", redirect_slashes=False)
    guard = token_guard(token)
    transfer = StreamedTransfer(backend)
    group = WeightGroupEndpoint(backend)
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

    async def update_weights(request: Request, version: int, checksum: str | None = None, bucket: int = 0, buckets: int = 1,
                             digest: str | None = None) -> dict[str, Any]:
        """One bucket of a full update (safetensors), loaded as it arrives: the body's `digest` (XXH3-64) is checked
        before it is loaded, `checksum` (of every bucket's tensors) against what was read back at the last bucket."""
        done = await transfer.add(await read_body(request, transfer), version=version, bucket=bucket, buckets=buckets,
                                  digest=digest, checksum=checksum)
        if done is None:
            return {"received": bucket, "buckets": buckets, "weight_version": backend.weight_version}
        return done

    async def update_weights_from_path(body: WeightsPathBody) -> dict[str, Any]:
        weights = await asyncio.to_thread(WeightsOnDisk, body.path, backend.parameter_shapes())
        loaded = await backend.on_engine(lambda: load_from_disk(backend, weights, body.version, body.checksum))
        return {"weight_version": body.version, "weight_checksum": loaded, "received_checksum": loaded}

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

    async def set_weight_version(body: VersionBody) -> dict[str, Any]:
        checksum = await backend.relabel(body.from_version, body.version)
        return {"weight_version": body.version, "weight_checksum": checksum}

    async def init_weight_group(body: InitGroupBody, request: Request) -> dict[str, Any]:
        address = (request.scope.get("server") or ("127.0.0.1", 0))[0]  # where the trainer reached this server
        return await group.init(body, address)

    async def update_weights_group(body: GroupUpdateBody) -> dict[str, Any]:
        return await group.update(body)

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
    add_route(app, "/set_weight_version", set_weight_version, ["POST"], guard)
    add_route(app, "/init_weight_group", init_weight_group, ["POST"], guard)
    add_route(app, "/update_weights_group", update_weights_group, ["POST"], guard)
    add_openai_routes(app, backend, model_name, ends)
    return app


async def read_body(request: Request, transfer: StreamedTransfer) -> bytearray:
    """The body, read into one buffer of its announced length (starlette's `body()` keeps the pieces and their join:
    twice the bucket). A bucket larger than LARGE_BODY is read once the one before is loaded, so two are never held."""
    try:
        size = int(request.headers.get("content-length", ""))
    except ValueError:
        raise ServerError(411, "a weight bucket needs a content-length header") from None
    if size > LARGE_BODY and transfer.loading is not None:
        await asyncio.wait([transfer.loading])
    body, filled = bytearray(size), 0
    view = memoryview(body)
    async for piece in request.stream():
        if filled + len(piece) > size:
            raise ServerError(400, f"the body is longer than its content-length of {size} bytes")
        view[filled : filled + len(piece)] = piece
        filled += len(piece)
    if filled != size:
        raise ServerError(400, f"the body ended after {filled} of its {size} bytes: resend the transfer from bucket 0")
    return body


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServerError)
    async def server_error(request: Request, exc: ServerError) -> JSONResponse:
        return error_response(request.url.path, exc.message, exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for error in exc.errors()[:3]:
            where = ".".join(str(part) for part in error.get("loc", ()) if part not in ("body", "query"))
            problems.append(f"{where or 'body'}: {error.get('msg')}")
        return error_response(request.url.path, f"bad request to {request.url.path}: " + "; ".join(problems), 400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = "no such endpoint" if exc.status_code == 404 else str(exc.detail)
        return error_response(request.url.path, f"{request.method} {request.url.path}: {message}", exc.status_code)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        return error_response(request.url.path, f"internal error in {request.url.path}: {type(exc).__name__}: {exc}", 500)
