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


def wait_for(client, condition, what: str, timeout_s: float = 60.0) -> dict[tuple[str, tuple], float]:
    """The first scrape in which ``condition(samples)`` holds: a worker records a job's end just after RQ's own
    bookkeeping, so a job seen ended may not be counted yet. Returns at once when it holds; fails naming ``what``
    after ``timeout_s`` (a bound for a loaded machine, not a measurement)."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = scrape(client)
        if condition(samples):
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"metrics never showed {what} within {timeout_s} s")
        time.sleep(0.1)


def test_metrics_count_jobs_durations_queues_and_workers(service):
    c = service.client
    before = scrape(c)
    ok = [c.post("/test/sleep", json={"steps": 2, "step_s": 0.1}).json()["id"] for _ in range(2)]
    bad = c.post("/test/sleep", json={"steps": 2, "step_s": 0, "fail_at": 1}).json()["id"]
    for job_id in [*ok, bad]:
        service.wait(job_id)

    def counted(samples, name, **lb) -> float:
        return value(samples, name, **lb) - value(before, name, **lb)

    # Wait for every count asserted below, not only some of them.
    after = wait_for(c, lambda s: counted(s, "explainq_jobs_finished_total", kind="test_sleep", status="succeeded") >= 2
                     and counted(s, "explainq_jobs_finished_total", kind="test_sleep", status="failed") >= 1
                     and counted(s, "explainq_job_duration_seconds_count", kind="test_sleep") >= 3,
                     "two successes, a failure and three durations")
    delta = lambda name, **lb: counted(after, name, **lb)  # noqa: E731
    assert delta("explainq_jobs_submitted_total", kind="test_sleep") == 3
    assert delta("explainq_jobs_finished_total", kind="test_sleep", status="succeeded") == 2
    assert delta("explainq_jobs_finished_total", kind="test_sleep", status="failed") == 1
    assert delta("explainq_job_duration_seconds_count", kind="test_sleep") == 3
    # Buckets that hold whatever the machine's load: the two successes sleep 2 x 0.1 s each, so at most the
    # failing job falls below 0.1 s; the buckets are cumulative; every job is in +Inf.
    assert delta("explainq_job_duration_seconds_bucket", kind="test_sleep", le="0.1") <= 1
    assert delta("explainq_job_duration_seconds_bucket", kind="test_sleep", le="0.1") \
        <= delta("explainq_job_duration_seconds_bucket", kind="test_sleep", le="0.5") \
        <= delta("explainq_job_duration_seconds_bucket", kind="test_sleep", le="+Inf") == 3
    assert delta("explainq_job_duration_seconds_sum", kind="test_sleep") >= 0.4
    assert value(after, "explainq_workers_live", queue="explain") == 1
    assert value(after, "explainq_workers_live", queue="train") == 1
    assert value(after, "explainq_queue_depth", queue="explain") == 0
    assert value(after, "explainq_queue_oldest_age_seconds", queue="explain") == 0

    # Queue gauges: block the worker with a job that runs until it is canceled, then queue two more behind it.
    blocker = c.post("/test/sleep", json={"steps": 10_000, "step_s": 0.05}).json()["id"]
    service.wait(blocker, statuses=("running",))
    waiting = [c.post("/test/sleep", json={"steps": 1, "step_s": 0}).json()["id"] for _ in range(2)]
    now = wait_for(c, lambda s: value(s, "explainq_queue_oldest_age_seconds", queue="explain") >= 1.0,
                   "the oldest queued job's age reach 1 s")
    assert value(now, "explainq_queue_depth", queue="explain") == 2
    assert value(now, "explainq_queue_oldest_age_seconds", queue="explain") < 120
    canceled_before = value(now, "explainq_jobs_finished_total", kind="test_sleep", status="canceled")
    for job_id in [*waiting, blocker]:
        assert c.delete(f"/jobs/{job_id}").status_code == 202
    service.wait(blocker)
    final = wait_for(c, lambda s: value(s, "explainq_jobs_finished_total", kind="test_sleep", status="canceled")
                     >= canceled_before + 3, "three cancellations")
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


def test_a_job_deleted_as_it_ends_is_not_counted_and_does_not_stop_the_worker(redis_settings):
    """A finished job its owner deletes while the worker is still writing its end (DELETE /jobs/{id} of a failed
    job races the worker's metrics): record_job_end skips it instead of raising out of the worker's loop."""
    import redis
    from rq import Queue

    from core.metrics import record_job_end

    r = redis.Redis.from_url(redis_settings.redis_url)
    job = Queue("explain", connection=r).enqueue("workers.runner.execute", "test_sleep", {})
    job.delete()
    record_job_end(r, job)  # raised InvalidJobOperation before
    assert not r.exists("explainq:metrics:finished")
