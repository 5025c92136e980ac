"""A fanned-out parent's view from its counters (O(1) in its shards) equals the reference view that reads every
shard (``core.fanout.overlay(scan=True)``), through starts, progress, retries, requeues after a lost worker,
failures, cancels, reports made twice, a start nobody reported, and a tear-down; and the counters' view reads only
the running shards, however many shards there are."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.fanjobs import PLUGINS, FanRequest
from tests.fanjobs import register as register_fan_kinds

register_fan_kinds()

ALICE = {"Authorization": "Bearer key-alice"}


def _views(r, parent: str) -> tuple[dict, dict]:
    """(the counters' view, the scan's view) of ``parent``, without the time-dependent ETA."""
    from core import fanout
    from core.jobview import VIEW_FIELDS, fields_to_raw, job_view, parse_meta

    raw = fields_to_raw(r.hmget(f"rq:job:{parent}", *VIEW_FIELDS))
    base = job_view(parent, raw)
    meta = parse_meta(raw)
    out = []
    for scan in (False, True):
        view = fanout.overlay(r, parent, base, meta, scan=scan)
        view["progress"] = {k: v for k, v in view["progress"].items() if k != "eta_s"}
        out.append(view)
    return out[0], out[1]


def _agree(r, parent: str) -> dict:
    counted, scanned = _views(r, parent)
    assert counted == scanned
    return counted


def _planned(redis_settings, n: int, shard_size: int, window: int = 2):
    import redis as redis_py
    from rq import Queue
    from rq.serializers import JSONSerializer

    from core.settings import Settings
    from workers import fanout as worker_fanout
    from workers.context import JobContext

    settings = Settings(EXPLAINQ_HOME=str(redis_settings.home), REDIS_URL=redis_settings.redis_url,
                        EXPLAINQ_SHARD_WINDOW=window)
    r = redis_py.Redis.from_url(settings.redis_url)
    job = Queue("explain", connection=r, serializer=JSONSerializer).enqueue_call(
        "workers.runner.execute", args=("test_fan", {"n": n}), meta={"kind": "test_fan", "owner": "alice"})
    r.lrem("rq:queue:explain", 0, job.id)
    r.hset(job.key, "status", "started")
    worker_fanout.fan_out(JobContext(settings, job, device="cpu"), "test_fan", FanRequest(n=n, shard_size=shard_size),
                          n, shard_size, retries=1)
    r.hset(job.key, "status", "finished")  # the parent planned; its view is its children's from now on
    return settings, r, job.id


def _set(r, sid: str, status: str, **meta) -> None:
    key = f"rq:job:{sid}"
    old = json.loads(r.hget(key, "meta") or b"{}")
    fields = {"status": status, "meta": json.dumps({**old, **meta})}
    if status == "started":
        fields["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    r.hset(key, mapping=fields)


def test_counters_equal_the_scan_through_retries_requeues_failures_and_cancels(redis_settings):
    from core import fanout

    settings, r, parent = _planned(redis_settings, n=40, shard_size=3)  # 14 shards: 12 of 3 items, 2 of 2
    s = [fanout.shard_id(parent, i) for i in range(14)]
    view = _agree(r, parent)
    assert view["shards"] == {"total": 14, "queued": 14, "running": 0, "succeeded": 0, "failed": 0, "canceled": 0}

    def end(sid):
        for _ in range(2):  # a second report of the same end counts nothing
            fanout.shard_ended(r, sid, parent, "alice", settings.shard_window)

    # s0 starts, reports progress, is retried (queued again), starts again and succeeds
    _set(r, s[0], "started", progress={"done": 1, "total": 4})
    assert fanout.shard_sync(r, s[0]) and not fanout.shard_sync(r, s[0])
    assert _agree(r, parent)["shards"]["running"] == 1
    _set(r, s[0], "queued")
    fanout.shard_sync(r, s[0])
    assert _agree(r, parent)["shards"]["running"] == 0
    _set(r, s[0], "started", progress={"done": 3, "total": 4})
    fanout.shard_sync(r, s[0])
    assert _agree(r, parent)["progress"]["done"] == 2.25
    _set(r, s[0], "finished")
    end(s[0])
    # s1: its worker is lost mid-run, the reaper requeues it (status queued), then it fails for good
    _set(r, s[1], "started")
    fanout.shard_sync(r, s[1])
    _set(r, s[1], "queued", lost_attempts=1)
    fanout.shard_sync(r, s[1])
    _set(r, s[1], "started")
    fanout.shard_sync(r, s[1])
    _set(r, s[1], "failed")
    end(s[1])
    # s2 stops on a cancel (a failure whose meta says canceled); s13 (2 items) succeeds without a reported start
    _set(r, s[2], "started")
    fanout.shard_sync(r, s[2])
    _set(r, s[2], "failed", canceled=True)
    end(s[2])
    _set(r, s[13], "finished")
    end(s[13])
    view = _agree(r, parent)
    assert view["shards"] == {"total": 14, "queued": 10, "running": 0, "succeeded": 2, "failed": 1, "canceled": 1}
    assert view["progress"]["done"] == 5  # 3 + 2 items
    # s3 starts on a worker that dies before counting it: maintenance's sweep counts it
    r.sadd("explainq:fanout:inflight:alice", s[3])
    _set(r, s[3], "started", progress={"done": 2, "total": 4})
    counted, scanned = _views(r, parent)
    assert counted["shards"]["running"] == 0 and scanned["shards"]["running"] == 1  # not counted yet
    fanout.sweep(r, settings)
    assert _agree(r, parent)["shards"]["running"] == 1
    # the counters' view reads the running shards and the reduce step, not every shard
    r.config_resetstat()
    _views(r, parent)
    calls = {k: v["calls"] for k, v in r.info("commandstats").items()}
    assert calls.get("cmdstat_hmget", 0) == (1 + 1) + (14 + 1) + 1  # counters' view, the scan, the parent
    # the rest succeed; the counters end where the scan does
    for sid in s[3:13]:
        _set(r, sid, "started")
        fanout.shard_sync(r, sid)
        _set(r, sid, "finished")
        end(sid)
    view = _agree(r, parent)
    assert view["shards"] == {"total": 14, "queued": 0, "running": 0, "succeeded": 12, "failed": 1, "canceled": 1}
    assert view["progress"]["done"] == 40 - 3 - 3


def test_a_tear_down_counts_every_waiting_shard_as_canceled(redis_settings):
    from core import fanout

    settings, r, parent = _planned(redis_settings, n=9, shard_size=1, window=3)
    running = fanout.shard_id(parent, 0)
    _set(r, running, "started")
    fanout.shard_sync(r, running)
    fanout.tear_down(r, parent, "alice", settings)
    view = _agree(r, parent)
    assert view["shards"] == {"total": 9, "queued": 0, "running": 1, "succeeded": 0, "failed": 0, "canceled": 8}
    _set(r, running, "stopped")  # it stops at its next progress step
    fanout.shard_ended(r, running, parent, "alice", settings.shard_window)
    assert _agree(r, parent)["shards"]["canceled"] == 9


def test_a_fanout_without_counters_is_viewed_by_the_scan(redis_settings):
    from core import fanout, keys

    _settings, r, parent = _planned(redis_settings, n=4, shard_size=1)
    r.delete(keys.fanout_counts(parent))  # planned before the counters existed
    sid = fanout.shard_id(parent, 1)
    _set(r, sid, "finished")
    assert not fanout.shard_sync(r, sid)
    counted, _ = _views(r, parent)
    assert counted["shards"]["succeeded"] == 1  # the reference read it


def _service(tmp_path, **env):
    from tests.service import Service

    extra = {"EXPLAINQ_KIND_PLUGINS": PLUGINS, **{k: str(v) for k, v in env.items()}}
    return Service(tmp_path, queues=("explain,bulk",), api_keys="alice:key-alice", heartbeat_ttl_s=3, env=extra)


def test_after_a_run_with_failures_and_retries_the_counters_equal_the_scan(tmp_path):
    with _service(tmp_path, EXPLAINQ_SHARD_WINDOW=2) as svc:
        r = svc.client.post("/test/fan", json={"n": 8, "step_s": 0, "fail": [2, 5], "shard_retries": 1,
                                              "max_failed_fraction": 0.5}, headers=ALICE)
        assert r.status_code == 202, r.text
        parent = r.json()["id"]
        view = svc.wait(parent, headers=ALICE, timeout_s=60)
        assert view["status"] == "succeeded", (view, svc.worker_logs())
        assert view["shards"] == {"total": 8, "queued": 0, "running": 0, "succeeded": 6, "failed": 2,
                                  "canceled": 0}
        counted, scanned = _views(svc.redis(), parent)
        assert counted == scanned
        assert counted["shards"] == view["shards"] and counted["progress"] == {
            k: v for k, v in view["progress"].items() if k != "eta_s"}


@pytest.mark.slow
def test_a_shard_requeued_after_its_worker_is_killed_is_counted_once(tmp_path):
    with _service(tmp_path, EXPLAINQ_SHARD_WINDOW=1) as svc:
        r = svc.client.post("/test/fan", json={"n": 3, "step_s": 4, "shard_retries": 1}, headers=ALICE)
        parent = r.json()["id"]
        deadline = time.monotonic() + 60
        while svc.client.get(f"/jobs/{parent}", headers=ALICE).json().get("shards", {}).get("running", 0) == 0:
            assert time.monotonic() < deadline, svc.worker_logs()
            time.sleep(0.05)
        os.killpg(svc.workers[0].pid, signal.SIGKILL)
        svc.workers[0].wait()
        svc.start_worker("explain,bulk")
        view = svc.wait(parent, headers=ALICE, timeout_s=120)
        assert view["status"] == "succeeded", (view, svc.worker_logs())
        rd = svc.redis()
        lost = [json.loads(rd.hget(f"rq:job:{parent}-s{i:05d}", "meta")).get("lost_attempts", 0) for i in range(3)]
        assert sum(lost) == 1, lost  # one shard went back on its queue after its worker died
        counted, scanned = _views(rd, parent)
        assert counted == scanned
        assert counted["shards"] == {"total": 3, "queued": 0, "running": 0, "succeeded": 3, "failed": 0,
                                     "canceled": 0}
