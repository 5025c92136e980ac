"""The public view of a job, read from RQ's job hash (no torch, no FastAPI).

One vocabulary, ``queued | running | succeeded | failed | canceled``, mapped from RQ's statuses; the view is built
from the handful of job-hash fields it needs (:data:`VIEW_FIELDS`), read with the queue position by one Lua call
(:data:`VIEW_SCRIPT`), so nothing but the meta is deserialised. Fan-out's parent view (:mod:`core.fanout`) and the
job store (:mod:`core.jobstore`) both build on it.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from rq.job import JobStatus
from rq.serializers import JSONSerializer

from core.contract.kind import QUEUES
from core.keys import JOB_PREFIX, QUEUE_PREFIX

TERMINAL = ("succeeded", "failed", "canceled")
STATUSES = ("queued", "running", *TERMINAL)

# The job-hash fields the view needs. Reading only these (HMGET) instead of the whole hash (HGETALL) skips RQ's
# compressed call data, the bulk of the hash, which the API never needs.
VIEW_FIELDS = ("status", "origin", "created_at", "started_at", "ended_at", "last_heartbeat", "meta")
_VIEW_FIELDS_B = tuple(f.encode() for f in VIEW_FIELDS)
_RQ_ACTIVE = {s.value for s in (JobStatus.QUEUED, JobStatus.DEFERRED, JobStatus.SCHEDULED, JobStatus.STARTED)}


def fields_to_raw(values: list[bytes | None]) -> dict[bytes, bytes]:
    """HMGET's list of values back into the ``{field: value}`` shape of HGETALL (missing fields dropped)."""
    return {f: v for f, v in zip(_VIEW_FIELDS_B, values, strict=True) if v is not None}


STATUS_MAP = {
    JobStatus.QUEUED.value: "queued",
    JobStatus.DEFERRED.value: "queued",
    JobStatus.SCHEDULED.value: "queued",
    JobStatus.STARTED.value: "running",
    JobStatus.FINISHED.value: "succeeded",
    JobStatus.FAILED.value: "failed",
    JobStatus.STOPPED.value: "canceled",
    JobStatus.CANCELED.value: "canceled",
}


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


# A job's view fields and, for a queued job, its position in its queue. The field names are part of the script
# (status and origin first). ``queues_from`` is the index in KEYS of the first of the queue lists.
VIEW_FUNCTION = """
local function view(job_key, job_id, queues_from)
  local values = redis.call('HMGET', job_key, """ + ", ".join(f"'{f}'" for f in VIEW_FIELDS) + """)
  local position = false
  if values[1] == 'queued' and values[2] then
    local wanted = '""" + QUEUE_PREFIX + """' .. values[2]
    local listed = false
    for i = queues_from, #KEYS do
      if KEYS[i] == wanted then position = redis.call('LPOS', KEYS[i], job_id); listed = true end
    end
    -- a worker class's own queue (<queue>@<class>, core/placement.py) is not among the kinds' queue keys
    if not listed and string.find(values[2], '@', 1, true) then position = redis.call('LPOS', wanted, job_id) end
  end
  values[#values + 1] = position
  return values
end
"""
# The job view in one round trip; a call sends only the keys and the id.
# KEYS: the job hash, then every queue list. ARGV: the job id.
VIEW_SCRIPT = VIEW_FUNCTION + """
return view(KEYS[1], ARGV[1], 2)
"""
QUEUE_KEYS = tuple(QUEUE_PREFIX + q for q in QUEUES)


def view_script_args(job_id: str) -> tuple[list[str], list[str]]:
    return [JOB_PREFIX + job_id, *QUEUE_KEYS], [job_id]


def view_script_result(values: list[Any]) -> tuple[dict[bytes, bytes], int | None]:
    """The ``VIEW_SCRIPT`` answer as (raw fields, queue position or None)."""
    *fields, position = values
    return fields_to_raw(fields), (int(position) if position is not None else None)


def _text(raw: dict[bytes, bytes], field: str) -> str | None:
    value = raw.get(field.encode())
    if value is None or value == b"":
        return None
    return value.decode()


def parse_ts(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def parse_meta(raw: dict[bytes, bytes]) -> dict[str, Any]:
    """The job's ``meta`` field (kind, owner, progress...), ``{}`` when absent."""
    value = raw.get(b"meta")
    if not value:
        return {}
    return loads_finite(value)


def is_abandoned(raw: dict[bytes, bytes], heartbeat_ttl_s: float, now: float | None = None) -> bool:
    """A started job whose worker stopped heart-beating for longer than the heartbeat TTL."""
    if _text(raw, "status") != JobStatus.STARTED.value:
        return False
    last = parse_ts(_text(raw, "last_heartbeat")) or parse_ts(_text(raw, "started_at"))
    if last is None:
        return False
    return (now or time.time()) - last > heartbeat_ttl_s


def job_view(job_id: str, raw: dict[bytes, bytes], base_url: str = "", position: int | None = None,
             meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The public job resource (DESIGN.md "Jobs") from the RQ job hash fields (one HMGET, nothing unpickled).

    ``position`` is the job's place in its queue (0 = next), shown only while the job is queued. ``meta`` is
    ``parseparse_meta(raw)`` when the caller has it already.
    """
    if meta is None:
        meta = parse_meta(raw)
    rq_status = _text(raw, "status") or "queued"
    status = STATUS_MAP.get(rq_status, "queued")
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
        "label": meta.get("label"),
        "tags": meta.get("tags") or [],
        "model": meta.get("model"),
        "input": meta.get("input"),
        "status": status,
        "queue": _text(raw, "origin"),
        "position": position if status == "queued" else None,
        "created_at": _text(raw, "created_at"),
        "started_at": _text(raw, "started_at"),
        "finished_at": _text(raw, "ended_at") if status in TERMINAL else None,
        "progress": meta.get("progress"),
        "metrics": meta.get("metrics"),
        "error": error,
        "kept": bool(meta.get("kept")),
        "result_url": f"{path}/result" if status == "succeeded" else None,
        "links": {"self": path, "cancel": path, "events": f"{path}/events", "result": f"{path}/result"},
    }
    if status == "canceled" and view["finished_at"] is None:
        view["finished_at"] = meta.get("canceled_at")
    return view

