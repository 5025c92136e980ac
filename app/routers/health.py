"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from rq import Worker

from app.deps import caller
from core.contract.kind import QUEUES

router = APIRouter(tags=["health"])


@router.get("/health", summary="The API process is alive")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready", summary="Redis is reachable and every queue has a live worker")
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
    status = 503 if reasons else 200
    return JSONResponse(
        status_code=status,
        content={"status": "ready" if not reasons else "unavailable", "workers": workers, "reasons": reasons},
    )
