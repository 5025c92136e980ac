"""The Python SDK (sync and async) against a real server: real Redis, a real worker process, HTTP over a socket."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from explainq_client import (
    APIConnectionError,
    AsyncClient,
    AttributionResult,
    AuthenticationError,
    Client,
    ConflictError,
    JobCanceledError,
    JobFailedError,
    NotFoundError,
    Result,
    ServiceUnavailableError,
    ValidationError,
    WaitTimeoutError,
)

from tests.http_server import KEYS, HttpServer, keyed_service

SLEEP = "/test/sleep"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from keyed_service(tmp_path_factory.mktemp("sdk-home"))


@pytest.fixture()
def client(server):
    _, http = server
    with Client(http.url, KEYS["alice"]) as c:
        yield c


def test_submit_wait_result_and_progress(client):
    job = client.submit(SLEEP, {"steps": 4, "step_s": 0.05})
    assert job.kind == "test_sleep" and job.status in ("queued", "running")
    assert job.wait(timeout=60) is job
    assert job.status == "succeeded" and job.done and job.error is None
    assert job.progress["done"] == job.progress["total"] == 4 and job.progress["unit"] == "steps"
    result = job.result()
    assert isinstance(result, Result) and result["steps"] == 4 and result.kind == "test_sleep"
    assert job.result() is result  # kept, not fetched again
    assert client.jobs.get(job.id).status == "succeeded"


def test_stream_yields_progress_events_until_end(client):
    job = client.submit(SLEEP, {"steps": 5, "step_s": 0.1})
    events = list(job.stream(interval_s=0.05))
    assert events[-1].event == "end" and events[-1].status == "succeeded"
    assert all(e.job is not None for e in events[:-1])
    dones = [e.progress["done"] for e in events if e.progress]
    assert dones == sorted(dones) and dones[-1] == 5 and len(dones) >= 2
    assert "running" in [e.event for e in events]
    assert job.status == "succeeded"  # the job's view follows the stream


def test_wait_raises_the_jobs_error_code_on_failure(client):
    job = client.submit(SLEEP, {"steps": 5, "step_s": 0.01, "fail_at": 2})
    with pytest.raises(JobFailedError) as info:
        job.wait(timeout=60)
    assert info.value.code == "bad_step" and info.value.message == "step 2 failed on purpose"
    assert info.value.job.id == job.id and job.status == "failed"
    with pytest.raises(ConflictError) as conflict:
        job.result()
    assert conflict.value.status_code == 409 and conflict.value.code == "failed"


def test_cancel_running_job_then_wait_raises_canceled(client):
    job = client.submit(SLEEP, {"steps": 400, "step_s": 0.05})
    for event in job.stream(interval_s=0.05):
        if event.event == "running":
            break
    with pytest.raises(ConflictError) as early:
        job.result()
    assert early.value.code == "not_ready"
    job.cancel()
    with pytest.raises(JobCanceledError) as info:
        job.wait(timeout=30)
    assert info.value.code == "canceled" and job.status == "canceled"
    assert job.progress["done"] < 400
    with pytest.raises(ConflictError) as again:
        client.jobs.cancel(job.id)
    assert again.value.code == "already_finished"


def test_cancel_queued_job_through_jobs(client):
    blocker = client.submit(SLEEP, {"steps": 10_000, "step_s": 0.05})  # runs until canceled
    queued = client.submit(SLEEP, {"steps": 1, "step_s": 0})
    assert client.jobs.cancel(queued.id).status == "canceled"
    blocker.cancel()
    with pytest.raises(JobCanceledError):
        blocker.wait(timeout=30)


def test_wait_timeout_is_typed_and_leaves_the_job_running(client):
    job = client.submit(SLEEP, {"steps": 10_000, "step_s": 0.05})  # 500 s: running until canceled below
    start = time.monotonic()
    with pytest.raises(WaitTimeoutError) as info:
        job.wait(timeout=0.5, poll_interval=0.1)
    assert 0.4 < time.monotonic() - start < 60 and isinstance(info.value, TimeoutError)
    assert not job.done
    job.cancel()
    with pytest.raises(JobCanceledError):
        job.wait(timeout=60)


def test_list_filters_pages_and_iterates(client):
    ids = [client.submit(SLEEP, {"steps": 1, "step_s": 0}).id for _ in range(3)]
    for job_id in ids:
        client.jobs.get(job_id).wait(timeout=60)
    page = client.jobs.list(kind="test_sleep", status="succeeded", limit=2)
    assert len(page) == 2 and page.next_cursor
    assert all(j.status == "succeeded" and j.kind == "test_sleep" for j in page)
    seen = [j.id for j in client.jobs.iter(kind="test_sleep", status="succeeded", page_size=2)]
    assert len(seen) == len(set(seen)) and set(ids) <= set(seen)
    assert [i for i in seen if i in ids] == list(reversed(ids))  # newest first
    with pytest.raises(ValidationError) as info:
        client.jobs.list(status="finished")
    assert info.value.fields == ["status"] and info.value.errors[0].loc == ("query", "status")


def test_models_list(client):
    listing = client.models.list()
    (model,) = [m for m in listing.models if m.name == "counter"]
    assert model.kind == "test" and model.parameters == 3 and model.meta == {"note": "<b>escaped</b>"}
    assert "counter" in listing.names()


def test_artifacts_and_download(client, tmp_path):
    """``GET /jobs/{id}/artifacts`` and the file route."""
    job = client.submit(SLEEP, {"steps": 1, "step_s": 0}).wait(timeout=60)
    (artifact,) = job.artifacts()
    assert (artifact.name, artifact.size) == ("out.txt", 4) and artifact.url.endswith("/artifacts/out.txt")
    (path,) = job.download(tmp_path)
    assert path == tmp_path / "out.txt" and path.read_text() == "done"
    assert [a["name"] for a in job.result().artifacts] == ["out.txt"]


def test_health_and_ready(client):
    assert client.health() == {"status": "ok"}
    assert client.ready()["status"] == "ready"


@pytest.mark.parametrize(("method", "kwargs", "field"), [
    ("attributions", {"model": "no-such-model", "samples": [{"id": "a", "history": ["x"], "candidate": "y"}]},
     "model"),
    ("attributions", {"model": "m", "samples": [{"id": "a", "history": [], "candidate": "y"}]},
     "samples.0.history"),
    ("attributions", {"model": "m", "samples": [{"id": "a", "history": ["x"], "candidate": "y"}], "n_steps": 0},
     "n_steps"),
    ("tracin", {"model": "no-such-model", "test_triples": [["a", "b", "c"]]}, "model"),
    ("tracin", {"model": "m", "test_triples": [["a", "b"]]}, "test_triples.0"),
    ("train_bdh", {"epochs": 0}, "epochs"),
    ("train_bdh", {"model": {"n_layer": 1, "n_embd": 30, "n_head": 4}}, "model.n_head"),
    ("train_conve", {"name": "bad name!"}, "name"),
    ("train_conve", {"name": "ok", "embedding_dim": 2}, "embedding_dim"),
    ("ablations", {"dataset": "no-such-dataset"}, "dataset"),
    ("ablations", {"dataset": "d", "layer_sets": ["audio"]}, "layer_sets.0"),
    ("train_news", {"name": "n1", "dataset": "no-such-dataset"}, "dataset"),
    ("train_news", {"name": "n1", "dataset": "d", "architecture": "lstm"}, "architecture"),
    ("import_model", {"name": "m1", "kind": "conve", "path": "no/such/dir"}, "path"),
    ("import_model", {"name": "m1", "kind": "resnet", "path": "p"}, "kind"),
])
def test_every_kind_method_reports_the_bad_field(client, method, kwargs, field):
    with pytest.raises(ValidationError) as info:
        getattr(client, method)(**kwargs)
    assert info.value.status_code == 422
    assert field in info.value.fields, info.value.errors


def test_unknown_field_passed_through_extra_is_refused_by_name(client):
    with pytest.raises(ValidationError) as info:
        client.train_bdh(epochs=1, bogus=1)
    assert info.value.fields == ["bogus"]


def test_unknown_job_is_not_found_everywhere(client):
    with pytest.raises(NotFoundError) as info:
        client.jobs.get("no-such-job")
    assert info.value.code == "not_found" and info.value.status_code == 404
    with pytest.raises(NotFoundError):
        client.jobs.cancel("no-such-job")


def test_another_keys_job_is_not_found(server, client):
    job = client.submit(SLEEP, {"steps": 1, "step_s": 0})
    with Client(server[1].url, KEYS["bob"]) as bob, pytest.raises(NotFoundError):
        bob.jobs.get(job.id)


@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_missing_or_bad_key_is_an_authentication_error(server, key, monkeypatch):
    monkeypatch.delenv("EXPLAINQ_API_KEY", raising=False)
    with Client(server[1].url, key) as anonymous, pytest.raises(AuthenticationError) as info:
        anonymous.jobs.list()
    assert info.value.status_code == 401 and info.value.code == "unauthorized"


def test_url_and_key_come_from_the_environment(server, monkeypatch):
    monkeypatch.setenv("EXPLAINQ_URL", server[1].url)
    monkeypatch.setenv("EXPLAINQ_API_KEY", KEYS["alice"])
    with Client() as c:
        assert isinstance(c.jobs.list(limit=1).items, list)


class LoseFirstSubmitResponse(httpx.HTTPTransport):
    """The first POST reaches the server and creates the job, but its answer is lost on the way back."""

    def __init__(self) -> None:
        super().__init__()
        self.posts: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.method == "POST":
            self.posts.append(request)
            if len(self.posts) == 1:
                response.read()
                response.close()
                raise httpx.ReadError("connection reset", request=request)
        return response


def test_a_retried_submission_never_creates_two_jobs(server):
    transport = LoseFirstSubmitResponse()
    with Client(server[1].url, KEYS["alice"], transport=transport) as c:
        before = {j.id for j in c.jobs.iter(kind="test_sleep")}
        job = c.submit(SLEEP, {"steps": 1, "step_s": 0, "model": "counter"})
        after = {j.id for j in c.jobs.iter(kind="test_sleep")}
    assert len(transport.posts) == 2
    keys = {r.headers["Idempotency-Key"] for r in transport.posts}
    assert len(keys) == 1 and len(keys.pop()) >= 16
    assert after - before == {job.id}


def test_explicit_idempotency_key_replays_and_conflicts(client):
    first = client.submit(SLEEP, {"steps": 1, "step_s": 0}, idempotency_key="sdk-key-1")
    again = client.submit(SLEEP, {"steps": 1, "step_s": 0}, idempotency_key="sdk-key-1")
    assert again.id == first.id
    with pytest.raises(ValidationError) as info:
        client.submit(SLEEP, {"steps": 2, "step_s": 0}, idempotency_key="sdk-key-1")
    assert info.value.errors[0].loc == ("header", "Idempotency-Key")


def test_503_is_retried_after_retry_after_then_raised(tmp_path):
    """An API whose Redis is down answers 503 with Retry-After: 2; the client waits it out, then gives up."""
    from core.redis_server import free_port
    from core.settings import Settings

    settings = Settings(EXPLAINQ_HOME=str(tmp_path), REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
                        EXPLAINQ_REDIS_TIMEOUT_S=0.2)
    with HttpServer(settings) as dead, Client(dead.url, max_retries=1) as c:
        start = time.monotonic()
        with pytest.raises(ServiceUnavailableError) as info:
            c.jobs.list()
        elapsed = time.monotonic() - start
    assert info.value.code == "redis_unavailable" and info.value.retry_after == 2
    assert 2.0 <= elapsed < 10


@pytest.mark.slow
def test_a_brief_redis_outage_is_ridden_out(tmp_path):
    """Redis stops; the API answers 503 with Retry-After; Redis is back before it; the call succeeds."""
    import threading

    from core.redis_server import EmbeddedRedis
    from core.settings import Settings

    redis_server = EmbeddedRedis(tmp_path / "redis").start()
    settings = Settings(EXPLAINQ_HOME=str(tmp_path), REDIS_URL=redis_server.url, EXPLAINQ_REDIS_TIMEOUT_S=0.2)
    try:
        with HttpServer(settings) as api, Client(api.url, max_retries=3) as c:
            assert c.jobs.list().items == []
            redis_server.stop()
            restart = threading.Timer(1.0, redis_server.start)
            restart.start()
            start = time.monotonic()
            assert c.jobs.list().items == []
            elapsed = time.monotonic() - start
            restart.join()
        assert 2.0 <= elapsed < 15  # one 503, then the Retry-After of 2 s was waited out
    finally:
        redis_server.stop()


def test_an_unreachable_server_is_a_connection_error():
    from core.redis_server import free_port

    with Client(f"http://127.0.0.1:{free_port()}", max_retries=1) as c, pytest.raises(APIConnectionError):
        c.health()


def test_job_renders_its_status_in_jupyter(client):
    job = client.submit(SLEEP, {"steps": 1, "step_s": 0})
    html = job.wait(timeout=60)._repr_html_()
    assert job.id in html and "succeeded" in html


# ------------------------------------------------------------------------------------------------ async
def test_async_client_has_the_same_surface(server):
    async def scenario() -> None:
        async with AsyncClient(server[1].url, KEYS["alice"]) as c:
            job = await c.submit(SLEEP, {"steps": 3, "step_s": 0.05})
            events = [e async for e in job.stream(interval_s=0.05)]
            assert events[-1].event == "end" and job.status == "succeeded"
            assert (await (await c.jobs.get(job.id)).wait(timeout=30)).status == "succeeded"
            assert (await job.result())["steps"] == 3

            failing = await c.submit(SLEEP, {"steps": 3, "step_s": 0, "fail_at": 0})
            with pytest.raises(JobFailedError) as info:
                await failing.wait(timeout=60)
            assert info.value.code == "bad_step"

            running = await c.submit(SLEEP, {"steps": 400, "step_s": 0.05})
            await running.cancel()
            with pytest.raises(JobCanceledError):
                await running.wait(timeout=30)

            page = await c.jobs.list(limit=2)
            assert len(page) == 2
            assert len([j async for j in c.jobs.iter(kind="test_sleep", page_size=2)]) >= 3
            assert any(m.name == "counter" for m in (await c.models.list()).models)
            with pytest.raises(ValidationError) as bad:
                await c.attributions(model="no-such-model", samples=[{"id": "a", "history": ["x"],
                                                                      "candidate": "y"}])
            assert bad.value.fields == ["model"]
            with pytest.raises(NotFoundError):
                await c.jobs.get("no-such-job")
        async with AsyncClient(server[1].url, "wrong-key") as bad_key:
            with pytest.raises(AuthenticationError):
                await bad_key.jobs.list()

    asyncio.run(scenario())


def test_attribution_result_class_is_chosen_by_renderer():
    from explainq_client.results import make_result

    assert isinstance(make_result("attributions", {"samples": []}), AttributionResult)


def test_a_kind_the_sdk_does_not_know_is_submitted_and_rendered_as_it_describes_itself(client):
    """The server's ``GET /kinds`` names the route and the renderer: ``submit`` by the kind's name reaches its
    route (which is not derived from the name), and the result class follows the renderer, not the name."""
    from explainq_client import TrainingResult

    described = {k["name"]: k for k in client.kinds()}
    assert described["test_described"]["route"] == "/test/described-route"
    assert described["test_described"]["renderer"] == "training"
    assert described["import_model"]["route"] == "/models/import"
    assert described["attributions"]["renderer"] == "attributions" and "test_described" in described
    job = client.submit("test_described", {"steps": 1, "step_s": 0.01})
    assert job.kind == "test_described"
    result = job.wait(timeout=60).result()
    assert isinstance(result, TrainingResult) and result.kind == "test_described"
    with pytest.raises(ValueError, match="unknown job kind 'bogus'"):
        client.submit("bogus", {})


def test_datasets_register_get_delete(server, client):
    """A MIND directory under the data roots registers by name (format and counts detected), is looked up, is
    another key's to neither delete nor take over, and is deleted by its owner."""
    from tests.byo_fixtures import mind_dir

    service, http = server
    mind_dir(service.settings.data_roots[0] / "sdk-mind")
    registered = client.datasets.register("sdk-mind", "sdk-mind", description="tiny MIND")
    assert registered["name"] == "sdk-mind" and registered["kind"] == "news" and registered["counts"]
    got = client.datasets.get("sdk-mind")
    assert got["format"] == registered["format"] and got["meta"]["description"] == "tiny MIND"
    with pytest.raises(ConflictError) as again:
        client.datasets.register("sdk-mind", "sdk-mind")
    assert "overwrite" in again.value.message
    assert client.datasets.register("sdk-mind", "sdk-mind", overwrite=True)["name"] == "sdk-mind"
    with pytest.raises(ValidationError) as outside:
        client.datasets.register("escape", "../../etc")
    assert outside.value.fields == ["path"]
    with Client(http.url, KEYS["bob"]) as bob, pytest.raises(ConflictError):
        bob.datasets.delete("sdk-mind")
    assert client.datasets.delete("sdk-mind")["deleted"] == "sdk-mind"
    with pytest.raises(NotFoundError):
        client.datasets.get("sdk-mind")
    with pytest.raises(NotFoundError):
        client.datasets.delete("sdk-mind")
