"""Workers under faults: Redis going away mid-job, reaping only dead workers' jobs, zombies, NaN, JSON logs."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from core import reaper
from core.jobview import job_view
from core.redis_server import redis_client
from tests.service import Service


def _submit(svc: Service, route: str = "/test/sleep", **body: Any) -> str:
    r = svc.client.post(route, json=body)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def _raw(svc: Service, job_id: str) -> dict[bytes, bytes]:
    return svc.redis().hgetall(f"rq:job:{job_id}")


def _wait_raw(svc: Service, job_id: str, predicate, timeout_s: float, what: str) -> dict[bytes, bytes]:
    """Poll the job hash in Redis directly (riding out connection errors while Redis restarts)."""
    deadline = time.monotonic() + timeout_s
    raw: dict[bytes, bytes] = {}
    while time.monotonic() < deadline:
        try:
            raw = _raw(svc, job_id)
            if predicate(raw):
                return raw
        except Exception:  # Redis restarting
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{what}: {raw}\n{svc.worker_logs()}")


def _done(raw: dict[bytes, bytes]) -> float:
    meta = json.loads(raw.get(b"meta", b"{}"))
    return (meta.get("progress") or {}).get("done") or 0


@pytest.mark.slow
def test_redis_down_for_10s_mid_job_the_job_keeps_computing_and_succeeds(tmp_path):
    env = {"EXPLAINQ_REDIS_RETRY_S": "60"}
    with Service(tmp_path, heartbeat_ttl_s=20, queues=("train",), env=env) as svc:
        t0 = time.monotonic()
        job_id = _submit(svc, "/test/train-sleep", steps=250, step_s=0.1)  # ~25 s of "training"
        before = _done(_wait_raw(svc, job_id, lambda r: _done(r) >= 30, 60, "job never progressed"))
        svc.redis_server.stop()  # SIGTERM: AOF flushed
        time.sleep(10)
        assert svc.workers[0].poll() is None, svc.worker_logs()
        svc.redis_server.start()  # same port, same AOF directory, same password
        raw = _wait_raw(svc, job_id, lambda r: r.get(b"status") == b"finished", 60, "job did not finish")
        elapsed = time.monotonic() - t0
        # It computed through the outage: a job that had stalled for 10 s would take ~35 s.
        assert elapsed < 33, elapsed
        assert _done(raw) == 250 > before
        body = svc.wait(job_id, timeout_s=10)
        assert body["status"] == "succeeded" and body["error"] is None
        assert svc.client.get(f"/jobs/{job_id}/result").json()["steps"] == 250
        logs = svc.worker_logs()
        assert "redis unreachable" in logs and "found an unhandled exception" not in logs
        # The worker's loop survived: it takes new work.
        assert svc.wait(_submit(svc, "/test/train-sleep", steps=1, step_s=0), timeout_s=60)["status"] == "succeeded"


@pytest.mark.slow
def test_a_redis_restart_longer_than_the_ttl_does_not_reap_live_jobs(tmp_path):
    ttl = 3
    with Service(tmp_path, heartbeat_ttl_s=ttl, queues=("train",), env={"EXPLAINQ_REDIS_RETRY_S": "60"}) as svc:
        job_id = _submit(svc, "/test/train-sleep", steps=150, step_s=0.1)
        _wait_raw(svc, job_id, lambda r: _done(r) >= 10, 60, "job never progressed")
        svc.redis_server.stop()
        time.sleep(2 * ttl)  # longer than the TTL: every liveness key and heartbeat is stale
        svc.redis_server.start()
        conn = svc.redis()
        assert reaper.redis_uptime_s(conn) < ttl
        assert not reaper.is_abandoned(conn, job_id, ttl) and reaper.reap_queue(conn, "train", ttl) == []
        while reaper.redis_uptime_s(conn) < ttl + 1:
            time.sleep(0.2)
        # The worker re-appeared within one TTL: its liveness key names the job.
        assert not reaper.is_abandoned(conn, job_id, ttl) and reaper.reap_queue(conn, "train", ttl) == []
        raw = _wait_raw(svc, job_id, lambda r: r.get(b"status") in (b"finished", b"failed"), 60, "job never ended")
        assert raw[b"status"] == b"finished", json.loads(raw[b"meta"])


@pytest.mark.slow
def test_a_lost_job_stays_lost_when_its_zombie_worker_comes_back(tmp_path):
    ttl = 2
    with Service(tmp_path, heartbeat_ttl_s=ttl, queues=("explain",)) as svc:
        job_id = _submit(svc, steps=60, step_s=0.1)
        _wait_raw(svc, job_id, lambda r: _done(r) >= 5, 60, "job never progressed")
        conn = svc.redis()
        worker = conn.hget(f"rq:job:{job_id}", "worker_name").decode()
        assert conn.get(reaper.keys.alive(worker)).decode() == job_id
        assert not reaper.is_abandoned(conn, job_id, ttl)
        os.killpg(svc.workers[0].pid, signal.SIGSTOP)  # a hung worker: no heartbeat, no progress
        try:
            deadline = time.monotonic() + 30
            while conn.exists(reaper.keys.alive(worker)) and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(ttl + 0.5)
            assert reaper.is_abandoned(conn, job_id, ttl)
            assert reaper.reap_queue(conn, "explain", ttl) == [job_id]
        finally:
            os.killpg(svc.workers[0].pid, signal.SIGCONT)
        view = job_view(job_id, _raw(svc, job_id))
        assert view["status"] == "failed" and view["error"]["code"] == "worker_lost"
        # The zombie resumes, finds its job taken away and drops it: the failure stands, no result appears.
        time.sleep(3)
        raw = _raw(svc, job_id)
        assert raw[b"status"] == b"failed" and json.loads(raw[b"meta"])["error"]["code"] == "worker_lost"
        assert svc.client.get(f"/jobs/{job_id}").json()["status"] == "failed"
        assert "no longer running here" in svc.worker_logs()
        assert svc.wait(_submit(svc, steps=1, step_s=0), timeout_s=60)["status"] == "succeeded"


def test_non_finite_floats_reach_json_as_null(tmp_path):
    with Service(tmp_path, queues=("explain",)) as svc:
        job_id = _submit(svc, "/test/nonfinite")
        body = svc.wait(job_id)
        assert body["status"] == "succeeded", body
        assert body["metrics"] == {"loss": None}
        raw = _raw(svc, job_id)
        meta = json.loads(raw[b"meta"])
        assert meta["summary"] == {"best": None, "ok": 0.5}
        assert b"NaN" not in raw[b"meta"] and b"Infinity" not in raw[b"meta"]
        r = svc.client.get(f"/jobs/{job_id}/result")
        assert b"NaN" not in r.content and b"Infinity" not in r.content
        assert r.json() == {"score": None, "scores": [0.25, None, None], "nested": {"x": [None, 1]}}


def test_worker_logs_are_json_lines_naming_the_job(tmp_path):
    with Service(tmp_path, queues=("explain",)) as svc:
        job_id = _submit(svc, steps=2, step_s=0)
        assert svc.wait(job_id)["status"] == "succeeded"
        time.sleep(0.5)
        lines = [ln for ln in (tmp_path / "worker-0.log").read_text().splitlines() if ln.strip()]
        records = [json.loads(ln) for ln in lines]  # every line is one JSON object
        mine = [r for r in records if r.get("job_id") == job_id]
        assert {r["message"] for r in mine} >= {"job started"}
        for r in mine:
            assert r["kind"] == "test_sleep" and r["owner"] == "anonymous" and r["worker"]
            assert r["level"] and r["logger"] and r["time"]


def test_threads_and_nice_apply_to_the_worker_process(tmp_path):
    with Service(tmp_path, queues=()) as svc:
        svc.start_worker("train", args=("--threads", "1", "--nice", "5"))
        svc.wait_for_workers(1)
        body = svc.wait(_submit(svc, "/test/threads"))
        assert body["status"] == "succeeded", body
        result = svc.client.get(f"/jobs/{body['id']}/result").json()
        # --nice adds to the niceness the worker started with (this process's, when the suite itself runs niced)
        assert result == {"torch_threads": 1, "nice": min(19, os.nice(0) + 5), "omp": "1", "mkl": "1"}


def test_jobs_enqueued_before_an_upgrade_still_run_and_ignore_their_function_path(tmp_path):
    with Service(tmp_path, queues=("explain",)) as svc:
        q = Queue("explain", connection=svc.redis(), serializer=JSONSerializer)
        job = q.enqueue("workers.runner.execute", args=("os:system", "test_sleep", {"steps": 1, "step_s": 0}),
                        meta={"kind": "test_sleep", "owner": "anonymous"})
        raw = _wait_raw(svc, job.id, lambda r: r.get(b"status") in (b"finished", b"failed"), 60, "never ran")
        assert raw[b"status"] == b"finished"
        assert Job.fetch(job.id, connection=svc.redis(), serializer=JSONSerializer).return_value()["steps"] == 1


def test_the_reaping_rule(tmp_path):
    from rq.utils import utcformat

    from core.redis_server import EmbeddedRedis

    server = EmbeddedRedis(tmp_path / "redis", appendonly=False).start()
    try:
        conn = redis_client(server.url)
        job = Queue("explain", connection=conn, serializer=JSONSerializer).enqueue(
            "workers.runner.execute", args=("test_sleep", {}), meta={"owner": "anonymous"})
        key, ttl = f"rq:job:{job.id}", 5
        stale = utcformat(datetime.now(UTC) - timedelta(seconds=3 * ttl))
        conn.hset(key, mapping={"status": "started", "worker_name": "w1", "last_heartbeat": stale})
        conn.zadd("rq:wip:explain", {f"{job.id}:exec1": time.time() + 100})
        conn.set(reaper.keys.alive("w1"), job.id, ex=ttl)
        assert not reaper.is_abandoned(conn, job.id, ttl, uptime_s=100)  # its worker is alive
        conn.delete(reaper.keys.alive("w1"))
        assert not reaper.is_abandoned(conn, job.id, ttl, uptime_s=ttl - 1)  # Redis restarted < 1 TTL ago
        conn.hset(key, "last_heartbeat", utcformat(datetime.now(UTC)))
        assert not reaper.is_abandoned(conn, job.id, ttl, uptime_s=100)  # beat recently (an older worker)
        conn.hset(key, "last_heartbeat", stale)
        assert reaper.is_abandoned(conn, job.id, ttl, uptime_s=100)
        assert reaper.reap_job(conn, job.id, ttl, uptime_s=100)
        assert not reaper.reap_job(conn, job.id, ttl, uptime_s=100)  # once
        view = job_view(job.id, conn.hgetall(key))
        assert view["status"] == "failed" and view["error"]["code"] == "worker_lost" and view["finished_at"]
        assert conn.zcard("rq:wip:explain") == 0
    finally:
        server.stop()
