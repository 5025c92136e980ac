"""API semantics under concurrency and faults, over a real Redis and a real HTTP server (uvicorn in a thread).

Most tests here need jobs to stay queued, so they run against a Redis with no worker; those about jobs that run
use the shared ``service`` fixture (conftest.py), which has a worker.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis as redis_lib
import uvicorn
from rq.job import Job
from rq.registry import CanceledJobRegistry
from rq.results import Result
from rq.serializers import JSONSerializer

from app.main import create_app
from core import keys
from core.contract.kind import JobKind
from core.jobstore import JobStore, body_hash
from core.redis_server import EmbeddedRedis, free_port
from core.settings import Settings
from tests.jobkinds import SleepRequest

OWNERS = [f"owner{i}" for i in range(16)]
KEYS = ",".join(f"{name}:key-{name}" for name in OWNERS)


@pytest.fixture(scope="module")
def redis_srv(tmp_path_factory):
    srv = EmbeddedRedis(tmp_path_factory.mktemp("redis"), appendonly=False).start()
    yield srv
    srv.stop()


@pytest.fixture()
def r(redis_srv):
    conn = redis_lib.Redis.from_url(redis_srv.url)
    yield conn
    conn.close()


def _settings(redis_srv, tmp_path, **extra) -> Settings:
    return Settings(EXPLAINQ_HOME=str(tmp_path), REDIS_URL=redis_srv.url, EXPLAINQ_API_KEYS=KEYS, **extra)


@contextlib.contextmanager
def live_server(settings: Settings):
    """The real app served by uvicorn on a free port, in a thread of this process."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def client_for(base: str, owner: str) -> httpx.Client:
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer key-{owner}"}, timeout=30)


@pytest.fixture()
def server(redis_srv, tmp_path):
    with live_server(_settings(redis_srv, tmp_path)) as base:
        yield base


def post(client: httpx.Client, steps: int = 2, headers=None):
    return client.post("/test/sleep", json={"steps": steps, "step_s": 0.01}, headers=headers)


# ------------------------------------------------------------------------------------------------ job ids
def test_job_ids_are_validated_before_redis(server, r):
    c = client_for(server, "owner0")
    # A key of another type under the job prefix must never be read as a job (WRONGTYPE would be a 503).
    r.sadd("rq:job:x:dependents", "y")
    for path in ["/jobs/x:dependents", "/jobs/x:dependents/result", "/jobs/x:dependents/events",
                 "/jobs/-abc", "/jobs/" + "a" * 129, "/jobs/a.b", "/jobs/%20"]:
        resp = c.get(path)
        assert resp.status_code == 404, (path, resp.text)
        assert resp.json()["detail"]["code"] == "not_found"
    assert c.delete("/jobs/x:dependents").status_code == 404
    # Well-formed ids (uuid hex, shard ids) that do not exist are 404 too.
    assert c.get("/jobs/0123abcd-s0001").status_code == 404
    assert c.get("/jobs/" + "a" * 128).status_code == 404


def test_a_unique_prefix_of_ones_own_job_id_names_the_job_everywhere(server, r):
    alice, bob = client_for(server, "owner5"), client_for(server, "owner6")
    job_id = post(alice).json()["id"]
    prefix = job_id[:8]
    resp = alice.get(f"/jobs/{prefix}")
    assert resp.status_code == 200, resp.text
    assert resp.json()["id"] == job_id  # the canonical full id
    assert alice.get(f"/jobs/{job_id[:6]}").json()["id"] == job_id
    assert alice.get(f"/jobs/{prefix}/request").json()["steps"] == 2
    result = alice.get(f"/jobs/{prefix}/result")
    assert result.status_code == 409 and result.json()["job"]["id"] == job_id
    assert alice.get(f"/jobs/{prefix}/artifacts").status_code == 200
    with alice.stream("GET", f"/jobs/{prefix}/events") as events:
        assert events.status_code == 200
        data = next(line for line in events.iter_lines() if line.startswith("data: "))
        assert json.loads(data[len("data: "):])["id"] == job_id
    # Another owner's job never matches, and too short a prefix is not looked up: 404 exactly as an unknown job.
    for path in [f"/jobs/{prefix}", f"/jobs/{prefix}/result", f"/jobs/{prefix}/request",
                 f"/jobs/{prefix}/artifacts"]:
        resp = bob.get(path)
        assert resp.status_code == 404, (path, resp.text)
        assert resp.json()["detail"] == {"code": "not_found", "message": f"no job {prefix!r}"}
    assert bob.delete(f"/jobs/{prefix}").status_code == 404
    assert alice.get(f"/jobs/{job_id[:5]}").status_code == 404
    assert alice.get(f"/jobs/{job_id[:8]}zz").status_code == 404
    # Two of the caller's jobs starting alike: 409 with both full ids; a longer prefix picks one.
    twin = job_id[:8] + ("0" if job_id[8] != "0" else "1") + job_id[9:]
    r.restore("rq:job:" + twin, 0, r.dump("rq:job:" + job_id))
    r.zadd(keys.owner_jobs("owner5"), {twin: time.time()})
    resp = alice.get(f"/jobs/{prefix}")
    assert resp.status_code == 409, resp.text
    assert resp.json()["detail"]["code"] == "ambiguous_id"
    assert sorted(resp.json()["detail"]["matches"]) == sorted([job_id, twin])
    assert alice.get(f"/jobs/{job_id[:9]}").json()["id"] == job_id
    assert alice.get(f"/jobs/{prefix}/result").status_code == 409
    assert alice.get(f"/jobs/{prefix}/result").json()["detail"]["code"] == "ambiguous_id"
    # The full id is read as before; an expired twin no longer makes the prefix ambiguous.
    r.delete("rq:job:" + twin)
    assert alice.get(f"/jobs/{job_id}").json()["id"] == job_id
    canceled = alice.delete(f"/jobs/{prefix}")
    assert canceled.status_code == 202, canceled.text
    assert canceled.json()["id"] == job_id and canceled.json()["status"] == "canceled"


# ------------------------------------------------------------------------------------------------- paging
def _page_all(c: httpx.Client, limit: int, between=None, **params) -> list[str]:
    seen, cursor, pages = [], None, 0
    while True:
        resp = c.get("/jobs", params={"limit": limit, **params, **({"cursor": cursor} if cursor else {})})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        seen += [j["id"] for j in body["items"]]
        cursor = body["next_cursor"]
        pages += 1
        if not cursor:
            return seen
        if between:
            between(pages, seen)


def test_keyset_paging_while_jobs_expire_and_are_added(server, r):
    c = client_for(server, "owner1")
    initial = [post(c).json()["id"] for _ in range(30)]
    newest_first = list(reversed(initial))
    deleted, added = set(), []

    def between(page: int, seen: list[str]) -> None:
        # Expire two jobs not yet seen and one already seen, and add a new job, between every two pages.
        unseen = [j for j in newest_first if j not in seen and j not in deleted]
        for job_id in unseen[1:3] + seen[-1:]:
            r.delete(f"rq:job:{job_id}")
            deleted.add(job_id)
        added.append(post(c).json()["id"])

    seen = _page_all(c, 4, between=between)
    assert len(seen) == len(set(seen)), "a job was returned twice"
    live_initial = [j for j in newest_first if j not in deleted]
    # Every initial job still alive when its page came was returned, in order; none of the expired unseen ones.
    assert [j for j in seen if j in set(initial)] == [j for j in newest_first if j in set(seen)]
    assert set(live_initial) <= set(seen)
    assert not (set(seen) & {j for j in deleted if j not in seen})
    assert not set(added) & set(seen)  # newer than the first page: they show up on a fresh listing
    fresh = _page_all(c, 7)
    assert fresh[: len(added)] == list(reversed(added))
    assert len(fresh) == len(set(fresh)) == len(live_initial) + len(added)
    # Stale ids were removed from the index during the scans.
    index = {m.decode() for m in r.zrange(keys.owner_jobs("owner1"), 0, -1)}
    assert index.isdisjoint(deleted) and len(index) == len(fresh)


def test_keyset_paging_with_equal_creation_times(server, r):
    c = client_for(server, "owner2")
    ids = [post(c).json()["id"] for _ in range(12)]
    # Several jobs created in the same instant: the id breaks the tie and pages never skip or repeat one.
    r.zadd(keys.owner_jobs("owner2"), {job_id: 1000.0 for job_id in ids[:9]})
    for limit in (1, 2, 4, 5, 50):
        seen = _page_all(c, limit)
        assert sorted(seen) == sorted(ids) and len(seen) == len(ids), limit
        assert seen[:3] == list(reversed(ids[9:]))
        assert seen[3:] == sorted(ids[:9], reverse=True)


def test_a_scan_limit_returns_a_cursor_never_a_silent_end(redis_srv, tmp_path, r):
    settings = _settings(redis_srv, tmp_path)
    store = JobStore(r, settings)
    with live_server(settings) as base:
        c = client_for(base, "owner3")
        ids = [post(c).json()["id"] for _ in range(12)]
        r.delete(*[f"rq:job:{job_id}" for job_id in ids])  # all expired but one, the oldest
        wanted = post(c).json()["id"]
    r.zadd(keys.owner_jobs("owner3"), {wanted: 1.0})
    items, cursor = store.list("owner3", kind="no_such_kind", limit=5, scan_limit=5)
    assert items == [] and cursor is not None
    seen, pages = [], 1
    while cursor:
        items, cursor = store.list("owner3", kind="test_sleep", status="queued", limit=50, cursor=cursor,
                                   scan_limit=5)
        seen += [i["id"] for i in items]
        pages += 1
    assert pages >= 3 and seen == [wanted]
    assert r.zcard(keys.owner_jobs("owner3")) == 1


# ------------------------------------------------------------------------------------------- idempotency
def test_concurrent_posts_with_one_key_create_exactly_one_job(server, r):
    c = client_for(server, "owner4")
    key = {"Idempotency-Key": "concurrent-1"}
    barrier = threading.Barrier(20)

    def one(_):
        with client_for(server, "owner4") as cl:
            barrier.wait()
            return post(cl, headers=key)

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(one, range(20)))
    created = [a for a in answers if a.status_code == 202 and "idempotent-replayed" not in a.headers]
    replayed = [a for a in answers if a.status_code == 202 and a.headers.get("idempotent-replayed") == "true"]
    assert len(created) == 1, [a.status_code for a in answers]
    assert len(created) + len(replayed) == 20  # one atomic step: never "in progress"
    job_id = created[0].json()["id"]
    assert all(a.json()["id"] == job_id for a in replayed)
    assert r.zcard(keys.owner_jobs("owner4")) == 1
    # After the creation, every retry is a replay.
    again = post(c, headers=key)
    assert again.status_code == 202 and again.json()["id"] == job_id and again.headers["idempotent-replayed"]
    # Same key, other body: 422 naming the header.
    other = c.post("/test/sleep", json={"steps": 3}, headers=key)
    assert other.status_code == 422 and other.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]
    # The job expired: the key is taken over by a fresh job.
    r.delete(f"rq:job:{job_id}")
    fresh = post(c, headers=key)
    assert fresh.status_code == 202 and fresh.json()["id"] != job_id
    assert "idempotent-replayed" not in fresh.headers
    assert post(c, headers=key).json()["id"] == fresh.json()["id"]


def test_a_key_an_earlier_version_left_being_created_answers_409_in_progress(server, r):
    c = client_for(server, "owner5")
    digest = hashlib.sha256(b"in-flight").hexdigest()
    body_digest = body_hash({"kind": "test_sleep", "payload": {"steps": 2, "step_s": 0.01, "fail_at": None,
                                                               "model": None}})
    r.set(f"explainq:idem:owner5:{digest}", json.dumps({"job_id": "abc", "body": body_digest,
                                                        "state": "creating"}), ex=30)
    resp = post(c, headers={"Idempotency-Key": "in-flight"})
    assert resp.status_code == 409 and resp.headers["retry-after"] == "1"
    assert resp.json()["detail"]["code"] == "idempotency_in_progress"


# ------------------------------------------------------------------------------------------------- quotas
def test_active_job_quota_is_exact_under_concurrency(redis_srv, tmp_path, r):
    with live_server(_settings(redis_srv, tmp_path, EXPLAINQ_MAX_ACTIVE_JOBS=5)) as base:
        barrier = threading.Barrier(16)

        def one(_):
            with client_for(base, "owner6") as cl:
                barrier.wait()
                return post(cl)

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(one, range(16)))
        codes = sorted(a.status_code for a in answers)
        assert codes == [202] * 5 + [429] * 11, codes
        refused = next(a for a in answers if a.status_code == 429)
        detail = refused.json()["detail"]
        assert detail["code"] == "quota_exceeded" and detail["limit"] == "EXPLAINQ_MAX_ACTIVE_JOBS"
        assert int(refused.headers["retry-after"]) > 0
        # Another owner is not affected.
        assert post(client_for(base, "owner7")).status_code == 202
        # A canceled job frees its slot (pruned at check time); an expired one too.
        c = client_for(base, "owner6")
        ids = [a.json()["id"] for a in answers if a.status_code == 202]
        assert c.delete(f"/jobs/{ids[0]}").status_code == 202
        assert post(c).status_code == 202
        assert post(c).status_code == 429
        r.delete(f"rq:job:{ids[1]}")
        assert post(c).status_code == 202


def test_queue_length_limit(redis_srv, tmp_path, r):
    waiting = r.llen("rq:queue:explain")
    with live_server(_settings(redis_srv, tmp_path, EXPLAINQ_MAX_QUEUE_LENGTH=waiting + 3)) as base:
        barrier = threading.Barrier(8)

        def one(i):
            with client_for(base, OWNERS[8 + i]) as cl:
                barrier.wait()
                return post(cl)

        with ThreadPoolExecutor(8) as pool:
            codes = sorted(a.status_code for a in pool.map(one, range(8)))
        assert codes == [202] * 3 + [429] * 5
        resp = post(client_for(base, "owner8"))
        assert resp.status_code == 429 and resp.json()["detail"]["limit"] == "EXPLAINQ_MAX_QUEUE_LENGTH"
        # The train queue is a different queue.
        other = client_for(base, "owner8").post("/test/train-sleep", json={"steps": 1})
        assert other.status_code == 202
    assert r.llen("rq:queue:explain") == waiting + 3


# ------------------------------------------------------------------------------------------ queue position
def test_queued_job_has_its_queue_position(server, r):
    c = client_for(server, "owner9")
    before = r.llen("rq:queue:train")
    jobs = [c.post("/test/train-sleep", json={"steps": 1}).json() for _ in range(3)]
    assert [j["position"] for j in jobs] == [before, before + 1, before + 2]
    assert [c.get(f"/jobs/{j['id']}").json()["position"] for j in jobs] == [before, before + 1, before + 2]
    assert c.delete(f"/jobs/{jobs[0]['id']}").status_code == 202
    assert c.get(f"/jobs/{jobs[0]['id']}").json()["position"] is None
    assert c.get(f"/jobs/{jobs[1]['id']}").json()["position"] == before
    listed = {j["id"]: j for j in c.get("/jobs").json()["items"]}
    assert listed[jobs[0]["id"]]["position"] is None


# ------------------------------------------------------------------------------------------------ retention
def test_retention_settings_apply_to_every_kind(r, redis_srv, tmp_path):
    long_kind = JobKind(name="test_sleep", route="/test/sleep", request=SleepRequest, queue="explain",
                        func="tests.jobkinds:sleep_job", result_ttl_s=30 * 24 * 3600)
    payload = {"steps": 1, "step_s": 0.0}
    set_env = JobStore(r, _settings(redis_srv, tmp_path, EXPLAINQ_RESULT_TTL_S=50, EXPLAINQ_FAILURE_TTL_S=40))
    job = Job.fetch(set_env.submit(long_kind, payload, "owner10")[0], connection=r, serializer=JSONSerializer)
    assert (job.result_ttl, job.failure_ttl) == (50, 40)
    unset = JobStore(r, _settings(redis_srv, tmp_path))
    job = Job.fetch(unset.submit(long_kind, payload, "owner10")[0], connection=r, serializer=JSONSerializer)
    assert job.result_ttl == 30 * 24 * 3600
    # The RQ job names its kind, never a function.
    assert job.func_name == "workers.runner.execute" and tuple(job.args) == ("test_sleep", payload)


def test_a_canceled_queued_job_expires_after_the_failure_ttl(redis_srv, tmp_path, r):
    with live_server(_settings(redis_srv, tmp_path, EXPLAINQ_FAILURE_TTL_S=1)) as base:
        c = client_for(base, "owner11")
        job_id = c.post("/test/train-sleep", json={"steps": 1}).json()["id"]
        assert c.delete(f"/jobs/{job_id}").json()["status"] == "canceled"
        registry = CanceledJobRegistry("train", connection=r)
        assert job_id in registry.get_job_ids()
        assert 0 < r.ttl(f"rq:job:{job_id}") <= 1
        time.sleep(2.1)
        assert c.get(f"/jobs/{job_id}").status_code == 404
        assert c.get("/metrics").status_code == 200  # a scrape also prunes the canceled registries
        assert job_id.encode() not in r.zrange(registry.key, 0, -1)


# ------------------------------------------------------------------------------------------ body size (413)
def test_chunked_body_over_the_limit_is_413(redis_srv, tmp_path):
    with live_server(_settings(redis_srv, tmp_path, EXPLAINQ_MAX_BODY_BYTES=2048)) as base:
        c = client_for(base, "owner12")

        def chunks(n):
            yield b'{"steps": 1, "model": "'
            for _ in range(n):
                yield b"x" * 512
            yield b'"}'

        resp = c.post("/test/sleep", content=chunks(20), headers={"content-type": "application/json"})
        assert resp.status_code == 413 and resp.json()["detail"]["code"] == "body_too_large"
        # A chunked body under the limit is replayed to the route intact.
        resp = c.post("/test/sleep", content=chunks(1), headers={"content-type": "application/json"})
        assert resp.status_code == 202, resp.text
        # Content-Length over the limit is refused before reading.
        resp = c.post("/test/sleep", content=b"{" + b" " * 4096 + b"}", headers={"content-type": "application/json"})
        assert resp.status_code == 413


# --------------------------------------------------------------------------------------- Redis errors (503)
def test_redis_out_of_memory_and_read_only_are_503(redis_srv, tmp_path, r):
    with live_server(_settings(redis_srv, tmp_path)) as base:
        c = client_for(base, "owner13")
        job_id = post(c).json()["id"]
        r.config_set("maxmemory-policy", "noeviction")
        r.config_set("maxmemory", "1")
        try:
            resp = post(c)
            assert resp.status_code == 503, resp.text
            assert resp.json()["detail"]["code"] == "redis_unavailable" and resp.headers["retry-after"]
            assert "OutOfMemory" in resp.json()["detail"]["message"] or "Response" in resp.json()["detail"]["message"]
            post(c, headers={"Idempotency-Key": "oom"})
            assert c.get(f"/jobs/{job_id}").status_code == 200  # reads still work
        finally:
            r.config_set("maxmemory", "0")
        assert post(c).status_code == 202
        # A read-only replica (its master unreachable): writes are refused with READONLY.
        r.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
        try:
            resp = post(c)
            assert resp.status_code == 503 and resp.headers["retry-after"]
        finally:
            r.execute_command("REPLICAOF", "NO", "ONE")
        assert post(c).status_code == 202
        metrics = c.get("/metrics").text
        assert 'explainq_api_redis_errors_total{error="' in metrics


@pytest.mark.parametrize("error", ["BusyLoadingError", "AuthenticationError", "ReadOnlyError", "TimeoutError",
                                   "ConnectionError", "ResponseError"])
def test_every_redis_error_class_is_503(redis_srv, tmp_path, error):
    from fastapi.testclient import TestClient
    from redis import exceptions

    app = create_app(_settings(redis_srv, tmp_path))

    async def boom(*args, **kwargs):
        raise getattr(exceptions, error)("simulated")

    app.state.store.asubmit_with_view = boom
    with TestClient(app) as client:
        resp = client.post("/test/sleep", json={"steps": 1}, headers={"Authorization": "Bearer key-owner14"})
    assert resp.status_code == 503 and resp.headers["retry-after"] == "2"
    assert resp.json()["detail"]["code"] == "redis_unavailable"


# ---------------------------------------------------------------------------------------- non-finite numbers
def test_nan_in_meta_and_result_never_reaches_json(server, r):
    c = client_for(server, "owner15")
    job_id = post(c).json()["id"]
    meta = {"kind": "test_sleep", "owner": "owner15", "metrics": {"loss": math.nan, "acc": math.inf},
            "progress": {"done": 1, "total": 2, "unit": "steps", "message": "", "eta_s": -math.inf}}
    r.hset(f"rq:job:{job_id}", "meta", json.dumps(meta))
    resp = c.get(f"/jobs/{job_id}")
    assert resp.status_code == 200
    assert resp.json()["metrics"] == {"loss": None, "acc": None} and resp.json()["progress"]["eta_s"] is None
    # The events stream's data is strict JSON.
    job = Job.fetch(job_id, connection=r, serializer=JSONSerializer)
    with r.pipeline() as pipe:
        job.set_status("finished", pipeline=pipe)
        Result.create(job, Result.Type.SUCCESSFUL, ttl=60, return_value={"score": math.nan, "ok": [1.0, math.inf]},
                      pipeline=pipe)
        pipe.execute()
    text = c.get(f"/jobs/{job_id}/events", params={"interval_s": 0.05}).text

    def strict(name):
        raise AssertionError(f"non-finite {name} in JSON")

    data = [json.loads(line[6:], parse_constant=strict) for line in text.splitlines() if line.startswith("data: ")]
    assert data and data[0]["metrics"] == {"loss": None, "acc": None}
    resp = c.get(f"/jobs/{job_id}/result")
    assert resp.status_code == 200 and json.loads(resp.text, parse_constant=strict) == {"score": None,
                                                                                      "ok": [1.0, None]}


# ------------------------------------------------------------------------------------------ DELETE finished
def test_a_cancel_only_delete_of_a_finished_job_is_409_with_its_final_status(service):
    ok = service.client.post("/test/sleep", json={"steps": 1, "step_s": 0}).json()["id"]
    bad = service.client.post("/test/sleep", json={"steps": 2, "step_s": 0, "fail_at": 0}).json()["id"]
    for job_id, final in ((ok, "succeeded"), (bad, "failed")):
        service.wait(job_id)
        resp = service.client.delete(f"/jobs/{job_id}", params={"cancel_only": "true"})
        assert resp.status_code == 409
        body = resp.json()
        assert body["detail"]["code"] == "already_finished" and body["detail"]["status"] == final
        assert body["job"]["status"] == final
    running = service.client.post("/test/sleep", json={"steps": 200, "step_s": 0.05}).json()["id"]
    service.wait(running, statuses=("running",))
    assert service.client.delete(f"/jobs/{running}").status_code == 202
    service.wait(running)
    resp = service.client.delete(f"/jobs/{running}", params={"cancel_only": "true"})
    assert resp.status_code == 409 and resp.json()["detail"]["status"] == "canceled"
    resp = service.client.delete(f"/jobs/{running}")  # without cancel_only a finished job is deleted
    assert resp.status_code == 200 and resp.json()["deleted"] is True
    assert service.client.get(f"/jobs/{running}").status_code == 404
