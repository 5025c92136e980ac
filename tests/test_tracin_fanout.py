"""TracIn fanned out over real worker processes: shards over the candidate training triples, merged by a reduce
step into exactly what one unsharded job returns (lists, counts, global top, CSV, every score)."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from core import registry
from core.contract.results.influence import InfluenceResult
from models.kg.train import TrainConfig, train_conve
from models.kg.triples import load_nations
from tests.results_compare import assert_renders, assert_same

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


def _tolerance(where: str) -> tuple[float, float]:
    return 1e-4, 1e-9  # fp32 scores, summed over checkpoints in another order by the shards


# how a run was split and when: the rest of the result is the same whole or sharded
PER_RUN = {"seconds", "shards", "artifacts"}


def _same_result(fan: dict, one: dict) -> None:
    for result in (fan, one):
        InfluenceResult.model_validate(result)
    assert one["shards"] is None and fan["shards"]["total"] > 1 and fan["shards"]["failed"] == []
    assert_same(fan, one, _tolerance, PER_RUN)
    assert {a["name"] for a in fan["artifacts"]} == {a["name"] for a in one["artifacts"]}


def _renders(svc, *job_ids: str) -> None:
    """The SDK's renderers (HTML and text) and ``explainq-client result --table`` draw every result."""
    from explainq_client import TracInResult

    assert_renders(svc.settings, job_ids, TracInResult)


@pytest.mark.parametrize("extra", [{}, {"filter": {"n_hops": 1}, "layers": "last"}])
def test_test_mode_sharded_equals_one_job(svc, extra):
    body = {"test_triples": TESTS, "top_k": 4, **extra}
    one_job, one = _run(svc, {**body, "shard_size": N_TRAIN})
    assert "shards" not in one_job
    fan_job, fan = _run(svc, {**body, "shard_size": 300})
    n_cand = one["n_candidates"]
    n_shards = -(-n_cand // 300)
    assert fan_job["shards"]["total"] == fan_job["shards"]["succeeded"] == n_shards > 1
    assert fan_job["progress"]["done"] == fan_job["progress"]["total"] == n_cand
    children = svc.client.get(f"/jobs?parent={fan_job['id']}").json()["items"]
    assert [c["queue"] for c in children] == ["bulk"] * (n_shards + 1)
    if not extra:  # the shards ran on both worker processes
        assert len({svc.redis().hget(f"rq:job:{c['id']}", "worker_name") for c in children[:-1]}) == 2

    # one result, whole or sharded: the same fields, every entry inline here, all of them in results.jsonl
    _same_result(fan, one)
    assert one["listed"]["results"] == {"total": len(TESTS), "inline": len(TESTS), "artifact": "results.jsonl"}
    _same_entries(_jsonl(svc, fan_job["id"], "results.jsonl"), one["results"])
    _same_entries(_jsonl(svc, one_job["id"], "results.jsonl"), one["results"])
    assert fan["failed"] is None and fan["estimator"] == "tracin" and not fan["approximate"]
    for key in ("top_proponents", "top_opponents"):
        counted = sum(r["n_positive" if key == "top_proponents" else "n_negative"] for r in one["results"])
        assert len(one[key]) == min(4, counted)
    rows_fan, rows_one = _csv(svc, fan_job["id"]), _csv(svc, one_job["id"])
    assert [(r["TestHead"], r["TrainHead"], r["TrainTail"], r["Role"]) for r in rows_fan] == \
        [(r["TestHead"], r["TrainHead"], r["TrainTail"], r["Role"]) for r in rows_one]
    if not extra:
        _renders(svc, one_job["id"], fan_job["id"])


def test_a_result_lists_its_first_entries_inline_and_every_one_in_results_jsonl(svc):
    """More test triples than a result holds inline: the first ones inline, all in the artifact, the same
    whether the job ran whole or as shards."""
    from models.kg import influence

    many = (TESTS * 50)[:influence.RESULTS_INLINE + 25]
    body = {"test_triples": many, "top_k": 2, "layers": "last"}
    one_job, one = _run(svc, {**body, "shard_size": N_TRAIN})
    fan_job, fan = _run(svc, {**body, "shard_size": 800})
    _same_result(fan, one)
    assert len(one["results"]) == influence.RESULTS_INLINE < len(many)
    assert one["listed"]["results"] == {"total": len(many), "inline": influence.RESULTS_INLINE,
                                        "artifact": "results.jsonl"}
    for job in (one_job, fan_job):
        entries = _jsonl(svc, job["id"], "results.jsonl")
        assert len(entries) == len(many)
        _same_entries(entries[:influence.RESULTS_INLINE], one["results"])


def test_every_score_goes_to_an_npy_artifact_when_sharded_too(svc):
    body = {"test_triples": [TESTS[0], TESTS[4]], "top_k": None, "layers": "last", "filter": {"n_hops": 1}}
    one_job, one = _run(svc, {**body, "shard_size": N_TRAIN})
    fan_job, fan = _run(svc, {**body, "shard_size": 100})
    _same_result(fan, one)
    for res in (one, fan):
        assert res["scores"]["artifact"] == "scores.npy" and res["scores"]["columns"] == "candidates.tsv"
    a = np.load(io.BytesIO(svc.artifact(one_job["id"], "scores.npy")))
    b = np.load(io.BytesIO(svc.artifact(fan_job["id"], "scores.npy")))
    assert a.shape == b.shape == (2, one["n_candidates"])
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
    one_job, one = _run(svc, {**body, "shard_size": N_TRAIN})
    fan_job, fan = _run(svc, {**body, "shard_size": 500})
    assert fan_job["shards"]["total"] == 4
    _same_result(fan, one)
    assert fan["n_candidates"] == N_TRAIN and len(fan["ranking"]) == 25
    assert one["listed"]["ranking"] == {"total": N_TRAIN, "inline": 25, "artifact": "self_influence.jsonl"}
    for job in (one_job, fan_job):  # the whole ranking, whichever way it ran
        full = _jsonl(svc, job["id"], "self_influence.jsonl")
        assert len(full) == N_TRAIN and len({tuple(r["train_triple"]) for r in full}) == N_TRAIN
        values = [r["self_influence"] for r in full]
        assert values == sorted(values, reverse=True)
        assert [r["train_triple"] for r in full[:25]] == [r["train_triple"] for r in one["ranking"]]
    _renders(svc, one_job["id"], fan_job["id"])


def test_single_mode_and_the_stored_feature_estimators_give_the_same_shape(svc):
    """Mode single, and TRAK over the features a featurize job stored: InfluenceResults with the same fields."""
    _, single = _run(svc, {"mode": "single", "test_triples": TESTS[:2], "train_triples": TESTS[2:4]})
    InfluenceResult.model_validate(single)
    assert [len(e["pairs"]) for e in single["results"]] == [2, 2] and single["listed"]["results"]["total"] == 2
    r = svc.client.post("/featurize", json={"model": MODEL, "proj_dim": 16, "layers": "last"})
    assert r.status_code == 202, r.text
    assert svc.wait(r.json()["id"], timeout_s=300)["status"] == "succeeded"
    from core import lastuse
    from core.filestore import get_store

    store = get_store(svc.settings)
    entries = [f"features/{c['key']}" for c in svc.client.get(f"/jobs/{r.json()['id']}/result").json()["checkpoints"]]
    featurized = [lastuse.last_used(store, e) for e in entries]
    assert entries and all(t is not None for t in featurized)  # retention's clock for the shared features
    trak_job, trak = _run(svc, {"test_triples": TESTS, "top_k": 3, "estimator": "trak", "projection_dim": 16,
                                "layers": "last"})
    assert all(lastuse.last_used(store, e) >= t for e, t in zip(entries, featurized, strict=True))  # read: used
    InfluenceResult.model_validate(trak)
    _, exact = _run(svc, {"test_triples": TESTS, "top_k": 3, "layers": "last"})
    assert set(trak) == set(exact) and trak["approximate"] and trak["estimator"] == "trak"
    assert trak["listed"]["results"] == exact["listed"]["results"]
    assert [e["test_triple"] for e in trak["results"]] == [e["test_triple"] for e in exact["results"]]
    _renders(svc, trak_job["id"])


def test_the_old_name_of_the_exact_estimator_is_still_read(svc):
    """``exact`` was the name of ``tracin`` in POST /tracin: a request (or a stored request cloned) that says so
    runs as ``tracin`` and is stored under the registry's name."""
    job, result = _run(svc, {"test_triples": TESTS[:1], "top_k": 2, "estimator": "exact"})
    assert result["estimator"] == "tracin"
    assert svc.client.get(f"/jobs/{job['id']}/request").json()["estimator"] == "tracin"


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
