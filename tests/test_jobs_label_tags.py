"""A job's ``label`` and ``tags``: on every kind's request, validated naming the field, kept with the job, shown in
its view with the model and input columns, and searchable through ``GET /jobs?q=&tag=``, the SDK and the CLI.

A real app over HTTP (uvicorn in a thread) on a private Redis, no workers: the jobs stay queued.
"""

from __future__ import annotations

import json

import httpx
import pytest

from core.contract.columns import job_columns
from core.contract.kind import load_kinds as load_all
from core.redis_server import EmbeddedRedis
from core.settings import Settings
from tests.http_server import HttpServer

KEYS = "alice:label-key-alice-0123456789,bob:label-key-bob-0123456789"
ALICE, BOB = "label-key-alice-0123456789", "label-key-bob-0123456789"
SLEEP = {"steps": 1, "step_s": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("labels")
    redis = EmbeddedRedis(home / "redis", appendonly=False).start()
    try:
        settings = Settings(EXPLAINQ_HOME=str(home), REDIS_URL=redis.url, EXPLAINQ_API_KEYS=KEYS,
                            EXPLAINQ_MAX_ACTIVE_JOBS=1000)
        with HttpServer(settings) as http:
            yield http.url
    finally:
        redis.stop()


def _api(url: str, key: str = ALICE) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def _submit(api: httpx.Client, **fields) -> dict:
    r = api.post("/test/sleep", json={**SLEEP, **fields})
    assert r.status_code == 202, r.text
    return r.json()


def _ids(r: httpx.Response) -> list[str]:
    assert r.status_code == 200, r.text
    return [j["id"] for j in r.json()["items"]]


def test_every_public_kind_takes_a_label_and_tags() -> None:
    for kind in load_all().values():
        if kind.internal:
            continue
        fields = kind.request.model_fields
        assert "label" in fields and "tags" in fields, kind.name
        assert fields["label"].title and fields["tags"].title, kind.name


@pytest.mark.parametrize(("fields", "loc"), [
    ({"label": "x" * 201}, ["body", "label"]),
    ({"label": "two\nlines"}, ["body", "label"]),
    ({"label": 7}, ["body", "label"]),
    ({"tags": "one"}, ["body", "tags"]),
    ({"tags": ["ok", "not a slug"]}, ["body", "tags", 1]),
    ({"tags": ["-dash-first"]}, ["body", "tags", 0]),
    ({"tags": ["x" * 33]}, ["body", "tags", 0]),
    ({"tags": [f"t{i}" for i in range(17)]}, ["body", "tags"]),
])
def test_a_bad_label_or_tag_is_422_naming_the_field(server, fields, loc) -> None:
    with _api(server) as api:
        r = api.post("/test/sleep", json={**SLEEP, **fields})
        assert r.status_code == 422, r.text
        assert [d["loc"] for d in r.json()["detail"]] == [loc], r.text
        # a product kind refuses it on the same field, before any registry check
        r = api.post("/train/conve", json={"name": "x", **fields})
        assert r.status_code == 422 and loc in [d["loc"] for d in r.json()["detail"]], r.text


def test_label_and_tags_are_kept_with_the_job_and_shown_in_its_view(server) -> None:
    with _api(server) as api:
        job = _submit(api, label="  Baseline run  ", tags=["NRMS", "week-3", "nrms"])
        assert job["label"] == "Baseline run" and job["tags"] == ["nrms", "week-3"]
        again = api.get(f"/jobs/{job['id']}").json()
        assert again["label"] == "Baseline run" and again["tags"] == ["nrms", "week-3"]
        assert api.get(f"/jobs/{job['id']}/request").json()["label"] == "Baseline run"
        plain = _submit(api)
        assert plain["label"] is None and plain["tags"] == []
        # a request without them is stored (and its Idempotency-Key's body compared) as before they existed
        assert not {"label", "tags"} & set(api.get(f"/jobs/{plain['id']}/request").json())


def test_search_by_text_and_tags_keeps_only_the_callers_matching_jobs(server) -> None:
    with _api(server) as api, _api(server, BOB) as bob:
        a = _submit(api, label="Poisoned twin comparison", tags=["poison", "nrms-s"])
        b = _submit(api, label="clean baseline", tags=["nrms-s"])
        c = _submit(api, label="unrelated")
        theirs = _submit(bob, label="Poisoned twin comparison", tags=["poison", "nrms-s"])
        assert _ids(api.get("/jobs", params={"q": "POISONED"})) == [a["id"]]
        assert _ids(api.get("/jobs", params={"tag": "nrms-s"}))== [b["id"], a["id"]]
        assert _ids(api.get("/jobs", params=[("tag", "nrms-s"), ("tag", "Poison")])) == [a["id"]]
        assert _ids(api.get("/jobs", params={"q": "baseline", "tag": "poison"})) == []
        assert c["id"] in _ids(api.get("/jobs", params={"q": c["id"][:10]}))
        assert _ids(api.get("/jobs", params={"q": "test_sleep", "tag": "nrms-s"})) == [b["id"], a["id"]]
        assert theirs["id"] not in _ids(api.get("/jobs", params={"q": "poisoned"}))
        assert _ids(bob.get("/jobs", params={"tag": "poison"})) == [theirs["id"]]


@pytest.mark.parametrize(("params", "loc"), [
    ({"q": "x" * 201}, ["query", "q"]),
    ({"tag": "no spaces"}, ["query", "tag", 0]),
    ({"tag": "y" * 33}, ["query", "tag", 0]),
    ([("tag", f"t{i}") for i in range(17)], ["query", "tag"]),
])
def test_a_bad_search_is_422_naming_the_parameter(server, params, loc) -> None:
    with _api(server) as api:
        r = api.get("/jobs", params=params)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == loc, r.text


def test_model_and_input_columns_tell_jobs_apart() -> None:
    assert job_columns({"model": "nrms", "samples": [{"candidate": "Lakers win"}, {"candidate": "b"}]}) == {
        "model": "nrms", "input": "2 samples: “Lakers win”"}
    assert job_columns({"model": "nrms", "compare_with": "twin",
                        "dataset": {"name": "mind", "split": "valid", "n_samples": 500}}) == {
        "model": "nrms vs twin", "input": "mind (valid, 500)"}
    assert job_columns({"model": "conve", "test_triples": [["usa", "embassy", "uk"]]}) == {
        "model": "conve", "input": "1 triple: usa · embassy · uk"}
    assert job_columns({"model": "conve", "mode": "self"})["input"] == "self-influence"
    assert job_columns({"name": "my-conve", "dataset": "nations"}) == {"model": "→ my-conve", "input": "nations"}
    assert job_columns({"dataset": "digits", "model": {"n_layer": 2}, "register_as": "bdh-small"}) == {
        "model": "→ bdh-small", "input": "digits"}
    long = job_columns({"model": "m", "samples": [{"candidate": "word " * 100}]})["input"]
    assert len(long) == 120 and long.endswith("…")


def test_the_view_carries_the_columns_and_they_are_searched(server) -> None:
    with _api(server) as api:
        job = _submit(api, model="nrms-columns-model")
        assert job["model"] == "nrms-columns-model"
        assert _ids(api.get("/jobs", params={"q": "columns-model"})) == [job["id"]]


def test_sdk_submits_and_searches_by_label_and_tag(server) -> None:
    from explainq_client import Client
    from explainq_client.errors import ValidationError

    with Client(server, ALICE) as client:
        job = client.submit("test_sleep", SLEEP, label="sdk labelled", tags=["sdk-tag"])
        assert job.label == "sdk labelled" and job.tags == ["sdk-tag"]
        assert [j.id for j in client.jobs(q="SDK LABELLED")] == [job.id]
        assert [j.id for j in client.jobs(tag="sdk-tag")] == [job.id]
        assert [j.id for j in client.jobs.iter(tag=["sdk-tag"], q="labelled")] == [job.id]
        with pytest.raises(ValidationError) as err:
            client.submit("test_sleep", SLEEP, tags=["bad tag"])
        assert err.value.fields == ["tags.0"], err.value.fields


def test_cli_submits_with_label_and_tags_and_lists_by_search(server, tmp_path, capsys) -> None:
    from explainq_client.cli import run

    request = tmp_path / "sleep.json"
    request.write_text(json.dumps(SLEEP))
    base = ["--url", server, "--api-key", ALICE]
    assert run([*base, "submit", "test_sleep", str(request), "--label", "from the shell", "--tag", "cli-x"]) == 0
    job = json.loads(capsys.readouterr().out)
    assert job["label"] == "from the shell" and job["tags"] == ["cli-x"]
    assert run([*base, "jobs", "--search", "FROM THE SHELL", "--json"]) == 0
    assert [j["id"] for j in json.loads(capsys.readouterr().out)["items"]] == [job["id"]]
    assert run([*base, "jobs", "--tag", "cli-x"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["id", "kind", "status", "progress", "error", "created_at", "model", "label", "tags"]
    assert len(table) == 2 and job["id"] in table[1] and "from the shell" in table[1] and "cli-x" in table[1]
    assert run([*base, "jobs", "--tag", "bad tag"]) == 2
    assert "tag" in capsys.readouterr().err


def test_jobs_created_after_a_time_are_listed_without_scanning_older_ones(server) -> None:
    with _api(server) as api:
        first = _submit(api, tags=["after-t"])
        second = _submit(api, tags=["after-t"])
        third = _submit(api, tags=["after-t"])
        r = api.get("/jobs", params={"created_after": first["created_at"], "tag": "after-t"})
        assert _ids(r) == [third["id"], second["id"]]
        assert _ids(api.get("/jobs", params={"created_after": third["created_at"]})) == []
        r = api.get("/jobs", params={"created_after": "yesterday"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "created_after"]


def test_the_scan_stops_at_created_after() -> None:
    """The owner index is read down to the time asked for, not further (``_index_rows``' floor)."""
    from datetime import UTC, datetime

    from core.jobstore import _index_rows

    class Pipe:
        def __init__(self):
            self.calls = []

        def zrange(self, *args, **kwargs):
            self.calls.append(args)

        def execute(self):
            return [[] for _ in self.calls]

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    pipe = Pipe()

    class Redis:
        def pipeline(self, transaction=False):
            return pipe

    when = datetime(2026, 1, 1, tzinfo=UTC)
    _index_rows(Redis(), "idx", None, 50, when.timestamp())
    _index_rows(Redis(), "idx", (when.timestamp() + 5, "b" * 32), 50, when.timestamp())
    floor = f"({when.timestamp()!r}"
    assert [c[1:] for c in pipe.calls] == [("+inf", floor), (repr(when.timestamp() + 5),) * 2,
                                           (f"({when.timestamp() + 5!r}", floor)]


def test_async_sdk_searches_by_label_and_tag(server) -> None:
    import asyncio

    from explainq_client import AsyncClient

    async def go() -> tuple[str, list[str], list[str]]:
        async with AsyncClient(server, ALICE) as client:
            job = await client.submit("test_sleep", SLEEP, label="async labelled", tags=["async-tag"])
            found = [j.id for j in await client.jobs(q="ASYNC LABELLED")]
            tagged = [j.id async for j in client.jobs.iter(tag="async-tag")]
            return job.id, found, tagged

    job_id, found, tagged = asyncio.run(go())
    assert found == [job_id] and tagged == [job_id]


def test_created_after_agrees_with_the_full_listing_filtered_by_time(server) -> None:
    """The bounded scan (reference: every job of the tag, filtered by ``created_at``), cut at each job."""
    with _api(server) as api:
        for _ in range(6):
            _submit(api, tags=["cut-ref"])
        everything = api.get("/jobs", params={"tag": "cut-ref", "limit": 100}).json()["items"]
        for cut in everything:
            fast = _ids(api.get("/jobs", params={"tag": "cut-ref", "created_after": cut["created_at"]}))
            assert fast == [j["id"] for j in everything if j["created_at"] > cut["created_at"]]
