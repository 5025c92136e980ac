"""POST /attributions end to end: a private Redis, a real worker subprocess, the HTTP API."""

from __future__ import annotations

import io
import json
import shutil

import pytest

from core import registry
from models.news.demo import build_small

SMALL = {"n_news": 240, "n_users": 60}
MODEL = "nrms-word-test"
HISTORY = ["Lakers beat Celtics in overtime thriller", "Yankees rally to win the league title",
           "Coach praises Packers defense after championship win"]


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    from tests.service import Service

    root = tmp_path_factory.getbasetemp() / "news-small"
    paths = build_small(root, ("nrms-word-demo",), **SMALL)
    home = tmp_path_factory.mktemp("news-home")
    service = Service(home, heartbeat_ttl_s=30, start=False)
    shutil.copytree(paths["nrms-word-demo"], home / "models" / MODEL)
    for name in (MODEL, f"{MODEL}-twin"):
        registry.register_model(service.settings, name, kind="news", loader="models.news.checkpoint:load",
                                path=home / "models" / MODEL, parameters=1)
    shutil.copytree(root / "data" / "news-synthetic", home / "data" / "news-small")
    registry.register_dataset(service.settings, "news-small", kind="news", path=home / "data" / "news-small")
    with service.start():
        yield service


def _submit(svc, body: dict) -> dict:
    r = svc.client.post("/attributions", json=body)
    assert r.status_code == 202, r.text
    assert r.headers["Location"] == f"/jobs/{r.json()['id']}"
    return svc.wait(r.json()["id"], timeout_s=180)


def test_inline_samples_end_to_end(svc) -> None:
    body = {"model": MODEL, "n_steps": 32, "top_k": 3, "precision": "fp32", "samples": [
        {"id": "a", "history": HISTORY, "candidate": "Dodgers sign star quarterback to record deal",
         "label": "real"},
        {"id": "b", "history": HISTORY, "candidate": "SHOCKING: the Senate passes budget bill", "label": "fake"},
    ]}
    job = _submit(svc, body)
    assert job["status"] == "succeeded", job
    assert job["kind"] == "attributions"
    assert job["progress"]["unit"] == "samples" and job["progress"]["done"] == job["progress"]["total"] == 2
    result = svc.client.get(f"/jobs/{job['id']}/result").json()
    assert [s["id"] for s in result["samples"]] == ["a", "b"]
    for s in result["samples"]:
        for key in ("tokens", "token_attributions", "words", "word_attributions", "score", "baseline_score",
                    "attribution_sum", "delta", "relative_delta", "top_positive", "top_negative"):
            assert key in s
        assert len(s["tokens"]) == len(s["token_attributions"])
        assert len(s["top_positive"]) <= 3
    assert result["summary"]["n_steps"] == 32 and result["summary"]["median_relative_delta"] < 1e-3
    assert set(result["word_stats"]) == {"real", "fake"}
    assert all(set(stats) == {"top", "bottom", "words"} for stats in result["word_stats"].values())
    assert result["errors"] == [] and result["n_errors"] == 0 and result["n_samples"] == 2
    # a whole run has the sharded run's shape: no shards, every list described, every record in samples.jsonl
    assert result["shards"] is None and result["comparison"] is None and result["faithfulness"] is None
    assert result["listed"] == {"samples": {"total": 2, "inline": 2, "artifact": "samples.jsonl"},
                                "errors": {"total": 0, "inline": 0, "artifact": None}}
    lines = svc.artifact(job["id"], "samples.jsonl").decode().splitlines()
    assert [json.loads(line) for line in lines] == result["samples"]
    assert [a["name"] for a in result["artifacts"]] == ["samples.jsonl", "word_stats.json", "words.csv"]


def test_a_tolerance_without_a_method_runs_nested_clenshaw_curtis(svc) -> None:
    body = {"model": MODEL, "tolerance": 1e-4, "precision": "fp32", "samples": [
        {"id": "a", "history": HISTORY, "candidate": "Dodgers sign star quarterback to record deal"}]}
    job = _submit(svc, body)
    assert job["status"] == "succeeded", job
    result = svc.client.get(f"/jobs/{job['id']}/result").json()
    summary = result["summary"]
    assert summary["method"] == "clenshaw_curtis" and summary["tolerance_met"] is True
    assert summary["max_relative_delta"] <= 1e-4
    assert summary["gradient_evaluations"] == result["samples"][0]["n_steps"]["title"]


def test_dataset_comparison_and_npz_artifact(svc) -> None:
    body = {"model": MODEL, "compare_with": f"{MODEL}-twin", "n_steps": 8, "method": "riemann_trapezoid",
            "dataset": {"name": "news-small", "split": "test", "n_samples": 32, "balanced": True, "seed": 1}}
    job = _submit(svc, body)
    assert job["status"] == "succeeded", job
    result = svc.client.get(f"/jobs/{job['id']}/result").json()
    assert len(result["samples"]) == 32
    labels = [s["label"] for s in result["samples"]]
    assert labels.count("fake") == 16
    assert result["comparison"]["model"] == f"{MODEL}-twin"
    assert result["comparison"]["changed"] == []  # the same weights under two names
    assert result["comparison"]["changed_total"] == 0 and result["comparison"]["n_samples"] == 32
    assert [p["id"] for p in result["comparison"]["per_sample"]] == [s["id"] for s in result["samples"]]
    assert result["listed"]["comparison.samples"] == {"total": 32, "inline": 32, "artifact": "compare.jsonl"}
    names = [a["name"] for a in result["artifacts"]]
    assert names == ["attributions.npz", "compare.jsonl", "comparison.json", "samples.jsonl", "word_stats.json",
                     "words.csv"]
    import numpy as np

    with np.load(io.BytesIO(svc.artifact(job["id"], "attributions.npz"))) as npz:
        assert npz["offsets"][-1] == len(npz["token_attributions"]) == len(npz["tokens"])
        assert list(npz["ids"]) == [s["id"] for s in result["samples"]]


def test_a_job_whose_samples_all_fail_names_them(svc) -> None:
    job = _submit(svc, {"model": MODEL, "n_steps": 4, "samples": [{"id": "blank", "history": HISTORY,
                                                                   "candidate": "   "}]})
    assert job["status"] == "failed"
    assert job["error"]["code"] == "all_samples_failed"
    assert "blank" in job["error"]["message"]


@pytest.mark.parametrize("patch,loc", [
    ({"model": "nope"}, ["body", "model"]),
    ({"compare_with": "nope"}, ["body", "compare_with"]),
    ({"n_steps": 5000}, ["body", "n_steps"]),
    ({"n_steps": 0}, ["body", "n_steps"]),
    ({"samples": [{"id": "x", "history": [], "candidate": "Lakers win"}]}, ["body", "samples", 0, "history"]),
    ({"samples": [{"id": "x", "history": ["ok", 3], "candidate": "Lakers win"}]},
     ["body", "samples", 0, "history", 1]),
    ({"samples": [{"id": "x", "history": ["ok"], "candidate": 7}]}, ["body", "samples", 0, "candidate"]),
    ({"samples": [{"id": "x", "history": ["ok"], "candidate": "a"}, {"id": "x", "history": ["ok"],
                                                                    "candidate": "b"}]},
     ["body", "samples", 1, "id"]),
    ({"dataset": {"name": "news-small"}}, ["body", "samples"]),
    ({"samples": None, "dataset": {"name": "missing"}}, ["body", "dataset", "name"]),
    ({"method": "simpson"}, ["body", "method"]),
    ({"batch_size": 0}, ["body", "batch_size"]),
    ({"precision": "fp8"}, ["body", "precision"]),
    ({"method": "riemann_trapezoid", "n_steps": 1}, ["body", "n_steps"]),
    ({"method": "clenshaw_curtis", "n_steps": 1}, ["body", "n_steps"]),
    ({"tolerance": 1e-3, "n_steps": 1}, ["body", "n_steps"]),  # clenshaw_curtis, the default with a tolerance
    ({"tolerance": 0}, ["body", "tolerance"]),
])
def test_bad_input_is_a_422_naming_the_field(svc, patch: dict, loc: list) -> None:
    body = {"model": MODEL, "samples": [{"id": "x", "history": HISTORY, "candidate": "Lakers win"}], **patch}
    r = svc.client.post("/attributions", json=body)
    assert r.status_code == 422, r.text
    locs = [d["loc"][: len(loc)] for d in r.json()["detail"]]
    assert loc in locs, r.json()
