"""Deciding that a running job was abandoned by its worker, and failing it with ``worker_lost`` (no torch).

One rule, used by the workers' registry maintenance and offered to the API:

- every worker keeps a liveness key ``explainq:alive:<worker name>`` with a TTL of ``EXPLAINQ_HEARTBEAT_TTL_S``,
  refreshed by its heartbeat thread for as long as the process lives (through a long model load too);
- a ``started`` job is abandoned only when the liveness key of the worker named in the job is gone AND the job's
  own ``last_heartbeat`` is older than the TTL;
- nothing is abandoned while Redis itself has been up for less than one TTL (``INFO uptime_in_seconds``): after a
  Redis restart the workers get one TTL to reconnect and beat again, so a Redis outage never fails live jobs.

A job failed here gets ``meta.error = {"code": "worker_lost", ...}``; its worker, should it come back, sees the job
is no longer ``started`` and does not overwrite the failure (see ``workers/worker.py``). A shard failed here has
ended: its parent's reduce step is released when it was the last one (``core/fanout.py``); the owner's window is
refilled by the workers' maintenance.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from redis import Redis
from redis.client import Pipeline
from redis.exceptions import WatchError
from rq import Queue
from rq.job import Job, JobStatus
from rq.job_lifecycle import record_job_failure
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.utils import now as rq_now
from rq.utils import parse_composite_key, utcformat

from core import fanout, keys

log = logging.getLogger("explainq.reaper")

LOST_ERROR = {
    "code": "worker_lost",
    "message": "the worker running this job stopped (killed or crashed) before it finished; submit the job again",
}


def redis_uptime_s(redis: Redis | Pipeline) -> float:
    return float(redis.info("server")["uptime_in_seconds"])


def _parse_ts(value: bytes | None) -> float | None:
    if not value:
        return None
    return datetime.strptime(value.decode(), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def is_abandoned(redis: Redis | Pipeline, job_id: str, heartbeat_ttl_s: float, uptime_s: float | None = None,
                 now: float | None = None) -> bool:
    """True when job ``job_id`` is ``started`` but its worker is gone (see the module docstring for the rule)."""
    status, worker, last_beat, started = redis.hmget(
        keys.JOB_PREFIX + job_id, "status", "worker_name", "last_heartbeat", "started_at"
    )
    if status is None or status.decode() != JobStatus.STARTED.value:
        return False
    if uptime_s is None:
        uptime_s = redis_uptime_s(redis)
    if uptime_s < heartbeat_ttl_s:
        return False
    if worker and redis.exists(keys.alive(worker.decode())):
        return False
    last = _parse_ts(last_beat) or _parse_ts(started)
    return last is None or (now or time.time()) - last > heartbeat_ttl_s


def reap_job(redis: Redis, job_id: str, heartbeat_ttl_s: float, uptime_s: float | None = None) -> bool:
    """Fail job ``job_id`` with ``worker_lost`` if it is abandoned; atomic against its worker finishing it.

    Returns whether the job was failed here. This is the call for the API (e.g. when a client reads a running job).
    """
    key = keys.JOB_PREFIX + job_id
    with redis.pipeline() as pipe:
        try:
            pipe.watch(key)
            if not is_abandoned(pipe, job_id, heartbeat_ttl_s, uptime_s=uptime_s):
                return False
            job = Job.fetch(job_id, connection=redis, serializer=JSONSerializer)
            registry = StartedJobRegistry(job.origin, connection=redis, serializer=JSONSerializer)
            entries = [e for e in pipe.zrange(registry.key, 0, -1)
                       if parse_composite_key(e.decode())[0] == job_id]
            queue = Queue(job.origin, connection=redis, serializer=JSONSerializer)
            if job.retries_left:  # a job enqueued with Retry goes back on its queue, as RQ does for a failure
                job.meta["lost_attempts"] = int(job.meta.get("lost_attempts", 0)) + 1
                pipe.multi()
                if entries:
                    pipe.zrem(registry.key, *entries)
                pipe.hset(key, "meta", JSONSerializer.dumps(job.meta))
                job.retry(queue, pipe)
                pipe.execute()
                if fanout.is_shard(job.meta):  # queued again in its parent's counters
                    try:
                        fanout.shard_sync(redis, job_id, job.meta["parent"])
                    except Exception:  # maintenance's sweep counts it later
                        log.exception("could not count shard %s as queued again", job_id)
                log.warning("job %s requeued (%s retries left): its worker %s is gone", job_id, job.retries_left,
                            job.worker_name)
                return True
            job.meta["error"] = dict(LOST_ERROR)
            ended = rq_now()
            job.meta["lost_at"] = utcformat(ended)
            job.ended_at = ended
            pipe.multi()
            pipe.hset(key, mapping={"meta": JSONSerializer.dumps(job.meta), "ended_at": utcformat(ended)})
            record_job_failure(job, "worker lost: its liveness key expired", pipe)
            if entries:
                pipe.zrem(registry.key, *entries)
            pipe.execute()
        except WatchError:  # the job changed meanwhile (its worker wrote to it): it is not abandoned
            return False
    log.warning("job %s failed: its worker %s is gone", job_id, job.worker_name)
    try:
        if fanout.is_shard(job.meta):  # it ended: its parent's reduce step may be released now
            fanout.shard_ended(redis, job_id, job.meta["parent"], job.meta.get("owner") or "", None)
        queue.enqueue_dependents(job)  # jobs that depend on it with failures allowed may run now
    except Exception:  # a shard: maintenance's fan-out sweep counts it as ended later
        log.exception("could not release what waits for job %s", job_id)
    return True


def reap_queue(redis: Redis, queue_name: str, heartbeat_ttl_s: float) -> list[str]:
    """Fail every abandoned job of ``queue_name``'s started registry and drop the registry's stale entries.

    Replaces RQ's ``StartedJobRegistry.cleanup`` (which fails a job when its execution's score expires, e.g. after
    Redis was down for longer than the TTL). Returns the ids of the jobs failed.
    """
    registry = StartedJobRegistry(queue_name, connection=redis, serializer=JSONSerializer)
    uptime = redis_uptime_s(redis)
    now = time.time()
    reaped: list[str] = []
    stale: list[bytes] = []
    for entry, score in redis.zrange(registry.key, 0, -1, withscores=True):
        job_id = parse_composite_key(entry.decode())[0]
        status = redis.hget(keys.JOB_PREFIX + job_id, "status")
        if status is not None and status.decode() == JobStatus.STARTED.value:
            if job_id not in reaped and reap_job(redis, job_id, heartbeat_ttl_s, uptime_s=uptime):
                reaped.append(job_id)
        elif score < now:  # a finished, failed or deleted job's leftover entry
            stale.append(entry)
    if stale:
        redis.zrem(registry.key, *stale)
    return reaped
