"""System status: the workers and queues (``GET /workers``), and with them the demo preparation (``GET /status``).

Nothing here names a server path or a secret: a worker is its name (``host.pid``), its queues, state, loaded models
and resident memory; a running job is shown by id only to its owner, a loaded model by name only to its owner (and
to everyone for the service's own demo models): another tenant's are counted in ``other_models``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool

from app.deps import caller
from core import budgets, demo_status, system_status
from core import usage as usage_lib

router = APIRouter(tags=["health"])

WORKERS_EXAMPLE = {
    "workers": [{"name": "host-1.4242", "queues": ["explain", "bulk"], "state": "busy",
                 "current_job": {"id": "3f0c...", "kind": "tracin", "yours": True},
                 "models": [{"name": "conve-nations-demo", "device": "cpu", "loads": 1, "bytes": 1200000}], "other_models": 1,
                 "rss_bytes": 812000000, "device": "cpu", "last_heartbeat": "2026-01-01T12:00:01.000000Z",
                 "started_at": "2026-01-01T11:00:00.000000Z",
                 "offer": {"class": "cpu", "gpu": False, "gpu_name": None, "gpu_memory_bytes": None,
                           "memory_budget_bytes": 8589934592, "declared": False}}],
    "queues": [{"name": "explain", "queued": 0, "workers": 1, "worker_names": ["host-1.4242"]},
               {"name": "bulk", "queued": 0, "workers": 1, "worker_names": ["host-1.4242"]},
               {"name": "train", "queued": 2, "workers": 0, "worker_names": []}],
}


@router.get("/workers", summary="Live workers (queues, state, current job, loaded models, memory) and every "
            "queue's queued count", description="Only your own running job is identified (another's is `{\"id\": null, "
            "\"kind\": null, \"yours\": false}`); a worker's loaded models are named when they are yours or the "
            "service's demo models, another tenant's are counted in `other_models`.", responses={200: {"content": {"application/json": {"example": WORKERS_EXAMPLE}}}})
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


USAGE_EXAMPLE = {
    "owner": "alice",
    "stored": {"models": {"count": 2, "bytes": 5242880},
               "datasets": {"count": 1, "in_store": 0, "in_place": 1, "bytes": 0},
               "artifacts": {"jobs": 12, "jobs_counted": 12, "complete": True, "bytes": 1048576,
                             "results_bytes": 0},
               "shared": {"entries": 1, "bytes": 2097152, "features": 1, "evaluation_caches": 0},
               "bytes": 8388608},
    "in_flight": {"jobs": 2, "queued": 1, "running": 1, "shards_out": 4, "queued_estimated_seconds": 42.0,
                  "unestimated": 0, "max_active_jobs": 100,
                  "items": [{"id": "3f0c...", "kind": "tracin", "state": "running"},
                            {"id": "9a1b...", "kind": "train_conve", "state": "queued"}]},
    "budgets": {"store_bytes": 10737418240, "compute_s": None, "compute_in_flight_s": 342.0},
}


@router.get("/usage", summary="Your own usage: the bytes the service stores for you (models, datasets copied into "
            "the store, your newest jobs' artifacts, the shared features and evaluation caches your jobs used) and "
            "your work in flight",
            description="Only the caller's own records. `stored.artifacts.complete` is false when only the newest "
            f"{usage_lib.MAX_ARTIFACT_JOBS} jobs' artifacts were sized; a dataset referenced in place under the data "
            "roots is counted in `in_place`, not sized. `stored.shared`: the shared, content-addressed entries "
            "(gradient features, evaluation caches) your jobs on record used or wrote, each in full (one copy "
            "serves every tenant asking for the same content); deleting the job releases them. "
            "`in_flight.queued_estimated_seconds`: each queued job at its "
            "kind's mean run time so far. `budgets`: this service's per-tenant budgets (null: none) and the "
            "estimated seconds of your queued and running jobs that the compute budget compares with.",
            responses={200: {"content": {"application/json": {"example": USAGE_EXAMPLE}}}})
async def usage(request: Request, owner: str = Depends(caller)) -> dict[str, Any]:
    settings, redis = request.app.state.settings, request.app.state.redis
    answer = await run_in_threadpool(usage_lib.usage, settings, redis, owner)
    # the store budget's check (core/budgets.py) reuses this measurement
    await run_in_threadpool(budgets.remember, settings, redis, owner, answer["stored"])
    return answer
