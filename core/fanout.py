"""Fan-out bookkeeping shared by the API and the workers (no torch).

A large request is a **parent** job. Its job function plans the work into shards and creates, as RQ jobs on the
``bulk`` queue:

- shard jobs ``<parent>-s00000``, ``<parent>-s00001``, ... (ids are deterministic, so re-running the parent never
  creates a shard twice), created *deferred* and listed in the parent's pending list;
- one reduce job ``<parent>-reduce``, created deferred too, which merges the shards' outputs.

**The window.** An owner has at most ``EXPLAINQ_SHARD_WINDOW`` shards out on ``bulk`` (queued or running; ``0``
means as many as live workers serve ``bulk``): the rest wait in their parent's pending list. Whenever one of the
owner's shards ends (succeeded, failed for good, canceled) the owner's next pending shard is released, taking the
owner's parents in turn (round robin). Released shards join the tail of ``bulk``, so owners take turns there too; an
owner with nothing out on ``bulk`` puts its first window at the front (like an interactive request, it waits for at
most one running shard). Every step is one Lua script (:data:`RELEASE`, :data:`END`, :data:`ARM`,
:data:`TEAR_DOWN`): a shard is released once, its end counted once, and the reduce step is released exactly when
the parent's open set (shards not ended, plus a marker while it plans) empties and the parent was not canceled.
A worker that dies between a shard's end and the release strands nothing: :func:`sweep` (workers' maintenance) ends
what ended and refills every owner's window, and tears down the fan-outs whose parent failed.

The parent's own RQ job ends when it has planned. It stays in its owner's active set (``JobStore.prune_active``)
until its reduce step ends, so one owner has at most ``EXPLAINQ_MAX_ACTIVE_JOBS`` fan-outs at a time. What a client
sees of the parent is derived at read time from its shards and its reduce step: status, ``shards: {total, queued,
running, succeeded, failed, canceled}`` (pending shards are queued), progress summed over the shards with an ETA,
and the reduce step's result as the parent's result. ``explainq:children:<parent>`` indexes the shards for ``GET
/jobs?parent=``. Canceling the parent (:func:`tear_down`) cancels every shard and the reduce step.

**Counters, not a scan.** The view costs O(1) in the number of shards: the parent's counters
(``explainq:fanout:counts:<parent>``: running, succeeded, failed, canceled, items done, the first start) are moved
by one Lua function (``sync``) that reads a shard's job hash and counts a transition only from the state it last
counted the shard in (``explainq:fanout:state:<parent>``), so a report made twice, a retry, or a requeue after a
lost worker never counts twice. It runs inside the scripts that change a shard's state here (the end, the
tear-down) and right after RQ's own changes (a worker starts a shard, a failure is retried, the reaper requeues);
maintenance's sweep runs it on every in-flight shard, so a start a dead worker did not report is counted there.
The view (:data:`VIEW`, one call) reads the counters and the running shards' progress (at most the window);
:func:`overlay` with ``scan=True`` is the reference that reads every shard, and a fan-out planned before the
counters existed is viewed that way.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from rq.queue import Queue
from rq.registry import CanceledJobRegistry
from rq.utils import now as rq_now
from rq.utils import utcformat
from rq.worker_registration import WORKERS_BY_QUEUE_KEY

from core import keys
from core.jobview import STATUS_MAP, parse_meta, parse_ts
from core.keys import JOB_PREFIX, QUEUE_PREFIX
from core.metrics import record_finished

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


def shard_count(n_items: int, shard_size: int) -> int:
    """How many shards :func:`plan` makes of ``n_items`` at ``shard_size``."""
    return -(-max(0, n_items) // max(1, int(shard_size)))


def too_many_shards(n_items: int, shard_size: int, cap: int, unit: str) -> str | None:
    """Why ``shard_size`` is refused for ``n_items`` (more shards than ``cap``, ``EXPLAINQ_MAX_SHARDS``), or None.
    Each shard is a job, and a parent's cancel reads every one of them."""
    n = shard_count(n_items, shard_size)
    if n <= cap:
        return None
    least = -(-n_items // cap)
    return (f"shard_size {shard_size}: {n_items:,} {unit} would make {n:,} shards, more than the {cap:,} one job may "
            f"have (EXPLAINQ_MAX_SHARDS); use shard_size {least:,} or more, or 'auto'")


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


def _scan(redis: Any, parent_id: str, fan: dict[str, Any], n: int) -> tuple[dict[str, int], float, float | None,
                                                                           list[Any]]:
    """The reference summary: (counts, items done, first start, the reduce step's row) from every shard's row."""
    rows = _read_rows(redis, parent_id, n)
    counts, done, first_start = _tally_shards(rows[:n], fan, n)
    return counts, done, first_start, rows[n]


def _index(sid: str) -> int | None:
    tail = sid.rsplit("-s", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _counted(redis: Any, parent_id: str, fan: dict[str, Any], n: int) -> tuple[dict[str, int], float,
                                                                              float | None, list[Any]] | None:
    """The same summary from the parent's counters and its running shards (one call, O(window)); None for a
    fan-out without counters (planned before them, or expired)."""
    answer = _call(redis, VIEW, [parent_id])
    if not answer:
        return None
    flat, running, rows, reduce_row = answer
    c = {flat[i].decode(): flat[i + 1].decode() for i in range(0, len(flat), 2)}
    counts = {"total": n, "queued": 0}
    for state in ("running", "succeeded", "failed", "canceled"):
        counts[state] = int(c.get(state, 0))
    counts["queued"] = n - counts["running"] - counts["succeeded"] - counts["failed"] - counts["canceled"]
    done = float(int(c.get("done", 0)))
    for sid, (_status, meta_raw) in zip(running, rows, strict=True):
        i = _index(sid.decode())
        if i is not None and i < n:
            done += _shard_done("running", _meta_of(meta_raw), _shard_size(fan, i))
    return counts, done, parse_ts(c.get("first_start")), list(reduce_row)


def overlay(redis: Any, parent_id: str, view: dict[str, Any], meta: dict[str, Any],
            scan: bool = False) -> dict[str, Any]:
    """The parent's public view from its counters and reduce step (one call, whatever the number of shards);
    ``scan`` (or a fan-out without counters) derives it from every shard's status fields instead (the
    reference)."""
    fan = meta.get("fanout") or {}
    n = int(fan.get("shards", 0))
    summary = None if scan else _counted(redis, parent_id, fan, n)
    counts, done, first_start, (r_status, r_meta_raw, _, r_ended) = summary or _scan(redis, parent_id, fan, n)
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


def apply(redis: Any, job_id: str, view: dict[str, Any], raw: dict[bytes, bytes],
          scan: bool = False) -> dict[str, Any]:
    """``view`` with the fan-out overlay when the job is a parent (one more call); unchanged otherwise."""

    meta = _meta_of(raw.get(b"meta"))
    if not is_parent(meta) or view["status"] in ("queued", "failed"):
        return view  # still planning, or the planning itself failed: the parent's own status is the truth
    if redis.exists(keys.cancel(job_id)):
        meta = {**meta, "canceled": True}
    return overlay(redis, job_id, view, meta, scan=scan)


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


# ------------------------------------------------------------------------------------------------ the window
PLANNING = "*planning*"  # in a parent's open set while it plans: its reduce step is not released before planning ends
_TERMINAL_RQ = {b"finished", b"failed", b"stopped", b"canceled"}
_WAITING_RQ = {b"queued", b"deferred", b"scheduled"}

# The functions every fan-out script shares. Key names are built here from the prefixes (like the submission script,
# this assumes one Redis server, not a cluster). A window below 0 means "end the shard, release nothing".
_LUA = """
local JOB = '@JOB@'
local PENDING = '@PENDING@'
local WAITING = '@WAITING@'
local FANQUEUE = '@FANQUEUE@'
local QUEUE = '@QUEUE@'
local OPEN = '@OPEN@'
local PARENTS = '@PARENTS@'
local INFLIGHT = '@INFLIGHT@'
local LIVE = '@LIVE@'
local OWNERS = '@OWNERS@'
local CANCEL = '@CANCEL@'
local BULK_NAME = '@BULK_NAME@'
local BULK = '@BULK@'
local QUEUES = '@QUEUES@'
local WORKERS = '@WORKERS@'
local DEFERRED = '@DEFERRED@'
local PLANNING = '@PLANNING@'
local COUNTS = '@COUNTS@'
local STATE = '@STATE@'
local RUNNING = '@RUNNING@'

-- The parent's counters follow one shard: its job hash's status (a failure that was a cancel counts as canceled)
-- against the state they last counted it in; a transition is counted once, however often it is reported.
local STATES = {queued = 'queued', deferred = 'queued', scheduled = 'queued', started = 'running',
                finished = 'succeeded', failed = 'failed', stopped = 'canceled', canceled = 'canceled'}
local function was_canceled(meta)
  if not meta then return false end
  local ok, m = pcall(cjson.decode, meta)
  if ok and type(m) == 'table' then
    local c = m['canceled']
    return c ~= nil and c ~= false and c ~= cjson.null and c ~= 0 and c ~= ''
  end
  return string.find(meta, '"canceled": *true') ~= nil
end
local function sync(parent, sid)
  local counts = COUNTS .. parent
  local plan = redis.call('HMGET', counts, 'total', 'items')
  local index = tonumber(string.match(sid, '%-s(%d+)$'))
  if not plan[1] or not index then return 0 end  -- no counters (planned before them), or not a shard
  local job = redis.call('HMGET', JOB .. sid, 'status', 'meta', 'started_at')
  local state = STATES[job[1] or ''] or 'queued'
  if state == 'failed' and was_canceled(job[2]) then state = 'canceled' end
  if job[3] and job[3] ~= '' then
    local first = redis.call('HGET', counts, 'first_start')
    if not first or job[3] < first then redis.call('HSET', counts, 'first_start', job[3]) end
  end
  local prev = redis.call('HGET', STATE .. parent, sid) or 'queued'
  if prev == state then return 0 end
  local total, items = tonumber(plan[1]), tonumber(plan[2])
  local size = 0
  if total > 0 and index < total then  -- core.fanout.plan's ranges: the first (items % total) have one more
    local base = math.floor(items / total)
    size = base
    if index < items - base * total then size = size + 1 end
  end
  if prev ~= 'queued' then redis.call('HINCRBY', counts, prev, -1) end
  if state == 'queued' then
    redis.call('HDEL', STATE .. parent, sid)
  else
    redis.call('HINCRBY', counts, state, 1)
    redis.call('HSET', STATE .. parent, sid, state)
  end
  if prev == 'succeeded' then redis.call('HINCRBY', counts, 'done', -size) end
  if state == 'succeeded' then redis.call('HINCRBY', counts, 'done', size) end
  if state == 'running' then
    redis.call('SADD', RUNNING .. parent, sid)
  elseif prev == 'running' then
    redis.call('SREM', RUNNING .. parent, sid)
  end
  local ttl = redis.call('PTTL', counts)  -- the per-shard keys live as long as the counters
  if ttl > 0 then
    redis.call('PEXPIRE', STATE .. parent, ttl)
    redis.call('PEXPIRE', RUNNING .. parent, ttl)
  end
  return 1
end

-- The queue a parent's children wait in: bulk, or a worker class's own (<queue>@<class>, core/placement.py).
local function queue_of(parent)
  return redis.call('GET', FANQUEUE .. parent) or BULK_NAME
end

local function window_of(w)
  w = tonumber(w)
  if w == nil or w < 0 then return nil end
  if w > 0 then return w end
  return math.max(1, redis.call('SCARD', WORKERS))
end

-- Move the owner's pending shards onto bulk while it has fewer than `window` out there, one parent after another
-- (the parent released from longest ago first). An owner with nothing out puts them at the front.
local function release(owner, window, now)
  local out = {}
  if window == nil then return out end
  local inflight = INFLIGHT .. owner
  local parents = PARENTS .. owner
  local idle = redis.call('SCARD', inflight) == 0
  local into = {}
  while redis.call('SCARD', inflight) < window do
    local head = redis.call('ZRANGE', parents, 0, 0)
    if #head == 0 then break end
    local parent = head[1]
    local pending = PENDING .. parent
    if redis.call('EXISTS', CANCEL .. parent) == 1 then
      redis.call('ZREM', parents, parent)  -- being torn down: nothing of it goes out any more
    else
      local q = queue_of(parent)
      local sid = redis.call('LPOP', pending)
      if sid then redis.call('SREM', WAITING .. q, sid) end
      if sid and redis.call('HGET', JOB .. sid, 'status') == 'deferred' then
        redis.call('HSET', JOB .. sid, 'status', 'queued', 'enqueued_at', now)
        redis.call('SADD', inflight, sid)
        out[#out + 1] = sid
        into[#into + 1] = QUEUE .. q
      end
      if redis.call('LLEN', pending) == 0 then
        redis.call('ZREM', parents, parent)
      else
        local last = redis.call('ZRANGE', parents, -1, -1, 'WITHSCORES')
        redis.call('ZADD', parents, tonumber(last[2]) + 1, parent)
      end
    end
  end
  if idle then
    for i = #out, 1, -1 do redis.call('LPUSH', into[i], out[i]) end
  else
    for i = 1, #out do redis.call('RPUSH', into[i], out[i]) end
  end
  for i = 1, #into do redis.call('SADD', QUEUES, into[i]) end
  if redis.call('SCARD', inflight) == 0 and redis.call('ZCARD', parents) == 0 then
    redis.call('SREM', OWNERS, owner)
  end
  return out
end

-- Release the parent's reduce step (at the front of bulk) once no shard is open and the parent was not canceled.
local function maybe_reduce(parent, now)
  if redis.call('HEXISTS', LIVE, parent) == 0 then return 0 end  -- planned before the window, or torn down
  if redis.call('SCARD', OPEN .. parent) > 0 then return 0 end
  if redis.call('EXISTS', CANCEL .. parent) == 1 then return 0 end
  local rid = parent .. '@REDUCE@'
  if redis.call('HGET', JOB .. rid, 'status') ~= 'deferred' then return 0 end
  local q = queue_of(parent)
  redis.call('HSET', JOB .. rid, 'status', 'queued', 'enqueued_at', now)
  redis.call('LPUSH', QUEUE .. q, rid)
  redis.call('SADD', QUEUES, QUEUE .. q)
  redis.call('HDEL', LIVE, parent)
  for _, id in ipairs(redis.call('LRANGE', PENDING .. parent, 0, -1)) do redis.call('SREM', WAITING .. q, id) end
  redis.call('DEL', PENDING .. parent)
  return 1
end
"""


def _lua(body: str) -> str:
    names = {
        "JOB": JOB_PREFIX, "PENDING": keys.fanout_pending(""), "OPEN": keys.fanout_open(""),
        "WAITING": keys.backlog_pending(""), "FANQUEUE": keys.fanout_queue(""), "QUEUE": QUEUE_PREFIX,
        "BULK_NAME": BULK,
        "PARENTS": keys.fanout_parents(""), "INFLIGHT": keys.fanout_inflight(""), "LIVE": keys.FANOUT_LIVE,
        "OWNERS": keys.FANOUT_OWNERS, "CANCEL": keys.cancel(""), "BULK": QUEUE_PREFIX + BULK,
        "QUEUES": Queue.redis_queues_keys, "WORKERS": WORKERS_BY_QUEUE_KEY % BULK,
        "DEFERRED": "rq:deferred:", "PLANNING": PLANNING, "REDUCE": reduce_id(""),
        "COUNTS": keys.fanout_counts(""), "STATE": keys.fanout_state(""), "RUNNING": keys.fanout_running(""),
    }
    text = _LUA + body
    for name, value in names.items():
        text = text.replace(f"@{name}@", value)
    return text


# ARGV: owner, window, now. Answers the shards released.
RELEASE = _lua("""
return release(ARGV[1], window_of(ARGV[2]), ARGV[3])
""")

# A shard ended (succeeded, failed for good, canceled; idempotent). ARGV: shard, parent, owner, window, now.
# Answers {1 when the reduce step was released, else 0, then the shards released}.
END = _lua("""
sync(ARGV[2], ARGV[1])
redis.call('SREM', INFLIGHT .. ARGV[3], ARGV[1])
redis.call('SREM', OPEN .. ARGV[2], ARGV[1])
local answer = {maybe_reduce(ARGV[2], ARGV[5])}
for _, sid in ipairs(release(ARGV[3], window_of(ARGV[4]), ARGV[5])) do answer[#answer + 1] = sid end
return answer
""")

# Count one shard's state change in its parent's counters (idempotent). ARGV: parent, shard. Answers 1 when counted.
SYNC = _lua("""
return sync(ARGV[1], ARGV[2])
""")

# A parent's summary in one call: {counters (HGETALL), running shards, their {status, meta}, the reduce step's
# {status, meta, started_at, ended_at}}, or nil without counters. ARGV: parent.
VIEW = _lua("""
local counts = redis.call('HGETALL', COUNTS .. ARGV[1])
if #counts == 0 then return false end
local running = redis.call('SMEMBERS', RUNNING .. ARGV[1])
local rows = {}
for i, sid in ipairs(running) do rows[i] = redis.call('HMGET', JOB .. sid, 'status', 'meta') end
return {counts, running, rows, redis.call('HMGET', JOB .. ARGV[1] .. '@REDUCE@', 'status', 'meta', 'started_at',
                                          'ended_at')}
""")

# The parent planned every shard. ARGV: parent, owner, window, now. Answers like END.
ARM = _lua("""
redis.call('SREM', OPEN .. ARGV[1], PLANNING)
local answer = {maybe_reduce(ARGV[1], ARGV[4])}
for _, sid in ipairs(release(ARGV[2], window_of(ARGV[3]), ARGV[4])) do answer[#answer + 1] = sid end
return answer
""")

# Cancel a fan-out: every child still waiting (pending, deferred or queued on bulk, and the reduce step) is canceled
# at once, a running shard or reduce step gets its cancel flag (it stops at its next progress step), the
# bookkeeping goes, and the owner's window is refilled from its other parents.
# ARGV: parent, owner (when the fan-out is not live any more), window, now, canceled registry, its score,
# failure TTL, cancel-flag TTL. Answers the children canceled here.
TEAR_DOWN = _lua("""
local parent = ARGV[1]
local owner = redis.call('HGET', LIVE, parent) or ARGV[2]
local now, registry, score, ttl, flag_ttl = ARGV[4], ARGV[5], ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
local canceled = {}
local q = queue_of(parent)
local function cancel_waiting(id)
  local job = JOB .. id
  local status = redis.call('HGET', job, 'status')
  if status ~= 'deferred' and status ~= 'queued' and status ~= 'scheduled' then return false end
  if status == 'queued' then
    redis.call('LREM', QUEUE .. (redis.call('HGET', job, 'origin') or q), 0, id)
    redis.call('SET', CANCEL .. id, '1', 'EX', flag_ttl)  -- in case a worker popped it a moment ago
  end
  redis.call('ZREM', DEFERRED .. q, id)
  redis.call('HSET', job, 'status', 'canceled', 'ended_at', now)
  redis.call('ZADD', registry, score, id)
  redis.call('EXPIRE', job, ttl)
  sync(parent, id)
  canceled[#canceled + 1] = id
  return true
end
for _, id in ipairs(redis.call('LRANGE', PENDING .. parent, 0, -1)) do
  redis.call('SREM', WAITING .. q, id)
  cancel_waiting(id)
  redis.call('SREM', OPEN .. parent, id)
end
redis.call('DEL', PENDING .. parent)
redis.call('ZREM', PARENTS .. owner, parent)
for _, id in ipairs(redis.call('SMEMBERS', OPEN .. parent)) do
  if id ~= PLANNING then
    local status = redis.call('HGET', JOB .. id, 'status')
    if status == 'started' then
      redis.call('SET', CANCEL .. id, '1', 'EX', flag_ttl)
    else
      cancel_waiting(id)
      redis.call('SREM', INFLIGHT .. owner, id)
      redis.call('SREM', OPEN .. parent, id)
    end
  end
end
redis.call('SREM', OPEN .. parent, PLANNING)
local rid = parent .. '@REDUCE@'
if not cancel_waiting(rid) and redis.call('HGET', JOB .. rid, 'status') == 'started' then
  redis.call('SET', CANCEL .. rid, '1', 'EX', flag_ttl)  -- merging: it stops at its next progress step
end
redis.call('HDEL', LIVE, parent)
release(owner, window_of(ARGV[3]), now)
return canceled
""")


def _now() -> str:
    return utcformat(rq_now())


def _window(window: int | None) -> int:
    return -1 if window is None else int(window)


def _call(redis: Any, script: str, args: list[Any]) -> Any:
    return redis.register_script(script)(keys=[], args=args)


def parent_of(shard: str) -> str:
    """The parent id of shard ``<parent>-s00000``."""
    return shard.rsplit("-s", 1)[0]


def is_shard(meta: dict[str, Any]) -> bool:
    return meta.get("parent") is not None and meta.get("shard") is not None


def release(redis: Any, owner: str, window: int) -> list[str]:
    """Fill the owner's window from its pending shards; returns the shards released."""
    return [s.decode() for s in _call(redis, RELEASE, [owner, _window(window), _now()])]


def shard_ended(redis: Any, shard: str, parent: str, owner: str, window: int | None) -> bool:
    """Count shard ``shard`` as ended (idempotent): release the reduce step when it was the parent's last open one,
    and the owner's next pending shards (none with ``window`` None). Returns whether the reduce step was released."""
    answer = _call(redis, END, [shard, parent, owner, _window(window), _now()])
    return bool(answer[0])


def shard_sync(redis: Any, shard: str, parent: str | None = None) -> bool:
    """Count shard ``shard``'s current state in its parent's counters (idempotent; nothing for a fan-out without
    counters). Returns whether a transition was counted."""
    return bool(_call(redis, SYNC, [parent or parent_of(shard), shard]))


def init_counters(pipe: Any, parent: str, n_shards: int, n_items: int, ttl_s: int) -> None:
    """The parent's counters, created with its plan (left as they are when the parent plans again); the shards'
    state keys take their TTL as they are written."""
    pipe.hsetnx(keys.fanout_counts(parent), "total", n_shards)
    pipe.hsetnx(keys.fanout_counts(parent), "items", n_items)
    pipe.expire(keys.fanout_counts(parent), ttl_s)


def arm(redis: Any, parent: str, owner: str, window: int) -> bool:
    """The parent has planned all its shards: from now on its last shard's end releases the reduce step (released
    here when every shard ended already). Returns whether the reduce step was released."""
    return bool(_call(redis, ARM, [parent, owner, _window(window), _now()])[0])


def tear_down(redis: Any, parent: str, owner: str | None, settings: Any) -> list[str]:
    """Cancel the fan-out of ``parent``: its children that wait are canceled (returned), running shards are flagged
    to stop, its bookkeeping is removed and the owner's window goes to its other parents. Idempotent."""
    ttl = settings.failure_ttl_s
    queue = (redis.get(keys.fanout_queue(parent)) or BULK.encode()).decode()
    canceled = [c.decode() for c in _call(redis, TEAR_DOWN, [
        parent, owner or "", _window(settings.shard_window), _now(),
        CanceledJobRegistry(queue, connection=redis).key, time.time() + ttl, ttl, settings.result_ttl_s])]
    if canceled:
        meta = _meta_of(redis.hget(JOB_PREFIX + parent, "meta"))
        fan = meta.get("fanout") or {}
        n_reduce = sum(1 for c in canceled if c == reduce_id(parent))
        if len(canceled) > n_reduce:
            record_finished(redis, fan.get("shard_kind") or "unknown", "canceled", None, len(canceled) - n_reduce)
        if n_reduce:
            record_finished(redis, fan.get("reduce_kind") or "unknown", "canceled", None)
    return canceled


def still_waiting(redis: Any, parent: str, meta: dict[str, Any]) -> list[str]:
    """The parent's children (planned shards and the reduce step) that are still queued or deferred: none after
    :func:`tear_down`, except for a fan-out planned before the window existed. One pipelined read."""
    ids = related(redis, parent, meta)
    with redis.pipeline(transaction=False) as pipe:
        for jid in ids:
            pipe.hget(JOB_PREFIX + jid, "status")
        statuses = pipe.execute()
    return [jid for jid, st in zip(ids, statuses, strict=True) if st in _WAITING_RQ]


def sweep(redis: Any, settings: Any) -> dict[str, int]:
    """Maintenance (any worker, any time; idempotent): tear down the fan-outs whose parent failed or was canceled,
    count as ended the in-flight shards that ended without it (their worker died in between), and refill every
    owner's window. Returns how many of each it did."""
    torn = ended = 0
    live = {p.decode(): o.decode() for p, o in redis.hgetall(keys.FANOUT_LIVE).items()}
    if live:
        parents = sorted(live)
        with redis.pipeline(transaction=False) as pipe:
            for parent in parents:
                pipe.hget(JOB_PREFIX + parent, "status")
            statuses = pipe.execute()
        for parent, status in zip(parents, statuses, strict=True):
            if status in (b"failed", b"stopped", b"canceled"):
                tear_down(redis, parent, live[parent], settings)
                torn += 1
    for owner in sorted(o.decode() for o in redis.smembers(keys.FANOUT_OWNERS)):
        shards = sorted(s.decode() for s in redis.smembers(keys.fanout_inflight(owner)))
        if shards:
            with redis.pipeline(transaction=False) as pipe:
                for sid in shards:
                    pipe.hget(JOB_PREFIX + sid, "status")
                statuses = pipe.execute()
            for sid, status in zip(shards, statuses, strict=True):
                if status is None or status in _TERMINAL_RQ:
                    shard_ended(redis, sid, parent_of(sid), owner, None)
                    ended += 1
                else:  # a start (or requeue) its worker did not live to count
                    shard_sync(redis, sid)
        release(redis, owner, settings.shard_window)
    return {"torn_down": torn, "ended": ended}
