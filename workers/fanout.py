"""The worker side of fan-out (see core/fanout.py): plan the shards and the reduce step, run a shard once.

- ``fan_out`` is called by a parent job function with its kind's name: the kind's ``FanOut`` declaration
  (``core.contract.kind``) names the shard and reduce kinds, the unit, the timeout and the request fields the
  children read from the parent; it creates the shard jobs and the reduce job deferred
  (deterministic ids; existing ones are left alone, so a parent re-run enqueues nothing twice), records the plan in
  the parent's meta, indexes the shards and lets the owner's window release the first ones, then returns. The rest
  are released as shards end (``core/fanout.py``).
- ``run_shard`` wraps a shard's work: a shard whose output is already in the store (``done.json`` is written last)
  returns it without recomputing, so finished shards are never redone when a parent or a shard is retried.
- ``auto_shard_size`` sizes shards from the throughput measured by earlier shards of the same kind and model
  (an exponential moving average in Redis), so that one shard takes about two minutes: an interactive request on a
  worker that serves ``explain,bulk`` waits at most that long.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import BaseModel
from redis.exceptions import WatchError
from rq import Queue
from rq.job import Job, JobStatus, Retry
from rq.serializers import JSONSerializer

from core import fanout, keys, placement, registry
from core.artifacts import artifacts_key, record_owner
from core.contract.kind import KINDS
from core.fanout import BULK, plan, reduce_id, shard_count, shard_id, too_many_shards
from core.filestore import StoreError, get_store
from core.keys import JOB_PREFIX
from workers.context import JobCanceled, JobContext, JobError, WorkerShutdown, json_safe

log = logging.getLogger("explainq.fanout")

RUNNER = "workers.runner.execute"
TARGET_SHARD_S = 120.0


def record_rate(ctx: JobContext, kind: str, model: str, units: float, seconds: float) -> None:
    """Fold a measured rate (cost units per second) into the kind's and model's moving average."""
    if seconds <= 0 or units <= 0:
        return
    key = keys.rate(kind, model)
    r = registry.connection(ctx.settings)
    try:
        old = r.get(key)
        rate = units / seconds
        new = rate if old is None else 0.7 * float(old) + 0.3 * rate
        r.set(key, repr(new), ex=30 * 24 * 3600)
    except Exception:  # a rate is advice; never fail a shard for it
        log.warning("could not record the throughput of %s/%s", kind, model, exc_info=True)


def auto_shard_size(ctx: JobContext, kind: str, model: str, cost_per_item: float, default_rate: float,
                    lo: int = 8, hi: int = 20_000) -> int:
    """Items per shard so that a shard takes about ``TARGET_SHARD_S`` at the measured (or default) rate."""
    try:
        raw = registry.connection(ctx.settings).get(keys.rate(kind, model))
    except Exception:  # advice only: size from the default rate
        log.warning("could not read the measured throughput of %s/%s; using the default", kind, model,
                    exc_info=True)
        raw = None
    rate = float(raw) if raw else default_rate
    return int(min(hi, max(lo, rate * TARGET_SHARD_S / max(cost_per_item, 1e-9))))


PLAN_BATCH = 256  # shards created per transaction while planning


def capped_shard_size(request: BaseModel, n_items: int, shard_size: int, cap: int, unit: str) -> int:
    """``shard_size``, or the least that makes at most ``cap`` shards (``EXPLAINQ_MAX_SHARDS``) of ``n_items``
    when the request left it to the service (``auto``); a JobError naming ``shard_size`` for a fixed one that
    makes more (the API refuses those it can count at submission), or naming the count for a kind without it."""
    if shard_count(n_items, shard_size) <= cap:
        return shard_size
    given = getattr(request, "shard_size", None)
    if given == "auto":
        return -(-n_items // cap)
    if given is None:
        raise JobError("invalid_request", f"{n_items:,} {unit} would make {shard_count(n_items, shard_size):,} "
                       f"shards, more than the {cap:,} one job may have (EXPLAINQ_MAX_SHARDS)")
    raise JobError("invalid_request", too_many_shards(n_items, shard_size, cap, unit))


class Planned(BaseModel):
    """What a fanned-out parent job returns: its plan (the parent's public result is its reduce step's)."""

    fanout: dict[str, Any]


# (request JSON, start, end) of one shard -> the shard's own (request JSON, start, end)
ShardItems = Callable[[dict[str, Any], int, int], tuple[dict[str, Any], int, int]]


def fan_out(ctx: JobContext, kind: str, request: BaseModel, n_items: int, shard_size: int, *, retries: int,
            max_failed_fraction: float = 0.0, shard_items: ShardItems | None = None) -> Planned:
    """Plan the shards and the reduce step of the current (parent) job of kind ``kind``; returns the plan.

    The kind's ``FanOut`` declaration gives the shard and reduce kinds (``<kind>_shard``, ``<kind>_reduce``), the
    unit, the children's timeout and the request fields the children read from the parent (``from_parent``: set
    to None in the copy they carry, so those fields must be optional). ``shard_items`` may give a shard its own
    slice of the request (inline samples, say) and the range within it.

    Every child is created deferred, in transactions that refuse to create anything once the parent's cancel flag
    is raised. The shards join the parent's pending list, and the owner's window (``core/fanout.py``) releases them
    onto ``bulk``; the reduce step is released when the last shard ends. A child that exists already is left
    alone, so a parent re-run (after a shutdown put it back on its queue) creates nothing twice.
    """
    job = ctx.job
    if job is None:
        raise RuntimeError("fan_out runs inside a service job")
    declared = KINDS[kind].fanout
    if declared is None:
        raise ValueError(f"kind {kind!r} declares no fan-out")
    shard_kind, reduce_kind = f"{kind}_shard", f"{kind}_reduce"
    from_parent = list(declared.from_parent)
    carried = {**request.model_dump(mode="json"), **{f: None for f in from_parent}}
    parent = job.id
    owner = ctx.owner
    settings = ctx.settings
    shard_size = capped_shard_size(request, n_items, shard_size, settings.max_shards, declared.unit)
    ranges = plan(n_items, shard_size)
    conn = job.connection
    placed_on = shard_placement(settings, job.meta.get("placement"))
    queue_name = placed_on.queue
    queue = Queue(queue_name, connection=conn, serializer=JSONSerializer)
    if queue_name != BULK:  # the children wait in a worker class's own queue (core/placement.py)
        conn.set(keys.fanout_queue(parent), queue_name, ex=max(settings.result_ttl_s, settings.failure_ttl_s) + 3600)
    plan_meta = {"shards": len(ranges), "shard_size": shard_size, "items": n_items, "unit": declared.unit,
                 "ranges": ranges, "max_failed_fraction": max_failed_fraction, "shard_kind": shard_kind,
                 "reduce_kind": reduce_kind}
    ctx.set_meta("fanout", plan_meta)  # before any child: a cancel that reads no plan finds no child either
    record_owner(settings, parent, owner, job.meta.get("kind"))
    common = dict(timeout=declared.timeout_s, result_ttl=settings.result_ttl_s, failure_ttl=settings.failure_ttl_s,
                  ttl=None, status=JobStatus.DEFERRED)

    def shard_payload(index: int, start: int, end: int) -> dict[str, Any]:
        own, lo, hi = shard_items(carried, start, end) if shard_items is not None else (carried, start, end)
        return {"parent": parent, "index": index, "start": lo, "end": hi, "request": own,
                "from_parent": from_parent}

    rid = reduce_id(parent)
    placed = {"placement": placed_on.meta()} if placed_on.needs else {}
    try:
        reduce_job = queue.create_job(
            RUNNER, args=(reduce_kind, {"parent": parent, "shards": len(ranges), "request": carried,
                                        "from_parent": from_parent}), job_id=rid,
            meta={"kind": reduce_kind, "owner": owner, "parent": parent, **placed}, **common)
        kept_s = max(settings.result_ttl_s, settings.failure_ttl_s) + 3600
        _unless_canceled(conn, parent, lambda pipe: _begin(pipe, parent, owner, reduce_job, len(ranges), n_items,
                                                           kept_s))
        for first in range(0, len(ranges), PLAN_BATCH):
            batch = [(i, ranges[i]) for i in range(first, min(first + PLAN_BATCH, len(ranges)))]
            with conn.pipeline(transaction=False) as pipe:
                for i, _ in batch:
                    pipe.exists(JOB_PREFIX + shard_id(parent, i))
                exists = pipe.execute()
            new = [queue.create_job(RUNNER, args=(shard_kind, shard_payload(i, start, end)), job_id=shard_id(parent, i),
                                    retry=Retry(max=retries) if retries > 0 else None,
                                    meta={"kind": shard_kind, "owner": owner, "parent": parent, "shard": i,
                                          **placed}, **common)
                   for (i, (start, end)), there in zip(batch, exists, strict=True) if not there]
            _unless_canceled(conn, parent, lambda pipe, new=new, batch=batch: _add_shards(pipe, parent, owner, new,
                                                                                          batch, queue_name))
            fanout.release(conn, owner, settings.shard_window)
            done = first + len(batch)
            ctx.progress(done, len(ranges), "shards", message=f"planned shard {done}/{len(ranges)}")
        conn.expire(keys.children(parent), max(settings.result_ttl_s, settings.failure_ttl_s) + 3600)
        fanout.arm(conn, parent, owner, settings.shard_window)
    except WorkerShutdown:
        raise  # the parent goes back on its queue and plans again, reusing what exists
    except BaseException:
        try:  # canceled, or failed while planning: no child of it may wait (maintenance retries this)
            fanout.tear_down(conn, parent, owner, settings)
        except Exception:
            log.exception("could not tear down the children of %s", parent)
        raise
    log.info("fanned out into %d shards of up to %d %s", len(ranges), shard_size, declared.unit)
    return Planned(fanout={**plan_meta, "reduce": rid})


def parent_payload(job: Any, parent: str) -> dict[str, Any]:
    """The payload a fanned-out parent job was submitted with (what its children read ``from_parent``)."""
    try:
        payload = Job.fetch(parent, connection=job.connection, serializer=JSONSerializer).args[-1]
    except Exception as exc:  # the parent's record expired or was deleted: nothing sensible to compute
        raise JobError("parent_missing", f"the parent job {parent!r} (which holds the request) is gone: "
                       f"{type(exc).__name__}") from None
    if not isinstance(payload, dict):
        raise JobError("parent_missing", f"the parent job {parent!r} holds no request")
    return payload


def _unless_canceled(conn: Any, parent: str, writes: Callable[[Any], None]) -> None:
    """Run ``writes`` on a transaction that commits only while the parent's cancel flag is not raised."""
    flag = keys.cancel(parent)
    with conn.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(flag)
                if pipe.exists(flag):
                    raise JobCanceled("canceled on request")
                pipe.multi()
                writes(pipe)
                pipe.execute()
                return
            except WatchError:
                continue


def _begin(pipe: Any, parent: str, owner: str, reduce_job: Job, n_shards: int, n_items: int, kept_s: int) -> None:
    """The reduce step (deferred), the parent's counters, the planning marker, the fan-out live for its owner."""
    if not Job.exists(reduce_job.id, connection=reduce_job.connection):
        reduce_job.save(pipeline=pipe)
    fanout.init_counters(pipe, parent, n_shards, n_items, kept_s)
    pipe.sadd(keys.fanout_open(parent), fanout.PLANNING)
    pipe.hset(keys.FANOUT_LIVE, parent, owner)
    pipe.sadd(keys.FANOUT_OWNERS, owner)


def shard_placement(settings: Any, placed: dict[str, Any] | None) -> placement.Placement:
    """Where a parent's shards and reduce step wait: ``bulk``, or the own ``bulk@<class>`` of the smallest worker
    class that serves ``bulk`` and can run them, when the parent's needs (``meta["placement"]``) rule some
    classes out; a JobError ``no_capable_worker`` when none can."""
    needs = (placed or {}).get("needs") or {}
    if not needs:
        return placement.Placement(BULK)
    try:
        return placement.place_needs(settings, BULK, needs)
    except placement.Unplaceable as exc:
        raise JobError("no_capable_worker", f"its shards cannot run on any worker class that serves bulk: "
                       f"{exc.message}") from None


def _add_shards(pipe: Any, parent: str, owner: str, new: list[Job], batch: list[tuple[int, Any]],
                queue_name: str = BULK) -> None:
    """New shards (deferred) join the parent's pending list and open set; the parent takes its turn among the
    owner's parents."""
    for shard in new:
        shard.save(pipeline=pipe)
    pipe.zadd(keys.children(parent), {shard_id(parent, i): i for i, _ in batch})
    if new:
        ids = [shard.id for shard in new]
        pipe.rpush(keys.fanout_pending(parent), *ids)
        pipe.sadd(keys.backlog_pending(queue_name), *ids)
        pipe.sadd(keys.fanout_open(parent), *ids)
        pipe.zadd(keys.fanout_parents(owner), {parent: 0}, nx=True)
        pipe.sadd(keys.FANOUT_OWNERS, owner)


def shard_key(shard: str, name: str) -> str:
    return artifacts_key(shard, name)


def run_shard(ctx: JobContext, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``work`` unless this shard's output already reached the store; ``work`` writes its files with
    ``ctx.artifact_path`` and returns the shard's summary, stored last as ``done.json``."""
    store = get_store(ctx.settings)
    done_key = shard_key(ctx.job_id, "done.json")
    try:
        return {**json.loads(store.read_text(done_key)), "reused": True}
    except StoreError:
        pass
    t0 = time.perf_counter()
    summary = work()
    summary["seconds"] = round(time.perf_counter() - t0, 3)
    ctx.publish_artifacts()  # the records first, then the marker that says they are complete
    store.put_bytes(json.dumps(summary).encode(), done_key)
    return summary


def shard_done(ctx: JobContext, parent: str, index: int) -> dict[str, Any] | None:
    """A finished shard's summary, or None when it failed or never ran."""
    try:
        return json.loads(get_store(ctx.settings).read_text(shard_key(shard_id(parent, index), "done.json")))
    except StoreError:
        return None


def shard_records(ctx: JobContext, parent: str, index: int, name: str) -> Iterator[dict[str, Any]]:
    """The JSONL records a finished shard wrote, streamed one line at a time from the store."""
    key = shard_key(shard_id(parent, index), name)
    store = get_store(ctx.settings)
    if not store.exists(key):
        return
    with store.open(key, "rb") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def failed_fraction(n_failed: int, n_total: int) -> float:
    return n_failed / n_total if n_total else 0.0


def write_jsonl(path: Any, records: Any) -> None:
    """One JSON record per line (NaN and infinity as null), the format shards and reduce steps exchange."""
    with open(path, "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(json_safe(rec)) + "\n")


def parent_ranges(ctx: JobContext, parent: str) -> list[tuple[int, int]]:
    """The ``[start, end)`` ranges of the parent's shards, from the plan in its meta."""
    meta = Job.fetch(parent, connection=ctx.job.connection, serializer=ctx.job.serializer).meta
    return [tuple(r) for r in (meta.get("fanout") or {}).get("ranges", [])]
