"""``GET /metrics``: Prometheus text format, behind the same API-key auth as every endpoint."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.concurrency import run_in_threadpool
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.deps import caller
from core import placement
from core.filestore import get_store
from core.jobstore import prune_canceled
from core.metrics import build_registry

router = APIRouter(tags=["health"])

STORE_CHECK_S = 2.0  # at most, per scrape (EXPLAINQ_STORE_TIMEOUT_S when that is shorter)


def install(app: Any) -> None:
    """Give a FastAPI app its registry (``app.state.metrics_registry``), its Redis-error counter
    (``app.state.redis_errors``) and the ``GET /metrics`` route."""
    settings = app.state.settings
    app.state.metrics_registry, app.state.redis_errors = build_registry(
        app.state.redis, placement.all_queues(settings), store_check=lambda: get_store(settings).check(STORE_CHECK_S),
        unknown_cost_s=settings.backlog_unknown_cost_s)
    app.include_router(router)


def _scrape(request: Request) -> bytes:
    state = request.app.state
    prune_canceled(state.redis)  # canceled jobs past their TTL leave RQ's canceled registries
    return generate_latest(state.metrics_registry)


@router.get("/metrics", summary="Service metrics (Prometheus text format)",
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def metrics(request: Request, _owner: str = Depends(caller)) -> Response:
    body = await run_in_threadpool(_scrape, request)
    return Response(content=body, media_type=CONTENT_TYPE_LATEST)
