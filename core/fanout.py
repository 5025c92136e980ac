"""Fan-out bookkeeping shared by the API and the workers (no torch).

A large request is a **parent** job. Its job function plans the work into shards and enqueues, as ordinary RQ jobs:

- shard jobs ``<parent>-s00000``, ``<parent>-s00001``, ... on the ``bulk`` queue (any worker on any host takes
  them; ids are deterministic, so re-running the parent never enqueues a shard twice);
- one reduce job ``<parent>-reduce`` on the ``bulk`` queue that depends on every shard (failures allowed), and
  merges their outputs.

The parent's own RQ job ends as soon as it has enqueued them. What a client sees of the parent is derived at read
time from its shards and its reduce step: status, ``shards: {total, queued, running, succeeded, failed}``, progress
summed over the shards with an ETA, and the reduce step's result as the parent's result. ``explainq:children:
<parent>`` indexes the shards for ``GET /jobs?parent=``. Canceling the parent cancels every shard and the reduce.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from core import keys
from core.jobview import STATUS_MAP, parse_meta, parse_ts
from core.keys import JOB_PREFIX

BULK = "bulk"
SHARD_DIGITS = 5


def shard_id(parent: str, index: int) -> str:
    return f"{parent}-s{index:0{SHARD_DIGITS}d}"


def reduce_id(parent: str) -> str:
    return f"{parent}-reduce"


def plan(n_items: int, shard_size: int) -> list[tuple[int, int]]:
    """``[start, end)`` ranges covering ``n_items`` in order, each of at most ``shard_size`` items, as even as
    possible (no tiny last shard)."""
    if n_items <= 0:
        return []
    shard_size = max(1, int(shard_size))
    n = -(-n_items // shard_size)
    base, extra = divmod(n_items, n)
    out, start = [], 0
    for i in range(n):
        end = start + base + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


def _meta_of(raw: bytes | None) -> dict[str, Any]:
    return parse_meta({b"meta": raw} if raw else {})


def _state_of(status: bytes | None) -> str:
    """A job hash's status field in the service's vocabulary (a missing job reads as queued)."""
    return STATUS_MAP.get(status.decode() if status else "", "queued")


def _read_rows(redis: Any, parent_id: str, n: int) -> list[Any]:
    """``[status, meta, started_at, ended_at]`` of each of the ``n`` shards, then of the reduce step."""
    ids = [shard_id(parent_id, i) for i in range(n)] + [reduce_id(parent_id)]
    with redis.pipeline(transaction=False) as pipe:
        for jid in ids:
            pipe.hmget(JOB_PREFIX + jid, "status", "meta", "started_at", "ended_at")
        return pipe.execute()


def _shard_state(status: bytes | None, meta_raw: bytes | None) -> tuple[str, dict[str, Any]]:
    """A shard's state (a failure that was a cancel counts as canceled) and its meta."""
    state = _state_of(status)
    m = _meta_of(meta_raw)
    if state == "failed" and m.get("canceled"):
        state = "canceled"
    return state, m


def _shard_size(fan: dict[str, Any], i: int) -> int:
    return fan["ranges"][i][1] - fan["ranges"][i][0] if fan.get("ranges") else 0


def _shard_done(state: str, m: dict[str, Any], size: int) -> float:
    """Items of a shard done: all of a succeeded one, a running one's reported fraction, none otherwise."""
    if state == "succeeded":
        return size
    if state == "running" and m.get("progress"):
        p = m["progress"]
        if p.get("total"):
            return min(size, size * float(p.get("done") or 0) / float(p["total"]))
    return 0.0


def _earlier(first: float | None, started: bytes | None) -> float | None:
    """The earliest start so far, given one more shard's ``started_at``."""
    t = parse_ts(started.decode() if started else None)
    if t is not None and (first is None or t < first):
        return t
    return first


def _tally_shards(rows: list[Any], fan: dict[str, Any], n: int) -> tuple[dict[str, int], float, float | None]:
    """(counts by state, items done, the earliest shard start) over the shards' rows."""
    counts = {"total": n, "queued": 0, "running": 0, "succeeded": 0, "failed": 0, "canceled": 0}
    done = 0.0
    first_start: float | None = None
    for i, (status, meta_raw, started, _ended) in enumerate(rows):
        state, m = _shard_state(status, meta_raw)
        counts[state] += 1
        done += _shard_done(state, m, _shard_size(fan, i))
        first_start = _earlier(first_start, started)
    return counts, done, first_start


def _set_status(view: dict[str, Any], meta: dict[str, Any], r_state: str, r_meta: dict[str, Any],
                r_ended: bytes | None) -> None:
    """The parent's status, end time and error: canceled wins, then the reduce step's outcome; running otherwise."""
    canceled = meta.get("canceled") or view["status"] == "canceled"
    if canceled:
        view["status"] = "canceled"
    elif r_state == "succeeded":
        view["status"] = "succeeded"
        view["finished_at"] = r_ended.decode() if r_ended else view.get("finished_at")
    elif r_state in ("failed", "canceled"):
        view["status"] = "failed" if r_state == "failed" else "canceled"
        view["error"] = r_meta.get("error") or {"code": "reduce_failed",
                                                "message": "the step that merges the shards failed"}
        view["finished_at"] = r_ended.decode() if r_ended else view.get("finished_at")
    else:
        view["status"] = "running"
        view["finished_at"] = None
        view["error"] = None


def _eta_s(status: str, first_start: float | None, done: float, total: float) -> float | None:
    """Seconds left at the rate the shards have gone since the first one started (running parents only)."""
    eta = None
    if status == "running" and first_start is not None and 0 < done < total:
        rate = done / max(datetime.now(UTC).timestamp() - first_start, 1e-6)
        eta = round((total - done) / rate, 1) if rate > 0 else None
    return eta


def overlay(redis: Any, parent_id: str, view: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """The parent's public view from its shards and reduce step (one pipelined read of their status fields)."""
    fan = meta.get("fanout") or {}
    n = int(fan.get("shards", 0))
    rows = _read_rows(redis, parent_id, n)
    counts, done, first_start = _tally_shards(rows[:n], fan, n)
    r_status, r_meta_raw, _, r_ended = rows[n]
    r_state = _state_of(r_status)
    r_meta = _meta_of(r_meta_raw)
    total = float(fan.get("items") or 0)
    view = dict(view)
    view["shards"] = counts
    _set_status(view, meta, r_state, r_meta, r_ended)
    if view["status"] != "succeeded":
        view["result_url"] = None
    else:
        view["result_url"] = view["links"]["result"]
    eta = _eta_s(view["status"], first_start, done, total)
    view["progress"] = {"done": round(done, 3), "total": total, "unit": fan.get("unit", "items"),
                        "message": f"{counts['succeeded']}/{n} shards done" + (
                            ", merging" if r_state == "running" else ""), "eta_s": eta}
    view["fanout"] = {"shard_size": fan.get("shard_size"), "reduce": reduce_id(parent_id),
                      "max_failed_fraction": fan.get("max_failed_fraction")}
    return view


def is_parent(meta: dict[str, Any]) -> bool:
    return bool(meta.get("fanout"))


def apply(redis: Any, job_id: str, view: dict[str, Any], raw: dict[bytes, bytes]) -> dict[str, Any]:
    """``view`` with the fan-out overlay when the job is a parent (one more pipelined read); unchanged otherwise."""

    meta = _meta_of(raw.get(b"meta"))
    if not is_parent(meta) or view["status"] in ("queued", "failed"):
        return view  # still planning, or the planning itself failed: the parent's own status is the truth
    if redis.exists(keys.cancel(job_id)):
        meta = {**meta, "canceled": True}
    return overlay(redis, job_id, view, meta)


def children(redis: Any, parent: str) -> list[str]:
    """The parent's shard ids in order, then its reduce step when it exists."""
    ids = [m.decode() for m in redis.zrange(keys.children(parent), 0, -1)]
    if redis.exists(JOB_PREFIX + reduce_id(parent)):
        ids.append(reduce_id(parent))
    return ids


def related(redis: Any, parent: str, meta: dict[str, Any]) -> list[str]:
    """Every job a cancel of the parent must reach: its shards (planned or indexed) and its reduce step."""
    n = int((meta.get("fanout") or {}).get("shards", 0))
    ids = {shard_id(parent, i) for i in range(n)} | set(children(redis, parent))
    return sorted(ids) + [reduce_id(parent)]
