"""The SDK's own logic with a scripted transport: retries and Retry-After, idempotency keys, SSE parsing,
artifact downloads, request bodies, and the Jupyter HTML (escaping, the colour scale)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import typing
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest
from explainq_client import (
    APIConnectionError,
    AsyncClient,
    Client,
    ConflictError,
    ExplainqError,
    RateLimitError,
    RetryPolicy,
    ServiceUnavailableError,
    TracInResult,
    TrainingResult,
    ValidationError,
    diverging_color,
)
from explainq_client._http import SSEParser
from explainq_client._kinds import route_for
from explainq_client.errors import parse_retry_after
from explainq_client.render import NEGATIVE_RGB, NEUTRAL_RGB, POSITIVE_RGB, attribution_html
from explainq_client.results import make_result

JOB = {"id": "j1", "kind": "tracin", "status": "queued", "progress": None, "error": None}


def scripted(*answers: httpx.Response | Callable[[httpx.Request], httpx.Response]):
    """A transport answering each request with the next scripted response; records the requests."""
    seen: list[httpx.Request] = []
    queue = list(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = queue.pop(0)
        return answer(request) if callable(answer) else answer

    return httpx.MockTransport(handler), seen


def unavailable(retry_after: str | None = "1") -> httpx.Response:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return httpx.Response(503, json={"detail": {"code": "redis_unavailable", "message": "retry"}}, headers=headers)


def test_503_then_success_waits_retry_after_and_keeps_the_idempotency_key():
    transport, seen = scripted(unavailable("1"), httpx.Response(202, json=JOB))
    with Client("http://x", transport=transport) as c:
        start = time.monotonic()
        job = c.tracin(model="m", test_triples=[["a", "b", "c"]])
        elapsed = time.monotonic() - start
    assert job.id == "j1" and len(seen) == 2 and elapsed >= 1.0
    keys = [r.headers["Idempotency-Key"] for r in seen]
    assert keys[0] == keys[1] and len(keys[0]) == 32
    assert json.loads(seen[0].content) == {"model": "m", "test_triples": [["a", "b", "c"]]}  # nothing unset sent


def test_429_with_an_http_date_retry_after_is_honoured():
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=2), usegmt=True)
    transport, seen = scripted(httpx.Response(429, json={"detail": {"code": "rate_limited", "message": "slow"}},
                                              headers={"Retry-After": when}), httpx.Response(200, json={"items": []}))
    with Client("http://x", transport=transport) as c:
        start = time.monotonic()
        assert c.jobs.list().items == []
        assert time.monotonic() - start >= 0.9  # the date has one-second resolution
    assert len(seen) == 2


def test_a_retry_after_longer_than_max_delay_is_raised_at_once():
    transport, seen = scripted(httpx.Response(429, json={"detail": {"code": "quota", "message": "later"}},
                                              headers={"Retry-After": "3600"}))
    with Client("http://x", transport=transport) as c, pytest.raises(RateLimitError) as info:
        c.jobs.list()
    assert info.value.retry_after == 3600 and info.value.code == "quota" and len(seen) == 1


def test_retries_run_out_into_the_typed_error():
    transport, seen = scripted(*(unavailable("0") for _ in range(3)))
    with Client("http://x", transport=transport, max_retries=2) as c, pytest.raises(ServiceUnavailableError):
        c.models.list()
    assert len(seen) == 3


def test_idempotency_in_progress_is_retried():
    busy = httpx.Response(409, json={"detail": {"code": "idempotency_in_progress", "message": "wait"}},
                          headers={"Retry-After": "0"})
    transport, seen = scripted(busy, httpx.Response(202, json=JOB))
    with Client("http://x", transport=transport) as c:
        assert c.submit("/tracin", {"model": "m"}, idempotency_key="k").id == "j1"
    assert [r.headers["Idempotency-Key"] for r in seen] == ["k", "k"]


def test_connection_failures_are_retried_then_typed():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    transport, seen = scripted(refuse, refuse, refuse)
    policy = RetryPolicy(max_retries=2, backoff_s=0.01)
    with Client("http://x", transport=transport, retry=policy) as c, pytest.raises(APIConnectionError):
        c.health()
    assert len(seen) == 3


def test_models_delete_sends_delete_and_types_the_conflict():
    conflict = httpx.Response(409, json={"detail": {"code": "owned_by_other", "message": "another owner's model"}})
    deleted = {"deleted": "my model", "kind": "news", "owner": "alice"}
    transport, seen = scripted(httpx.Response(200, json=deleted), conflict)
    with Client("http://x", transport=transport) as c:
        assert c.models.delete("my model") == deleted
        with pytest.raises(ConflictError) as info:
            c.models.delete("theirs")
    assert [(r.method, r.url.raw_path) for r in seen] == [("DELETE", b"/models/my%20model"),
                                                         ("DELETE", b"/models/theirs")]
    assert info.value.code == "owned_by_other"


def test_parse_retry_after():
    assert parse_retry_after("2") == 2 and parse_retry_after("0.5") == 0.5 and parse_retry_after(None) is None
    assert parse_retry_after("garbage") is None
    past = format_datetime(datetime.now(UTC) - timedelta(seconds=30), usegmt=True)
    assert parse_retry_after(past) == 0


def test_errors_without_the_json_shape_are_still_typed():
    transport, _ = scripted(httpx.Response(422, json={"detail": [{"loc": ["body", "samples", 0, "id"],
                                                                  "msg": "duplicate", "type": "value_error"}]}),
                            httpx.Response(404, text="Not Found"))
    with Client("http://x", transport=transport) as c:
        with pytest.raises(ValidationError) as info:
            c.attributions(model="m", samples=[])
        assert info.value.fields == ["samples.0.id"] and "samples.0.id: duplicate" in str(info.value)
        with pytest.raises(ExplainqError):
            c.jobs.get("x")


def test_route_for_and_bad_urls():
    kinds = {"train_bdh": {"name": "train_bdh", "route": "/train/bdh"},
             "import_model": {"name": "import_model", "route": "/models/import"}}
    assert route_for("train_bdh", kinds) == route_for("train/bdh", kinds) == route_for("train-bdh", kinds) \
        == "/train/bdh"
    assert route_for("import_model", kinds) == "/models/import"  # the kind's own route, not one derived from its name
    assert route_for("/test/sleep", kinds) == "/test/sleep"
    with pytest.raises(ValueError, match="unknown job kind 'bogus': one of import_model, train_bdh"):
        route_for("bogus", kinds)
    with pytest.raises(ExplainqError, match="base_url"):
        Client("localhost:8000")


def test_sse_parser():
    parser = SSEParser()
    lines = [": keep-alive", "", "event: running", 'data: {"id": "j1",', 'data: "status": "running"}', "",
             "event: end", 'data: {"status": "succeeded"}', ""]
    events = [e for e in map(parser.feed, lines) if e is not None]
    assert [e.event for e in events] == ["running", "end"]
    assert events[0].job == {"id": "j1", "status": "running"} and events[1].job is None
    assert events[1].status == "succeeded"


def test_ready_is_asked_once_and_its_503_is_an_answer():
    body = {"status": "unavailable", "workers": {"explain": 0}, "reasons": ["no live worker on queue 'explain'"]}
    transport, seen = scripted(httpx.Response(503, json=body))
    with Client("http://x", transport=transport) as c:
        assert c.ready() == body
    assert len(seen) == 1


def test_stream_reopens_a_dropped_connection_and_follows_the_job():
    def sse(*events: tuple[str, dict]) -> httpx.Response:
        text = ": keep-alive\n\n" + "".join(f"event: {e}\ndata: {json.dumps(d)}\n\n" for e, d in events)
        return httpx.Response(200, content=text.encode(), headers={"Content-Type": "text/event-stream"})

    running = {**JOB, "status": "running", "progress": {"done": 1, "total": 2, "unit": "steps"}}
    done = {**JOB, "status": "succeeded", "progress": {"done": 2, "total": 2, "unit": "steps"}}
    transport, seen = scripted(httpx.Response(200, json=JOB), sse(("running", running)),  # then the link drops
                               sse(("running", running), ("succeeded", done), ("end", {"status": "succeeded"})))
    with Client("http://x", transport=transport, retry=RetryPolicy(backoff_s=0.01)) as c:
        job = c.jobs.get("j1")
        events = list(job.stream())
    assert [e.event for e in events] == ["running", "running", "succeeded", "end"]
    assert [r.url.path for r in seen[1:]] == ["/jobs/j1/events"] * 2
    assert job.status == "succeeded" and job.progress["done"] == 2


def artifact_server(tmp_names: dict[str, bytes]) -> httpx.MockTransport:
    """``GET /jobs/j1/artifacts`` and each file, as the API serves them."""

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/jobs/j1":
            return httpx.Response(200, json={**JOB, "status": "succeeded"})
        if path == "/jobs/j1/artifacts":
            return httpx.Response(200, json={"items": [
                {"name": n, "size": len(b), "media_type": "text/csv", "url": f"/jobs/j1/artifacts/{n}"}
                for n, b in tmp_names.items()]})
        name = path.removeprefix("/jobs/j1/artifacts/")
        if name in tmp_names:
            return httpx.Response(200, content=tmp_names[name], headers={"Content-Type": "text/csv"})
        return httpx.Response(404, json={"detail": {"code": "not_found", "message": name}})

    return httpx.MockTransport(handler)


def test_artifacts_and_download_keep_relative_paths(tmp_path):
    files = {"influence.csv": b"a,b\n1,2\n", "checkpoints/last/model.bin": b"\x00" * 70_000}
    with Client("http://x", transport=artifact_server(files)) as c:
        job = c.jobs.get("j1")
        listed = job.artifacts()
        assert [(a.name, a.size) for a in listed] == [("influence.csv", 8), ("checkpoints/last/model.bin", 70_000)]
        paths = job.download(tmp_path / "out")
        assert [p.relative_to(tmp_path / "out").as_posix() for p in paths] == list(files)
        assert all(p.read_bytes() == files[n] for p, n in zip(paths, files, strict=True))
        assert not list((tmp_path / "out").rglob("*.part"))
        only = job.download(tmp_path / "one", names=["influence.csv"])
        assert [p.name for p in only] == ["influence.csv"]
        with pytest.raises(ExplainqError, match="no artifact"):
            job.download(tmp_path / "x", names=["missing.csv"])


def test_download_refuses_names_that_leave_the_target(tmp_path):
    with Client("http://x", transport=artifact_server({"../evil.txt": b"x"})) as c:
        with pytest.raises(ExplainqError, match="refusing"):
            c.jobs.get("j1").download(tmp_path / "out")
    assert not (tmp_path / "evil.txt").exists()


def test_async_download_and_retry(tmp_path):
    files = {"a/b.txt": b"hello"}

    async def scenario() -> None:
        async with AsyncClient("http://x", transport=artifact_server(files)) as c:
            job = await c.jobs.get("j1")
            (path,) = await job.download(tmp_path)
            assert path.read_bytes() == b"hello"
        transport, seen = scripted(unavailable("0"), httpx.Response(202, json=JOB))
        async with AsyncClient("http://x", transport=transport) as c:
            job = await c.train_conve(name="kg", epochs=1)
            assert job.id == "j1" and len(seen) == 2
            assert seen[0].headers["Idempotency-Key"] == seen[1].headers["Idempotency-Key"]
            assert json.loads(seen[1].content) == {"name": "kg", "epochs": 1}

    asyncio.run(scenario())


# ------------------------------------------------------------------------------------------------ rendering
def test_diverging_color_scale():
    hexed = ["#" + "".join(f"{c:02x}" for c in rgb) for rgb in (NEGATIVE_RGB, NEUTRAL_RGB, POSITIVE_RGB)]
    assert [diverging_color(v, 2.0) for v in (-2.0, 0.0, 2.0)] == hexed
    assert diverging_color(-9.0, 2.0) == hexed[0] and diverging_color(9.0, 2.0) == hexed[2]
    assert diverging_color(1.0, 0.0) == hexed[1] and diverging_color(float("nan"), 1.0) == hexed[1]
    half = diverging_color(1.0, 2.0)
    assert half not in hexed and int(half[1:3], 16) > POSITIVE_RGB[0]  # between neutral and orange


def test_attribution_html_escapes_and_signs_every_word():
    result = make_result("attributions", {"model": "<m>", "samples": [{
        "id": "s<1>", "label": "fake", "words": ["<script>alert(1)</script>", "fine", "bad"],
        "word_attributions": [0.5, 0.0, -0.25], "score": 1.0, "baseline_score": 0.25, "delta": 1e-6}],
        "word_stats": {"fake": {"top": [{"word": "<b>", "mean": 0.5, "count": 1}], "bottom": [], "words": 1}},
        "comparison": {"model": "twin", "threshold": 0.1, "changed": [
            {"word": "&x", "mean_before": 0.0, "mean_after": 0.3, "change": 0.3}]}})
    html = result._repr_html_()
    assert html == attribution_html(result)
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;b&gt;" in html and "&amp;x" in html and "s&lt;1&gt;" in html
    assert "title='+0.5'" in html and "title='-0.25'" in html and "title='+0'" in html
    assert diverging_color(0.5, 0.5) in html and diverging_color(-0.25, 0.5) in html


def test_training_result_renders_curves():
    history = [{"epoch": e, "train_loss": 1.0 / e, "val_accuracy": 0.5 + e / 10, "lr": 0.1} for e in (1, 2, 3)]
    html = make_result("training", {"history": history, "best_val_accuracy": 0.8}, "train_bdh")._repr_html_()
    assert isinstance(make_result("training", {}), TrainingResult)
    assert html.count("<polyline") == 2 and "train_loss" in html and "val_accuracy" in html and "lr<" not in html
    conve = [{"epoch": 1, "loss": 0.9}, {"epoch": 2, "loss": 0.5, "valid": {"mrr": 0.3, "hits@10": 0.7}}]
    html = make_result("training", {"history": conve, "metrics": {"test": {"mrr": 0.31}}})._repr_html_()
    assert "valid.mrr" in html and "valid.hits@10" in html and "metrics.test.mrr" in html


def test_tracin_result_renders_tables():
    result = make_result("influence", {"model": "kg", "mode": "test", "filter": {"n_hops": 1}, "results": [{
        "test_triple": ["usa", "embassy", "<uk>"], "self_influence": 2.0, "n_candidates": 3,
        "proponents": [{"train_triple": ["usa", "aid", "uk"], "influence": 0.4, "train_self_influence": 1.0}],
        "opponents": [{"train_triple": ["uk", "war", "usa"], "influence": -0.2, "train_self_influence": 0.5}]}]})
    assert isinstance(result, TracInResult)
    html = result._repr_html_()
    assert "proponents" in html and "opponents" in html and "usa · embassy · &lt;uk&gt;" in html
    assert "+0.4" in html and "-0.2" in html and "n_hops" in html


def test_self_influence_ranking_and_ablation_tables():
    ranking = make_result("influence", {"model": "kg", "mode": "self", "ranking": [
        {"train_triple": ["a", "r", "b"], "self_influence": 3.5}, {"train_triple": ["c", "r", "d"],
                                                                   "self_influence": 1.25}]})._repr_html_()
    assert "self-influence ranking" in ranking and ranking.index("a · r · b") < ranking.index("c · r · d")
    ablation = make_result("ablation", {"dataset": "lora-demo", "results": {
        "all": {"spectral": {"test_acc": {"mean": 0.95, "std": 0.01}}},
        "visual": {"spectral": {"test_acc": {"mean": 0.5, "std": 0.05}}}},
        "drop": {"spectral": {"absolute": 0.45, "relative": 0.47}}})._repr_html_()
    assert "0.95 ± 0.01" in ablation and "0.5 ± 0.05" in ablation and "0.45" in ablation
    assert "drop all→visual" in ablation


def test_the_sdk_never_imports_torch():
    code = "import sys, explainq_client, explainq_client.cli; assert 'torch' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_train_news_and_import_model_post_their_routes_with_only_the_given_fields():
    view = {**JOB, "kind": "train_news"}
    transport, seen = scripted(httpx.Response(202, json=view), httpx.Response(202, json={**view, "kind": "import_model"}))
    with Client("http://x", transport=transport) as c:
        job = c.train_news(name="n1", dataset="mind-small", architecture="naml", encoder="word", valid_split=None)
        c.import_model(name="m1", kind="conve", path="models/m1", checkpoints=[{"file": "c1.pt", "lr": 0.001}])
    assert job.id == "j1"
    assert [(r.method, r.url.path) for r in seen] == [("POST", "/train/news"), ("POST", "/models/import")]
    assert json.loads(seen[0].content) == {"name": "n1", "dataset": "mind-small", "architecture": "naml",
                                           "encoder": "word", "valid_split": None}
    assert json.loads(seen[1].content) == {"name": "m1", "kind": "conve", "path": "models/m1",
                                           "checkpoints": [{"file": "c1.pt", "lr": 0.001}]}
    assert all(r.headers.get("Idempotency-Key") for r in seen)

    async def go():
        atransport_seen: list[httpx.Request] = []

        def handler(request: httpx.Request) -> httpx.Response:
            atransport_seen.append(request)
            return httpx.Response(202, json=view)

        async with AsyncClient("http://x", transport=httpx.MockTransport(handler)) as ac:
            await ac.train_news(name="n2", dataset="d", epochs=1)
            await ac.import_model(name="m2", kind="nrms", path="p", vocab="vocab.json")
        return atransport_seen

    aseen = asyncio.run(go())
    assert [r.url.path for r in aseen] == ["/train/news", "/models/import"]
    assert json.loads(aseen[0].content) == {"name": "n2", "dataset": "d", "epochs": 1}
    assert json.loads(aseen[1].content) == {"name": "m2", "kind": "nrms", "path": "p", "vocab": "vocab.json"}


def test_datasets_register_get_delete_sync_and_async():
    registered = {"name": "d1", "kind": "news", "owner": "me", "format": "mind", "counts": {"train": 3},
                  "path": "data/d1", "created_at": "t"}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(201, json=registered)
        if request.method == "GET":
            if request.url.path.endswith("/nope"):
                return httpx.Response(404, json={"detail": {"code": "not_found", "message": "no dataset 'nope'"}})
            return httpx.Response(200, json={**registered, "meta": {}})
        return httpx.Response(409, json={"detail": {"code": "owned_by_other", "message": "not yours"}})

    seen: list[httpx.Request] = []

    def recording(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    with Client("http://x", transport=httpx.MockTransport(recording)) as c:
        assert c.datasets.register("d1", "data/d1", description="small") == registered
        assert c.datasets.register("d1", "data/d1", overwrite=True)["name"] == "d1"
        assert c.datasets.get("d1")["format"] == "mind"
        with pytest.raises(ExplainqError) as missing:
            c.datasets.get("nope")
        assert missing.value.status_code == 404
        with pytest.raises(ConflictError):
            c.datasets.delete("theirs")
    assert json.loads(seen[0].content) == {"name": "d1", "path": "data/d1", "overwrite": False, "description": "small"}
    assert json.loads(seen[1].content) == {"name": "d1", "path": "data/d1", "overwrite": True}
    assert [(r.method, r.url.path) for r in seen[2:]] == [("GET", "/datasets/d1"), ("GET", "/datasets/nope"),
                                                          ("DELETE", "/datasets/theirs")]

    async def go():
        async with AsyncClient("http://x", transport=httpx.MockTransport(handler)) as ac:
            out = [await ac.datasets.register("d1", "data/d1"), await ac.datasets.get("d1")]
            with pytest.raises(ConflictError):
                await ac.datasets.delete("theirs")
            return out

    out = asyncio.run(go())
    assert out[0] == registered and out[1]["meta"] == {}


def test_results_as_plain_text_tables():
    from explainq_client.results import Result

    attributions = make_result("attributions", {"model": "nrms", "samples": [
        {"id": "s1", "label": 1, "score": 0.8, "delta": 0.01, "words": ["lakers", "win", "title"],
         "word_attributions": [0.5, -0.05, 0.2]}],
        "word_stats": {"1": {"top": [{"word": "lakers", "mean": 0.5, "count": 3}],
                             "bottom": [{"word": "win", "mean": -0.05, "count": 3}], "words": 2}}}).text()
    lines = attributions.splitlines()
    assert lines[0] == "attributions of model nrms" and lines[2].split()[:4] == ["sample", "label", "score", "delta"]
    assert lines[3].split()[:4] == ["s1", "1", "0.8", "0.01"]
    assert lines[3].endswith("lakers(+0.5) title(+0.2) win(-0.05)")  # by |attribution|
    assert "highest and lowest words for label 1 (of 2; all in word_stats.json)" in attributions
    assert [line.split() for line in attributions.splitlines()[-2:]] == [["lakers", "+0.5", "3"], ["win", "-0.05", "3"]]
    assert "<" not in attributions

    tracin = make_result("influence", {"model": "kg", "mode": "test", "results": [{
        "test_triple": ["usa", "embassy", "uk"], "self_influence": 2.0, "n_candidates": 3,
        "proponents": [{"train_triple": ["usa", "aid", "uk"], "influence": 0.4, "train_self_influence": 1.0}],
        "opponents": [{"train_triple": ["uk", "war", "usa"], "influence": -0.2, "train_self_influence": 0.5}]}]}).text()
    assert "test triple usa · embassy · uk (self-influence 2, 3 candidates)" in tracin
    rows = [line.split() for line in tracin.splitlines()]
    assert rows.index(["top", "proponents"]) < rows.index(["1", "usa", "·", "aid", "·", "uk", "+0.4", "1"]) \
        < rows.index(["top", "opponents"]) < rows.index(["1", "uk", "·", "war", "·", "usa", "-0.2", "0.5"])
    ranking = make_result("influence", {"model": "kg", "mode": "self", "ranking": [
        {"train_triple": ["a", "r", "b"], "self_influence": 3.5}]}).text()
    assert "self-influence ranking" in ranking and ranking.splitlines()[-1].split() == ["1", "a", "·", "r", "·", "b", "3.5"]

    training = make_result("training", {"model_name": "bdh", "best_val_accuracy": 0.75, "history": [
        {"epoch": 1, "train_loss": 0.9, "valid": {"mrr": 0.25}}, {"epoch": 2, "train_loss": 0.5}]}).text()
    rows = training.splitlines()
    assert rows[0] == "training bdh" and rows[2].split() == ["epoch", "train_loss", "valid.mrr"]
    assert rows[3].split() == ["1", "0.9", "0.25"] and rows[4].split() == ["2", "0.5"]
    assert "best_val_accuracy  0.75" in training

    ablation = make_result("ablation", {"dataset": "lora-demo", "results": {
        "all": {"spectral": {"test_acc": {"mean": 0.95, "std": 0.01}}},
        "visual": {"spectral": {"test_acc": {"mean": 0.5, "std": 0.05}}}},
        "drop": {"spectral": {"absolute": 0.45}}}).text()
    assert ablation.splitlines()[2].split() == ["representation", "all", "test", "acc", "visual", "test", "acc",
                                                "drop", "all->visual"]
    assert ablation.splitlines()[3].split() == ["spectral", "0.95", "±", "0.01", "0.5", "±", "0.05", "0.45"]

    assert json.loads(Result({"steps": 2}).text()) == {"steps": 2}  # no known renderer: JSON


def test_cli_result_table_and_unknown_kind_with_a_scripted_server(monkeypatch, capsys):
    from explainq_client import cli

    kinds = {"kinds": [{"name": "train_bdh", "route": "/train/bdh", "queue": "train", "renderer": "training"},
                       {"name": "tracin", "route": "/tracin", "queue": "explain", "renderer": "influence"}]}
    view = {**JOB, "kind": "train_bdh", "status": "succeeded"}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/kinds":
            return httpx.Response(200, json=kinds)
        if request.url.path == "/jobs/j1/result":
            return httpx.Response(200, json={"history": [{"epoch": 1, "train_loss": 0.5}]})
        if request.url.path == "/jobs/j1":
            return httpx.Response(200, json=view)
        return httpx.Response(200, json={"items": [], "next_cursor": None})

    monkeypatch.setattr(cli, "Client", lambda *a, **k: Client("http://x", transport=httpx.MockTransport(handler)))
    assert cli.run(["result", "j1", "--table"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert out.splitlines()[2].split() == ["epoch", "train_loss"] and out.splitlines()[3].split() == ["1", "0.5"]
    assert cli.run(["result", "j1"]) == cli.EXIT_OK
    assert json.loads(capsys.readouterr().out) == {"history": [{"epoch": 1, "train_loss": 0.5}]}
    assert cli.run(["jobs", "--kind", "bogus"]) == cli.EXIT_USAGE
    assert "unknown job kind 'bogus': one of tracin, train_bdh" in capsys.readouterr().err
    assert cli.run(["jobs", "--kind", "train-bdh"]) == cli.EXIT_OK


def _literal_values(annotation) -> set:
    """The string choices a (possibly nested, unioned) ``Literal`` annotation allows."""
    if annotation is None:
        return set()
    if typing.get_origin(annotation) is typing.Literal:
        return {a for a in typing.get_args(annotation) if isinstance(a, str)}
    return set().union(*(_literal_values(a) for a in typing.get_args(annotation))) if typing.get_args(annotation) \
        else set()


def test_every_public_kind_has_typed_sdk_methods_with_the_request_schemas_fields():
    """Each kind the server lists has its ``sdk_method`` on Client and AsyncClient, taking exactly the fields of
    the kind's request schema, and posting to the kind's route."""
    import inspect

    from core.contract.kind import load_kinds as load_all

    kinds = {k.name: k for k in load_all().values() if not k.internal and not k.name.startswith("test_")}
    assert {"attributions", "tracin", "train_bdh", "train_conve", "train_news", "import_model", "ablations"} <= \
        set(kinds)
    for kind in kinds.values():
        name = kind.sdk_method or kind.name
        for cls in (Client, AsyncClient):
            method = getattr(cls, name, None)
            assert method is not None, f"{cls.__name__}.{name} is missing"
            params = set(inspect.signature(method).parameters) - {"self", "idempotency_key", "extra"}
            assert params == set(kind.request.model_fields), (name, params ^ set(kind.request.model_fields))
            assert inspect.getdoc(method), name
        hints = typing.get_type_hints(getattr(Client, name))
        for field, info in kind.request.model_fields.items():
            server, sdk = _literal_values(info.annotation), _literal_values(hints.get(field))
            assert not server or not sdk or server == sdk, (name, field, server ^ sdk)
        required = {f: "x" for f, info in kind.request.model_fields.items() if info.is_required()}
        transport, seen = scripted(httpx.Response(202, json={**JOB, "kind": kind.name}))
        with Client("http://x", transport=transport) as c:
            getattr(c, name)(**required)
        assert seen[0].url.path == kind.route and json.loads(seen[0].content) == required


# ------------------------------------------------------------------------------------- listed lists, schemas
LISTED = {"model": "kg", "mode": "test", "n_test": 5,
          "results": [{"test_triple": ["a", "r", str(i)], "self_influence": 1.0, "n_candidates": 3}
                      for i in range(2)],
          "top_proponents": [{"test_triple": ["a", "r", "0"], "train_triple": ["b", "r", "c"], "influence": 0.5}],
          "listed": {"results": {"total": 5, "inline": 2, "artifact": "results.jsonl"}}}
ENTRIES = [{"test_triple": ["a", "r", str(i)], "self_influence": 1.0, "n_candidates": 3} for i in range(5)]


def listed_server(schema: str = "InfluenceResult", result: dict | None = None) -> tuple[httpx.MockTransport,
                                                                                      list[str]]:
    """A succeeded tracin job whose result holds 2 of its 5 test triples (all in results.jsonl, streamed in
    chunks), served with ``X-Explainq-Result-Schema: schema``; records the paths asked for."""
    paths: list[str] = []
    body = "".join(json.dumps(e) + "\n" for e in ENTRIES).encode()

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        if request.url.path == "/kinds":
            return httpx.Response(200, json={"kinds": [{"name": "tracin", "route": "/tracin", "queue": "explain",
                                                        "renderer": "influence", "result": "InfluenceResult"}]})
        if request.url.path == "/jobs/j1/result":
            return httpx.Response(200, json=result or LISTED, headers={"X-Explainq-Result-Schema": schema})
        if request.url.path == "/jobs/j1/artifacts/results.jsonl":
            return httpx.Response(200, stream=httpx.ByteStream(body), headers={"Content-Type": "application/x-ndjson"})
        return httpx.Response(200, json={**JOB, "status": "succeeded"})

    return httpx.MockTransport(handler), paths


def test_entries_streams_every_entry_of_a_listed_list_from_its_artifact():
    transport, paths = listed_server()
    with Client("http://x", transport=transport) as c:
        job = c.jobs.get("j1")
        result = job.result()
        assert isinstance(result, TracInResult) and result.validated and result.schema == "InfluenceResult"
        assert len(result["results"]) == 2 and result.total("results") == 5
        assert list(job.entries("results")) == ENTRIES  # more than the result holds inline
        assert paths.count("/jobs/j1/artifacts/results.jsonl") == 1
        assert list(job.entries("top_proponents")) == LISTED["top_proponents"]  # held whole: the result's own
        assert paths.count("/jobs/j1/result") == 1  # the result is read once
        with pytest.raises(ExplainqError, match="no list 'bogus'"):
            list(job.entries("bogus"))

    async def scenario() -> list:
        transport, _ = listed_server()
        async with AsyncClient("http://x", transport=transport) as ac:
            job = await ac.jobs.get("j1")
            return [e async for e in job.entries("results")]

    assert asyncio.run(scenario()) == ENTRIES


def test_a_listed_list_without_its_artifact_is_an_error_not_a_short_list():
    missing = {**LISTED, "listed": {"results": {"total": 5, "inline": 2, "artifact": None}}}
    transport, _ = listed_server(result=missing)
    with Client("http://x", transport=transport) as c, pytest.raises(ExplainqError, match="2 of the 5 entries"):
        list(c.jobs.get("j1").entries("results"))


def test_an_unvalidated_result_header_gives_a_plain_result_shown_as_json():
    from explainq_client.results import Result

    old = {"model": "kg", "mode": "test", "results": {"artifact": "results.jsonl", "count": 5}}
    transport, _ = listed_server("unvalidated", old)
    with Client("http://x", transport=transport) as c:
        job = c.jobs.get("j1")
        result = job.result()
    assert type(result) is Result and result.validated is False and result == old
    assert json.loads(result.text()) == old
    assert "written by an earlier version" in result._repr_html_()
    assert "written by an earlier version" in job._repr_html_()  # the job shows it too


def test_cli_entries_prints_json_lines_and_result_table_notes_an_unvalidated_result(monkeypatch, capsys):
    from explainq_client import cli

    transport, _ = listed_server()
    monkeypatch.setattr(cli, "Client", lambda *a, **k: Client("http://x", transport=transport))
    assert cli.run(["entries", "j1", "results"]) == cli.EXIT_OK
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == ENTRIES
    assert cli.run(["result", "j1", "--table"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "showing 2 of 5 test triples; all of them are in results.jsonl: explainq-client entries <job id> " \
        "results" in out

    old = {"model": "kg", "results": {"artifact": "results.jsonl", "count": 5}}
    transport, _ = listed_server("unvalidated", old)
    monkeypatch.setattr(cli, "Client", lambda *a, **k: Client("http://x", transport=transport))
    assert cli.run(["result", "j1", "--table"]) == cli.EXIT_OK
    printed = capsys.readouterr()
    assert json.loads(printed.out) == old and "earlier version" in printed.err


def _progress_views() -> list[httpx.Response]:
    """A job's views as it runs: queued, two training reports, a phase of another unit, succeeded."""
    def view(status, progress):
        return httpx.Response(200, json={**JOB, "kind": "evaluate_mislabel", "status": status, "progress": progress})

    return [view("queued", None),
            view("running", {"done": 1, "total": 4, "unit": "batches", "message": "epoch 1"}),
            view("running", {"done": 3, "total": 4, "unit": "batches", "message": None}),
            view("running", {"done": 1, "total": 2, "unit": "estimators", "message": "estimator tracin"}),
            view("succeeded", {"done": 2, "total": 2, "unit": "estimators", "message": "estimators done"})]


def test_wait_shows_progress_with_tqdm_auto_when_asked(monkeypatch):
    import tqdm.auto

    drawn: list[tuple] = []

    class Bar:  # records what wait() draws, as tqdm.auto.tqdm would show it
        def __init__(self, total=None, unit="it", desc=None):
            self.total, self.unit, self.desc, self.n, self.postfix = total, unit, desc, 0, ""
            drawn.append(("open", unit, total, desc))

        def set_postfix_str(self, text, refresh=True):
            self.postfix = text

        def refresh(self):
            drawn.append(("draw", self.unit, self.n, self.total, self.postfix))

        def close(self):
            drawn.append(("close", self.unit))

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    transport, _ = scripted(*_progress_views())
    with Client("http://x", transport=transport) as c:
        job = c.jobs.get("j1")
        assert job.wait(poll_interval=0.01, progress=True) is job
    assert drawn == [
        ("open", "batches", 4, "evaluate_mislabel j1"), ("draw", "batches", 1, 4, "running: epoch 1"),
        ("draw", "batches", 3, 4, "running"), ("close", "batches"),
        ("open", "estimators", 2, "evaluate_mislabel j1"), ("draw", "estimators", 1, 2, "running: estimator tracin"),
        ("draw", "estimators", 2, 2, "succeeded: estimators done"), ("close", "estimators")]
    # off by default outside a notebook, and when asked not to
    for asked in (None, False):
        drawn.clear()
        transport, _ = scripted(*_progress_views())
        with Client("http://x", transport=transport) as c:
            c.jobs.get("j1").wait(poll_interval=0.01, progress=asked)
        assert drawn == []


def test_wait_draws_a_real_tqdm_bar_and_the_async_client_too(capsys):
    transport, _ = scripted(*_progress_views())
    with Client("http://x", transport=transport) as c:
        c.jobs.get("j1").wait(poll_interval=0.01, progress=True)
    err = capsys.readouterr().err
    assert "3/4" in err and "2/2" in err and "estimators done" in err

    async def go():
        transport, _ = scripted(*_progress_views())
        async with AsyncClient("http://x", transport=transport) as ac:
            job = await ac.jobs.get("j1")
            await job.wait(poll_interval=0.01, progress=True)

    asyncio.run(go())
    assert "2/2" in capsys.readouterr().err


def test_wait_is_on_by_default_in_a_notebook(monkeypatch):
    import types

    from explainq_client import jobs

    class ZMQInteractiveShell:  # IPython's kernel shell, by name
        pass

    class TerminalInteractiveShell:  # IPython in a terminal: no widget, so off by default
        pass

    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    assert jobs.in_notebook() is False
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=TerminalInteractiveShell))
    assert jobs.in_notebook() is False and jobs.ProgressBar(jobs.JobBase(JOB), None)._tqdm is None
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=ZMQInteractiveShell))
    assert jobs.in_notebook() is True
    assert jobs.ProgressBar(jobs.JobBase(JOB), None)._tqdm is not None
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # tqdm not installed: off in a notebook, an error if asked
    assert jobs.ProgressBar(jobs.JobBase(JOB), None)._tqdm is None
    with pytest.raises(ImportError, match="pip install tqdm"):
        jobs.ProgressBar(jobs.JobBase(JOB), True)
