"""The job resource over a real Redis and a real worker process."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from tests.service import ROOT


def submit(svc, steps=3, step_s=0.05, route="/test/sleep", headers=None, **extra):
    r = svc.client.post(route, json={"steps": steps, "step_s": step_s, **extra}, headers=headers)
    assert r.status_code == 202, r.text
    return r


def test_lifecycle_queued_running_succeeded_with_monotonic_progress(service):
    r = submit(service, steps=8, step_s=0.15)
    job = r.json()
    assert r.headers["location"] == f"/jobs/{job['id']}"
    assert job["status"] in ("queued", "running") and job["kind"] == "test_sleep"
    seen_status, dones = [], []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        body = service.client.get(f"/jobs/{job['id']}").json()
        if not seen_status or seen_status[-1] != body["status"]:
            seen_status.append(body["status"])
        if body["progress"]:
            dones.append(body["progress"]["done"])
            assert body["progress"]["total"] == 8 and body["progress"]["unit"] == "steps"
        if body["status"] == "succeeded":
            break
        time.sleep(0.05)
    assert seen_status[-1] == "succeeded"
    assert "running" in seen_status
    assert seen_status.index("running") < seen_status.index("succeeded")
    assert dones == sorted(dones) and dones[-1] == 8
    assert body["finished_at"] and body["started_at"] and body["error"] is None
    assert body["result_url"] == f"/jobs/{job['id']}/result"
    result = service.client.get(body["result_url"]).json()
    assert result["steps"] == 8
    (artifact,) = result["artifacts"]
    assert artifact == {"name": "out.txt", "size": len(service.artifact(job["id"], "out.txt")),
                        "media_type": "text/plain"}
    # the request as validated and stored, defaults filled in
    assert service.client.get(f"/jobs/{job['id']}/request").json() == {"steps": 8, "step_s": 0.15, "fail_at": None,
                                                                       "model": None}
    assert service.client.get("/jobs/nope/request").status_code == 404
    listed = service.client.get(f"/jobs/{job['id']}/artifacts").json()["items"]
    assert listed == [{**artifact, "url": f"/jobs/{job['id']}/artifacts/out.txt"}]


def test_eta_is_reported_while_running(service):
    """Three ETAs seen while the job runs (it runs until it is canceled, however slow the machine), each
    non-negative and below what the whole job would take were every 0.05 s step 20 times slower."""
    job = submit(service, steps=1_000, step_s=0.05).json()
    etas = []
    deadline = time.monotonic() + 120
    while len(etas) < 3:
        assert time.monotonic() < deadline, f"fewer than 3 ETAs while running: {etas}"
        body = service.client.get(f"/jobs/{job['id']}").json()
        assert body["status"] in ("queued", "running"), body
        if body["progress"] and body["progress"]["eta_s"] is not None and body["status"] == "running":
            etas.append(body["progress"]["eta_s"])
        time.sleep(0.1)
    assert service.client.delete(f"/jobs/{job['id']}").status_code == 202
    assert service.wait(job["id"])["status"] == "canceled"
    assert all(0 <= e < 1_000 * 0.05 * 20 for e in etas), etas


def test_job_error_is_recorded_with_code_and_message(service):
    job = submit(service, steps=5, fail_at=2).json()
    body = service.wait(job["id"])
    assert body["status"] == "failed"
    assert body["error"] == {"code": "bad_step", "message": "step 2 failed on purpose"}
    r = service.client.get(f"/jobs/{job['id']}/result")
    assert r.status_code == 409 and r.json()["detail"]["code"] == "failed"


def test_cancel_queued_and_running_jobs(service):
    running = submit(service, steps=200, step_s=0.05).json()
    service.wait(running["id"], statuses=("running",))
    queued = submit(service, steps=2).json()
    assert service.client.get(f"/jobs/{queued['id']}").json()["status"] == "queued"

    r = service.client.delete(f"/jobs/{queued['id']}")
    assert r.status_code == 202 and r.json()["status"] == "canceled"

    r = service.client.delete(f"/jobs/{running['id']}")
    assert r.status_code == 202
    body = service.wait(running["id"], timeout_s=20)
    assert body["status"] == "canceled" and body["error"]["code"] == "canceled"
    assert body["progress"]["done"] < 200
    # The canceled queued job never ran.
    assert service.client.get(f"/jobs/{queued['id']}").json()["started_at"] is None
    # Cancelling a finished job is a conflict, not an error.
    assert service.client.delete(f"/jobs/{running['id']}", params={"cancel_only": "true"}).status_code == 409


def test_malformed_bodies_give_422_naming_the_field(service):
    r = service.client.post("/test/sleep", json={"steps": "many"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "steps"]
    r = service.client.post("/test/sleep", json={"steps": 1, "bogus": 2})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "bogus"]
    r = service.client.post("/test/sleep", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    r = service.client.get("/jobs", params={"status": "done"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "status"]
    r = service.client.get("/jobs", params={"cursor": "%%%"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "cursor"]


def test_unknown_job_is_404_everywhere(service):
    for method, path in [("get", "/jobs/nope"), ("delete", "/jobs/nope"), ("get", "/jobs/nope/result"),
                         ("get", "/jobs/nope/events")]:
        r = getattr(service.client, method)(path)
        assert r.status_code == 404, (method, path)
        assert r.json()["detail"]["code"] == "not_found"


def test_body_size_limit(service):
    big = {"steps": 1, "model": "x" * (9 * 1024 * 1024)}
    r = service.client.post("/test/sleep", content=json.dumps(big), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["detail"]["code"] == "body_too_large"


def test_idempotent_resubmission(service):
    h = {"Idempotency-Key": "abc-123"}
    first = submit(service, steps=2, headers=h)
    again = submit(service, steps=2, headers=h)
    assert again.json()["id"] == first.json()["id"]
    assert again.headers.get("idempotent-replayed") == "true"
    r = service.client.post("/test/sleep", json={"steps": 3, "step_s": 0.05}, headers=h)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]
    other = submit(service, steps=2, headers={"Idempotency-Key": "another"})
    assert other.json()["id"] != first.json()["id"]


def test_list_filters_and_paginates(service):
    ids = [submit(service, steps=1, step_s=0).json()["id"] for _ in range(5)]
    for job_id in ids:
        service.wait(job_id)
    seen, cursor = [], None
    while True:
        page = service.client.get("/jobs", params={"limit": 2, "kind": "test_sleep", "status": "succeeded",
                                                   **({"cursor": cursor} if cursor else {})}).json()
        seen += [j["id"] for j in page["items"]]
        assert all(j["status"] == "succeeded" for j in page["items"])
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert len(seen) == len(set(seen))
    assert set(ids) <= set(seen)
    # newest first
    assert [s for s in seen if s in ids] == list(reversed(ids))
    assert service.client.get("/jobs", params={"kind": "no_such_kind"}).json()["items"] == []


def test_events_stream_progress_until_end(service):
    job = submit(service, steps=5, step_s=0.1).json()
    with service.client.stream("GET", f"/jobs/{job['id']}/events", params={"interval_s": 0.05}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    events = [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("event: ")]
    assert events[-1] == "end" and "succeeded" in events
    data = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    dones = [d["progress"]["done"] for d in data if d.get("progress")]
    assert dones == sorted(dones) and dones[-1] == 5


def test_health_ready_models_docs(service):
    assert service.client.get("/health").json() == {"status": "ok"}
    ready = service.client.get("/ready")
    assert ready.status_code == 200 and ready.json()["workers"] == {"explain": 1, "bulk": 1, "train": 1}
    assert "models" in service.client.get("/models").json()
    assert service.client.get("/docs").status_code == 200
    paths = service.client.get("/openapi.json").json()["paths"]
    assert "/jobs/{job_id}" in paths and "/test/sleep" in paths


def test_api_process_never_imports_torch():
    code = ("import sys, app.main, explainq.cli; app.main.create_app(); "
            "assert 'torch' not in sys.modules, 'torch imported'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
