"""A tenant's own usage (``GET /usage``): the bytes the service stores for them and their work in flight.

- **stored**: the tenant's registered models (their store versions), registered datasets the service copied into
  the store (a dataset referenced in place under the data roots is counted, not sized: those bytes are the
  tenant's own files), the artifacts and stored results of their newest :data:`MAX_ARTIFACT_JOBS` jobs (``complete`` says whether
  that was all of them), and the shared entries (gradient features, evaluation caches) their jobs on record used
  or wrote, each in full (``core/lastuse.py``'s claims);
- **in_flight**: the jobs of the active-jobs quota that are queued or running (a fanned-out job counts until its
  reduce step ends), the shards they have out on ``bulk``, and the estimated seconds of the queued ones (each at
  its kind's mean run time so far, ``EXPLAINQ_BACKLOG_UNKNOWN_COST_S`` for a kind that never ended, as the
  backlog's cost does: :mod:`core.backlog`).

Only the caller's own records are read; nothing names a server path. No torch.
"""

from __future__ import annotations

from typing import Any

from core import artifacts, backlog, fanout, keys, lastuse, registry, results
from core.filestore import StoreError
from core.keys import JOB_PREFIX, METRICS_DURATION
from core.settings import Settings

MAX_ARTIFACT_JOBS = 200  # jobs whose artifacts one call sizes (each is one listing of the store)
QUEUED = ("queued", "deferred", "scheduled")


def _location_bytes(store: Any, location: str) -> int:
    return sum(f["size"] for f in store.list_files(location))


def _result_bytes(store: Any, job_id: str) -> int:
    """The size of the job's result in the store (core/results.py), 0 when Redis holds it."""
    try:
        return int(store.size(results.result_key(job_id)))
    except (FileNotFoundError, StoreError):
        return 0


def stored(settings: Settings, redis: Any, owner: str) -> dict[str, Any]:
    store = registry.store(settings)
    models = {n: e for n, e in registry.list_models(settings).items() if e.get("owner") == owner}
    datasets = {n: e for n, e in registry.list_datasets(settings).items() if e.get("owner") == owner}
    model_bytes = sum(_location_bytes(store, e["location"]) for e in models.values() if e.get("location"))
    in_store = [e for e in datasets.values() if e.get("location")]
    dataset_bytes = sum(_location_bytes(store, e["location"]) for e in in_store)
    total_jobs = int(redis.zcard(keys.owner_jobs(owner)))
    newest = [j.decode() for j in redis.zrevrange(keys.owner_jobs(owner), 0, MAX_ARTIFACT_JOBS - 1)]
    artifact_bytes = sum(f["size"] for j in newest for f in artifacts.list_files(settings, j))
    result_bytes = sum(_result_bytes(store, j) for j in newest)
    shared = shared_entries(redis, store, owner)
    shared_bytes = sum(shared.values())
    return {
        "models": {"count": len(models), "bytes": model_bytes},
        "datasets": {"count": len(datasets), "in_store": len(in_store), "in_place": len(datasets) - len(in_store),
                     "bytes": dataset_bytes},
        "artifacts": {"jobs": total_jobs, "jobs_counted": len(newest), "complete": len(newest) == total_jobs,
                      "bytes": artifact_bytes, "results_bytes": result_bytes},
        "shared": {"entries": len(shared), "bytes": shared_bytes,
                   "features": sum(1 for e in shared if e.startswith("features/")),
                   "evaluation_caches": sum(1 for e in shared if e.startswith(lastuse.EVALUATION_ROOT + "/"))},
        "bytes": model_bytes + dataset_bytes + artifact_bytes + result_bytes + shared_bytes,
    }


def shared_entries(redis: Any, store: Any, owner: str) -> dict[str, int]:
    """``{entry: bytes}``: the shared entries claimed by the tenant's jobs still on record (a kept job's too),
    each entry once and in full; an entry retention has removed counts nothing."""
    claimed = lastuse.claims(store, owner)
    jobs = sorted({j for ids in claimed.values() for j in ids})
    kept = {k.decode() for k in redis.hkeys(keys.KEPT)} if jobs else set()
    with redis.pipeline(transaction=False) as pipe:
        for job_id in jobs:
            pipe.exists(JOB_PREFIX + job_id)
        live = {j for j, e in zip(jobs, pipe.execute(), strict=True)
                if e or j in kept or j.split("-", 1)[0] in kept}
    out = {}
    for entry, ids in sorted(claimed.items()):
        if ids & live:
            size = _location_bytes(store, entry)
            if size:
                out[entry] = size
    return out


def in_flight(settings: Settings, redis: Any, owner: str) -> dict[str, Any]:
    members = sorted(m.decode() for m in redis.smembers(keys.owner_active(owner)))
    with redis.pipeline(transaction=False) as pipe:
        pipe.hgetall(METRICS_DURATION)
        pipe.scard(keys.fanout_inflight(owner))
        for job_id in members:
            pipe.hmget(JOB_PREFIX + job_id, ["status", "description"])
            pipe.hget(JOB_PREFIX + fanout.reduce_id(job_id), "status")
        durations, shards_out, *answers = pipe.execute()
    mean = backlog.mean_durations(durations)
    jobs: list[dict[str, Any]] = []
    seconds, unestimated = 0.0, 0
    for job_id, (status, description), reduce_status in zip(members, answers[::2], answers[1::2], strict=True):
        status = status.decode() if status else None
        reduce_status = reduce_status.decode() if reduce_status else None
        text = description.decode() if description else ""
        kind = text[: -len(" job")] if text.endswith(" job") else None
        if status in QUEUED:
            state = "queued"
            cost = mean.get(kind or "")
            if cost is None:
                cost, unestimated = settings.backlog_unknown_cost_s, unestimated + 1
            seconds += cost
        elif status == "started" or reduce_status in (*QUEUED, "started"):
            state = "running"
        else:
            continue  # ended: the quota's set is pruned at the next submission
        jobs.append({"id": job_id, "kind": kind, "state": state})
    return {"jobs": len(jobs), "queued": sum(j["state"] == "queued" for j in jobs),
            "running": sum(j["state"] == "running" for j in jobs), "shards_out": int(shards_out),
            "queued_estimated_seconds": round(seconds, 3), "unestimated": unestimated,
            "max_active_jobs": settings.max_active_jobs, "items": jobs}


def compute_in_flight(settings: Settings, redis: Any, owner: str) -> tuple[float, dict[str, float]]:
    """Estimated seconds of the tenant's queued and running jobs (each at its kind's mean run time, the unknown
    cost for a kind that never ended), and the mean run time per kind: what the compute budget compares with."""
    mean = backlog.mean_durations(redis.hgetall(METRICS_DURATION))
    seconds = sum(mean.get(item["kind"] or "", settings.backlog_unknown_cost_s)
                  for item in in_flight(settings, redis, owner)["items"])
    return seconds, mean


def usage(settings: Settings, redis: Any, owner: str) -> dict[str, Any]:
    measured = stored(settings, redis, owner)
    computed, _ = compute_in_flight(settings, redis, owner)
    return {"owner": owner, "stored": measured, "in_flight": in_flight(settings, redis, owner),
            "budgets": {"store_bytes": settings.tenant_store_bytes or None,
                        "compute_s": settings.tenant_compute_s or None, "compute_in_flight_s": round(computed, 1)}}
