"""Workers and queues as the dashboard and ``GET /workers`` show them (no torch, no FastAPI).

One pipelined read gathers RQ's worker registry (``rq:workers``, each worker's hash), explainq's liveness key of
each worker (the job it runs), the models each worker publishes (``explainq:worker-models:<worker>``: loaded
models, resident memory) and every queue's length; a second one reads the running jobs' owners and the loaded models'
owners. Nothing here names a server path: a worker is its name (``host.pid``), its queues, state and the models it
holds. A caller sees only its own: another tenant's running job is ``{"id": null, ...}``, another tenant's loaded
models are counted (``other_models``), not named.
"""

from __future__ import annotations

import json
from typing import Any

from rq.worker import BaseWorker
from rq.worker_registration import REDIS_WORKER_KEYS, WORKERS_BY_QUEUE_KEY

from core import keys, registry
from core.contract.kind import QUEUES
from core.ownership import owns, sees_model_details

WORKER_PREFIX = BaseWorker.redis_worker_namespace_prefix  # rq:worker:<name>: RQ's worker hash
MAX_WORKERS = 500  # a page never lists more (a registry that large is a misconfiguration, not a team)


def _text(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else value


def _published(value: bytes | None) -> dict[str, Any]:
    try:
        info = json.loads(value) if value else {}
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def snapshot(redis: Any, caller: str | None) -> dict[str, Any]:
    """``{"workers": [...], "queues": [...]}``: every live worker (RQ's registry, a worker whose key expired is
    left out) and every queue with its queued count and live workers. A worker's current job is shown with its
    id only to the job's owner; to anyone else it is ``{"id": null, "yours": false}``."""
    worker_keys = sorted(_text(k) for k in redis.smembers(REDIS_WORKER_KEYS))[:MAX_WORKERS]
    names = [k[len(WORKER_PREFIX):] for k in worker_keys]
    with redis.pipeline(transaction=False) as pipe:
        for key, name in zip(worker_keys, names, strict=True):
            pipe.hmget(key, "queues", "state", "last_heartbeat", "birth", "death")
            pipe.get(keys.alive(name))
            pipe.get(keys.worker_models(name))
        for q in QUEUES:
            pipe.llen(keys.QUEUE_PREFIX + q)
        answers = pipe.execute()
    workers = []
    for i, name in enumerate(names):
        fields, alive, published = answers[3 * i: 3 * i + 3]
        queues, state, heartbeat, birth, death = (_text(v) for v in fields)
        if queues is None or death is not None:  # expired or dead: RQ's maintenance drops it from the set later
            continue
        info = _published(published)
        models = [{"name": m.get("name"), "device": m.get("device"), "loads": m.get("loads"),
                   "bytes": m.get("bytes")} for m in info.get("models", []) if isinstance(m, dict)]
        workers.append({
            "name": name, "queues": [q for q in queues.split(",") if q], "state": state or "unknown",
            "current_job": _text(alive) or None, "models": models, "rss_bytes": info.get("rss_bytes"),
            "device": info.get("device"), "last_heartbeat": heartbeat, "started_at": birth,
            "offer": info.get("offer"),  # its worker class and what it has (core/placement.py)
        })
    _show_jobs(redis, workers, caller)
    _show_models(redis, workers, caller)
    lengths = list(answers[3 * len(names):])
    # worker classes' own queues (<queue>@<class>) that live workers serve, after the kinds' queues
    extra = sorted({q for w in workers for q in w["queues"]} - set(QUEUES))
    if extra:
        with redis.pipeline(transaction=False) as pipe:
            for q in extra:
                pipe.llen(keys.QUEUE_PREFIX + q)
            lengths += pipe.execute()
    queues = []
    for q, length in zip((*QUEUES, *extra), lengths, strict=True):
        serving = [w["name"] for w in workers if q in w["queues"]]
        queues.append({"name": q, "queued": int(length), "workers": len(serving), "worker_names": serving})
    return {"workers": workers, "queues": queues}


def _show_jobs(redis: Any, workers: list[dict[str, Any]], caller: str | None) -> None:
    """Replace each running job id by ``{"id", "kind", "yours"}``, the id and kind only for its owner."""
    running = [w for w in workers if w["current_job"] and keys.valid_job_id(w["current_job"])]
    with redis.pipeline(transaction=False) as pipe:
        for w in running:
            pipe.hget(keys.JOB_PREFIX + w["current_job"], "meta")
        metas = pipe.execute() if running else []
    owned = {}
    for w, raw in zip(running, metas, strict=True):
        meta = _published(raw)
        if owns(meta, caller):
            owned[w["name"]] = {"id": w["current_job"], "kind": meta.get("kind"), "yours": True}
    for w in workers:
        if w["current_job"] is not None:
            w["current_job"] = owned.get(w["name"], {"id": None, "kind": None, "yours": False})


def _show_models(redis: Any, workers: list[dict[str, Any]], caller: str | None) -> None:
    """Keep in each worker's ``models`` those the caller may see in full (its own and the service's, by
    :func:`core.ownership.sees_model_details`); the others, and names no longer registered, are counted in
    ``other_models``."""
    names = sorted({m["name"] for w in workers for m in w["models"] if isinstance(m.get("name"), str)})
    records = redis.hmget(keys.registry("models"), names) if names else []
    visible = set()
    for name, raw in zip(names, records, strict=True):
        entry = _published(raw)
        if entry and sees_model_details({"owner": entry.get("owner") or registry.SYSTEM}, caller):
            visible.add(name)
    for w in workers:
        shown = [m for m in w["models"] if m.get("name") in visible]
        w["other_models"] = len(w["models"]) - len(shown)
        w["models"] = shown


# How many workers listening on a queue are alive: registered with RQ (KEYS[1], ``rq:workers:<queue>``), their
# hash not expired, no death recorded. One round trip; the worker hashes are named by the set (a single Redis).
LIVE_WORKERS_SCRIPT = """
local n = 0
for _, key in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local v = redis.call('HMGET', key, 'queues', 'death')
  if v[1] and not v[2] then n = n + 1 end
end
return n
"""


def live_workers_keys(queue: str) -> list[str]:
    return [WORKERS_BY_QUEUE_KEY % queue]


def waiting_reason(queue: str | None, live: int, demo: dict[str, Any] | None) -> str | None:
    """Why a queued job does not start: no live worker listens on its queue (and, while the demo is being
    prepared, that workers start when its first model is ready); None when a worker is there."""
    if live or not queue:
        return None
    if demo and demo.get("active"):
        counts = demo["counts"]
        total = sum(counts.values())
        return (f"no worker is listening on queue '{queue}' yet: the demo models are being prepared "
                f"({counts['ready']} of {total} steps ready) and workers start as soon as the first is ready")
    return f"no worker is listening on queue '{queue}'; it starts when one does (explainq worker --queues {queue})"
