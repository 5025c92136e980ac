"""TracIn fanned out over real worker processes: shards over the candidate training triples, merged by a reduce
step into exactly what one unsharded job returns (lists, counts, global top, CSV, every score)."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from core import registry
from models.kg.train import TrainConfig, train_conve
from models.kg.triples import load_nations

TINY = {"epochs": 2, "batch_size": 256, "lr": 0.01, "embedding_dim": 20, "embedding_height": 4, "num_filters": 4,
        "checkpoint_every": 1, "seed": 0}
MODEL = "conve-fan"
TESTS = [["usa", "embassy", "uk"], ["uk", "embassy", "usa"], ["china", "intergovorgs", "usa"],
         ["brazil", "treaties", "usa"], ["india", "embassy", "china"]]
N_TRAIN = 1592


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    from tests.service import Service

    home = tmp_path_factory.mktemp("kgfan")
    service = Service(home, queues=("explain,bulk", "explain,bulk"), heartbeat_ttl_s=20, start=False)
    out = home / "models" / MODEL
    summary = train_conve(load_nations(), TrainConfig(**TINY), out, device="cpu")
    registry.register_model(service.settings, MODEL, kind="conve", loader="models.kg.checkpoint:load",
                            path=out, parameters=summary["parameters"], preload=True)
    service.start()
    try:
        yield service
    finally:
        service.stop()


def _run(svc, body):
    r = svc.client.post("/tracin", json={"model": MODEL, **body})
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=300)
    assert job["status"] == "succeeded", (job, svc.worker_logs())
    return job, svc.client.get(f"/jobs/{job['id']}/result").json()


def _jsonl(svc, job_id, name):
    return [json.loads(line) for line in svc.artifact(job_id, name).decode().splitlines() if line.strip()]


def _csv(svc, job_id):
    return list(csv.DictReader(io.StringIO(svc.artifact(job_id, "influence.csv").decode())))


def _same_entries(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g["test_triple"] == w["test_triple"]
        for key in ("n_candidates", "n_positive", "n_negative", "truncated"):
            assert g[key] == w[key], key
        np.testing.assert_allclose(g["self_influence"], w["self_influence"], rtol=1e-5)
        for key in ("proponents", "opponents"):
            assert [e["train_triple"] for e in g[key]] == [e["train_triple"] for e in w[key]], key
            for field in ("influence", "train_self_influence"):
                np.testing.assert_allclose([e[field] for e in g[key]], [e[field] for e in w[key]], rtol=1e-4,
                                           atol=1e-9)


@pytest.mark.parametrize("extra", [{}, {"filter": {"n_hops": 1}, "layers": "last"}])
def test_test_mode_sharded_equals_one_job(svc, extra):
    body = {"test_triples": TESTS, "top_k": 4, **extra}
    one_job, one = _run(svc, {**body, "shard_size": N_TRAIN})
    assert "shards" not in one_job
    fan_job, fan = _run(svc, {**body, "shard_size": 300})
    n_cand = one["n_candidates_scored"]
    n_shards = -(-n_cand // 300)
    assert fan_job["shards"]["total"] == fan_job["shards"]["succeeded"] == n_shards > 1
    assert fan_job["progress"]["done"] == fan_job["progress"]["total"] == n_cand
    children = svc.client.get(f"/jobs?parent={fan_job['id']}").json()["items"]
    assert [c["queue"] for c in children] == ["bulk"] * (n_shards + 1)
    if not extra:  # the shards ran on both worker processes
        assert len({svc.redis().hget(f"rq:job:{c['id']}", "worker_name") for c in children[:-1]}) == 2

    # the parent's result is a summary; the per-test-triple entries are in results.jsonl, equal to one job's
    assert "results" in one and fan["results"] == {"artifact": "results.jsonl", "count": len(TESTS)}
    _same_entries(_jsonl(svc, fan_job["id"], "results.jsonl"), one["results"])
    _same_entries(_jsonl(svc, one_job["id"], "results.jsonl"), one["results"])
    assert fan["n_candidates_scored"] == n_cand and fan["failed"] == {"shards": [], "candidates": 0, "triples": []}
    for key in ("top_proponents", "top_opponents"):
        counted = sum(r["n_positive" if key == "top_proponents" else "n_negative"] for r in one["results"])
        assert len(one[key]) == min(4, counted)
        assert [(e["test_triple"], e["train_triple"]) for e in fan[key]] == \
            [(e["test_triple"], e["train_triple"]) for e in one[key]]
        np.testing.assert_allclose([e["influence"] for e in fan[key]], [e["influence"] for e in one[key]],
                                   rtol=1e-4)
    rows_fan, rows_one = _csv(svc, fan_job["id"]), _csv(svc, one_job["id"])
    assert [(r["TestHead"], r["TrainHead"], r["TrainTail"], r["Role"]) for r in rows_fan] == \
        [(r["TestHead"], r["TrainHead"], r["TrainTail"], r["Role"]) for r in rows_one]


def test_every_score_goes_to_an_npy_artifact_when_sharded_too(svc):
    body = {"test_triples": [TESTS[0], TESTS[4]], "top_k": None, "layers": "last", "filter": {"n_hops": 1}}
    one_job, one = _run(svc, {**body, "shard_size": N_TRAIN})
    fan_job, fan = _run(svc, {**body, "shard_size": 100})
    assert fan_job["shards"]["total"] > 1
    for res in (one, fan):
        assert res["scores"]["artifact"] == "scores.npy" and res["scores"]["columns"] == "candidates.tsv"
    a = np.load(io.BytesIO(svc.artifact(one_job["id"], "scores.npy")))
    b = np.load(io.BytesIO(svc.artifact(fan_job["id"], "scores.npy")))
    assert a.shape == b.shape == (2, one["n_candidates_scored"])
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-9, equal_nan=True)
    assert np.isnan(a).any() and not np.isnan(a).all()  # NaN marks a column outside a test triple's filter
    cols = svc.artifact(one_job["id"], "candidates.tsv").decode().splitlines()
    assert cols == svc.artifact(fan_job["id"], "candidates.tsv").decode().splitlines()
    assert len(cols) == a.shape[1]
    # every candidate listed (few pairs), ranked from the same scores
    entries = _jsonl(svc, fan_job["id"], "results.jsonl")
    _same_entries(entries, one["results"])
    for i, e in enumerate(entries):
        row = a[i]
        assert e["n_positive"] == int((row > 0).sum()) == len(e["proponents"])
        col = cols.index("\t".join(e["proponents"][0]["train_triple"]))
        assert e["proponents"][0]["influence"] == pytest.approx(float(np.nanmax(row)), rel=1e-5)
        assert row[col] == pytest.approx(float(np.nanmax(row)), rel=1e-5)


def test_self_mode_sharded_equals_one_job(svc):
    body = {"mode": "self", "top_k": 25, "layers": "last"}
    _, one = _run(svc, {**body, "shard_size": N_TRAIN})
    fan_job, fan = _run(svc, {**body, "shard_size": 500})
    assert fan_job["shards"]["total"] == 4
    assert fan["n_candidates"] == one["n_candidates"] == N_TRAIN == fan["n_scored"]
    assert [r["train_triple"] for r in fan["ranking"]] == [r["train_triple"] for r in one["ranking"]]
    np.testing.assert_allclose([r["self_influence"] for r in fan["ranking"]],
                               [r["self_influence"] for r in one["ranking"]], rtol=1e-5)
    full = _jsonl(svc, fan_job["id"], "self_influence.jsonl")
    assert len(full) == N_TRAIN and len({tuple(r["train_triple"]) for r in full}) == N_TRAIN
    values = [r["self_influence"] for r in full]
    assert values == sorted(values, reverse=True)


def test_fan_out_fields_are_validated(svc):
    for body, loc in (({"test_triples": TESTS, "shard_size": 0}, ["body", "shard_size"]),
                      ({"test_triples": TESTS, "max_failed_fraction": 2}, ["body", "max_failed_fraction"]),
                      ({"mode": "single", "test_triples": TESTS * 200, "train_triples": [TESTS[0]] * 1001},
                       ["body", "train_triples"])):
        r = svc.client.post("/tracin", json={"model": MODEL, **body})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == loc


def test_a_workers_test_factor_cache_is_per_parent_and_per_loaded_model():
    from workers.jobs import tracin as jobs

    class Bundle:  # stands in for a loaded KGBundle (only its identity matters)
        pass

    a, b = Bundle(), Bundle()
    jobs._drop_test_factors()
    first = jobs._test_factor_cache("parent-1", a)
    first["block"] = "factors"
    assert jobs._test_factor_cache("parent-1", a) is first  # the next shard of the same parent
    assert jobs._test_factor_cache("parent-1", b) == {}  # the model was reloaded: nothing carried over
    second = jobs._test_factor_cache("parent-2", b)
    second["block"] = "factors"
    assert jobs._test_factor_cache("parent-1", b) == {}  # another parent
    jobs._test_factor_cache("parent-2", b)["block"] = "factors"
    jobs._drop_test_factors("parent-1")  # another parent's reduce leaves it
    assert jobs._test_factor_cache("parent-2", b) == {"block": "factors"}
    jobs._drop_test_factors("parent-2")  # its own reduce drops it
    assert jobs._test_factor_cache("parent-2", b) == {}
    jobs._drop_test_factors()
