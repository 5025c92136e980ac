"""Every Redis key explainq writes, in one place.

RQ's own keys (``rq:job:<id>``, ``rq:queue:<name>``, its registries) are RQ's: :data:`JOB_PREFIX` and
:data:`QUEUE_PREFIX` are read from RQ. Everything else is ``explainq:*`` and is spelled here only; docs/DESIGN.md's
table of shared state is checked against :data:`KEYS` by a test.
"""

from __future__ import annotations

import re

from rq.job import Job
from rq.queue import Queue

JOB_PREFIX = Job.redis_job_namespace_prefix  # rq:job:<id>: RQ's job hash
QUEUE_PREFIX = Queue.redis_queue_namespace_prefix  # rq:queue:<name>: RQ's queue list

PREFIX = "explainq:"

# The one job-id rule: RQ's ids are uuid4 hex, a shard is ``<parent>-s00001``, a reduce step ``<parent>-reduce``.
# An id is a key component, so anything else never reaches Redis (a path or query naming another id is a 404/422).
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
_JOB_ID_RE = re.compile(JOB_ID_PATTERN)


def valid_job_id(job_id: str) -> bool:
    return _JOB_ID_RE.fullmatch(job_id) is not None

# fixed keys
ARTIFACT_OWNERS = "explainq:artifacts:owners"
KEPT = "explainq:kept"
STORE_ORPHANS = "explainq:store:orphans"
WORKER_MODELS = "explainq:worker-models"
UI_SECRET = "explainq:ui:secret"
UI_SESSION_PREFIX = "explainq:ui:session:"
METRICS_SUBMITTED = "explainq:metrics:submitted"
METRICS_FINISHED = "explainq:metrics:finished"
METRICS_DURATION = "explainq:metrics:duration"
METRICS_MODEL_LOADS = "explainq:metrics:model_loads"
METRICS_STORE_UNAVAILABLE = "explainq:metrics:store_unavailable"
ALIVE_PREFIX = "explainq:alive:"
DEMO_PLAN = "explainq:demo:plan"
DEMO_ALIVE = "explainq:demo:alive"
BACKLOG_SECONDS = "explainq:backlog:seconds"
RATELIMIT_PREFIX = "explainq:ratelimit:"  # <scope>:<who>: one token bucket (core.ratelimit)


def owner_jobs(owner: str) -> str:
    """Sorted set: the owner's job ids by creation time (keyset paging for ``GET /jobs``)."""
    return f"explainq:jobs:{owner}"


def usage_stored(owner: str) -> str:
    """String: the owner's stored bytes as ``GET /usage`` measured them, with a TTL (the store budget, core.budgets)."""
    return f"explainq:usage:stored:{owner}"


def owner_active(owner: str) -> str:
    """Set: the owner's job ids that may still be queued or running (the active-jobs quota)."""
    return f"explainq:active:{owner}"


def idempotency(owner: str, key_digest: str) -> str:
    """String: an ``Idempotency-Key``'s record, by the SHA-256 hex digest of the key."""
    return f"explainq:idem:{owner}:{key_digest}"


def cancel(job_id: str) -> str:
    """String: the cooperative cancel flag a running job checks at each progress step."""
    return f"explainq:cancel:{job_id}"


def children(parent: str) -> str:
    """List: a fanned-out job's shard ids."""
    return f"explainq:children:{parent}"


# Fan-out's bookkeeping (core/fanout.py): which shards wait, which are out on ``bulk``, which have not ended.
FANOUT_LIVE = "explainq:fanout:live"
FANOUT_OWNERS = "explainq:fanout:owners"


def fanout_pending(parent: str) -> str:
    """List: a fanned-out job's shards not yet released onto ``bulk``, in order."""
    return f"explainq:fanout:pending:{parent}"


def fanout_open(parent: str) -> str:
    """Set: a fanned-out job's shards that have not ended (and a marker while it plans); its reduce step is
    released when this empties."""
    return f"explainq:fanout:open:{parent}"


def fanout_parents(owner: str) -> str:
    """Sorted set: the owner's fanned-out jobs with pending shards, by their last release (round robin)."""
    return f"explainq:fanout:parents:{owner}"


def fanout_inflight(owner: str) -> str:
    """Set: the owner's shards released onto ``bulk`` that have not ended (queued or running; at most the
    window)."""
    return f"explainq:fanout:inflight:{owner}"


def fanout_counts(parent: str) -> str:
    """Hash: a fanned-out job's shard counters (``total``, ``items``, ``running``, ``succeeded``, ``failed``,
    ``canceled``, items ``done`` by succeeded shards, ``first_start``), moved as shards change state: its view
    reads this instead of every shard (core/fanout.py)."""
    return f"explainq:fanout:counts:{parent}"


def fanout_state(parent: str) -> str:
    """Hash: shard id -> the state its parent's counters last counted it in (absent: queued)."""
    return f"explainq:fanout:state:{parent}"


def fanout_running(parent: str) -> str:
    """Set: a fanned-out job's shards its counters count as running (their progress is read; at most the
    window)."""
    return f"explainq:fanout:running:{parent}"


def fanout_queue(parent: str) -> str:
    """String: the queue a fanned-out job's children wait in when it is a worker class's own
    (``bulk@<class>``, core/placement.py); absent: ``bulk``."""
    return f"explainq:fanout:queue:{parent}"


def backlog_pending(queue: str) -> str:
    """Set: the shards of every fan-out that wait for ``queue`` outside RQ's queue (not yet released onto it);
    with the queue's own list, what autoscalers read as its backlog (``core/backlog.py``)."""
    return f"explainq:backlog:pending:{queue}"


def registry(section: str) -> str:
    """Hash: name -> JSON record of the ``models`` or ``datasets`` section."""
    if section not in ("models", "datasets"):
        raise ValueError(section)
    return f"explainq:registry:{section}"


def alive(worker_name: str) -> str:
    """String with a TTL: a worker's liveness key, holding the id of the job it runs."""
    return f"{ALIVE_PREFIX}{worker_name}"


def worker_models(worker_name: str) -> str:
    """String with a TTL: JSON of the models a worker holds loaded (the set :data:`WORKER_MODELS` names workers)."""
    return f"{WORKER_MODELS}:{worker_name}"


def ui_session(digest: str) -> str:
    """String with a TTL: a dashboard session's record (its API key's fingerprint, its CSRF token), by the SHA-256
    of the session id its cookie carries; deleted at sign-out."""
    return f"{UI_SESSION_PREFIX}{digest}"


def rate(kind: str, model: str) -> str:
    """String: measured throughput (items per second, a moving average) that sizes ``auto`` shards."""
    return f"explainq:rate:{kind}:{model}"


# Each key as the docs write it: the pattern with its placeholders, and what it holds. DESIGN.md's table must name
# every one of these (tests/test_architecture.py).
KEYS: dict[str, str] = {
    "explainq:jobs:<owner>": "the owner's job ids scored by creation time (keyset paging for `GET /jobs`)",
    "explainq:active:<owner>": "quota accounting: the owner's queued or running jobs",
    "explainq:idem:<owner>:<sha256>": "an `Idempotency-Key`'s job, with the job id and body hash",
    "explainq:cancel:<id>": "the cooperative cancel flag",
    "explainq:usage:stored:<owner>": "the owner's stored bytes as `GET /usage` measured them, reused by the store "
                                     "budget's check for `EXPLAINQ_USAGE_CACHE_S`",
    "explainq:registry:models": "model name -> JSON record with owner, kind, store location, metadata",
    "explainq:registry:datasets": "dataset name -> JSON record with owner, kind, location or path, metadata",
    STORE_ORPHANS: "replaced or deleted store versions, by release time, for retention",
    ARTIFACT_OWNERS: "job id -> owner of its files (kept until retention removes the files)",
    KEPT: "job id -> owner of the jobs their owners keep (`POST /jobs/{id}/keep`): no TTL, retention skips them",
    "explainq:children:<parent>": "a fanned-out job's shards",
    FANOUT_LIVE: "fanned-out job -> owner, from planning until its reduce step is released or it is torn down",
    FANOUT_OWNERS: "owners with pending or in-flight shards (what maintenance looks at)",
    "explainq:fanout:pending:<parent>": "a fanned-out job's shards not yet released onto `bulk`, in order",
    "explainq:fanout:open:<parent>": "a fanned-out job's shards that have not ended; the reduce step is released "
                                     "when it empties",
    "explainq:fanout:parents:<owner>": "the owner's fanned-out jobs with pending shards, by last release "
                                       "(round robin)",
    "explainq:fanout:inflight:<owner>": "the owner's shards out on `bulk` (queued or running): at most the window",
    "explainq:fanout:counts:<parent>": "a fanned-out job's shard counters, moved as its shards change state "
                                       "(its view reads them, not every shard)",
    "explainq:fanout:state:<parent>": "shard id -> the state the parent's counters last counted it in",
    "explainq:fanout:running:<parent>": "the shards a fanned-out job's counters count as running",
    "explainq:fanout:queue:<parent>": "the worker class's queue a fanned-out job's children wait in, when not "
                                      "`bulk` (`bulk@<class>`)",
    "explainq:backlog:pending:<queue>": "the shards of every fan-out waiting for the queue outside RQ's list "
                                        "(not yet released onto it): the backlog autoscalers add to its length",
    BACKLOG_SECONDS: "each queue's backlog in estimated seconds (and `at`: when it was read), written at every "
                     "metrics scrape and worker maintenance pass (`core/backlog.py`)",
    "explainq:alive:<worker>": "a worker's liveness key: the job it runs, TTL = heartbeat TTL",
    WORKER_MODELS: "the names of workers that publish their loaded models",
    "explainq:worker-models:<worker>": "the models one worker holds loaded, TTL = heartbeat TTL",
    METRICS_SUBMITTED: "jobs submitted, by kind",
    METRICS_FINISHED: "jobs finished, by kind and status",
    METRICS_DURATION: "job duration histogram buckets, by kind",
    METRICS_MODEL_LOADS: "model loads and their time, by model",
    METRICS_STORE_UNAVAILABLE: "store calls given up after their retries, by operation",
    "explainq:rate:<kind>:<model>": "measured throughput (moving average) that sizes shards",
    UI_SECRET: "the dashboard's cookie-signing secret, generated once",
    DEMO_PLAN: "the demo preparation's plan: its steps in order, the models and datasets each registers, their state",
    DEMO_ALIVE: "set while the demo preparation runs, TTL 30 s (a step left unfinished by a dead one is not coming)",
    "explainq:ui:session:<sha256>": "a dashboard session: its API key's fingerprint and CSRF token, TTL = its lifetime",
}
