"""Liveness and readiness.

- ``/health`` and ``/ready``: the service's status for people and scripts (``/ready`` needs a key when keys are
  configured, and wants a live worker on every queue and a store that answers).
- ``/livez`` and ``/readyz``: Kubernetes probes of the API pod alone, unauthenticated and cheap. ``/livez`` touches
  nothing; ``/readyz`` pings Redis with a short timeout and never looks at workers (they may scale to zero while
  the API keeps accepting jobs). Both are ``async`` so that a saturated thread pool cannot delay them, and neither
  answers with more than a status and the class of an error (no address, path or secret).
"""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from rq import Worker

from app.deps import caller
from app.routers.metrics import STORE_CHECK_S
from core.contract.kind import QUEUES
from core.filestore import get_store

log = logging.getLogger("explainq.api")

router = APIRouter(tags=["health"])

READYZ_TIMEOUT_S = 1.0  # at most; EXPLAINQ_REDIS_TIMEOUT_S when that is shorter


@router.get("/health", summary="The API process is alive")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready", summary="Redis and the store answer and every queue has a live worker")
def ready(request: Request, _owner: str = Depends(caller)) -> JSONResponse:
    redis = request.app.state.redis
    reasons: list[str] = []
    workers: dict[str, int] = {}
    try:
        redis.ping()
    except Exception as exc:  # any failure to reach Redis means "not ready", reported as such
        return JSONResponse(
            status_code=503, content={"status": "unavailable", "reasons": [f"redis unreachable: {exc}"]}
        )
    store = request.app.state.store
    for name in QUEUES:
        live = [w for w in Worker.all(connection=redis, queue=store.queue(name)) if w.get_state() != "suspended"]
        workers[name] = len(live)
        if not live:
            reasons.append(f"no live worker on queue '{name}'")
    store_reason = get_store(request.app.state.settings).check(STORE_CHECK_S)
    if store_reason:
        reasons.append(store_reason)
    status = 503 if reasons else 200
    return JSONResponse(
        status_code=status,
        content={"status": "ready" if not reasons else "unavailable", "workers": workers,
                 "store": "ok" if not store_reason else "unavailable", "reasons": reasons},
    )


@router.get("/livez", summary="Kubernetes liveness probe: the process serves HTTP (no auth, no Redis)")
async def livez() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="Kubernetes readiness probe: the API reaches Redis (no auth; workers not checked)")
async def readyz(request: Request) -> JSONResponse:
    timeout = min(READYZ_TIMEOUT_S, request.app.state.settings.redis_timeout_s)
    try:
        async with asyncio.timeout(timeout):
            await request.app.state.aredis.ping()
    except Exception as exc:  # unreachable, timed out, refused, loading: not ready
        reason = "redis timed out" if isinstance(exc, TimeoutError) else f"redis unreachable ({type(exc).__name__})"
        log.warning("readyz: %s: %s", reason, exc)
        return JSONResponse(status_code=503, content={"status": "unavailable", "reasons": [reason]})
    return JSONResponse(status_code=200, content={"status": "ready"})
