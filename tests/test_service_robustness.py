"""Failure modes: killed workers, SIGTERM, Redis going away, auth isolation, preloaded models."""

from __future__ import annotations

import os
import signal
import time

import pytest

from core import registry
from tests.service import Service


def _submit(svc, headers=None, **body):
    r = svc.client.post("/test/sleep", json=body, headers=headers)
    assert r.status_code == 202, r.text
    return r.json()["id"]


@pytest.mark.slow
def test_sigkill_mid_job_fails_with_reason_and_never_stays_running(tmp_path):
    with Service(tmp_path, heartbeat_ttl_s=3) as svc:
        job_id = _submit(svc, steps=400, step_s=0.05)
        svc.wait(job_id, statuses=("running",))
        os.killpg(svc.workers[0].pid, signal.SIGKILL)
        svc.workers[0].wait()
        t0 = time.monotonic()
        body = svc.wait(job_id, timeout_s=120, statuses=("failed", "queued", "succeeded"))
        assert time.monotonic() - t0 < 120
        assert body["status"] == "failed"
        assert body["error"]["code"] == "worker_lost" and "worker" in body["error"]["message"]
        # A new worker picks up new work.
        svc.start_worker("explain,train")
        assert svc.wait(_submit(svc, steps=1, step_s=0))["status"] == "succeeded"


@pytest.mark.slow
def test_sigterm_requeues_the_running_job_and_a_new_worker_finishes_it(tmp_path):
    with Service(tmp_path, heartbeat_ttl_s=5) as svc:
        job_id = _submit(svc, steps=60, step_s=0.05)
        svc.wait(job_id, statuses=("running",))
        os.killpg(svc.workers[0].pid, signal.SIGTERM)
        assert svc.workers[0].wait(30) == 0
        body = svc.client.get(f"/jobs/{job_id}").json()
        assert body["status"] == "queued", body
        svc.start_worker("explain,train")
        body = svc.wait(job_id, timeout_s=60)
        assert body["status"] == "succeeded" and body["progress"]["done"] == 60


@pytest.mark.slow
def test_redis_down_gives_503_json_and_recovers_without_losing_results(tmp_path):
    with Service(tmp_path, heartbeat_ttl_s=10) as svc:
        job_id = _submit(svc, steps=2, step_s=0.01)
        assert svc.wait(job_id)["status"] == "succeeded"
        before = svc.client.get(f"/jobs/{job_id}/result").json()
        svc.redis_server.stop()
        for method, path, body in [("get", f"/jobs/{job_id}", None), ("get", "/jobs", None),
                                   ("post", "/test/sleep", {"steps": 1}), ("get", "/models", None)]:
            kwargs = {"json": body} if body else {}
            r = getattr(svc.client, method)(path, **kwargs)
            assert r.status_code == 503, (path, r.status_code, r.text)
            assert r.json()["detail"]["code"] == "redis_unavailable"
        r = svc.client.get("/ready")
        assert r.status_code == 503 and "redis" in r.json()["reasons"][0]
        assert svc.client.get("/health").status_code == 200
        svc.redis_server.start()  # same port, same AOF directory
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            r = svc.client.get(f"/jobs/{job_id}")
            if r.status_code == 200:
                break
            time.sleep(0.2)
        assert r.status_code == 200 and r.json()["status"] == "succeeded"
        assert svc.client.get(f"/jobs/{job_id}/result").json() == before
        # The worker reconnects and takes new work.
        assert svc.wait(_submit(svc, steps=1, step_s=0), timeout_s=90)["status"] == "succeeded"


def test_auth_keys_isolate_jobs(tmp_path):
    with Service(tmp_path, api_keys="alice:key-a,bob:key-b") as svc:
        alice = {"Authorization": "Bearer key-a"}
        bob = {"Authorization": "Bearer key-b"}
        assert svc.client.get("/health").status_code == 200
        for path in ("/jobs", "/models", "/ready"):
            assert svc.client.get(path).status_code == 401
        assert svc.client.get("/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert svc.client.post("/test/sleep", json={"steps": 1}).status_code == 401
        job_id = _submit(svc, headers=alice, steps=1, step_s=0)
        assert svc.wait(job_id, headers=alice)["status"] == "succeeded"
        assert svc.client.get(f"/jobs/{job_id}", headers=bob).status_code == 404
        assert svc.client.get(f"/jobs/{job_id}/result", headers=bob).status_code == 404
        assert svc.client.delete(f"/jobs/{job_id}", headers=bob).status_code == 404
        assert svc.client.get("/jobs", headers=bob).json()["items"] == []
        assert [j["id"] for j in svc.client.get("/jobs", headers=alice).json()["items"]] == [job_id]
        # The same idempotency key under another owner is another job.
        h = {"Idempotency-Key": "k1"}
        a = svc.client.post("/test/sleep", json={"steps": 1}, headers={**alice, **h}).json()["id"]
        b = svc.client.post("/test/sleep", json={"steps": 1}, headers={**bob, **h}).json()["id"]
        assert a != b


def test_models_are_preloaded_once_and_shared_by_jobs(tmp_path):
    svc = Service(tmp_path, start=False)
    model_dir = tmp_path / "models" / "counter"
    model_dir.mkdir(parents=True)
    entry = registry.register_model(svc.settings, "counter", kind="test", loader="tests.jobkinds:load_counter_model",
                                    path=model_dir, parameters=42, preload=True)
    model_dir = registry.local_path(svc.settings, entry)  # the version in the store, which the worker loads
    with svc.start():
        assert (model_dir / "loads.txt").read_text() == "load\n"  # loaded at worker start
        for _ in range(2):
            job_id = _submit(svc, steps=1, step_s=0, model="counter")
            assert svc.wait(job_id)["status"] == "succeeded"
            assert svc.client.get(f"/jobs/{job_id}/result").json()["model_loads"] == 1
        assert (model_dir / "loads.txt").read_text() == "load\n"  # no loading by the jobs
        (entry,) = svc.client.get("/models").json()["models"]
        assert entry["name"] == "counter" and entry["parameters"] == 42
        assert entry["devices"] == ["cpu"] and entry["loaded_on"][0]["loads"] == 1
        # An unknown model fails the job with an actionable error.
        job_id = _submit(svc, steps=1, step_s=0, model="missing")
        body = svc.wait(job_id)
        assert body["status"] == "failed" and body["error"]["code"] == "unknown_model"
