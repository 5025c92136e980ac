"""Fan-out under the quotas, with more than one tenant: a parent counts against its owner's active jobs until its
reduce step ends, an owner holds at most ``EXPLAINQ_SHARD_WINDOW`` shards on the shared ``bulk`` queue, another
owner's small job starts after at most that many of the first owner's shards, a cancel during planning leaves no
child waiting, and a worker that dies between a shard's end and the release of the next one strands nothing.

The fan-out kind is the cheap ``test_fan`` of ``tests/fanjobs.py``: shards that sleep, through the product's own
planning, release and reduce.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from tests.fanjobs import PLUGINS, FanRequest
from tests.fanjobs import register as register_fan_kinds

register_fan_kinds()  # the API process must know the route before the app is created

ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"Authorization": "Bearer key-bob"}
KEYS = "alice:key-alice,bob:key-bob"
WAITING = (b"queued", b"deferred", b"scheduled")


def _service(tmp_path, queues=("explain,bulk",), heartbeat_ttl_s=20, **env):
    from tests.service import Service

    extra = {"EXPLAINQ_KIND_PLUGINS": PLUGINS, **{k: str(v) for k, v in env.items()}}
    return Service(tmp_path, queues=queues, api_keys=KEYS, heartbeat_ttl_s=heartbeat_ttl_s, env=extra)


def _post(svc, body, headers=ALICE, expect=202):
    r = svc.client.post("/test/fan", json=body, headers=headers)
    assert r.status_code == expect, r.text
    return r.json()["id"] if expect == 202 else r.json()


def _status(svc, job_id):
    return svc.redis().hget(f"rq:job:{job_id}", "status")


def _until(predicate, timeout_s, what, interval_s=0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def _ts(value: bytes | None) -> float | None:
    if not value:
        return None
    return datetime.strptime(value.decode(), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def _shards(parent: str, n: int) -> list[str]:
    return [f"{parent}-s{i:05d}" for i in range(n)]


def test_a_parent_counts_against_the_active_quota_until_its_reduce_ends(tmp_path):
    with _service(tmp_path, EXPLAINQ_MAX_ACTIVE_JOBS=2, EXPLAINQ_SHARD_WINDOW=1) as svc:
        slow = {"n": 40, "step_s": 0.5}
        first, second = _post(svc, slow), _post(svc, slow)
        # both parents have planned (their own RQ jobs ended): only their shards and reduce steps are left
        _until(lambda: _status(svc, first) == b"finished" and _status(svc, second) == b"finished", 60,
               "both parents to plan")
        assert svc.client.get(f"/jobs/{first}", headers=ALICE).json()["status"] == "running"
        refused = _post(svc, slow, expect=429)
        assert refused["detail"]["limit"] == "EXPLAINQ_MAX_ACTIVE_JOBS", refused
        _post(svc, {"n": 2, "step_s": 0}, headers=BOB)  # another tenant is not held back by alice's quota
        # canceling a fan-out ends its reduce step, and that frees the slot
        assert svc.client.delete(f"/jobs/{first}", headers=ALICE).status_code == 202
        assert svc.wait(first, headers=ALICE, timeout_s=30)["status"] == "canceled"
        third = _post(svc, {"n": 2, "step_s": 0})
        assert _post(svc, slow, expect=429)["detail"]["limit"] == "EXPLAINQ_MAX_ACTIVE_JOBS"
        for job in (second, third):
            svc.client.delete(f"/jobs/{job}", headers=ALICE)


def test_an_owner_holds_at_most_the_window_on_the_bulk_queue(tmp_path):
    window = 2
    with _service(tmp_path, EXPLAINQ_SHARD_WINDOW=window) as svc:
        parents = [_post(svc, {"n": 12, "step_s": 0.1}) for _ in range(3)]
        r = svc.redis()
        children = [sid for p in parents for sid in _shards(p, 12)]
        peak_queued = peak_in_flight = samples = 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            on_bulk = {m.decode() for m in r.lrange("rq:queue:bulk", 0, -1)}
            with r.pipeline(transaction=False) as pipe:
                for sid in children:
                    pipe.hget(f"rq:job:{sid}", "status")
                statuses = pipe.execute()
            queued = sum(1 for sid in children if sid in on_bulk)
            running = sum(1 for s in statuses if s == b"started")
            peak_queued = max(peak_queued, queued)
            peak_in_flight = max(peak_in_flight, queued + running)
            samples += 1
            if all(_status(svc, f"{p}-reduce") == b"finished" for p in parents):
                break
            time.sleep(0.02)
        assert samples > 20
        assert peak_queued <= window, peak_queued
        assert peak_in_flight <= window, peak_in_flight
        # the owner's parents take turns: the first six shards to start cover all three
        starts = sorted((_ts(r.hget(f"rq:job:{sid}", "started_at")) or 0, sid) for sid in children)
        assert {sid.rsplit("-s", 1)[0] for _, sid in starts[:6]} == set(parents), starts[:6]
        for p in parents:  # the window changes the order, not the outcome
            view = svc.wait(p, headers=ALICE, timeout_s=60)
            assert view["status"] == "succeeded", view
            assert view["shards"] == {"total": 12, "queued": 0, "running": 0, "succeeded": 12, "failed": 0,
                                      "canceled": 0}
            assert view["progress"]["done"] == view["progress"]["total"] == 12
            assert svc.client.get(f"/jobs/{p}/result", headers=ALICE).json() == {"n": 12, "failed": []}


def test_failed_shards_release_the_next_ones_and_the_reduce_decides(tmp_path):
    with _service(tmp_path, EXPLAINQ_SHARD_WINDOW=1) as svc:
        tolerated = _post(svc, {"n": 6, "step_s": 0, "fail": [2], "max_failed_fraction": 0.5})
        too_many = _post(svc, {"n": 6, "step_s": 0, "fail": [1, 4], "max_failed_fraction": 0.1})
        ok = svc.wait(tolerated, headers=ALICE, timeout_s=60)
        assert ok["status"] == "succeeded" and ok["shards"]["failed"] == 1 and ok["shards"]["succeeded"] == 5
        assert svc.client.get(f"/jobs/{tolerated}/result", headers=ALICE).json() == {"n": 5, "failed": [2]}
        bad = svc.wait(too_many, headers=ALICE, timeout_s=60)
        assert bad["status"] == "failed" and bad["error"]["code"] == "too_many_failures", bad


def test_another_owners_small_job_starts_after_at_most_the_window_of_shards(tmp_path):
    window = 2
    with _service(tmp_path, EXPLAINQ_SHARD_WINDOW=window) as svc:
        big = _post(svc, {"n": 80, "step_s": 0.25})
        _until(lambda: svc.client.get(f"/jobs/{big}", headers=ALICE).json().get("shards", {}).get("succeeded"),
               60, "alice's first shard to end")
        t_bob = time.time()
        small = _post(svc, {"n": 4, "step_s": 0.25}, headers=BOB)
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            view = svc.client.get(f"/jobs/{small}", headers=BOB).json()
            if view["status"] in ("succeeded", "failed", "canceled"):
                break
            time.sleep(0.1)
        assert view["status"] == "succeeded", view
        r = svc.redis()
        bob_starts = [_ts(r.hget(f"rq:job:{sid}", "started_at")) for sid in _shards(small, 4)]
        alice_starts = [_ts(r.hget(f"rq:job:{sid}", "started_at")) for sid in _shards(big, 80)]
        overtaking = [t for t in alice_starts if t is not None and t_bob < t < min(bob_starts)]
        assert len(overtaking) <= window, (len(overtaking), window)
        # bob's four shards went by while alice's run was far from over
        left = svc.client.get(f"/jobs/{big}", headers=ALICE).json()["shards"]
        assert left["queued"] >= 50, left
        svc.client.delete(f"/jobs/{big}", headers=ALICE)


def test_cancel_during_planning_leaves_no_child_queued_deferred_or_pending(tmp_path):
    from core import keys

    n = 3000
    with _service(tmp_path, EXPLAINQ_SHARD_WINDOW=1, EXPLAINQ_MAX_SHARDS=n) as svc:
        parent = _post(svc, {"n": n, "step_s": 0.05, "plan_delay_s": 0.001})
        r = svc.redis()
        # planning has begun: some shards exist, far from all of them
        _until(lambda: r.exists(f"rq:job:{parent}-s00050"), 60, "the parent to plan its first shards", 0.01)
        assert not r.exists(f"rq:job:{parent}-s{n - 1:05d}")
        assert svc.client.delete(f"/jobs/{parent}", headers=ALICE).status_code == 202
        view = svc.wait(parent, headers=ALICE, timeout_s=60)
        assert view["status"] == "canceled", view
        _until(lambda: not any(s == b"started" for s in _statuses(r, parent, n)), 30, "running shards to stop")
        time.sleep(1.0)  # anything a late step would still enqueue
        ids = _shards(parent, n) + [f"{parent}-reduce"]
        statuses = dict(zip(ids, _statuses(r, parent, n), strict=True))
        waiting = sorted(jid for jid, s in statuses.items() if s in WAITING)
        assert waiting == [], (len(waiting), waiting[:5])
        assert not [m for m in r.lrange("rq:queue:bulk", 0, -1) if m.decode().startswith(parent)]
        assert not [m for m in r.zrange("rq:deferred:bulk", 0, -1) if m.decode().startswith(parent)]
        assert statuses[f"{parent}-reduce"] in (None, b"canceled")
        for name in ("fanout_pending", "fanout_open"):  # the fan-out's own bookkeeping is gone too
            assert not r.exists(getattr(keys, name)(parent)), name
        assert svc.client.get(f"/jobs/{parent}", headers=ALICE).json()["status"] == "canceled"
        # and the owner's quota slot is free again
        assert svc.wait(_post(svc, {"n": 2, "step_s": 0}), headers=ALICE, timeout_s=60)["status"] == "succeeded"


def _statuses(r, parent: str, n: int) -> list[bytes | None]:
    with r.pipeline(transaction=False) as pipe:
        for jid in _shards(parent, n) + [f"{parent}-reduce"]:
            pipe.hget(f"rq:job:{jid}", "status")
        return pipe.execute()


def test_a_worker_killed_between_a_shard_end_and_the_release_strands_nothing(tmp_path):
    """The first worker dies (``os._exit``) right after RQ recorded its first shard as finished, before anything
    else ran; a worker started later releases the pending shards in its maintenance pass, and the job completes."""
    n = 5
    plugins = PLUGINS + ",tests.fanjobs:die_after_first_shard_end"
    with _service(tmp_path, heartbeat_ttl_s=3, EXPLAINQ_SHARD_WINDOW=1, EXPLAINQ_KIND_PLUGINS=plugins) as svc:
        parent = _post(svc, {"n": n, "step_s": 0.1})
        crashed = svc.workers[0]
        _until(lambda: crashed.poll() is not None, 60, "the worker to die after its first shard")
        assert (tmp_path / "fault-fired").exists(), svc.worker_logs()
        r = svc.redis()
        statuses = _statuses(r, parent, n)
        assert statuses[0] == b"finished"
        # nothing else was released meanwhile: the rest waits in the owner's pending list, not on bulk
        assert not [m for m in r.lrange("rq:queue:bulk", 0, -1) if m.decode().startswith(f"{parent}-s")]
        assert statuses[1:n] == [b"deferred"] * (n - 1), statuses
        svc.start_worker("explain,bulk")
        view = svc.wait(parent, headers=ALICE, timeout_s=90)
        assert view["status"] == "succeeded", (view, svc.worker_logs())
        assert view["shards"]["succeeded"] == n
        assert svc.client.get(f"/jobs/{parent}/result", headers=ALICE).json() == {"n": n, "failed": []}


def test_planning_again_creates_nothing_twice_and_each_end_counts_once(redis_settings, monkeypatch):
    """No worker: the planning of one parent is interrupted (a shutdown mid-way) and run again, then its shards'
    ends are reported by hand, some twice. The window holds, nothing is doubled, the reduce step comes last."""
    import redis as redis_py
    from rq import Queue
    from rq.serializers import JSONSerializer

    from core import fanout, keys
    from core.settings import Settings
    from workers import fanout as worker_fanout
    from workers.context import JobContext, WorkerShutdown

    settings = Settings(EXPLAINQ_HOME=str(redis_settings.home), REDIS_URL=redis_settings.redis_url,
                        EXPLAINQ_SHARD_WINDOW=2)
    r = redis_py.Redis.from_url(settings.redis_url)
    job = Queue("explain", connection=r, serializer=JSONSerializer).enqueue_call(
        "workers.runner.execute", args=("test_fan", {"n": 10}), meta={"kind": "test_fan", "owner": "alice"})
    r.lrem("rq:queue:explain", 0, job.id)
    r.hset(job.key, "status", "started")  # as a worker runs it
    ctx = JobContext(settings, job, device="cpu")
    monkeypatch.setattr(worker_fanout, "PLAN_BATCH", 4, raising=False)
    interrupt = {"at": 6}

    calls = {"n": 0}

    def shard_items(request, start, end):
        calls["n"] += 1
        if calls["n"] - 1 == interrupt["at"]:
            interrupt["at"] = None
            raise WorkerShutdown("worker is shutting down")
        return request, start, end

    def plan():
        calls["n"] = 0
        return worker_fanout.fan_out(ctx, "test_fan", FanRequest(n=10, shard_size=1), 10, 1, retries=0,
                                     shard_items=shard_items)

    with pytest.raises(WorkerShutdown):
        plan()
    assert r.llen("rq:queue:bulk") == 2, r.lrange("rq:queue:bulk", 0, -1)  # the window, from the first batch
    assert r.hget(f"rq:job:{job.id}-reduce", "status") == b"deferred"
    plan()
    plan()  # and once more, as if the first complete run's end had not been recorded
    shards = _shards(job.id, 10)
    bulk = [m.decode() for m in r.lrange("rq:queue:bulk", 0, -1)]
    pending = [m.decode() for m in r.lrange(keys.fanout_pending(job.id), 0, -1)]
    assert bulk == shards[:2]  # the window, in order
    assert pending == shards[2:]  # each shard once
    assert r.zcard(keys.children(job.id)) == 10
    assert {m.decode() for m in r.smembers(keys.fanout_open(job.id))} == set(shards)

    order = []
    while r.llen("rq:queue:bulk"):
        sid = r.lpop("rq:queue:bulk").decode()
        if sid.endswith("-reduce"):
            order.append(sid)
            break
        order.append(sid)
        assert r.scard(keys.fanout_inflight("alice")) <= 2
        r.hset(f"rq:job:{sid}", "status", "finished")
        for _ in range(2):  # a second report of the same end changes nothing
            fanout.shard_ended(r, sid, job.id, "alice", settings.shard_window)
    assert order == shards + [f"{job.id}-reduce"]
    assert r.hget(f"rq:job:{job.id}-reduce", "status") == b"queued"
    assert not r.exists(keys.fanout_pending(job.id), keys.fanout_open(job.id), keys.fanout_inflight("alice"),
                        keys.fanout_parents("alice"))
    assert not r.hexists(keys.FANOUT_LIVE, job.id) and not r.sismember(keys.FANOUT_OWNERS, "alice")
    # a cancel while the reduce step merges reaches it too: it stops at its next progress step
    r.hset(f"rq:job:{job.id}-reduce", "status", "started")
    fanout.tear_down(r, job.id, "alice", settings)
    assert r.exists(keys.cancel(f"{job.id}-reduce"))
