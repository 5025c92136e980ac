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
"""

from __future__ import annotations

from rq.registry import StartedJobRegistry

from core import keys
from core.keys import QUEUE_PREFIX

QUEUED, PENDING, RUNNING = "queued", "pending", "running"


def scaler_keys(queue: str) -> dict[str, str]:
    """What a queue's backlog is read from: ``queued`` (RQ's list), ``pending`` (shards not yet released onto it,
    a set) and ``running`` (RQ's started registry, a sorted set). Each is a key KEDA's redis scaler can count."""
    return {QUEUED: QUEUE_PREFIX + queue, PENDING: keys.backlog_pending(queue),
            RUNNING: StartedJobRegistry.key_template.format(queue)}

