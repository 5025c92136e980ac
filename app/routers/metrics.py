"""``GET /metrics``: Prometheus text format, behind the same API-key auth as every endpoint."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from fastapi.concurrency import run_in_threadpool
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.deps import caller
from app.jobstore import prune_canceled

router = APIRouter(tags=["health"])


def _scrape(request: Request) -> bytes:
    state = request.app.state
    prune_canceled(state.redis)  # canceled jobs past their TTL leave RQ's canceled registries
    return generate_latest(state.metrics_registry)


@router.get("/metrics", summary="Service metrics (Prometheus text format)",
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def metrics(request: Request, _owner: str = Depends(caller)) -> Response:
    body = await run_in_threadpool(_scrape, request)
    return Response(content=body, media_type=CONTENT_TYPE_LATEST)
