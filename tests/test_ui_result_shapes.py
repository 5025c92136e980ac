"""The job page over HTTP, against a stub of the public API: the dashboard draws each kind's one result shape by the
renderer the kind names (``GET /kinds``), says how many entries a result holds inline of how many in all (linking
the artifact with every one), chooses a training kind's summary by the result model it declares, and shows a
result whose ``X-Explainq-Result-Schema`` is ``unvalidated`` as JSON with a note instead of drawing it."""

from __future__ import annotations

import html as htmlmod
import re
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from app.routers.jobs import RESULT_SCHEMA_HEADER
from app.ui import router as ui
from app.ui.session import Session
from core.contract.results.influence import InfluenceResult
from tests.analysis_pages import tracin_result

JOB = "a" * 32
KINDS = [
    {"name": "tracin", "title": "Influence (TracIn, TRAK)", "route": "/tracin", "renderer": "influence",
     "result": "InfluenceResult", "charts": [], "live_rows": "latest", "resume_field": None},
    {"name": "train_conve", "title": "Train ConvE", "route": "/train/conve", "renderer": "training",
     "result": "TrainConvEResult", "charts": [], "live_rows": "latest", "resume_field": None},
    {"name": "digits_mlp", "title": "Digits MLP (example plugin)", "route": "/plugins/digits-mlp",
     "renderer": "training", "result": "DigitsMLPResult", "charts": [], "live_rows": "history",
     "resume_field": None},
]


class _Sessions:
    """Every request is one anonymous session (auth off)."""

    async def read(self, conn: Any) -> Session:
        return Session(owner="anonymous", key=None, csrf="t" * 24, id="s" * 40)


def _app(kind: str, result: Any, schema: str, artifacts: list[str]) -> TestClient:
    """The dashboard's router over a stub API serving one succeeded job of ``kind`` with ``result``."""
    app = FastAPI()
    app.state.settings = type("S", (), {"api_keys": {}})()
    app.state.ui_sessions = _Sessions()
    view = {"id": JOB, "kind": kind, "status": "succeeded", "queue": "explain", "created_at": None,
            "started_at": None, "finished_at": None, "progress": None, "label": None, "tags": []}

    @app.get("/kinds")
    def kinds() -> dict[str, Any]:
        return {"kinds": KINDS}

    @app.get("/jobs/{job_id}")
    def job(job_id: str) -> dict[str, Any]:
        return view

    @app.get("/jobs/{job_id}/request")
    def request(job_id: str) -> JSONResponse:
        return JSONResponse({"detail": {"code": "not_found", "message": "no request"}}, status_code=404)

    @app.get("/jobs/{job_id}/result")
    def get_result(job_id: str) -> JSONResponse:
        return JSONResponse(result, headers={RESULT_SCHEMA_HEADER: schema})

    @app.get("/jobs/{job_id}/artifacts")
    def get_artifacts(job_id: str) -> dict[str, Any]:
        return {"items": [{"name": n, "size": 10, "media_type": "application/x-ndjson",
                           "url": f"/jobs/{job_id}/artifacts/{n}"} for n in artifacts]}

    app.include_router(ui.router)
    return TestClient(app)


def _text(page: str) -> str:
    return htmlmod.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


def _sharded_influence(total: int = 450) -> dict[str, Any]:
    """A sharded run's result: 200 test triples inline of ``total`` (every one in results.jsonl)."""
    base = tracin_result()
    entry = base["results"][1]
    results = [{**entry, "test_triple": ["china", "intergovorgs", f"e{i}"]} for i in range(200)]
    return InfluenceResult.model_validate({
        **base, "n_test": total, "results": results, "shards": {"total": 3, "failed": []},
        "listed": {"results": {"total": total, "inline": 200, "artifact": "results.jsonl"}},
        "notes": ["the first 200 test triples are listed here, all 450 in results.jsonl"]}).model_dump(mode="json")


def test_an_influence_result_with_more_test_triples_than_inline_says_so_and_links_the_artifact() -> None:
    with _app("tracin", _sharded_influence(), "InfluenceResult", ["results.jsonl", "influence.csv"]) as c:
        page = c.get(f"/ui/jobs/{JOB}").text
    text = _text(page)
    assert page.count('<article class="test-triple">') == 200
    assert "Showing the first 200 of 450 test triples; all of them are in results.jsonl" in text
    assert f'<a class="mono" href="/jobs/{JOB}/artifacts/results.jsonl" download>results.jsonl</a>' in page
    assert "all 450 in results.jsonl" in text  # the result's notes
    assert "Influence (TracIn, TRAK)" in text and "tracin" in text  # the kind's title and name head the page
    assert 'id="result-unvalidated"' not in page


def test_an_unvalidated_result_is_json_with_a_note_not_a_renderer() -> None:
    old = {"model": "conve-a", "mode": "test", "results": {"artifact": "results.jsonl", "count": 450},
           "n_candidates_scored": 1500}
    with _app("tracin", old, "unvalidated", ["results.jsonl"]) as c:
        page = c.get(f"/ui/jobs/{JOB}").text
    card = re.search(r'<section class="card" id="result-unvalidated">(.*?)</section>', page, re.S)
    assert card is not None and "written by an earlier version of explainq" in card.group(1)
    assert '"n_candidates_scored": 1500' in card.group(1)
    assert 'id="tracin"' not in page and "test-triple" not in page


def test_a_plugins_training_result_gets_the_table_of_its_values_and_a_known_kind_its_summary() -> None:
    plugin = {"history": [{"epoch": 1, "train_loss": 0.5, "val_accuracy": 0.9}], "steps": [], "warnings": [],
              "artifacts": [], "parameters": 4810, "test_accuracy": 0.93, "confusion": [[1, 0], [0, 1]]}
    with _app("digits_mlp", plugin, "DigitsMLPResult", []) as c:
        page = c.get(f"/ui/jobs/{JOB}").text
    table = re.search(r'<table class="compact result-fields">(.*?)</table>', page, re.S).group(1)
    assert [tuple(_text(r).split()) for r in re.findall(r"<tr>(.*?)</tr>", table, re.S)] == [
        ("parameters", "4810"), ("test_accuracy", "0.93")]
    assert "Registered as" not in page and "<h2>Curves</h2>" in page
    assert "Digits MLP (example plugin)" in page and "digits_mlp" in page

    conve = {"history": [{"epoch": 1, "loss": 0.9}], "steps": [], "warnings": [], "artifacts": [],
             "model": "conve-ui", "parameters": 1234, "seconds": 2.5,
             "metrics": {"test": {"mrr": 0.3, "mr": 5.0, "hits@1": 0.2, "hits@3": 0.4, "hits@10": 0.7,
                                  "n_queries": 10}},
             "checkpoints": [{"file": "epoch-1.safetensors", "epoch": 1, "lr": 0.01}]}
    with _app("train_conve", conve, "TrainConvEResult", []) as c:
        page = c.get(f"/ui/jobs/{JOB}").text
    assert 'Registered as <a class="mono" href="/ui/models#model-conve-ui">conve-ui</a>' in page
    assert "epoch-1.safetensors" in page and "result-fields" not in page


@pytest.mark.parametrize("renderer", sorted(ui.RENDERERS))
def test_every_renderer_has_its_template(renderer: str) -> None:
    ui.templates.get_template(ui.RENDERERS[renderer].template)  # a new renderer is one entry: its card exists


def _drawn_kinds() -> list:
    from core.contract.kind import load_kinds

    return sorted((k for k in load_kinds().values() if k.renderer is not None and k.result is not None),
                  key=lambda k: k.name)


@pytest.mark.parametrize("kind", _drawn_kinds(), ids=lambda k: k.name)
@pytest.mark.parametrize("split", ["whole", "sharded"])
def test_every_kinds_result_draws_through_its_renderers_card(kind, split: str) -> None:
    """Each drawn kind's result model (an example with every field filled, as a whole or a sharded run writes
    it) through the router's table: its renderer's card, and a link to the artifact of every list the result
    holds in part."""
    from tests.result_examples import as_run, example

    data = as_run(example(kind.result), kind.result, split == "sharded")
    job = {"id": JOB, "kind": kind.name, "status": "succeeded", "queue": kind.queue, "created_at": None,
           "started_at": None, "finished_at": None, "progress": None}
    described = {**kind.describe(), "charts": []}
    ctx = ui.page_context(ui.PageInput(job, data, kind.result.__name__, described, [], True))
    assert ctx["card"] == ui.RENDERERS[kind.renderer].template and not ctx["unvalidated"]
    ctx.update(user=None, auth_on=False, csrf_field="csrf_token", path=f"/ui/jobs/{JOB}")
    page = ui.templates.get_template("job.html").render(ctx)
    assert described["title"] in page and "<h2>Result</h2>" not in page
    for name, entry in (data.get("listed") or {}).items():
        linked = f'href="/jobs/{JOB}/artifacts/{entry["artifact"]}"' in page
        assert linked == (entry["total"] > entry["inline"]), name
