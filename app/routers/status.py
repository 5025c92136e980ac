"""System status: the workers and queues (``GET /workers``), and with them the demo preparation (``GET /status``).

Nothing here names a server path or a secret: a worker is its name (``host.pid``), its queues, state, loaded models
and resident memory; a running job is shown by id only to its owner.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool

from app.deps import caller
from core import demo_status, system_status

router = APIRouter(tags=["health"])

WORKERS_EXAMPLE = {
    "workers": [{"name": "host-1.4242", "queues": ["explain", "bulk"], "state": "busy",
                 "current_job": {"id": "3f0c...", "kind": "tracin", "yours": True},
                 "models": [{"name": "conve-nations-demo", "device": "cpu", "loads": 1, "bytes": 1200000}],
                 "rss_bytes": 812000000, "device": "cpu", "last_heartbeat": "2026-01-01T12:00:01.000000Z",
                 "started_at": "2026-01-01T11:00:00.000000Z",
                 "offer": {"class": "cpu", "gpu": False, "gpu_name": None, "gpu_memory_bytes": None,
                           "memory_budget_bytes": 8589934592, "declared": False}}],
    "queues": [{"name": "explain", "queued": 0, "workers": 1, "worker_names": ["host-1.4242"]},
               {"name": "bulk", "queued": 0, "workers": 1, "worker_names": ["host-1.4242"]},
               {"name": "train", "queued": 2, "workers": 0, "worker_names": []}],
}


@router.get("/workers", summary="Live workers (queues, state, current job, loaded models, memory) and every "
            "queue's queued count", responses={200: {"content": {"application/json": {"example": WORKERS_EXAMPLE}}}})
async def workers(request: Request, owner: str = Depends(caller)) -> dict[str, Any]:
    return await run_in_threadpool(system_status.snapshot, request.app.state.redis, owner)


def _status(redis: Any, owner: str) -> dict[str, Any]:
    out = system_status.snapshot(redis, owner)
    out["demo"] = demo_status.read(redis)
    return out


@router.get("/status", summary="Workers and queues as `GET /workers`, and the demo preparation's progress",
            description="`demo.steps` lists the preparation's steps in order with their models, datasets and state "
            "(`pending`, `preparing`, `ready`, `failed`; `interrupted` when the preparing process is gone); "
            "`demo.active` is whether it runs now; `demo.eta_s` its estimate of the time left.")
async def status(request: Request, owner: str = Depends(caller)) -> dict[str, Any]:
    return await run_in_threadpool(_status, request.app.state.redis, owner)
