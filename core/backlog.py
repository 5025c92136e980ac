"""The backlog autoscalers read, per queue (no torch).

A queue's backlog is the work waiting for its workers: the jobs on RQ's list (``rq:queue:<queue>``) and the shards
of fan-outs that wait outside it, in their parents' pending lists, for their owner's window
(``explainq:backlog:pending:<queue>``: a set the fan-out scripts of ``core/fanout.py`` keep in the same steps as
those lists, as shards are planned, released and torn down). RQ's list alone misses the pending shards: with a
window of 2, a 32-shard job shows at most 2 shards on ``bulk`` and the other 30 nowhere RQ looks.

Two readers, both exact at any moment:

- Prometheus: ``explainq_backlog{queue}`` (``GET /metrics``, read at scrape time) next to ``explainq_queue_depth``
  (RQ's list alone) and ``explainq_jobs_running{queue}``;
- KEDA's ``redis`` scaler, which counts the members of the key it is given whatever its type (LLEN of a list,
  SCARD of a set, ZCARD of a sorted set): one trigger per key of :func:`scaler_keys`, summed by the
  ScaledObject's ``scalingModifiers`` formula (``deploy/base/scaledobjects.yaml``). The running jobs are part of
  what a worker class scales on, so that a class is not scaled in under the jobs it runs.

**Estimated cost** (:func:`read`): each queued job and pending shard counts the mean run time of the jobs of its
kind that ended so far (``explainq_job_duration_seconds``' sum over its count; a shard's kind is its parent's
``<kind>_shard``), or ``EXPLAINQ_BACKLOG_UNKNOWN_COST_S`` for a kind that has not ended once yet (counted apart, as
``unestimated``). Prometheus reads it as ``explainq_backlog_seconds{queue}``; it is also written to the hash
``explainq:backlog:seconds`` (queue -> seconds, and ``at`` -> when) at every scrape and every worker maintenance
pass, for readers of Redis. KEDA's ``redis`` scaler counts members and cannot read a number: scale on seconds with
its ``prometheus`` scaler.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rq.registry import StartedJobRegistry

from core import keys
from core.jobview import parse_meta
from core.keys import JOB_PREFIX, METRICS_DURATION, QUEUE_PREFIX

QUEUED, PENDING, RUNNING = "queued", "pending", "running"
SEP = "\t"  # core.metrics' field separator in the duration hash


def scaler_keys(queue: str) -> dict[str, str]:
    """What a queue's backlog is read from: ``queued`` (RQ's list), ``pending`` (shards not yet released onto it,
    a set) and ``running`` (RQ's started registry, a sorted set). Each is a key KEDA's redis scaler can count."""
    return {QUEUED: QUEUE_PREFIX + queue, PENDING: keys.backlog_pending(queue),
            RUNNING: StartedJobRegistry.key_template.format(queue)}



@dataclass(frozen=True)
class Backlog:
    """One queue's waiting work: jobs on its list, shards pending outside it, jobs running from it, and the
    estimated seconds of the queued and pending ones (``unestimated`` of them counted at the default)."""

    queued: int
    pending: int
    running: int
    seconds: float
    unestimated: int

    @property
    def items(self) -> int:
        return self.queued + self.pending


def mean_durations(raw: dict[bytes, bytes]) -> dict[str, float]:
    """Mean run time per kind from ``explainq:metrics:duration`` (``<kind>\tsum`` over ``<kind>\tcount``)."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for field, value in raw.items():
        kind, _, sub = field.decode().rpartition(SEP)
        if sub == "sum":
            sums[kind] = float(value)
        elif sub == "count":
            counts[kind] = float(value)
    return {k: sums.get(k, 0.0) / n for k, n in counts.items() if n > 0}


def _family(job_id: str) -> tuple[str, str] | None:
    """(parent, "shard" | "reduce") of a fan-out child's id, else None."""
    if job_id.endswith("-reduce"):
        return job_id[: -len("-reduce")], "reduce"
    head, sep, tail = job_id.rpartition("-s")
    if sep and tail.isdigit():
        return head, "shard"
    return None


def read(redis: Any, queues: tuple[str, ...], unknown_cost_s: float) -> dict[str, Backlog]:
    """Every queue's :class:`Backlog`, in two pipelined reads (the queues' members and the metric hash, then the
    kind of each queued job: its RQ description, or its parent's plan for a fan-out's child)."""
    with redis.pipeline(transaction=False) as pipe:
        pipe.hgetall(METRICS_DURATION)
        for q in queues:
            sources = scaler_keys(q)
            pipe.lrange(sources[QUEUED], 0, -1)
            pipe.smembers(sources[PENDING])
            pipe.zcard(sources[RUNNING])
        durations, *answers = pipe.execute()
    mean = mean_durations(durations)
    per_queue = [([i.decode() for i in answers[3 * n]], sorted(m.decode() for m in answers[3 * n + 1]),
                  int(answers[3 * n + 2])) for n in range(len(queues))]
    plain = sorted({j for queued, pending, _ in per_queue for j in (*queued, *pending) if _family(j) is None})
    parents = sorted({f[0] for queued, pending, _ in per_queue for j in (*queued, *pending)
                      if (f := _family(j)) is not None})
    with redis.pipeline(transaction=False) as pipe:
        for j in plain:
            pipe.hget(JOB_PREFIX + j, "description")
        for p in parents:
            pipe.hget(JOB_PREFIX + p, "meta")
        looked = pipe.execute() if plain or parents else []
    kind_of: dict[str, str | None] = {}
    for j, description in zip(plain, looked[: len(plain)], strict=True):
        text = description.decode() if description else ""
        kind_of[j] = text[: -len(" job")] if text.endswith(" job") else None
    plans = {p: (parse_meta({b"meta": raw}) if raw else {}).get("fanout") or {}
             for p, raw in zip(parents, looked[len(plain):], strict=True)}

    def kind(job_id: str) -> str | None:
        family = _family(job_id)
        if family is None:
            return kind_of.get(job_id)
        return plans.get(family[0], {}).get(f"{family[1]}_kind")

    out: dict[str, Backlog] = {}
    for q, (queued, pending, running) in zip(queues, per_queue, strict=True):
        seconds, unestimated = 0.0, 0
        for j in (*queued, *pending):
            cost = mean.get(kind(j) or "")
            if cost is None:
                cost, unestimated = unknown_cost_s, unestimated + 1
            seconds += cost
        out[q] = Backlog(len(queued), len(pending), running, round(seconds, 3), unestimated)
    return out


def publish(redis: Any, backlogs: dict[str, Backlog]) -> None:
    """``explainq:backlog:seconds``: each queue's estimated seconds, and ``at``, the time they were read."""
    mapping: dict[str, str] = {q: repr(b.seconds) for q, b in backlogs.items()}
    mapping["at"] = repr(round(time.time(), 3))
    redis.hset(keys.BACKLOG_SECONDS, mapping=mapping)
