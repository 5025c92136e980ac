"""Jobs on Redis: submission, the job view, listing, cancellation (no torch).

RQ owns the job hash (``rq:job:<id>``) and the queues; this module adds what the service needs around it:

- ``explainq:jobs:<owner>``: a sorted set of the owner's job ids by creation time, for ``GET /jobs``;
- ``explainq:idem:<owner>:<sha256(key)>``: an ``Idempotency-Key`` reservation ``{"job_id", "body"}``;
- ``explainq:cancel:<id>``: the cooperative cancel flag a running job checks at each progress step.

Statuses are mapped onto one vocabulary, ``queued | running | succeeded | failed | canceled``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from redis import Redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer

from app.kinds.base import JobKind
from app.settings import Settings

RUNNER = "workers.runner.execute"
JOB_PREFIX = Job.redis_job_namespace_prefix
TERMINAL = ("succeeded", "failed", "canceled")
STATUSES = ("queued", "running", *TERMINAL)

# The job-hash fields the view needs. Reading only these (HMGET) instead of the whole hash (HGETALL) skips RQ's
# compressed call data, the bulk of the hash, which the API never needs.
VIEW_FIELDS = ("status", "origin", "created_at", "started_at", "ended_at", "last_heartbeat", "meta")
_VIEW_FIELDS_B = tuple(f.encode() for f in VIEW_FIELDS)


def fields_to_raw(values: list[bytes | None]) -> dict[bytes, bytes]:
    """HMGET's list of values back into the ``{field: value}`` shape of HGETALL (missing fields dropped)."""
    return {f: v for f, v in zip(_VIEW_FIELDS_B, values, strict=True) if v is not None}


_STATUS_MAP = {
    JobStatus.QUEUED.value: "queued",
    JobStatus.DEFERRED.value: "queued",
    JobStatus.SCHEDULED.value: "queued",
    JobStatus.STARTED.value: "running",
    JobStatus.FINISHED.value: "succeeded",
    JobStatus.FAILED.value: "failed",
    JobStatus.STOPPED.value: "canceled",
    JobStatus.CANCELED.value: "canceled",
}


def owner_index_key(owner: str) -> str:
    return f"explainq:jobs:{owner}"


def cancel_key(job_id: str) -> str:
    return f"explainq:cancel:{job_id}"


def body_hash(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class IdempotencyConflict(Exception):
    """The Idempotency-Key was used before with a different body."""


# --------------------------------------------------------------------------------------------- the job view
def _text(raw: dict[bytes, bytes], field: str) -> str | None:
    value = raw.get(field.encode())
    if value is None or value == b"":
        return None
    return value.decode()


def _iso(value: str | None) -> str | None:
    """RQ stores ``%Y-%m-%dT%H:%M:%S.%fZ``; return it unchanged (already ISO 8601, UTC)."""
    return value


def _parse_ts(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def _meta(raw: dict[bytes, bytes]) -> dict[str, Any]:
    value = raw.get(b"meta")
    if not value:
        return {}
    return json.loads(value)


def is_abandoned(raw: dict[bytes, bytes], heartbeat_ttl_s: float, now: float | None = None) -> bool:
    """A started job whose worker stopped heart-beating for longer than the heartbeat TTL."""
    if _text(raw, "status") != JobStatus.STARTED.value:
        return False
    last = _parse_ts(_text(raw, "last_heartbeat")) or _parse_ts(_text(raw, "started_at"))
    if last is None:
        return False
    return (now or time.time()) - last > heartbeat_ttl_s


def job_view(job_id: str, raw: dict[bytes, bytes], base_url: str = "") -> dict[str, Any]:
    """The public job resource (DESIGN.md "Jobs") from the RQ job hash fields (one HMGET, nothing unpickled)."""
    meta = _meta(raw)
    rq_status = _text(raw, "status") or "queued"
    status = _STATUS_MAP.get(rq_status, "queued")
    if status == "failed" and meta.get("canceled"):
        status = "canceled"
    error = None
    if status == "failed":
        error = meta.get("error") or {
            "code": "worker_lost",
            "message": "the worker running this job stopped (killed or crashed) before it finished; "
            "submit the job again",
        }
    elif status == "canceled":
        error = {"code": "canceled", "message": meta.get("cancel_message") or "canceled on request"}
    path = f"{base_url}/jobs/{job_id}"
    view = {
        "id": job_id,
        "kind": meta.get("kind"),
        "status": status,
        "queue": _text(raw, "origin"),
        "created_at": _iso(_text(raw, "created_at")),
        "started_at": _iso(_text(raw, "started_at")),
        "finished_at": _iso(_text(raw, "ended_at")) if status in TERMINAL else None,
        "progress": meta.get("progress"),
        "metrics": meta.get("metrics"),
        "error": error,
        "result_url": f"{path}/result" if status == "succeeded" else None,
        "links": {"self": path, "cancel": path, "events": f"{path}/events", "result": f"{path}/result"},
    }
    if status == "canceled" and view["finished_at"] is None:
        view["finished_at"] = meta.get("canceled_at")
    return view


def owner_of(raw: dict[bytes, bytes]) -> str | None:
    return _meta(raw).get("owner")


# ------------------------------------------------------------------------------------------------ the store
class JobStore:
    """Synchronous operations on jobs, shared by the API and the CLI."""

    def __init__(self, redis: Redis, settings: Settings):
        self.redis = redis
        self.settings = settings
        self.serializer = JSONSerializer

    def queue(self, name: str) -> Queue:
        return Queue(name, connection=self.redis, serializer=self.serializer)

    # ---- submission
    def submit(
        self, kind: JobKind, payload: dict[str, Any], owner: str, idempotency_key: str | None = None
    ) -> tuple[str, bool]:
        """Enqueue a job; returns ``(job_id, replayed)``. Replays an earlier submission with the same key."""
        job_id = uuid.uuid4().hex
        digest = body_hash({"kind": kind.name, "payload": payload})
        idem_key = None
        if idempotency_key is not None:
            idem_key = f"explainq:idem:{owner}:{hashlib.sha256(idempotency_key.encode()).hexdigest()}"
            reservation = json.dumps({"job_id": job_id, "body": digest})
            if not self.redis.set(idem_key, reservation, nx=True, ex=self.settings.result_ttl_s):
                existing = json.loads(self.redis.get(idem_key) or "{}")
                if existing.get("body") != digest:
                    raise IdempotencyConflict(
                        "this Idempotency-Key was already used with a different request body"
                    )
                if self.redis.exists(JOB_PREFIX + existing["job_id"]):
                    return existing["job_id"], True
                # The earlier job expired: take the key over with a fresh job.
                self.redis.set(idem_key, reservation, ex=self.settings.result_ttl_s)
        meta = {"kind": kind.name, "owner": owner, "body": digest}
        try:
            self.queue(kind.queue).enqueue(
                RUNNER,
                args=(kind.func, kind.name, payload),
                job_id=job_id,
                job_timeout=kind.timeout_s,
                result_ttl=kind.result_ttl_s or self.settings.result_ttl_s,
                failure_ttl=self.settings.failure_ttl_s,
                ttl=None,
                meta=meta,
                description=f"{kind.name} job",
            )
            self.redis.zadd(owner_index_key(owner), {job_id: time.time()})
        except Exception:
            if idem_key is not None:
                self.redis.delete(idem_key)
            raise
        return job_id, False

    # ---- reading
    def raw(self, job_id: str) -> dict[bytes, bytes]:
        return fields_to_raw(self.redis.hmget(JOB_PREFIX + job_id, VIEW_FIELDS))

    def reap_if_abandoned(self, raw: dict[bytes, bytes], job_id: str) -> dict[bytes, bytes]:
        """Move an abandoned running job to failed now instead of waiting for a worker's maintenance pass."""
        if not is_abandoned(raw, self.settings.heartbeat_ttl_s):
            return raw
        origin = _text(raw, "origin")
        if origin:
            registry = StartedJobRegistry(origin, connection=self.redis, serializer=self.serializer)
            registry.cleanup()
        return self.raw(job_id)

    def list(
        self,
        owner: str,
        kind: str | None = None,
        status: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        base_url: str = "",
    ) -> tuple[list[dict[str, Any]], str | None]:
        """Newest first. The cursor is the opaque (score, id) of the last item returned."""
        index = owner_index_key(owner)
        max_score: str | float = "+inf"
        after_id = None
        if cursor:
            max_score, after_id = decode_cursor(cursor)
        items: list[dict[str, Any]] = []
        next_cursor = None
        scanned = 0
        batch = max(limit * 2, 50)
        offset = 0
        while len(items) < limit and scanned < 20000:
            rows = self.redis.zrevrangebyscore(index, max_score, "-inf", start=offset, num=batch, withscores=True)
            if not rows:
                break
            offset += len(rows)
            with self.redis.pipeline(transaction=False) as pipe:
                for member, _ in rows:
                    pipe.hmget(JOB_PREFIX + member.decode(), VIEW_FIELDS)
                raws = [fields_to_raw(values) for values in pipe.execute()]
            stale = []
            for (member, score), raw in zip(rows, raws, strict=True):
                scanned += 1
                job_id = member.decode()
                if after_id is not None:
                    if score == float(max_score) and job_id >= after_id:
                        continue
                if not raw:
                    stale.append(member)
                    continue
                view = job_view(job_id, raw, base_url)
                if (kind and view["kind"] != kind) or (status and view["status"] != status):
                    continue
                items.append(view)
                if len(items) == limit:
                    next_cursor = encode_cursor(score, job_id)
                    break
            if stale:
                self.redis.zrem(index, *stale)
            if len(rows) < batch:
                break
        return items, next_cursor

    # ---- cancel
    def cancel(self, job_id: str) -> None:
        """Cancel at once when queued; otherwise raise the flag the running job checks at its next step."""
        self.redis.set(cancel_key(job_id), "1", ex=self.settings.result_ttl_s)
        job = Job.fetch(job_id, connection=self.redis, serializer=self.serializer)
        status = job.get_status()
        if status in (JobStatus.QUEUED, JobStatus.DEFERRED, JobStatus.SCHEDULED):
            job.meta["canceled_at"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            job.save_meta()
            job.cancel()

    def result(self, job_id: str) -> Any:
        job = Job.fetch(job_id, connection=self.redis, serializer=self.serializer)
        return job.return_value(refresh=True)


def encode_cursor(score: float, job_id: str) -> str:
    return base64.urlsafe_b64encode(f"{score!r}|{job_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        score, _, job_id = base64.urlsafe_b64decode(padded.encode()).decode().partition("|")
        return float(score), job_id
    except Exception as exc:  # any malformed cursor is the client's error
        raise ValueError("malformed cursor") from exc
