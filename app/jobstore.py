"""Jobs on Redis: submission, the job view, listing, cancellation (no torch).

RQ owns the job hash (``rq:job:<id>``) and the queues; this module adds what the service needs around it:

- ``explainq:jobs:<owner>``: a sorted set of the owner's job ids by creation time, for ``GET /jobs``;
- ``explainq:active:<owner>``: a set of the owner's job ids that may still be queued or running (the quota);
  ids of terminal or vanished jobs are pruned from it when the owner reaches the limit;
- ``explainq:pending:<queue>``: a sorted set (by time) of ids admitted but not yet pushed on the queue, so that
  the queue-length check counts submissions in flight;
- ``explainq:idem:<owner>:<sha256(key)>``: an ``Idempotency-Key`` reservation ``{"job_id", "body", "state"}``,
  ``state`` being ``creating`` (short TTL) until the job exists, then ``created``;
- ``explainq:cancel:<id>``: the cooperative cancel flag a running job checks at each progress step.

Statuses are mapped onto one vocabulary, ``queued | running | succeeded | failed | canceled``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from redis import Redis
from redis.exceptions import RedisError, WatchError
from rq import Queue
from rq.job import Job, JobStatus
from rq.registry import CanceledJobRegistry
from rq.serializers import JSONSerializer

from app import fanout
from app.kinds.base import QUEUES, JobKind
from app.metrics import record_finished, record_submitted
from app.reaper import reap_job
from app.settings import Settings

log = logging.getLogger("explainq.jobs")

RUNNER = "workers.runner.execute"
JOB_PREFIX = Job.redis_job_namespace_prefix
QUEUE_PREFIX = Queue.redis_queue_namespace_prefix
TERMINAL = ("succeeded", "failed", "canceled")
STATUSES = ("queued", "running", *TERMINAL)
# RQ ids are uuid4 hex; shard ids are ``<parent>-s0001``. Anything else never reaches Redis.
JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
# How long an Idempotency-Key stays "creating" if the process creating its job dies before finishing.
CREATING_TTL_S = 30
# How long an admitted submission may take to reach its queue before the queue-length check forgets it.
PENDING_TTL_S = 60

# The job-hash fields the view needs. Reading only these (HMGET) instead of the whole hash (HGETALL) skips RQ's
# compressed call data, the bulk of the hash, which the API never needs.
VIEW_FIELDS = ("status", "origin", "created_at", "started_at", "ended_at", "last_heartbeat", "meta")
_VIEW_FIELDS_B = tuple(f.encode() for f in VIEW_FIELDS)
_RQ_ACTIVE = {s.value for s in (JobStatus.QUEUED, JobStatus.DEFERRED, JobStatus.SCHEDULED, JobStatus.STARTED)}


def valid_job_id(job_id: str) -> bool:
    return JOB_ID_RE.fullmatch(job_id) is not None


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


def active_key(owner: str) -> str:
    return f"explainq:active:{owner}"


def pending_key(queue: str) -> str:
    return f"explainq:pending:{queue}"


def cancel_key(job_id: str) -> str:
    return f"explainq:cancel:{job_id}"


def body_hash(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# ------------------------------------------------------------------------------------- non-finite numbers
def _nonfinite(_: str) -> None:
    return None


def loads_finite(value: bytes | str) -> Any:
    """``json.loads`` with ``NaN`` / ``Infinity`` / ``-Infinity`` read as ``None``: stored data stays valid JSON."""
    return json.loads(value, parse_constant=_nonfinite)


class FiniteJSONSerializer(JSONSerializer):
    """RQ's JSON serializer, reading non-finite numbers as ``None`` (results, meta)."""

    @staticmethod
    def loads(s, *args, **kwargs):
        return loads_finite(s.decode("utf-8") if isinstance(s, bytes) else s)


# ------------------------------------------------------------------------------------------------- errors
class IdempotencyConflict(Exception):
    """The Idempotency-Key was used before with a different body."""


class IdempotencyInProgress(Exception):
    """The job for this Idempotency-Key is being created by another request right now."""


class QuotaExceeded(Exception):
    """A limit on active jobs per owner or on a queue's length; ``limit`` names the setting."""

    def __init__(self, limit: str, value: int, message: str):
        super().__init__(message)
        self.limit = limit
        self.value = value
        self.message = message


# --------------------------------------------------------------------------------------------- Lua scripts
# Admission: the quota check and the slot reservation in one atomic step, so two requests can never both take
# the last slot. KEYS: active set, queue list, pending set. ARGV: job id, max active, max queue, now, pending ttl.
_ADMIT = """
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 1 end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', tonumber(ARGV[4]) - tonumber(ARGV[5]))
if redis.call('LLEN', KEYS[2]) + redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[3]) then return 2 end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
return 0
"""
# Compare-and-set (ARGV[2] non-empty) or compare-and-delete of a string key. ARGV: expected, new, ttl.
_CAS = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3]) end
return 1
"""
# The job view's fields and, for a queued job, its position in its queue: one round trip. The field names are part
# of the script (status and origin first), so a call sends only the keys and the id.
# KEYS: the job hash, then every queue list. ARGV: the job id.
VIEW_SCRIPT = """
local values = redis.call('HMGET', KEYS[1], """ + ", ".join(f"'{f}'" for f in VIEW_FIELDS) + """)
local position = false
if values[1] == 'queued' and values[2] then
  local wanted = '""" + QUEUE_PREFIX + """' .. values[2]
  for i = 2, #KEYS do
    if KEYS[i] == wanted then position = redis.call('LPOS', KEYS[i], ARGV[1]) end
  end
end
values[#values + 1] = position
return values
"""
QUEUE_KEYS = tuple(QUEUE_PREFIX + q for q in QUEUES)


def view_script_args(job_id: str) -> tuple[list[str], list[str]]:
    return [JOB_PREFIX + job_id, *QUEUE_KEYS], [job_id]


def view_script_result(values: list[Any]) -> tuple[dict[bytes, bytes], int | None]:
    """The ``VIEW_SCRIPT`` answer as (raw fields, queue position or None)."""
    *fields, position = values
    return fields_to_raw(fields), (int(position) if position is not None else None)


# --------------------------------------------------------------------------------------------- the job view
def _text(raw: dict[bytes, bytes], field: str) -> str | None:
    value = raw.get(field.encode())
    if value is None or value == b"":
        return None
    return value.decode()


def _parse_ts(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def _meta(raw: dict[bytes, bytes]) -> dict[str, Any]:
    value = raw.get(b"meta")
    if not value:
        return {}
    return loads_finite(value)


def is_abandoned(raw: dict[bytes, bytes], heartbeat_ttl_s: float, now: float | None = None) -> bool:
    """A started job whose worker stopped heart-beating for longer than the heartbeat TTL."""
    if _text(raw, "status") != JobStatus.STARTED.value:
        return False
    last = _parse_ts(_text(raw, "last_heartbeat")) or _parse_ts(_text(raw, "started_at"))
    if last is None:
        return False
    return (now or time.time()) - last > heartbeat_ttl_s


def job_view(job_id: str, raw: dict[bytes, bytes], base_url: str = "", position: int | None = None
             ) -> dict[str, Any]:
    """The public job resource (DESIGN.md "Jobs") from the RQ job hash fields (one HMGET, nothing unpickled).

    ``position`` is the job's place in its queue (0 = next), shown only while the job is queued.
    """
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
        "position": position if status == "queued" else None,
        "created_at": _text(raw, "created_at"),
        "started_at": _text(raw, "started_at"),
        "finished_at": _text(raw, "ended_at") if status in TERMINAL else None,
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


def prune_canceled(redis: Redis, queues: tuple[str, ...] = QUEUES) -> None:
    """Drop entries past their expiry from RQ's canceled registries (RQ never cleans those itself).

    Runs after each cancel and each ``/metrics`` scrape; housekeeping only, so a Redis error is logged, not raised.
    """
    now = time.time()
    try:
        with redis.pipeline(transaction=False) as pipe:
            for q in queues:
                pipe.zremrangebyscore(CanceledJobRegistry(q, connection=redis).key, "-inf", now)
            pipe.execute()
    except RedisError as exc:
        log.warning("canceled registries not pruned: %s", exc)


# ------------------------------------------------------------------------------------------------ the store
class JobStore:
    """Synchronous operations on jobs, shared by the API and the CLI."""

    def __init__(self, redis: Redis, settings: Settings):
        self.redis = redis
        self.settings = settings
        self.serializer = JSONSerializer
        self._queues: dict[str, Queue] = {}
        self._admit = redis.register_script(_ADMIT)
        self._cas = redis.register_script(_CAS)
        self._view = redis.register_script(VIEW_SCRIPT)

    def queue(self, name: str) -> Queue:
        # One Queue per name: RQ caches the server version on it, a round trip saved on every submission.
        if name not in self._queues:
            self._queues[name] = Queue(name, connection=self.redis, serializer=self.serializer)
        return self._queues[name]

    # ---- submission
    def submit(
        self, kind: JobKind, payload: dict[str, Any], owner: str, idempotency_key: str | None = None
    ) -> tuple[str, bool]:
        """Enqueue a job; returns ``(job_id, replayed)``. Replays an earlier submission with the same key."""
        job_id, replayed, _ = self.submit_with_view(kind, payload, owner, idempotency_key)
        return job_id, replayed

    def submit_with_view(
        self, kind: JobKind, payload: dict[str, Any], owner: str, idempotency_key: str | None = None
    ) -> tuple[str, bool, dict[str, Any]]:
        """``submit`` that also returns the job view, read in the same round trip as the enqueue.

        Raises ``IdempotencyConflict`` (same key, other body), ``IdempotencyInProgress`` (the key's job is being
        created by a concurrent request) or ``QuotaExceeded``.
        """
        job_id = uuid.uuid4().hex
        digest = body_hash({"kind": kind.name, "payload": payload})
        idem_key = claim = None
        if idempotency_key is not None:
            idem_key = f"explainq:idem:{owner}:{hashlib.sha256(idempotency_key.encode()).hexdigest()}"
            claim = json.dumps({"job_id": job_id, "body": digest, "state": "creating"})
            existing = self._claim_key(idem_key, claim, digest)
            if existing is not None:
                raw, position = self.raw_and_position(existing)
                return existing, True, job_view(existing, raw, position=position)
        try:
            self._admit_or_raise(kind, owner, job_id)
            try:
                raw, position = self._enqueue(kind, payload, owner, job_id, digest, idem_key)
            except BaseException:
                self._release(kind, owner, job_id)
                raise
        except BaseException:
            if idem_key is not None:
                self._cas(keys=[idem_key], args=[claim, "", 0])
            raise
        return job_id, False, job_view(job_id, raw, position=position)

    def _claim_key(self, idem_key: str, claim: str, digest: str) -> str | None:
        """Reserve the Idempotency-Key for a new job (None), or return the id of the job it already names."""
        for _ in range(8):
            if self.redis.set(idem_key, claim, nx=True, ex=CREATING_TTL_S):
                return None
            current = self.redis.get(idem_key)
            if current is None:
                continue  # the other claim was just released or expired: try again
            existing = json.loads(current)
            if existing.get("body") != digest:
                raise IdempotencyConflict("this Idempotency-Key was already used with a different request body")
            if existing.get("state") == "creating":
                raise IdempotencyInProgress("a job for this Idempotency-Key is being created; retry shortly")
            if self.redis.exists(JOB_PREFIX + existing["job_id"]):
                return existing["job_id"]
            # The earlier job expired: take the key over, unless another request changed it meanwhile.
            if self._cas(keys=[idem_key], args=[current, claim, CREATING_TTL_S]):
                return None
        raise IdempotencyInProgress("this Idempotency-Key is contended; retry shortly")

    def _admit_or_raise(self, kind: JobKind, owner: str, job_id: str) -> None:
        s = self.settings
        keys = [active_key(owner), QUEUE_PREFIX + kind.queue, pending_key(kind.queue)]
        for attempt in range(2):
            code = self._admit(keys=keys, args=[job_id, s.max_active_jobs, s.max_queue_length, time.time(),
                                                PENDING_TTL_S])
            if code == 0:
                return
            if code == 2:
                raise QuotaExceeded("EXPLAINQ_MAX_QUEUE_LENGTH", s.max_queue_length,
                                    f"queue {kind.queue!r} already holds {s.max_queue_length} waiting jobs")
            if attempt == 0 and self.prune_active(owner, kind.queue):
                continue
            break
        raise QuotaExceeded("EXPLAINQ_MAX_ACTIVE_JOBS", s.max_active_jobs,
                            f"you already have {s.max_active_jobs} queued or running jobs")

    def prune_active(self, owner: str, queue: str) -> int:
        """Remove ids of ended or vanished jobs from the owner's active set; returns how many went.

        An id admitted but not yet enqueued (still in a pending set) has no job hash yet and is kept.
        """
        members = list(self.redis.smembers(active_key(owner)))
        if not members:
            return 0
        with self.redis.pipeline(transaction=False) as pipe:
            for m in members:
                pipe.hget(JOB_PREFIX + m.decode(), "status")
            for q in QUEUES:
                for m in members:
                    pipe.zscore(pending_key(q), m)
            answers = pipe.execute()
        statuses, pending = answers[: len(members)], answers[len(members):]
        in_flight = {members[i % len(members)] for i, score in enumerate(pending) if score is not None}
        done = [m for m, st in zip(members, statuses, strict=True)
                if m not in in_flight and (st is None or st.decode() not in _RQ_ACTIVE)]
        if done:
            self.redis.srem(active_key(owner), *done)
        return len(done)

    def _enqueue(self, kind: JobKind, payload: dict[str, Any], owner: str, job_id: str, digest: str,
                 idem_key: str | None) -> tuple[dict[bytes, bytes], int | None]:
        """The job hash, the queue push, the owner index, the submission count and the key's ``created`` state
        in one MULTI/EXEC, which also reads back the job's view fields and the queue length."""
        s = self.settings
        queue = self.queue(kind.queue)
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.multi()
            queue.enqueue_call(
                RUNNER,
                args=(kind.name, payload),
                job_id=job_id,
                timeout=kind.timeout_s,
                result_ttl=s.result_ttl_for(kind.result_ttl_s),
                failure_ttl=s.failure_ttl_s,
                ttl=None,
                meta={"kind": kind.name, "owner": owner, "body": digest},
                description=f"{kind.name} job",
                pipeline=pipe,
            )
            record_submitted(pipe, kind.name)
            pipe.llen(queue.key)
            pipe.zrem(pending_key(kind.queue), job_id)
            pipe.zadd(owner_index_key(owner), {job_id: time.time()})
            if idem_key is not None:
                created = json.dumps({"job_id": job_id, "body": digest, "state": "created"})
                pipe.set(idem_key, created, ex=max(s.result_ttl_for(kind.result_ttl_s), s.failure_ttl_s))
            pipe.hmget(JOB_PREFIX + job_id, VIEW_FIELDS)
            answers = pipe.execute()
        n_idem = 1 if idem_key is not None else 0
        queue_length = answers[-4 - n_idem]
        # The job was pushed last inside the transaction, so it stands at the end of the queue.
        return fields_to_raw(answers[-1]), max(int(queue_length) - 1, 0)

    def _release(self, kind: JobKind, owner: str, job_id: str) -> None:
        """Give back an admitted slot whose job was never created (best effort: both entries also self-heal)."""
        try:
            with self.redis.pipeline(transaction=False) as pipe:
                pipe.srem(active_key(owner), job_id)
                pipe.zrem(pending_key(kind.queue), job_id)
                pipe.execute()
        except Exception:  # Redis itself failing is what got us here; the pending entry expires on its own
            pass

    # ---- reading
    def raw(self, job_id: str) -> dict[bytes, bytes]:
        return fields_to_raw(self.redis.hmget(JOB_PREFIX + job_id, VIEW_FIELDS))

    def raw_and_position(self, job_id: str) -> tuple[dict[bytes, bytes], int | None]:
        keys, args = view_script_args(job_id)
        return view_script_result(self._view(keys=keys, args=args))

    def reap_if_abandoned(self, raw: dict[bytes, bytes], job_id: str) -> dict[bytes, bytes]:
        """Move an abandoned running job to failed now instead of waiting for a worker's maintenance pass.

        ``is_abandoned`` (stale heartbeat) is only the cheap pre-check; ``app.reaper.reap_job`` decides with the
        full rule (the worker's liveness key is gone and Redis has been up one TTL), so a Redis restart or a slow
        poll never fails a job whose worker is alive."""
        if not is_abandoned(raw, self.settings.heartbeat_ttl_s):
            return raw
        if reap_job(self.redis, job_id, self.settings.heartbeat_ttl_s):
            return self.raw(job_id)
        return raw

    def list(
        self,
        owner: str,
        kind: str | None = None,
        status: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        base_url: str = "",
        scan_limit: int = 5000,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """Newest first, paged by keyset: the cursor is the (score, id) of the last index entry looked at.

        Entries are ordered by (creation time, id) descending. Each step reads the entries sharing the bound's
        score with a smaller id, then up to a batch strictly older, so jobs added, finished or expired between
        pages never shift a page: every job in the index when paging started and still there when its turn
        comes is returned exactly once. Ids whose job hash is gone are removed from the index on the way.
        When ``scan_limit`` entries were looked at without filling the page (filters skipping many), the page
        is returned short with a cursor to continue from.
        """
        index = owner_index_key(owner)
        bound: tuple[float, str] | None = decode_cursor(cursor) if cursor else None
        items: list[dict[str, Any]] = []
        scanned = 0
        batch = min(max(limit * 2, 50), 1000, scan_limit)
        while True:
            with self.redis.pipeline(transaction=False) as pipe:
                if bound is None:
                    pipe.zrange(index, "+inf", "-inf", byscore=True, desc=True, offset=0, num=batch,
                                withscores=True)
                else:
                    score = repr(bound[0])
                    pipe.zrange(index, score, score, byscore=True, withscores=True)
                    pipe.zrange(index, f"({score}", "-inf", byscore=True, desc=True, offset=0, num=batch,
                                withscores=True)
                answers = pipe.execute()
            older = answers[-1]
            rows = []
            if bound is not None:
                rows = sorted(((m, sc) for m, sc in answers[0] if m.decode() < bound[1]),
                              key=lambda row: row[0], reverse=True)
            rows += older
            if not rows:
                return items, None
            with self.redis.pipeline(transaction=False) as pipe:
                for member, _ in rows:
                    pipe.hmget(JOB_PREFIX + member.decode(), VIEW_FIELDS)
                raws = [fields_to_raw(values) for values in pipe.execute()]
            stale = []
            for (member, score), raw in zip(rows, raws, strict=True):
                scanned += 1
                job_id = member.decode()
                bound = (score, job_id)
                if not raw:
                    stale.append(member)
                    continue
                view = fanout.apply(self.redis, job_id, job_view(job_id, raw, base_url), raw)
                if (kind and view["kind"] != kind) or (status and view["status"] != status):
                    continue
                items.append(view)
                if len(items) == limit:
                    break
            if stale:
                self.redis.zrem(index, *stale)
            if len(items) == limit or scanned >= scan_limit:
                return items, encode_cursor(*bound)
            if len(older) < batch:
                return items, None

    # ---- cancel
    def cancel(self, job_id: str, _cascade: bool = True) -> None:
        """Cancel at once when queued; otherwise raise the flag the running job checks at its next step.

        A canceled queued job leaves its queue, is kept for ``EXPLAINQ_FAILURE_TTL_S`` and then expires, with its
        entry in RQ's canceled registry. Canceling a fanned-out parent cancels its shards and its reduce step.
        """
        if _cascade:
            meta = _meta(self.raw(job_id))
            if fanout.is_parent(meta):
                for child in fanout.related(self.redis, job_id, meta):
                    if self.redis.exists(JOB_PREFIX + child):
                        self.cancel(child, _cascade=False)
        self.redis.set(cancel_key(job_id), "1", ex=self.settings.result_ttl_s)
        ttl = self.settings.failure_ttl_s
        job_key = JOB_PREFIX + job_id
        with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(job_key)
                    job = Job.fetch(job_id, connection=self.redis, serializer=self.serializer)
                    if job.get_status() not in (JobStatus.QUEUED, JobStatus.DEFERRED, JobStatus.SCHEDULED):
                        return
                    pipe.multi()
                    job.meta["canceled_at"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                    pipe.hset(job_key, "meta", self.serializer.dumps(job.meta))
                    try:
                        job.cancel(pipeline=pipe)
                    except ValueError:  # a worker started the job meanwhile (RQ read its half-written execution)
                        pipe.reset()
                        continue
                    pipe.zadd(CanceledJobRegistry(job.origin, connection=self.redis).key, {job_id: time.time() + ttl})
                    pipe.expire(job_key, ttl)
                    pipe.execute()
                    break
                except WatchError:
                    continue
        record_finished(self.redis, job.meta.get("kind") or "unknown", "canceled", None)
        prune_canceled(self.redis)

    def request_of(self, job_id: str) -> dict[str, Any] | None:
        """The payload the job was enqueued with (``runner.execute(kind, payload)``), or None."""
        try:
            job = Job.fetch(job_id, connection=self.redis, serializer=FiniteJSONSerializer)
            args = job.args
        except Exception:  # a job hash without RQ's call data (expired between the checks, say)
            return None
        payload = args[-1] if args else None
        return payload if isinstance(payload, dict) else None

    def result(self, job_id: str) -> Any:
        if fanout.is_parent(_meta(self.raw(job_id))):  # a fanned-out request's result is its reduce step's
            job_id = fanout.reduce_id(job_id)
        job = Job.fetch(job_id, connection=self.redis, serializer=FiniteJSONSerializer)
        return job.return_value(refresh=True)


def encode_cursor(score: float, job_id: str) -> str:
    return base64.urlsafe_b64encode(f"{score!r}|{job_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        score, sep, job_id = base64.urlsafe_b64decode(padded.encode()).decode().partition("|")
        value = float(score)
        if not sep or not valid_job_id(job_id) or value != value:
            raise ValueError(cursor)
        return value, job_id
    except Exception as exc:  # any malformed cursor is the client's error
        raise ValueError("malformed cursor") from exc
