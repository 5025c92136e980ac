"""Service metrics in the Prometheus text format (no torch).

Everything that must read the same whichever API process is scraped lives in Redis and is read at scrape time
by ``RedisCollector``:

- ``explainq:metrics:submitted``  hash ``kind -> count`` (``record_submitted``, written in the submission's
  own MULTI/EXEC, so a job is counted exactly when it exists);
- ``explainq:metrics:finished``   hash ``kind<TAB>status -> count`` (``record_finished``, called by the worker);
- ``explainq:metrics:duration``   hash ``kind<TAB>le -> count`` per bucket, plus ``kind<TAB>sum`` / ``kind<TAB>count``;
- ``explainq:metrics:model_loads`` hash ``model<TAB>count`` / ``model<TAB>sum`` (``record_model_load``);
- ``explainq:metrics:store_unavailable`` hash ``operation -> count`` (``record_store_unavailable``: store calls
  given up after their retries, by whichever process gave up);
- queue depth and the oldest queued job's age from RQ's queues, live workers from RQ's worker registry;
- each queue's backlog (``explainq_backlog``: its length plus the fan-out shards not yet released onto it) and its
  running jobs (``core/backlog.py``).

Redis errors seen by this API process are an ordinary in-process counter (``REDIS_ERRORS``), and whether the store
answers this API process (``explainq_store_up``) is checked at each scrape (``StoreCollector``).
The recording helpers never raise: a metric that cannot be written is logged and dropped, never a job's failure.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from redis import Redis
from redis.client import Pipeline
from redis.exceptions import RedisError
from rq.exceptions import InvalidJobOperation

from core import backlog, keys
from core.contract.kind import QUEUES

log = logging.getLogger("explainq.metrics")

SUBMITTED = keys.METRICS_SUBMITTED
FINISHED = keys.METRICS_FINISHED
DURATION = keys.METRICS_DURATION
MODEL_LOADS = keys.METRICS_MODEL_LOADS
STORE_UNAVAILABLE = keys.METRICS_STORE_UNAVAILABLE
SEP = "\t"
PER_QUEUE = 5  # answers per queue in the scrape's read: length, head, workers, pending shards, running jobs
# Job durations span milliseconds (tests, tiny explanations) to hours (training runs).
DURATION_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, math.inf)

_TERMINAL_RQ = {"finished": "succeeded", "failed": "failed", "stopped": "canceled", "canceled": "canceled"}


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(bound)


def _safely(what: str, fn) -> None:
    try:
        fn()
    except (RedisError, OSError) as exc:
        log.warning("metric %s not recorded: %s", what, exc)


# ------------------------------------------------------------------------------------------ recording helpers
def record_submitted(redis: Redis | Pipeline, kind: str) -> None:
    """One job of ``kind`` was submitted; on a pipeline, the count is queued with the pipeline's other writes."""
    _safely("submitted", lambda: redis.hincrby(SUBMITTED, kind, 1))


def record_finished(redis: Redis, kind: str, status: str, duration_s: float | None, count: int = 1) -> None:
    """``count`` jobs of ``kind`` ended with ``status``; ``duration_s`` (one job's run time) feeds the duration
    histogram."""

    def write() -> None:
        with redis.pipeline(transaction=False) as pipe:
            pipe.hincrby(FINISHED, f"{kind}{SEP}{status}", count)
            if duration_s is not None and math.isfinite(duration_s) and duration_s >= 0:
                bound = next(b for b in DURATION_BUCKETS if duration_s <= b)
                pipe.hincrby(DURATION, f"{kind}{SEP}{_le(bound)}", 1)
                pipe.hincrbyfloat(DURATION, f"{kind}{SEP}sum", duration_s)
                pipe.hincrby(DURATION, f"{kind}{SEP}count", 1)
            pipe.execute()

    _safely("finished", write)


def record_model_load(redis: Redis, model: str, seconds: float) -> None:
    """Model ``model`` was loaded in ``seconds``."""

    def write() -> None:
        with redis.pipeline(transaction=False) as pipe:
            pipe.hincrby(MODEL_LOADS, f"{model}{SEP}count", 1)
            pipe.hincrbyfloat(MODEL_LOADS, f"{model}{SEP}sum", seconds)
            pipe.execute()

    _safely("model_load", write)


def record_store_unavailable(redis: Redis, operation: str) -> None:
    """A store call (``operation``: read, write, list, ...) was given up after its retries."""
    _safely("store_unavailable", lambda: redis.hincrby(STORE_UNAVAILABLE, operation, 1))


def record_job_end(redis: Redis, job: Any) -> None:
    """``record_finished`` for an RQ job the worker just handled; a job put back on its queue is not finished."""
    try:
        status = _TERMINAL_RQ.get(job.get_status(refresh=True) or "")
        if status is None:
            return
        if status == "failed" and job.meta.get("canceled"):
            status = "canceled"
        duration = None
        if job.started_at is not None:
            ended = job.ended_at or datetime.now(UTC).replace(tzinfo=None)
            started = job.started_at
            duration = (ended.replace(tzinfo=None) - started.replace(tzinfo=None)).total_seconds()
        record_finished(redis, job.meta.get("kind") or "unknown", status, duration)
    except InvalidJobOperation:  # its owner deleted the finished job meanwhile: nothing left to count it by
        log.info("metric finished not recorded: job %s was deleted as it ended", getattr(job, "id", "?"))
    except (RedisError, OSError) as exc:
        log.warning("metric finished not recorded: %s", exc)


# ----------------------------------------------------------------------------------------------- scraping
def _split(raw: dict[bytes, bytes]) -> Iterator[tuple[str, str, bytes]]:
    for field, value in raw.items():
        name, _, sub = field.decode().rpartition(SEP)
        if name:
            yield name, sub, value


def _rq_time(value: bytes | None) -> float | None:
    if not value:
        return None
    text = value.decode()
    for fmt in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    return None


class RedisCollector(Collector):
    """Reads the shared counters, histograms, queue and worker state from Redis at each scrape."""

    def __init__(self, redis: Redis, queues: Iterable[str], unknown_cost_s: float = 60.0):
        self.redis = redis
        self.queues = tuple(queues)
        self.unknown_cost_s = unknown_cost_s

    def collect(self) -> Iterator[Any]:
        submitted, finished, duration, loads, outages, per_queue = _read_hashes_and_queues(self.redis, self.queues)
        enqueued, live = _read_heads_and_workers(self.redis, per_queue, len(self.queues))
        yield _submitted_family(submitted)
        yield _finished_family(finished)
        yield _duration_family(duration)
        yield from _queue_families(self.queues, per_queue, enqueued, live)
        yield from self._cost_families()
        yield from _model_load_families(loads)
        fam = CounterMetricFamily("explainq_store_unavailable", "Store calls given up after their retries, by "
                                  "operation (any worker or API process)", labels=["operation"])
        for field, value in sorted(outages.items()):
            fam.add_metric([field.decode()], int(value))
        yield fam

    def _cost_families(self) -> list[GaugeMetricFamily]:
        """Each queue's backlog in estimated seconds (``core.backlog.read``), also published to Redis."""
        seconds = GaugeMetricFamily("explainq_backlog_seconds", "Estimated run time of the work waiting for each "
                                    "queue's workers: its queued jobs and pending fan-out shards, each at the mean "
                                    "run time of its kind so far", labels=["queue"])
        unknown = GaugeMetricFamily("explainq_backlog_unestimated", "Queued jobs and pending shards of kinds that "
                                    "have not ended once yet, counted at EXPLAINQ_BACKLOG_UNKNOWN_COST_S",
                                    labels=["queue"])
        try:
            backlogs = backlog.read(self.redis, self.queues, self.unknown_cost_s)
        except RedisError as exc:
            log.warning("backlog cost not read: %s", exc)
            return [seconds, unknown]
        for q, b in backlogs.items():
            seconds.add_metric([q], b.seconds)
            unknown.add_metric([q], b.unestimated)
        _safely("backlog seconds", lambda: backlog.publish(self.redis, backlogs))
        return [seconds, unknown]


class StoreCollector(Collector):
    """Whether the store answers the process that is scraped (``check``: None when it does, else the reason),
    with the time the check took; checked at each scrape, within the check's own bound."""

    def __init__(self, check: Any):
        self.check = check

    def collect(self) -> Iterator[Any]:
        t0 = time.perf_counter()
        reason = self.check()
        up = GaugeMetricFamily("explainq_store_up", "1 when the store answered this API process at this scrape, "
                               "else 0")
        up.add_metric([], 0.0 if reason else 1.0)
        took = GaugeMetricFamily("explainq_store_check_seconds", "How long that check took")
        took.add_metric([], time.perf_counter() - t0)
        return iter([up, took])


def _read_hashes_and_queues(redis: Redis, queues: tuple[str, ...]) -> tuple[Any, Any, Any, Any, Any, list[Any]]:
    """The five metric hashes, then for each queue its length, its head job id, its workers' keys, its pending
    shards and its running jobs (``PER_QUEUE`` answers each; one pipelined read)."""
    with redis.pipeline(transaction=False) as pipe:
        for key in (SUBMITTED, FINISHED, DURATION, MODEL_LOADS, STORE_UNAVAILABLE):
            pipe.hgetall(key)
        for q in queues:
            sources = backlog.scaler_keys(q)
            pipe.llen(sources[backlog.QUEUED])
            pipe.lindex(sources[backlog.QUEUED], 0)
            pipe.smembers(f"rq:workers:{q}")
            pipe.scard(sources[backlog.PENDING])
            pipe.zcard(sources[backlog.RUNNING])
        submitted, finished, duration, loads, outages, *per_queue = pipe.execute()
    return submitted, finished, duration, loads, outages, per_queue


def _read_heads_and_workers(redis: Redis, per_queue: list[Any], n_queues: int) -> tuple[list[Any], list[int]]:
    """Per queue: the head job's ``enqueued_at`` (None when empty) and how many of its workers are alive."""
    heads = [per_queue[PER_QUEUE * i + 1] for i in range(n_queues)]
    worker_sets = [sorted(per_queue[PER_QUEUE * i + 2]) for i in range(n_queues)]
    with redis.pipeline(transaction=False) as pipe:
        for head in heads:
            if head:
                pipe.hget(b"rq:job:" + head, "enqueued_at")
        for members in worker_sets:
            for key in members:
                pipe.exists(key)
        answers = iter(pipe.execute())
    enqueued = [next(answers) if head else None for head in heads]
    live = [sum(int(next(answers)) for _ in members) for members in worker_sets]
    return enqueued, live


def _submitted_family(submitted: dict[bytes, bytes]) -> CounterMetricFamily:
    fam = CounterMetricFamily("explainq_jobs_submitted", "Jobs submitted, by kind", labels=["kind"])
    for field, value in submitted.items():
        fam.add_metric([field.decode()], int(value))
    return fam


def _finished_family(finished: dict[bytes, bytes]) -> CounterMetricFamily:
    fam = CounterMetricFamily("explainq_jobs_finished", "Jobs that ended, by kind and final status",
                              labels=["kind", "status"])
    for kind, status, value in _split(finished):
        fam.add_metric([kind, status], int(value))
    return fam


def _duration_family(duration: dict[bytes, bytes]) -> HistogramMetricFamily:
    """The duration histogram per kind, its per-bucket counts made cumulative."""
    hist: dict[str, dict[str, float]] = {}
    for kind, sub, value in _split(duration):
        hist.setdefault(kind, {})[sub] = float(value)
    fam = HistogramMetricFamily("explainq_job_duration_seconds", "Run time of jobs that ended, by kind",
                                labels=["kind"])
    for kind, fields in sorted(hist.items()):
        cumulative, buckets = 0.0, []
        for bound in DURATION_BUCKETS:
            cumulative += fields.get(_le(bound), 0.0)
            buckets.append((_le(bound), cumulative))
        fam.add_metric([kind], buckets, sum_value=fields.get("sum", 0.0))
    return fam


def _queue_families(queues: tuple[str, ...], per_queue: list[Any], enqueued: list[Any],
                    live: list[int]) -> list[GaugeMetricFamily]:
    """Queue depth, the backlog (the queue and the fan-out shards not yet released onto it, ``core/backlog.py``),
    running jobs, the age of the job at each queue's head, and live workers per queue."""
    now = time.time()
    depth = GaugeMetricFamily("explainq_queue_depth", "Jobs waiting in each queue", labels=["queue"])
    waiting = GaugeMetricFamily("explainq_backlog", "Work waiting for each queue's workers: the jobs in the "
                                "queue and the fan-out shards not yet released onto it", labels=["queue"])
    running = GaugeMetricFamily("explainq_jobs_running", "Jobs running from each queue", labels=["queue"])
    age = GaugeMetricFamily("explainq_queue_oldest_age_seconds",
                            "Age of the job at the head of each queue (0 when empty)", labels=["queue"])
    workers = GaugeMetricFamily("explainq_workers_live", "Live workers listening on each queue",
                                labels=["queue"])
    for i, q in enumerate(queues):
        depth.add_metric([q], int(per_queue[PER_QUEUE * i]))
        waiting.add_metric([q], int(per_queue[PER_QUEUE * i]) + int(per_queue[PER_QUEUE * i + 3]))
        running.add_metric([q], int(per_queue[PER_QUEUE * i + 4]))
        t = _rq_time(enqueued[i])
        age.add_metric([q], max(0.0, now - t) if t is not None else 0.0)
        workers.add_metric([q], live[i])
    return [depth, waiting, running, age, workers]


def _model_load_families(loads: dict[bytes, bytes]) -> list[CounterMetricFamily]:
    """Model loads and the time they took, per model."""
    counts: dict[str, dict[str, float]] = {}
    for model, sub, value in _split(loads):
        counts.setdefault(model, {})[sub] = float(value)
    n = CounterMetricFamily("explainq_model_loads", "Model loads by workers", labels=["model"])
    s = CounterMetricFamily("explainq_model_load_seconds", "Time spent loading models", labels=["model"])
    for model, fields in sorted(counts.items()):
        n.add_metric([model], fields.get("count", 0.0))
        s.add_metric([model], fields.get("sum", 0.0))
    return [n, s]


def build_registry(redis: Redis, queues: Iterable[str] = QUEUES, store_check: Any = None,
                   unknown_cost_s: float = 60.0) -> tuple[CollectorRegistry, Counter]:
    """A per-app registry: the Redis-backed collector over ``queues`` (the kinds' and the worker classes' own), the
    store's check (``store_check``, when given) and this process's Redis-error counter."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RedisCollector(redis, queues, unknown_cost_s))
    if store_check is not None:
        registry.register(StoreCollector(store_check))
    errors = Counter("explainq_api_redis_errors", "Redis errors seen by this API process", ["error"],
                     registry=registry)
    return registry, errors
