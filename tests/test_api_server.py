"""How `explainq api` serves the app, and the hot routes' cheap paths (auth lookup, submission script)."""

from __future__ import annotations

import argparse
import subprocess
import sys

from tests.service import ROOT


def test_explainq_api_serves_the_tuned_app_with_uvloop_and_httptools(monkeypatch, tmp_path):
    import uvicorn

    from explainq import cli

    monkeypatch.setenv("EXPLAINQ_HOME", str(tmp_path))
    monkeypatch.setenv("EXPLAINQ_API_KEYS", "")
    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append((app, kw)))
    cli.cmd_api(argparse.Namespace(host="127.0.0.1", port=8123, workers=1, no_access_log=False))
    (app, kw), = calls
    assert app == "app.main:served_app" and kw["factory"] is True
    assert (kw["loop"], kw["http"]) == ("uvloop", "httptools") == cli.server_implementations()
    assert kw["log_config"] is None and kw["access_log"] is True and kw["log_level"] == "info"


def test_served_app_freezes_the_startup_objects_and_raises_the_first_gc_threshold():
    # In a child process: freezing this test process's objects would outlive the test.
    code = ("import gc, app.main as m; before = gc.get_threshold(); a = m.served_app(); "
            "assert a is m.app, a; assert gc.get_freeze_count() > 10000, gc.get_freeze_count(); "
            "assert gc.get_threshold() == (m.GC_GEN0_THRESHOLD, *before[1:]), gc.get_threshold()")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "EXPLAINQ_API_KEYS": ""})
    assert r.returncode == 0, r.stderr


def _routes(routes, group=None):
    """(the router it was included with, route) for every route of an app."""
    for route in routes:
        inner = getattr(route, "original_router", None)  # an included router (FastAPI >= 0.16x keeps them nested)
        if inner is not None:
            yield from _routes(inner.routes, inner)
        elif getattr(route, "methods", None):
            yield group, route


def test_only_routes_of_one_router_answer_the_same_request(tmp_path):
    """Routers are included hot ones first; that reorders nothing that matters because a request two routes could
    answer (``/ui/jobs/live`` and ``/ui/jobs/{job_id}``) always has both in one router, whose order is kept."""
    import re

    from app.main import create_app
    from core.settings import Settings
    from tests.jobkinds import register_test_kinds

    register_test_kinds()
    app = create_app(Settings(EXPLAINQ_HOME=str(tmp_path), REDIS_URL="redis://127.0.0.1:1/0"))
    routes = list(_routes(app.routes))
    assert {"/jobs/{job_id}", "/test/sleep", "/health", "/metrics", "/ui/jobs/{job_id}"} <= {r.path for _, r in routes}
    overlaps = 0
    for group, route in routes:
        concrete = re.sub(r"\{[^}]+\}", "x1", route.path)
        for method in route.methods - {"HEAD"}:
            answering = [(g, r) for g, r in routes if method in r.methods and r.path_regex.match(concrete)]
            assert route in [r for _, r in answering]
            assert all(g is group for g, _ in answering), (method, concrete, [r.path for _, r in answering])
            overlaps += len(answering) > 1
    assert overlaps  # the check above is not vacuous
    # The hot routes come first.
    order = [(sorted(r.methods)[0], r.path) for _, r in routes]
    assert order.index(("GET", "/jobs/{job_id}")) < order.index(("POST", "/test/sleep")) < order.index(
        ("GET", "/health"))


def test_api_keys_are_found_by_digest():
    from core.settings import Settings

    s = Settings(EXPLAINQ_API_KEYS="alice:key-a,bob:key-b, carol:k\u00e9y-c")
    assert s.api_key_for("key-a") == "key-a" and s.api_key_for("key-b") == "key-b"
    assert s.api_key_for("k\u00e9y-c") == "k\u00e9y-c" and s.api_keys["k\u00e9y-c"] == "carol"
    for wrong in ("", "key-", "key-a ", "KEY-A", "key-ab", "alice", "key-c"):
        assert s.api_key_for(wrong) is None, wrong
    assert Settings(EXPLAINQ_API_KEYS="").api_key_for("anything") is None


def test_caller_answers_the_key_owner_or_401(tmp_path):
    from fastapi.testclient import TestClient

    from app.main import create_app
    from core.settings import Settings

    app = create_app(Settings(EXPLAINQ_HOME=str(tmp_path), REDIS_URL="redis://127.0.0.1:1/0",
                              EXPLAINQ_API_KEYS="alice:key-a,bob:key-b"))
    with TestClient(app) as client:
        for headers, message in [({}, "send an API key as 'Authorization: Bearer <key>'"),
                                 ({"Authorization": "Basic key-a"}, "send an API key as 'Authorization: Bearer <key>'"),
                                 ({"Authorization": "Bearer key-c"}, "unknown API key"),
                                 ({"Authorization": "Bearer key-a-and-more"}, "unknown API key")]:
            r = client.get("/jobs/0123abcd", headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", headers
            assert r.json() == {"detail": {"code": "unauthorized", "message": message}}
        # A known key passes authentication (then the job is looked up: Redis is down here, so 503).
        for key in ("key-a", "key-b", " key-b "):
            r = client.get("/jobs/0123abcd", headers={"Authorization": f"bearer {key}"})
            assert r.status_code == 503 and r.headers["retry-after"] == "2", r.text


# ------------------------------------------------------------------------------------ the submission script
SLEEP_PAYLOAD = {"steps": 1, "step_s": 0.0, "fail_at": None, "model": None}


def _store(settings, **extra):
    import redis

    from core.jobstore import JobStore
    from core.settings import Settings

    if extra:
        settings = Settings(EXPLAINQ_HOME=str(settings.home), REDIS_URL=settings.redis_url, **extra)
    return JobStore(redis.Redis.from_url(settings.redis_url), settings)


def _snapshot(r) -> dict:
    """Every key with its type and content (TTLs left out: they tick)."""
    read = {"hash": r.hgetall, "set": r.smembers, "string": r.get,
            "list": lambda k: r.lrange(k, 0, -1), "zset": lambda k: r.zrange(k, 0, -1, withscores=True)}
    return {key: read[r.type(key).decode()](key) for key in r.keys("*")}


def test_a_submission_writes_exactly_what_rqs_own_enqueue_writes(redis_settings):
    import json
    import zlib

    import redis
    from rq import Queue
    from rq.serializers import JSONSerializer

    from core.contract.kind import KINDS
    from core.jobstore import RUNNER, body_hash
    from core.metrics import SUBMITTED

    store = _store(redis_settings)
    r = store.redis
    kind = KINDS["test_sleep"]
    job_id, replayed, view = store.submit_with_view(kind, SLEEP_PAYLOAD, "alice", "key-1")
    assert not replayed and view["id"] == job_id and view["status"] == "queued" and view["position"] == 0
    # The same job enqueued by RQ itself, in another database of the same server.
    kw = r.connection_pool.connection_kwargs
    other = redis.Redis(host=kw["host"], port=kw["port"], password=kw.get("password"), db=1)
    other.flushdb()
    digest = body_hash({"kind": kind.name, "payload": SLEEP_PAYLOAD})
    Queue(kind.queue, connection=other, serializer=JSONSerializer).enqueue_call(
        RUNNER, args=(kind.name, SLEEP_PAYLOAD), job_id=job_id, timeout=kind.timeout_s,
        result_ttl=store.settings.result_ttl_for(kind.result_ttl_s), failure_ttl=store.settings.failure_ttl_s,
        ttl=None, meta={"kind": kind.name, "owner": "alice", "body": digest}, description=f"{kind.name} job")
    ours, theirs = r.hgetall(f"rq:job:{job_id}"), other.hgetall(f"rq:job:{job_id}")
    assert ours.keys() == theirs.keys()
    for field in ours.keys() - {b"created_at", b"enqueued_at", b"data"}:
        assert ours[field] == theirs[field], field
    assert zlib.decompress(ours[b"data"]) == zlib.decompress(theirs[b"data"])
    assert r.ttl(f"rq:job:{job_id}") == other.ttl(f"rq:job:{job_id}") == -1
    assert r.lrange("rq:queue:explain", 0, -1) == other.lrange("rq:queue:explain", 0, -1) == [job_id.encode()]
    assert r.smembers("rq:queues") == other.smembers("rq:queues")
    # And the service's own records.
    assert r.smembers("explainq:active:alice") == {job_id.encode()}
    assert [m for m, _ in r.zrange("explainq:jobs:alice", 0, -1, withscores=True)] == [job_id.encode()]
    assert r.hget(SUBMITTED, kind.name) == b"1"
    (idem,) = r.keys("explainq:idem:alice:*")
    assert json.loads(r.get(idem)) == {"job_id": job_id, "body": digest, "state": "created"}
    assert r.ttl(idem) > 0
    other.flushdb()


def test_replays_takeovers_and_refusals(redis_settings):
    import pytest

    from core.contract.kind import KINDS
    from core.jobstore import IdempotencyConflict, IdempotencyInProgress, QuotaExceeded

    kind = KINDS["test_sleep"]
    store = _store(redis_settings, EXPLAINQ_MAX_ACTIVE_JOBS=2, EXPLAINQ_MAX_QUEUE_LENGTH=3)
    r = store.redis
    first, replayed, _ = store.submit_with_view(kind, SLEEP_PAYLOAD, "alice", "k")
    again, replayed, view = store.submit_with_view(kind, SLEEP_PAYLOAD, "alice", "k")
    assert again == first and replayed and view["id"] == first and view["position"] == 0
    # Refusals write nothing.
    before = _snapshot(r)
    with pytest.raises(IdempotencyConflict):
        store.submit_with_view(kind, {**SLEEP_PAYLOAD, "steps": 2}, "alice", "k")
    assert _snapshot(r) == before
    second, _, view = store.submit_with_view(kind, SLEEP_PAYLOAD, "alice")
    assert view["position"] == 1
    before = _snapshot(r)
    with pytest.raises(QuotaExceeded) as refused:
        store.submit_with_view(kind, SLEEP_PAYLOAD, "alice")
    assert refused.value.limit == "EXPLAINQ_MAX_ACTIVE_JOBS" and refused.value.value == 2
    assert _snapshot(r) == before
    store.submit_with_view(kind, SLEEP_PAYLOAD, "bob")  # the queue is now full (3)
    before = _snapshot(r)
    with pytest.raises(QuotaExceeded) as refused:
        store.submit_with_view(kind, SLEEP_PAYLOAD, "carol")
    assert refused.value.limit == "EXPLAINQ_MAX_QUEUE_LENGTH"
    assert _snapshot(r) == before
    # A key whose job expired is taken over; an ended job's slot is pruned at the limit.
    r.delete(f"rq:job:{first}")
    r.lpop("rq:queue:explain")
    fresh, replayed, view = store.submit_with_view(kind, SLEEP_PAYLOAD, "alice", "k")
    assert fresh not in (first, second) and not replayed and view["position"] == 2
    assert r.smembers("explainq:active:alice") == {second.encode(), fresh.encode()}
    # A key some other process is creating a job for right now.
    key = next(k for k in r.keys("explainq:idem:alice:*"))
    record = r.get(key)
    r.set(key, record.replace(b'"created"', b'"creating"'))
    with pytest.raises(IdempotencyInProgress):
        store.submit_with_view(kind, SLEEP_PAYLOAD, "alice", "k")


def test_the_async_submission_is_the_sync_one(redis_settings):
    import asyncio

    import redis.asyncio as aioredis

    from core.contract.kind import KINDS
    from core.jobstore import JobStore, QuotaExceeded

    kind = KINDS["test_sleep"]
    sync = _store(redis_settings, EXPLAINQ_MAX_ACTIVE_JOBS=2)

    async def run():
        aredis = aioredis.Redis.from_url(redis_settings.redis_url)
        store = JobStore(sync.redis, sync.settings, aredis)
        try:
            answers = [await store.asubmit_with_view(kind, SLEEP_PAYLOAD, "alice", "k") for _ in range(2)]
            answers.append(await store.asubmit_with_view(kind, SLEEP_PAYLOAD, "alice"))
            try:
                await store.asubmit_with_view(kind, SLEEP_PAYLOAD, "alice")
            except QuotaExceeded as exc:
                answers.append(exc.limit)
            return answers
        finally:
            await aredis.aclose()

    (a, a_replayed, a_view), (b, b_replayed, b_view), (c, _, c_view), refused = asyncio.run(run())
    assert (a_replayed, b_replayed, b) == (False, True, a) and refused == "EXPLAINQ_MAX_ACTIVE_JOBS"
    (d, _, d_view) = sync.submit_with_view(kind, SLEEP_PAYLOAD, "bob")

    def shape(view):
        return {k: v for k, v in view.items() if k not in ("id", "created_at", "links", "position")}

    assert shape(a_view) == shape(c_view) == shape(d_view) and a_view == b_view
    assert [a_view["position"], c_view["position"], d_view["position"]] == [0, 1, 2]
    assert sync.redis.lrange("rq:queue:explain", 0, -1) == [a.encode(), c.encode(), d.encode()]


def test_the_async_client_packs_commands_as_redis_py_does():
    import redis.asyncio as aioredis
    from rq.job import JobStatus

    from app.main import async_redis

    ours = async_redis("redis://127.0.0.1:1/0").connection_pool.make_connection()
    theirs = aioredis.Redis.from_url("redis://127.0.0.1:1/0").connection_pool.make_connection()
    assert type(ours) is not type(theirs) and isinstance(ours, type(theirs))
    for args in [("GET", "k"), ("CONFIG GET", "maxmemory"), ("HSET", "rq:job:x", "status", JobStatus.QUEUED),
                 ("EVALSHA", "a" * 40, 2, "k1", "k\u00e9y", 0, -7, 12345678901234, 0.5, 1e-07, 1e16, 3.0),
                 ("SET", b"\x00\xff binary", memoryview(b"mv"), bytearray(b"ba")),
                 ("HSET", "big", "data", b"x" * 100_000, "text", "y" * 70_000)]:
        assert b"".join(ours.pack_command(*args)) == b"".join(theirs.pack_command(*args)), args


def test_get_job_documents_its_path_parameter_as_the_other_job_routes_do(tmp_path):
    from app.main import create_app
    from core.settings import Settings

    spec = create_app(Settings(EXPLAINQ_HOME=str(tmp_path), REDIS_URL="redis://127.0.0.1:1/0")).openapi()
    operations = spec["paths"]["/jobs/{job_id}"]
    assert operations["get"]["parameters"] == operations["delete"]["parameters"][:1]
    assert [p["name"] for p in operations["get"]["parameters"]] == ["job_id"]


def test_run_script_answers_as_the_script_does_through_flushes_errors_and_dropped_connections(redis_settings):
    import asyncio

    import pytest
    import redis
    from redis.exceptions import ResponseError

    from app.main import async_redis
    from core.jobstore import run_script

    admin = redis.Redis.from_url(redis_settings.redis_url)

    async def run():
        client = async_redis(redis_settings.redis_url)
        echo = client.register_script("return {KEYS[1], ARGV[1], redis.call('INCR', KEYS[1])}")
        failing = client.register_script("return redis.error_reply('WRONG the script says no')")
        try:
            assert await run_script(client, echo, ["n"], ["a"]) == [b"n", b"a", 1]  # NOSCRIPT: loaded, then run
            assert await run_script(client, echo, ["n"], [b"\x00\xff"]) == [b"n", b"\x00\xff", 2]
            assert await echo(keys=["n"], args=["a"]) == [b"n", b"a", 3]
            pool = client.connection_pool
            connections = len(pool._available_connections)
            with pytest.raises(ResponseError, match="the script says no"):
                await run_script(client, failing, [], [])
            with pytest.raises(ResponseError, match="the script says no"):
                await run_script(client, failing, [], [])
            assert len(pool._available_connections) == connections  # an error reply leaves the connection usable
            admin.script_flush()
            assert await run_script(client, echo, ["n"], ["b"]) == [b"n", b"b", 4]
            admin.client_kill_filter(_type="normal", skipme=True)  # every pooled connection is now dead
            assert await run_script(client, echo, ["n"], ["c"]) == [b"n", b"c", 5]
            assert await run_script(client, echo, ["n"], ["d"]) == [b"n", b"d", 6]
            # A cancelled call leaves no unread reply behind on a pooled connection.
            slow = client.register_script("local t = redis.call('TIME'); while true do local n = redis.call('TIME');"
                                          " if (n[1] - t[1]) * 1000000 + n[2] - t[2] > 200000 then break end end"
                                          " return 'slow'")
            await client.script_load(slow.script)
            task = asyncio.ensure_future(run_script(client, slow, [], []))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for i in range(7, 10):
                assert await run_script(client, echo, ["n"], ["e"]) == [b"n", b"e", i]
        finally:
            await client.aclose()

    asyncio.run(run())


def test_the_root_redirects_to_the_dashboard_without_auth_and_is_not_in_the_schema(tmp_path):
    from fastapi.testclient import TestClient

    from app.main import create_app
    from core.settings import Settings

    app = create_app(Settings(EXPLAINQ_HOME=str(tmp_path), REDIS_URL="redis://127.0.0.1:1/0",
                              EXPLAINQ_API_KEYS="alice:key-alice"))
    resp = TestClient(app).get("/", follow_redirects=False)
    assert resp.status_code in (303, 307), resp.text
    assert resp.headers["location"] == "/ui"
    assert "/" not in app.openapi()["paths"]
