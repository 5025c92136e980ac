"""The FastAPI application factory. HTTP only: this process never imports torch."""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import math
from collections.abc import AsyncIterator
from typing import Any

import redis
import redis.asyncio as aioredis
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import security
from app.routers import artifacts, estimates, health, imports, jobs, models, status, submit
from app.routers import compare as compare_router
from app.routers import metrics as metrics_router
from app.ui import compare as ui_compare
from app.ui import router as ui
from core.contract.errors import FieldError
from core.contract.kind import load_kinds
from core.filestore import StoreUnavailable
from core.jobstore import JobStore
from core.metrics import record_store_unavailable
from core.results import StoredResultError
from core.settings import Settings

log = logging.getLogger("explainq.api")

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


class BodySizeLimit:
    """Reject request bodies over ``limit`` bytes with 413, whether or not Content-Length is sent.

    The body is buffered here, up to the limit, before the application sees it; a chunked body that crosses the
    limit is answered 413 by this middleware itself, and an accepted body is replayed to the application.
    """

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)  # no body is read on these routes
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await self._reject(send)
                return
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.limit:
                await self._reject(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as the server would

        await self.app(scope, replay, send)

    async def _reject(self, send: Send) -> None:
        body = (
            b'{"detail":{"code":"body_too_large","message":"request body exceeds '
            + str(self.limit).encode()
            + b' bytes"}}'
        )
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def _text(value: str) -> str:
    """``value`` with any lone surrogate (JSON's unpaired ``\\ud800`` escape) replaced by U+FFFD, which UTF-8 can
    encode."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return value


def finite_json(value: Any) -> Any:
    """``value`` as a response can carry it: every non-finite float replaced by its JSON spelling as a string
    (``"NaN"``, ``"Infinity"``, ``"-Infinity"``; ``1e999`` is read as infinity), and every lone surrogate in a
    string or key by U+FFFD, so that an error echoing a client's input is valid JSON in valid UTF-8."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, dict):
        return {finite_json(k): finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(v) for v in value]
    return value


def validation_errors(errors: Any) -> list[dict[str, Any]]:
    """FastAPI's 422 ``detail`` for ``RequestValidationError.errors()``, JSON-safe: non-finite numbers in an error's
    ``input`` and ``ctx`` become strings, lone surrogates U+FFFD; an input nested too deeply to copy is left out."""
    out = []
    for error in jsonable_encoder(errors):
        try:
            out.append(finite_json(error))
        except RecursionError:
            out.append(finite_json({k: v for k, v in error.items() if k != "input"}))
    return out


# Why FastAPI could not read a JSON body it then answers with a bare 400 ("There was an error parsing the body")
UNREADABLE_BODY = {UnicodeDecodeError: "the body is not JSON text: it is not valid UTF-8",
                   RecursionError: "the body's JSON is nested too deeply to read"}


def unreadable_body(exc: StarletteHTTPException) -> JSONResponse | None:
    """A 422 in the validation shape for a JSON body FastAPI failed to decode, or None for any other error."""
    cause = exc.__cause__
    if exc.status_code != 400 or cause is None:
        return None
    for kind, message in UNREADABLE_BODY.items():
        if isinstance(cause, kind):
            return JSONResponse(status_code=422, content={"detail": [
                {"type": "json_invalid", "loc": ["body"], "msg": message, "input": None}]})
    return None


@functools.cache
def _hiredis_packing(connection_class: type) -> type:
    """``connection_class`` packing commands with hiredis, as redis-py's synchronous connections do when hiredis is
    installed; its asyncio connections pack them in Python, argument by argument (a submission's ~75 arguments cost
    three times as much)."""
    from redis.connection import HiredisRespSerializer

    packer = HiredisRespSerializer()

    def pack_command(self: Any, *args: Any) -> list[bytes]:
        return packer.pack(*args)

    return type(f"HiredisPacking{connection_class.__name__}", (connection_class,), {"pack_command": pack_command})


def async_redis(url: str, **kwargs: Any) -> aioredis.Redis:
    """The API's asyncio Redis client (any URL scheme), packing commands with hiredis when it is installed."""
    from redis.utils import HIREDIS_AVAILABLE

    client = aioredis.Redis.from_url(url, **kwargs)
    pool = client.connection_pool
    if HIREDIS_AVAILABLE:
        pool.connection_class = _hiredis_packing(pool.connection_class)
    return client


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    url = settings.redis_url or DEFAULT_REDIS_URL
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await app.state.aredis.aclose()
        app.state.redis.close()

    app = FastAPI(
        lifespan=lifespan,
        title="explainq",
        version="0.1.0",
        description="Explanation and training jobs for PyTorch research models. Submit work with "
        "`POST /<kind>` (202 + job), poll `GET /jobs/{id}`, fetch `GET /jobs/{id}/result`.",
    )
    app.state.settings = settings
    timeout = settings.redis_timeout_s
    app.state.redis = redis.Redis.from_url(
        url, socket_connect_timeout=timeout, socket_timeout=timeout * 5, health_check_interval=30
    )
    app.state.aredis = async_redis(
        url, socket_connect_timeout=timeout, socket_timeout=timeout * 5, health_check_interval=30,
        max_connections=256,
    )
    app.state.store = JobStore(app.state.redis, settings, app.state.aredis)
    jobs.register_scripts(app)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own handler echoes a NaN or an infinity as a bare float, which JSON cannot carry (a 500)
        return JSONResponse(status_code=422, content={"detail": validation_errors(exc.errors())})

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return unreadable_body(exc) or await http_exception_handler(request, exc)

    @app.exception_handler(FieldError)
    async def field_error(_: Request, exc: FieldError) -> JSONResponse:
        retry = getattr(exc, "retry_after_s", None)
        return JSONResponse(status_code=exc.status_code, content=finite_json(exc.body()),
                            headers={"Retry-After": str(retry)} if retry is not None else None)

    @app.exception_handler(redis.exceptions.ConnectionError)
    @app.exception_handler(redis.exceptions.TimeoutError)
    @app.exception_handler(redis.exceptions.RedisError)
    async def redis_down(_: Request, exc: Exception) -> JSONResponse:
        # Unreachable, timed out, out of memory, read-only replica, loading, bad password: all transient or
        # operator problems on the server side, never the client's; the client should retry later.
        app.state.redis_errors.labels(type(exc).__name__).inc()
        log.warning("redis error (%s): %s", type(exc).__name__, exc)
        return JSONResponse(
            status_code=503,
            content={"detail": {"code": "redis_unavailable",
                                "message": f"the job store (Redis) cannot serve this request "
                                f"({type(exc).__name__}); retry shortly"}},
            headers={"Retry-After": "2"},
        )

    @app.exception_handler(StoreUnavailable)
    async def store_down(_: Request, exc: StoreUnavailable) -> JSONResponse:
        # the store timed out or refused on every retry: the server's problem, and a transient one
        await run_in_threadpool(record_store_unavailable, app.state.redis, exc.operation)
        log.warning("store unavailable: %s", exc)
        return JSONResponse(status_code=503, headers={"Retry-After": "5"},
                            content={"detail": {"code": "store_unavailable", "message": f"{exc}; retry shortly"}})

    @app.exception_handler(StoredResultError)
    async def stored_result(_: Request, exc: StoredResultError) -> JSONResponse:
        # a result pointer whose file was removed or changed outside explainq: the record stays, say what is wrong
        log.warning("stored result of job %s: %s", exc.job_id, exc.code)
        return JSONResponse(status_code=404 if exc.code == "result_missing" else 409,
                            content={"detail": {"code": exc.code, "message": exc.message}})

    @app.exception_handler(Exception)
    async def internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return JSONResponse(  # sent by Starlette's outermost middleware, around SecurityHeaders: its headers here
            status_code=500, content={"detail": {"code": "internal", "message": "internal error; see server logs"}},
            headers=security.HEADERS,
        )

    # Routes are matched in order, each request walking the list up to its route: the hot ones come first
    # (polling a job, submitting one). No two routes answer the same method and path (tests/test_api_server.py),
    # so the order changes nothing else.
    kinds = load_kinds(settings)  # the product's kinds and the EXPLAINQ_KIND_PLUGINS hooks, as the workers load them
    app.include_router(jobs.router)
    app.include_router(jobs.result_router(kinds))
    app.include_router(submit.build_router(kinds))
    app.include_router(submit.kinds_router(kinds))
    app.include_router(estimates.build_router(kinds))
    app.include_router(health.router)
    metrics_router.install(app)
    app.include_router(models.router)
    app.include_router(status.router)
    app.include_router(artifacts.router)
    app.include_router(compare_router.router)
    app.include_router(imports.router)
    app.include_router(ui_compare.router)
    app.include_router(ui.router)

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        # A browser pointed at the service lands on the dashboard (which asks for a key itself): no auth here.
        return RedirectResponse("/ui", status_code=307)

    app.mount(ui.STATIC_URL, ui.static_files(), name="ui-static")
    app.add_middleware(BodySizeLimit, limit=settings.max_body_bytes)
    # Added last, so outermost: the 413s of BodySizeLimit get the headers too. The API docs' pages load Swagger UI
    # and ReDoc from a CDN with an inline script: they get a policy of their own (app/security.py).
    app.add_middleware(security.SecurityHeaders, docs_paths=(app.docs_url, app.redoc_url,
                                                             app.swagger_ui_oauth2_redirect_url))

    return app


# The youngest generation's collection threshold in a server process (CPython's default is 700 allocations).
GC_GEN0_THRESHOLD = 20_000


def tune_gc() -> None:
    """Keep the cyclic garbage collector off the request path of a long-running server process.

    The app's own objects (modules, routes, pydantic schemas, some 10^5 of them) live as long as the process; after
    ``gc.freeze()`` no collection traverses them again. A request allocates a few hundred short-lived containers,
    almost all freed by reference counting; the higher first threshold collects the rare cycles among them in
    batches instead of every few requests.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])


def served_app() -> FastAPI:
    """The app as ``explainq api`` serves it (a uvicorn factory, called once per server process after the import):
    the module's app, with the process's garbage collector tuned (``tune_gc``)."""
    tune_gc()
    return app


app = create_app()
