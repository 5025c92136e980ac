"""``GET /metrics`` over a real Redis and a real worker, parsed with prometheus_client's text parser."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.main import create_app
from core.metrics import record_model_load
from core.settings import Settings


def scrape(client, headers=None) -> dict[tuple[str, tuple], float]:
    resp = client.get("/metrics", headers=headers)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_count_jobs_durations_queues_and_workers(service):
    c = service.client
    before = scrape(c)
    ok = [c.post("/test/sleep", json={"steps": 2, "step_s": 0.1}).json()["id"] for _ in range(2)]
    bad = c.post("/test/sleep", json={"steps": 2, "step_s": 0, "fail_at": 1}).json()["id"]
    for job_id in [*ok, bad]:
        service.wait(job_id)
    # The worker records a job's end right after RQ's own bookkeeping; give it a moment.
    deadline = time.monotonic() + 10
    while True:
        after = scrape(c)
        done = value(after, "explainq_jobs_finished_total", kind="test_sleep", status="succeeded") - value(
            before, "explainq_jobs_finished_total", kind="test_sleep", status="succeeded")
        if done >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    delta = lambda name, **lb: value(after, name, **lb) - value(before, name, **lb)  # noqa: E731
    assert delta("explainq_jobs_submitted_total", kind="test_sleep") == 3
    assert delta("explainq_jobs_finished_total", kind="test_sleep", status="succeeded") == 2
    assert delta("explainq_jobs_finished_total", kind="test_sleep", status="failed") == 1
    assert delta("explainq_job_duration_seconds_count", kind="test_sleep") == 3
    # The two 0.2 s jobs fall between 0.1 and 0.5 s, the failing one below 0.1 s.
    assert delta("explainq_job_duration_seconds_bucket", kind="test_sleep", le="0.1") >= 1
    assert delta("explainq_job_duration_seconds_bucket", kind="test_sleep", le="0.5") == 3
    assert delta("explainq_job_duration_seconds_bucket", kind="test_sleep", le="+Inf") == 3
    assert 0.3 < delta("explainq_job_duration_seconds_sum", kind="test_sleep") < 5
    assert value(after, "explainq_workers_live", queue="explain") == 1
    assert value(after, "explainq_workers_live", queue="train") == 1
    assert value(after, "explainq_queue_depth", queue="explain") == 0
    assert value(after, "explainq_queue_oldest_age_seconds", queue="explain") == 0

    # Queue gauges: block the worker with a long job, then queue two more behind it.
    blocker = c.post("/test/sleep", json={"steps": 100, "step_s": 0.05}).json()["id"]
    service.wait(blocker, statuses=("running",))
    waiting = [c.post("/test/sleep", json={"steps": 1, "step_s": 0}).json()["id"] for _ in range(2)]
    time.sleep(1.1)
    now = scrape(c)
    assert value(now, "explainq_queue_depth", queue="explain") == 2
    assert 1.0 <= value(now, "explainq_queue_oldest_age_seconds", queue="explain") < 30
    canceled_before = value(now, "explainq_jobs_finished_total", kind="test_sleep", status="canceled")
    for job_id in [*waiting, blocker]:
        assert c.delete(f"/jobs/{job_id}").status_code == 202
    service.wait(blocker)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        final = scrape(c)
        if value(final, "explainq_jobs_finished_total", kind="test_sleep", status="canceled") >= canceled_before + 3:
            break
        time.sleep(0.1)
    assert value(final, "explainq_jobs_finished_total", kind="test_sleep", status="canceled") == canceled_before + 3
    assert value(final, "explainq_queue_depth", queue="explain") == 0


def test_metrics_model_loads_and_auth(service):
    redis = service.redis()
    record_model_load(redis, "news-small", 1.5)
    record_model_load(redis, "news-small", 0.5)
    settings = Settings(EXPLAINQ_HOME=str(service.home), REDIS_URL=service.redis_server.url,
                        EXPLAINQ_API_KEYS="alice:secret")
    with TestClient(create_app(settings)) as client:
        assert client.get("/metrics").status_code == 401
        samples = scrape(client, headers={"Authorization": "Bearer secret"})
    assert value(samples, "explainq_model_loads_total", model="news-small") == 2
    assert value(samples, "explainq_model_load_seconds_total", model="news-small") == 2.0


@pytest.mark.slow
def test_recording_helpers_never_raise_when_redis_is_gone():
    import redis

    from core.metrics import record_finished, record_submitted

    gone = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    record_submitted(gone, "k")
    record_finished(gone, "k", "succeeded", 1.0)
    record_model_load(gone, "m", 1.0)
