"""Jobs on Redis: submission, the one job read, listing, cancellation, results (no torch).

RQ owns the job hash (``rq:job:<id>``) and the queues; this module adds what the service needs around it:

- ``explainq:jobs:<owner>``: a sorted set of the owner's job ids by creation time, for ``GET /jobs``;
- ``explainq:active:<owner>``: a set of the owner's job ids that may still be queued or running (the quota);
  ids of terminal or vanished jobs are pruned from it when the owner reaches the limit; a fanned-out parent counts
  until its reduce step has ended;
- ``explainq:idem:<owner>:<sha256(key)>``: an ``Idempotency-Key``'s job ``{"job_id", "body", "state": "created"}``
  (a ``creating`` state, written by earlier versions while a job was being created, is still answered 409);
- ``explainq:cancel:<id>``: the cooperative cancel flag a running job checks at each progress step.

Statuses are mapped onto one vocabulary, ``queued | running | succeeded | failed | canceled``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError, WatchError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import Queue
from rq.job import Job, JobStatus
from rq.registry import CanceledJobRegistry
from rq.results import Result
from rq.serializers import JSONSerializer

from core import fanout, keys, lastuse, results
from core.contract.kind import QUEUES, JobKind
from core.jobview import (
    _RQ_ACTIVE,
    QUEUE_KEYS,
    VIEW_FIELDS,
    VIEW_FUNCTION,
    FiniteJSONSerializer,
    fields_to_raw,
    is_abandoned,
    job_view,
    parse_meta,
    parse_ts,
    view_script_result,
)
from core.keys import JOB_PREFIX, QUEUE_PREFIX, valid_job_id
from core.metrics import record_finished, record_submitted
from core.placement import Placement
from core.reaper import reap_job
from core.settings import Settings

log = logging.getLogger("explainq.jobs")

RUNNER = "workers.runner.execute"
def body_hash(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# ------------------------------------------------------------------------------------- submission refusals
class IdempotencyConflict(Exception):
    """The Idempotency-Key was used before with a different body."""


class IdempotencyInProgress(Exception):
    """The Idempotency-Key's record is in the ``creating`` state that earlier versions wrote while they created a
    job (atomic submission writes none now): answered 409 with ``Retry-After`` until it expires."""


class QuotaExceeded(Exception):
    """A limit on active jobs per owner or on a queue's length; ``limit`` names the setting."""

    def __init__(self, limit: str, value: int, message: str):
        super().__init__(message)
        self.limit = limit
        self.value = value
        self.message = message


# A submission in one round trip, atomically: the Idempotency-Key check, the quota admission, then the job's writes
# (recorded from RQ's own enqueue, with the owner index, the submission count and the key's record), and the new job's
# view. Nothing is written unless the job is admitted, and two requests can never both take the last slot.
# KEYS: the job hash, the owner's active set, the kind's queue, the Idempotency-Key's record (or the job hash again
# when there is none), then every queue list (for a replayed job's position).
# ARGV: job id, max active, max queue, body digest, has key (1/0), number of writes, then each write as its
# argument count followed by its arguments.
# Answers {'created', job id, view...}, {'replayed', earlier job id, view...}, {'conflict'}, {'in_progress'},
# {'quota_active'} or {'quota_queue'}. A replayed job's hash is read by a key built here (the id is in the record);
# like RQ itself, this assumes one Redis server, not a cluster.
SUBMIT_SCRIPT = VIEW_FUNCTION + """
if ARGV[5] == '1' then
  local current = redis.call('GET', KEYS[4])
  if current then
    local ok, existing = pcall(cjson.decode, current)
    if ok and type(existing) == 'table' then
      if existing['body'] ~= ARGV[4] then return {'conflict'} end
      if existing['state'] == 'creating' then return {'in_progress'} end
      local earlier = existing['job_id']
      if type(earlier) == 'string' and redis.call('EXISTS', '""" + JOB_PREFIX + """' .. earlier) == 1 then
        local answer = {'replayed', earlier}
        for _, v in ipairs(view('""" + JOB_PREFIX + """' .. earlier, earlier, 5)) do answer[#answer + 1] = v end
        return answer
      end
    end
    -- the earlier job expired (or the record is unreadable): the key is taken over by this submission
  end
end
if redis.call('SCARD', KEYS[2]) >= tonumber(ARGV[2]) then return {'quota_active'} end
if redis.call('LLEN', KEYS[3]) >= tonumber(ARGV[3]) then return {'quota_queue'} end
redis.call('SADD', KEYS[2], ARGV[1])
local i = 7
for _ = 1, tonumber(ARGV[6]) do
  local n = tonumber(ARGV[i])
  redis.call(unpack(ARGV, i + 1, i + n))
  i = i + n + 1
end
local answer = {'created', ARGV[1]}
local values = redis.call('HMGET', KEYS[1], """ + ", ".join(f"'{f}'" for f in VIEW_FIELDS) + """)
for k = 1, """ + str(len(VIEW_FIELDS)) + """ do answer[#answer + 1] = values[k] end
-- the job was pushed last, so it stands at the end of its queue
answer[#answer + 1] = math.max(redis.call('LLEN', KEYS[3]) - 1, 0)
return answer
"""



async def run_script(client: Any, script: Any, keys: list[Any], args: list[Any]) -> Any:
    """``await script(keys=keys, args=args)`` on an asyncio client, without the client's per-command machinery
    (its retry wrapper, operation metrics and events: about a fifth of the CPU of a hot route's Redis call).

    One pooled connection, EVALSHA, its reply. An unknown script (``NOSCRIPT``), a broken connection and a timeout
    go on the client's own way, with its script loading and its retries; a command error is raised as the client
    raises it; a cancelled call closes its connection, whose reply was not read."""
    pool = client.connection_pool
    conn = await pool.get_connection()
    try:
        await conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
        return await conn.read_response()
    except NoScriptError:
        pass
    except ResponseError:
        raise
    except (RedisConnectionError, RedisTimeoutError):
        await conn.disconnect()
    except BaseException:
        await conn.disconnect()
        raise
    finally:
        await pool.release(conn)
    return await script(keys=keys, args=args)


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


def without_unset_listing_fields(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload without ``label`` and ``tags`` when they are unset (None, empty): a request that gives neither
    is stored, and its Idempotency-Key's body compared, exactly as before they existed."""
    if payload.get("requirements", 0) is None:  # stated only by jobs that need a kind of worker
        payload = {k: v for k, v in payload.items() if k != "requirements"}
    if payload.get("label") or payload.get("tags") or not ({"label", "tags"} & payload.keys()):
        return payload
    return {k: v for k, v in payload.items() if k not in ("label", "tags")}


def listing_meta(kind: JobKind, payload: dict[str, Any]) -> dict[str, Any]:
    """What the jobs list shows and searches of a new job, kept in its meta (the job view reads only the meta,
    never the payload): the request's ``label`` and ``tags``, and the ``model`` and ``input`` columns
    (``JobKind.summary_of``). Empty values are left out."""
    out: dict[str, Any] = {}
    if payload.get("label"):
        out["label"] = payload["label"]
    if payload.get("tags"):
        out["tags"] = list(payload["tags"])
    out.update(kind.summary_of(payload))
    return out


# ------------------------------------------------------------------------------------------------ the store
_CREATED = ("created", "replayed")


def _active(status: bytes | None) -> bool:
    return status is not None and status.decode() in _RQ_ACTIVE


class JobStore:
    """Operations on jobs, shared by the API and the CLI: synchronous, and ``asubmit_with_view`` on ``aredis``."""

    def __init__(self, redis: Redis, settings: Settings, aredis: Any = None):
        self.redis = redis
        self.aredis = aredis
        self.settings = settings
        self.serializer = JSONSerializer
        self._queues: dict[str, Queue] = {}
        self._submit = redis.register_script(SUBMIT_SCRIPT)
        self._asubmit = aredis.register_script(SUBMIT_SCRIPT) if aredis is not None else None

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
        self, kind: JobKind, payload: dict[str, Any], owner: str, idempotency_key: str | None = None,
        placement: Placement | None = None,
    ) -> tuple[str, bool, dict[str, Any]]:
        """``submit`` that also returns the job view, read in the same round trip as the enqueue.

        Raises ``IdempotencyConflict`` (same key, other body), ``IdempotencyInProgress`` (the key's job is being
        created by a concurrent request) or ``QuotaExceeded``.
        """
        keys, args = self.submission(kind, payload, owner, idempotency_key, placement)
        outcome = self._outcome(kind, self._submit(keys=keys, args=args))
        if outcome is None and self.prune_active(owner):
            outcome = self._outcome(kind, self._submit(keys=keys, args=args))
        if outcome is None:
            raise self._active_quota_exceeded()
        return outcome

    async def asubmit_with_view(
        self, kind: JobKind, payload: dict[str, Any], owner: str, idempotency_key: str | None = None,
        placement: Placement | None = None,
    ) -> tuple[str, bool, dict[str, Any]]:
        """``submit_with_view`` on the async client (``aredis``): one round trip, no thread. ``placement``
        (``core.placement.place``) names the job's queue when it is not its kind's."""
        queue = self.queue(placement.queue if placement is not None else kind.queue)
        if not queue.redis_server_version:  # RQ asks the server once per queue (a blocking call: in a thread)
            await asyncio.to_thread(queue.get_redis_server_version)
        keys, args = self.submission(kind, payload, owner, idempotency_key, placement)
        outcome = self._outcome(kind, await run_script(self.aredis, self._asubmit, keys, args))
        if outcome is None and await asyncio.to_thread(self.prune_active, owner):
            outcome = self._outcome(kind, await run_script(self.aredis, self._asubmit, keys, args))
        if outcome is None:
            raise self._active_quota_exceeded()
        return outcome

    def submission(self, kind: JobKind, payload: dict[str, Any], owner: str, idempotency_key: str | None,
                   placement: Placement | None = None) -> tuple[list[str], list[Any]]:
        """The keys and arguments of ``SUBMIT_SCRIPT`` for a new job (no Redis round trip).

        The job's writes are RQ's own: ``enqueue_call`` runs on a transaction pipeline that is never executed, and
        its queued commands (the job hash, the queue push, the queue registry), with the owner index, the submission
        count and the Idempotency-Key's record, become the script's arguments.
        """
        s = self.settings
        job_id = uuid.uuid4().hex
        payload = without_unset_listing_fields(payload)
        digest = body_hash({"kind": kind.name, "payload": payload})
        queue_name = placement.queue if placement is not None else kind.queue
        meta: dict[str, Any] = {"kind": kind.name, "owner": owner, "body": digest, **listing_meta(kind, payload)}
        if placement is not None and (placement.needs or placement.worker_class):
            meta["placement"] = placement.meta()  # what the worker that takes it checks (core/placement.py)
        recorder = self.redis.pipeline(transaction=True)
        recorder.multi()
        self.queue(queue_name).enqueue_call(
            RUNNER,
            args=(kind.name, payload),
            job_id=job_id,
            timeout=kind.timeout_s,
            result_ttl=s.result_ttl_for(kind.result_ttl_s),
            failure_ttl=s.failure_ttl_s,
            ttl=None,
            meta=meta,
            description=f"{kind.name} job",
            pipeline=recorder,
        )
        record_submitted(recorder, kind.name)
        recorder.zadd(keys.owner_jobs(owner), {job_id: time.time()})
        job_key = JOB_PREFIX + job_id
        idem_key = job_key
        if idempotency_key is not None:
            idem_key = keys.idempotency(owner, hashlib.sha256(idempotency_key.encode()).hexdigest())
            record = json.dumps({"job_id": job_id, "body": digest, "state": "created"})
            recorder.set(idem_key, record, ex=max(s.result_ttl_for(kind.result_ttl_s), s.failure_ttl_s))
        writes = [command for command, _ in recorder.command_stack]
        recorder.reset()
        args: list[Any] = [job_id, s.max_active_jobs, s.max_queue_length, digest,
                           0 if idempotency_key is None else 1, len(writes)]
        for command in writes:
            args.append(len(command))
            args.extend(command)
        return [job_key, keys.owner_active(owner), QUEUE_PREFIX + queue_name, idem_key, *QUEUE_KEYS], args

    def _outcome(self, kind: JobKind, answer: list[Any]) -> tuple[str, bool, dict[str, Any]] | None:
        """``(job_id, replayed, view)`` from ``SUBMIT_SCRIPT``'s answer; None when the owner is at the active-job
        limit (prune, then try once more); the other refusals raise."""
        code = answer[0].decode()
        if code in _CREATED:
            job_id = answer[1].decode()
            raw, position = view_script_result(answer[2:])
            return job_id, code == "replayed", job_view(job_id, raw, position=position)
        if code == "conflict":
            raise IdempotencyConflict("this Idempotency-Key was already used with a different request body")
        if code == "in_progress":
            raise IdempotencyInProgress("a job for this Idempotency-Key is still being created by an earlier version "
                                        "of the service; retry shortly")
        if code == "quota_queue":
            limit = self.settings.max_queue_length
            raise QuotaExceeded("EXPLAINQ_MAX_QUEUE_LENGTH", limit,
                                f"queue {kind.queue!r} already holds {limit} waiting jobs")
        if code == "quota_active":
            return None
        raise RuntimeError(f"unexpected answer from the submission script: {code!r}")

    def _active_quota_exceeded(self) -> QuotaExceeded:
        limit = self.settings.max_active_jobs
        return QuotaExceeded("EXPLAINQ_MAX_ACTIVE_JOBS", limit, f"you already have {limit} queued or running jobs")

    def prune_active(self, owner: str) -> int:
        """Remove ids of ended or vanished jobs from the owner's active set; returns how many went.

        A fanned-out parent has ended only when its reduce step has: its own RQ job ends once it has planned, but
        its shards and reduce step still run for it (``core/fanout.py``)."""
        members = list(self.redis.smembers(keys.owner_active(owner)))
        if not members:
            return 0
        with self.redis.pipeline(transaction=False) as pipe:
            for m in members:
                pipe.hget(JOB_PREFIX + m.decode(), "status")
                pipe.hget(JOB_PREFIX + fanout.reduce_id(m.decode()), "status")
            answers = pipe.execute()
        done = [m for m, st, reduce_st in zip(members, answers[::2], answers[1::2], strict=True)
                if not _active(st) and not _active(reduce_st)]
        if done:
            self.redis.srem(keys.owner_active(owner), *done)
        return len(done)

    # ---- reading
    def raw(self, job_id: str) -> dict[bytes, bytes]:
        return fields_to_raw(self.redis.hmget(JOB_PREFIX + job_id, VIEW_FIELDS))

    def reap_if_abandoned(self, raw: dict[bytes, bytes], job_id: str) -> dict[bytes, bytes]:
        """Move an abandoned running job to failed now instead of waiting for a worker's maintenance pass.

        ``is_abandoned`` (stale heartbeat) is only the cheap pre-check; ``core.reaper.reap_job`` decides with the
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
        q: str | None = None,
        tags: tuple[str, ...] = (),
        created_after: datetime | None = None,
        model_digest: str | None = None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """Newest first, paged by keyset: the cursor is the (score, id) of the last index entry looked at.

        Entries are ordered by (creation time, id) descending. Each step reads the entries sharing the bound's
        score with a smaller id, then up to a batch strictly older, so jobs added, finished or expired between
        pages never shift a page: every job in the index when paging started and still there when its turn
        comes is returned exactly once. Ids whose job hash is gone are removed from the index on the way.
        When ``scan_limit`` entries were looked at without filling the page (filters skipping many), the page
        is returned short with a cursor to continue from.

        ``q`` keeps jobs whose label, model, input, kind or id holds it (without case); ``tags`` those that carry
        every one of them (see ``JobFilter``). ``created_after`` keeps the jobs created after that time, and the
        scan stops there: an entry's score is taken when the job is recorded, after its ``created_at``, so every
        such job scores above it (a watching jobs list asks for what is new since its newest row at this cost).
        ``model_digest`` keeps the jobs that read or registered a model version whose digest starts with it.
        """
        wanted = JobFilter(kind, status, q, tags, created_after, model_digest)
        floor = created_after.timestamp() if created_after is not None else None
        index = keys.owner_jobs(owner)
        bound: tuple[float, str] | None = decode_cursor(cursor) if cursor else None
        items: list[dict[str, Any]] = []
        scanned = 0
        batch = min(max(limit * 2, 50), 1000, scan_limit)
        while True:
            rows, older = _index_rows(self.redis, index, bound, batch, floor)
            if not rows:
                return items, None
            looked_at, bound = _take_views(self.redis, index, rows, items, limit, wanted, base_url)
            scanned += looked_at
            if len(items) == limit or scanned >= scan_limit:
                return items, encode_cursor(*bound)
            if len(older) < batch:
                return items, None

    # ---- cancel
    def cancel(self, job_id: str, _cascade: bool = True) -> None:
        """Cancel at once when queued; otherwise raise the flag the running job checks at its next step.

        A canceled queued job leaves its queue, is kept for ``EXPLAINQ_FAILURE_TTL_S`` and then expires, with its
        entry in RQ's canceled registry. Canceling a fanned-out parent cancels its shards and its reduce step
        (``fanout.tear_down``), at any moment: the flag is raised first, and a parent that is still planning creates
        no child once it is raised, so the tear-down sees every child there will ever be.
        """
        self.redis.set(keys.cancel(job_id), "1", ex=self.settings.result_ttl_s)
        meta = parse_meta(self.raw(job_id))
        if _cascade and fanout.is_parent(meta):
            fanout.tear_down(self.redis, job_id, meta.get("owner"), self.settings)
            for child in fanout.still_waiting(self.redis, job_id, meta):  # a fan-out planned before the window
                self.cancel(child, _cascade=False)
        if self._cancel_waiting(job_id) and fanout.is_shard(meta):
            fanout.shard_ended(self.redis, job_id, meta["parent"], meta.get("owner") or "",
                               self.settings.shard_window)

    def _cancel_waiting(self, job_id: str) -> bool:
        """Cancel job ``job_id`` if it is queued or deferred; returns whether it was."""
        ttl = self.settings.failure_ttl_s
        job_key = JOB_PREFIX + job_id
        with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(job_key)
                    job = Job.fetch(job_id, connection=self.redis, serializer=self.serializer)
                    if job.get_status() not in (JobStatus.QUEUED, JobStatus.DEFERRED, JobStatus.SCHEDULED):
                        return False
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
        return True

    # ---- keep and delete (finished jobs)
    def family(self, job_id: str, meta: dict[str, Any] | None = None) -> list[str]:
        """The job and, for a fanned-out parent, its shards and reduce step: what its record and result are made of."""
        meta = parse_meta(self.raw(job_id)) if meta is None else meta
        if not fanout.is_parent(meta):
            return [job_id]
        return [job_id, *dict.fromkeys(fanout.related(self.redis, job_id, meta))]

    def _set_kept_meta(self, job_ids: list[str], kept: bool) -> None:
        for jid in job_ids:
            try:
                job = Job.fetch(jid, connection=self.redis, serializer=self.serializer)
            except Exception:  # a shard that expired (or never existed): nothing to mark
                continue
            if kept:
                job.meta["kept"] = True
            else:
                job.meta.pop("kept", None)
            job.save_meta()

    def keep(self, job_id: str, owner: str) -> None:
        """Exempt a finished job from retention: its record and result (a fan-out's shards' and reduce step's too)
        lose their TTL, the job joins ``explainq:kept`` (``explainq gc`` leaves its files), its meta says ``kept``."""
        ids = self.family(job_id)
        with self.redis.pipeline(transaction=True) as pipe:
            for jid in ids:
                pipe.persist(JOB_PREFIX + jid)
                pipe.persist(Result.get_key(jid))
            pipe.hset(keys.KEPT, job_id, owner)
            pipe.execute()
        self._set_kept_meta([job_id], True)

    def unkeep(self, job_id: str, kind: JobKind | None) -> None:
        """Undo ``keep``: the record and result expire again after the retention period of their status (the
        kind's result TTL when it succeeded, the failure TTL otherwise), counted from now."""
        raw = self.raw(job_id)
        status = (raw.get(b"status") or b"").decode()
        s = self.settings
        ttl = s.result_ttl_for(kind.result_ttl_s if kind else None) if status == "finished" else s.failure_ttl_s
        self._set_kept_meta([job_id], False)
        with self.redis.pipeline(transaction=True) as pipe:
            for jid in self.family(job_id):
                pipe.expire(JOB_PREFIX + jid, ttl)
                pipe.expire(Result.get_key(jid), ttl)
            pipe.hdel(keys.KEPT, job_id)
            pipe.execute()

    def is_kept(self, job_id: str) -> bool:
        return bool(self.redis.hexists(keys.KEPT, job_id))

    def delete(self, job_id: str, owner: str) -> int:
        """Delete a finished job: its files from the store first (a store error leaves every record, so the call
        can be repeated), then its record, result and bookkeeping, a fan-out's shards and reduce step with it.
        Returns the number of files removed."""
        from core.artifacts import artifacts_key, list_files
        from core.filestore import get_store

        ids = self.family(job_id)
        store = get_store(self.settings)
        removed = 0
        for jid in ids:
            removed += len(list_files(self.settings, jid))
            store.delete(artifacts_key(jid))
            results.delete(self.settings, jid)
        lastuse.release(store, owner, ids)  # its claims on shared entries: no longer in the owner's store bytes
        jobs = []
        for jid in ids:
            try:
                jobs.append(Job.fetch(jid, connection=self.redis, serializer=self.serializer))
            except Exception:  # expired or never created: only its keys below
                continue
        with self.redis.pipeline(transaction=True) as pipe:
            for job in jobs:
                job.delete(pipeline=pipe, remove_from_queue=True)
            for jid in ids:
                pipe.delete(JOB_PREFIX + jid, Result.get_key(jid), keys.cancel(jid))
                pipe.hdel(keys.ARTIFACT_OWNERS, jid)
            pipe.delete(keys.children(job_id))
            pipe.hdel(keys.KEPT, job_id)
            pipe.zrem(keys.owner_jobs(owner), job_id)
            pipe.srem(keys.owner_active(owner), job_id)
            pipe.delete(keys.usage_stored(owner))  # the store budget measures again
            pipe.execute()
        return removed

    def request_of(self, job_id: str) -> dict[str, Any] | None:
        """The payload the job was enqueued with (``runner.execute(kind, payload)``), or None."""
        try:
            job = Job.fetch(job_id, connection=self.redis, serializer=FiniteJSONSerializer)
            args = job.args
        except Exception:  # a job hash without RQ's call data (expired between the checks, say)
            return None
        payload = args[-1] if args else None
        return payload if isinstance(payload, dict) else None

    def result(self, job_id: str) -> tuple[Any, str | None]:
        """A succeeded job's result and ``result_schema``, the name of the result model the worker validated it
        against (None: written by earlier versions, or it did not validate). A fanned-out request's result is its
        reduce step's."""
        if fanout.is_parent(parse_meta(self.raw(job_id))):
            job_id = fanout.reduce_id(job_id)
        job = Job.fetch(job_id, connection=self.redis, serializer=FiniteJSONSerializer)
        schema = (job.meta or {}).get("result_schema")
        value = results.resolve(self.settings, job_id, job.return_value(refresh=True))
        return value, schema if isinstance(schema, str) else None


# ---- job-id prefixes
# A job id is ``uuid4().hex``: 32 characters. The dashboard, the SDK and the CLI show its first 8, and any unique
# prefix of at least ``ID_PREFIX_MIN`` characters names one of the caller's own jobs. The owner index is ordered by
# creation time, not by id, so a prefix cannot be looked up by range there (ZRANGEBYLEX needs equal scores): it is
# matched against the owner's newest ``ID_PREFIX_SCAN`` ids, one ZRANGE of at most that many members. An older job
# is reached by its full id.
FULL_ID_LENGTH = 32
ID_PREFIX_MIN = 6
ID_PREFIX_SCAN = 1000


def is_id_prefix(value: str) -> bool:
    """Whether ``value`` may be looked up as a prefix: a well-formed id of ``ID_PREFIX_MIN`` characters or more,
    shorter than a full id."""
    return ID_PREFIX_MIN <= len(value) < FULL_ID_LENGTH and valid_job_id(value)


async def aresolve_prefix(aredis: Any, owner: str, prefix: str, scan: int = ID_PREFIX_SCAN) -> list[str]:
    """The full ids among the owner's newest ``scan`` jobs that start with ``prefix``, newest first; when several
    do, only those whose job still exists (the index keeps an expired job's id until a listing drops it)."""
    if not is_id_prefix(prefix):
        return []
    members = await aredis.zrange(keys.owner_jobs(owner), 0, scan - 1, desc=True)
    wanted = prefix.encode()
    hits = [m.decode() for m in members if m.startswith(wanted)]
    if len(hits) > 1:
        async with aredis.pipeline(transaction=False) as pipe:
            for job_id in hits:
                pipe.exists(JOB_PREFIX + job_id)
            alive = await pipe.execute()
        hits = [job_id for job_id, there in zip(hits, alive, strict=True) if there]
    return hits


# ---- listing (JobStore.list)
_Row = tuple[bytes, float]  # an owner index entry: (job id, creation time)


def _index_rows(redis: Redis, index: str, bound: tuple[float, str] | None,
                batch: int, floor: float | None = None) -> tuple[list[_Row], list[_Row]]:
    """The next index entries after ``bound``, newest first: those sharing its score with a smaller id, then up to
    ``batch`` strictly older ones, none at or below ``floor``; returns (all of them, the older ones)."""
    lowest = "-inf" if floor is None else f"({floor!r}"
    with redis.pipeline(transaction=False) as pipe:
        if bound is None:
            pipe.zrange(index, "+inf", lowest, byscore=True, desc=True, offset=0, num=batch,
                        withscores=True)
        else:
            score = repr(bound[0])
            pipe.zrange(index, score, score, byscore=True, withscores=True)
            pipe.zrange(index, f"({score}", lowest, byscore=True, desc=True, offset=0, num=batch,
                        withscores=True)
        answers = pipe.execute()
    older = answers[-1]
    rows = []
    if bound is not None:
        rows = sorted(((m, sc) for m, sc in answers[0] if m.decode() < bound[1]),
                      key=lambda row: row[0], reverse=True)
    rows += older
    return rows, older


class JobFilter:
    """Which jobs a listing keeps: of ``kind``, in ``status``, whose label, model, input, kind or id holds ``q``
    (case-insensitive substring), carrying every tag of ``tags`` (stored in lower case), that read or registered a
    model whose digest starts with ``model_digest`` (the job's meta ``model_digests``, recorded by the runner)."""

    def __init__(self, kind: str | None = None, status: str | None = None, q: str | None = None,
                 tags: tuple[str, ...] = (), created_after: datetime | None = None,
                 model_digest: str | None = None):
        self.kind = kind
        self.model_digest = model_digest.lower() if model_digest else None
        self.status = status
        self.q = q.casefold() if q else None
        self.tags = frozenset(t.lower() for t in tags)
        self.after = created_after

    def matches(self, view: dict[str, Any], meta: dict[str, Any] | None = None) -> bool:
        if (self.kind and view["kind"] != self.kind) or (self.status and view["status"] != self.status):
            return False
        if self.model_digest is not None:
            found = (meta or {}).get("model_digests") or ()
            if not any(isinstance(d, str) and d.startswith(self.model_digest) for d in found):
                return False
        if self.after is not None and not (parse_ts(view.get("created_at")) or 0.0) > self.after.timestamp():
            return False
        if self.tags and not self.tags <= set(view.get("tags") or ()):
            return False
        if self.q:
            text = "\n".join(str(view.get(k) or "") for k in ("label", "model", "input", "kind", "id"))
            return self.q in text.casefold()
        return True


def fanned_out(raw: dict[bytes, bytes]) -> bool:
    """Whether a job's fields are a fanned-out parent's (its meta holds a plan): a byte check, no parsing."""
    return b'"fanout"' in raw.get(b"meta", b"")


def read_view(redis: Redis, job_id: str, raw: dict[bytes, bytes], base_url: str = "", position: int | None = None,
              meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The one job read: the public view of a job's fields, and for a fanned-out parent its status, shards and
    progress from the counters its children keep (``core/fanout.py``: one more script call, only for a parent,
    whatever its number of shards). The API calls it off its event loop for a parent (``fanned_out``) and inline
    otherwise; listings call it per row."""
    view = job_view(job_id, raw, base_url, position=position, meta=meta)
    return fanout.apply(redis, job_id, view, raw) if fanned_out(raw) else view


def _take_views(redis: Redis, index: str, rows: list[_Row], items: list[dict[str, Any]], limit: int,
                wanted: JobFilter, base_url: str) -> tuple[int, tuple[float, str]]:
    """Append to ``items`` the views of ``rows`` that ``wanted`` keeps until it holds ``limit``;
    drops the ids whose job hash is gone from the index. Returns (entries looked at, the last one's bound)."""
    with redis.pipeline(transaction=False) as pipe:
        for member, _ in rows:
            pipe.hmget(JOB_PREFIX + member.decode(), VIEW_FIELDS)
        raws = [fields_to_raw(values) for values in pipe.execute()]
    stale = []
    looked_at = 0
    for (member, score), raw in zip(rows, raws, strict=True):
        looked_at += 1
        job_id = member.decode()
        bound = (score, job_id)
        if not raw:
            stale.append(member)
            continue
        meta = parse_meta(raw)
        view = read_view(redis, job_id, raw, base_url, meta=meta)
        if wanted.matches(view, meta):
            items.append(view)
            if len(items) == limit:
                break
    if stale:
        redis.zrem(index, *stale)
    return looked_at, bound


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
