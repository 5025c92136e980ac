"""``POST /evaluate/attribution`` and ``POST /evaluate/mislabel``: bounds and names refused with the field named,
and (slow) the jobs end to end through real workers: the LDS recomputed independently from the stored ground
truth, the ground truth reused without training, the corrupted triples recovered, the AUC against scikit-learn,
another owner's evaluation invisible."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score

from tests.service import api_client

TINY = {"epochs": 1, "batch_size": 256, "lr": 0.01, "embedding_dim": 20, "embedding_height": 4, "num_filters": 4,
        "checkpoint_every": 1, "seed": 0}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with api_client(tmp_path_factory.mktemp("evaluate")) as c:
        yield c


def _locs(r) -> set[tuple]:
    return {tuple(d["loc"]) for d in r.json()["detail"]}


@pytest.mark.parametrize("route, body, loc", [
    ("/evaluate/attribution", {"m": 10**6}, ("body", "m")),
    ("/evaluate/attribution", {"m": 2}, ("body", "m")),
    ("/evaluate/attribution", {"alpha": 1.0}, ("body", "alpha")),
    ("/evaluate/attribution", {"alpha": 0}, ("body", "alpha")),
    ("/evaluate/attribution", {"recipe": {"epochs": 10**6}}, ("body", "recipe", "epochs")),
    ("/evaluate/attribution", {"recipe": {"epochs": 201}}, ("body", "recipe", "epochs")),
    ("/evaluate/attribution", {"recipe": {"epochs": 2, "checkpoint_every": 3}}, ("body", "recipe",
                                                                                 "checkpoint_every")),
    ("/evaluate/attribution", {"recipe": {"embedding_dim": 7}}, ("body", "recipe", "embedding_dim")),
    ("/evaluate/attribution", {"recipe": {"no_such": 1}}, ("body", "recipe", "no_such")),
    ("/evaluate/attribution", {"n_test": 10**9}, ("body", "n_test")),
    ("/evaluate/attribution", {"n_test": 0}, ("body", "n_test")),
    ("/evaluate/attribution", {"estimators": ["nope"]}, ("body", "estimators", 0)),
    ("/evaluate/attribution", {"estimators": ["random", "random"]}, ("body", "estimators", 1)),
    ("/evaluate/attribution", {"estimators": []}, ("body", "estimators")),
    ("/evaluate/attribution", {"estimators": ["random"] * 17}, ("body", "estimators")),
    ("/evaluate/attribution", {"seed": -1}, ("body", "seed")),
    ("/evaluate/mislabel", {"fraction": 0.9}, ("body", "fraction")),
    ("/evaluate/mislabel", {"fraction": 0}, ("body", "fraction")),
    ("/evaluate/mislabel", {"recipe": {"epochs": 1000}}, ("body", "recipe", "epochs")),
    ("/evaluate/mislabel", {"estimators": ["tracin", "trak?"]}, ("body", "estimators", 1)),
])
def test_bad_request_is_422_naming_the_field(client, route, body, loc):
    r = client.post(route, json=body)
    assert r.status_code == 422, r.text
    assert loc in _locs(r), r.text


def test_training_budget_over_m_and_epochs_names_both_fields(client):
    r = client.post("/evaluate/attribution", json={"m": 256, "recipe": {"epochs": 100}})
    assert r.status_code == 422, r.text
    assert {("body", "m"), ("body", "recipe", "epochs")} <= _locs(r)
    assert "20,000" in r.text
    assert client.post("/evaluate/attribution", json={"m": 200, "recipe": {"epochs": 100}}).status_code == 202


def test_unknown_dataset_names_the_field(client):
    r = client.post("/evaluate/attribution", json={"dataset": "no-such-graph"})
    assert r.status_code in (404, 422), r.text
    body = r.json()["detail"]
    locs = [tuple(d["loc"]) for d in body] if isinstance(body, list) else [tuple(body["loc"])]
    assert ("body", "dataset") in locs
    assert "/" not in json.dumps(body).replace("no-such-graph", "")  # no server path in the answer


def test_a_valid_request_is_queued_on_bulk_with_the_evaluation_renderer(client):
    r = client.post("/evaluate/attribution", json={"m": 4, "recipe": TINY, "n_test": 5})
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["kind"] == "evaluate_attribution" and job["status"] == "queued"
    kinds = {k["name"]: k for k in client.get("/kinds").json()["kinds"]}
    for name in ("evaluate_attribution", "evaluate_mislabel"):
        assert kinds[name]["renderer"] == "evaluation" and kinds[name]["queue"] == "bulk"
    assert kinds["evaluate_attribution"]["route"] == "/evaluate/attribution"


# ------------------------------------------------------------------------------------------- through the service
ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"Authorization": "Bearer key-bob"}


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    from tests.service import Service

    with Service(tmp_path_factory.mktemp("evalsvc"), api_keys="alice:key-alice,bob:key-bob",
                 heartbeat_ttl_s=20) as service:
        yield service


def _run(svc, route, body, headers=ALICE):
    r = svc.client.post(route, json=body, headers=headers)
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=600, headers=headers)
    assert job["status"] == "succeeded", (job, svc.worker_logs())
    return job, svc.client.get(f"/jobs/{job['id']}/result", headers=headers).json()


def _npz(svc, job_id, name):
    return np.load(io.BytesIO(svc.artifact(job_id, name, headers=ALICE)))


@pytest.mark.slow
def test_lds_end_to_end_equals_an_independent_computation_and_reuses_its_ground_truth(svc):
    from core.filestore import get_store

    body = {"m": 3, "alpha": 0.5, "n_test": 8, "recipe": TINY, "seed": 5}
    job, res = _run(svc, "/evaluate/attribution", {**body, "estimators": ["tracin_last", "random"]})
    assert job["shards"]["total"] == 4  # three subset models and the full-data model, one shard each
    assert res["trainings"] == 4 and res["ground_truth"]["reused"] == 0
    assert res["seeds"] == [5, 6, 7] and res["n_test"] == 8 and res["subset_size"] == 796
    names = {a["name"] for a in res["artifacts"]}
    assert {"ground_truth.npz", "scores-tracin_last.npy", "scores-random.npy", "lds_per_test.csv"} <= names
    assert all("/" not in a["name"] for a in res["artifacts"]) and str(svc.home) not in json.dumps(res)

    # independent: the subset models' masks and outputs as stored, the scores, scipy's Spearman
    store = get_store(svc.settings)
    key = res["ground_truth"]["key"]
    stored = [np.load(io.BytesIO(store.read_bytes(f"cache/evaluation/lds/{key}/subset-{i:05d}.npz")))
              for i in range(3)]
    gt = _npz(svc, job["id"], "ground_truth.npz")
    sel = gt["test_index"]
    masks = np.stack([z["mask"] for z in stored])
    outputs = np.stack([z["outputs"] for z in stored])[:, sel]
    assert [int(z["seed"]) for z in stored] == res["seeds"]
    np.testing.assert_array_equal(gt["masks"], masks)
    for name in ("tracin_last", "random"):
        scores = np.load(io.BytesIO(svc.artifact(job["id"], f"scores-{name}.npy", headers=ALICE)))
        assert scores.shape == (8, 1592)
        want = [stats.spearmanr(masks.astype(float) @ scores[j], outputs[:, j]).statistic for j in range(8)]
        got = res["estimators"][name]["per_test"]
        np.testing.assert_allclose(np.array(got, dtype=float), want, rtol=1e-12, atol=1e-12)
        lds = res["estimators"][name]["lds"]
        assert lds["mean"] == pytest.approx(np.nanmean(want), abs=1e-12)
        assert lds["low"] <= lds["mean"] <= lds["high"]
        assert res["estimators"][name]["seconds"] >= 0

    # another estimator on the same ground truth: nothing is trained, no fan-out
    job2, res2 = _run(svc, "/evaluate/attribution", {**body, "estimators": ["tracin"]})
    assert "shards" not in job2
    assert res2["trainings"] == 0 and res2["ground_truth"]["reused"] == 4
    assert res2["ground_truth"]["key"] == key and res2["test_triples"] == res["test_triples"]
    np.testing.assert_array_equal(_npz(svc, job2["id"], "ground_truth.npz")["outputs"], outputs)
    assert set(res2["estimators"]) == {"tracin"}

    # another owner sees none of it
    for path in (f"/jobs/{job['id']}", f"/jobs/{job['id']}/result", f"/jobs/{job['id']}/artifacts",
                 f"/jobs/{job['id']}/artifacts/ground_truth.npz"):
        assert svc.client.get(path, headers=BOB).status_code == 404, path


@pytest.mark.slow
def test_mislabel_end_to_end_records_the_corrupted_triples_and_its_auc_is_scikit_learns(svc):
    from models.kg.triples import load_nations

    job, res = _run(svc, "/evaluate/mislabel", {"fraction": 0.1, "recipe": TINY, "seed": 3,
                                                "estimators": ["tracin_last", "random"]})
    assert res["n_corrupted"] == 159 and res["trainings"] == 1
    rows = list(csv.DictReader(io.StringIO(svc.artifact(job["id"], "corrupted.tsv", headers=ALICE).decode()),
                               delimiter="\t"))
    idx = np.array([int(r["train_index"]) for r in rows])
    assert idx.tolist() == [c["train_index"] for c in res["corrupted"]]
    nations = load_nations()
    originals = nations.decode(nations.train[idx.tolist()])
    for r, o, c in zip(rows, originals, res["corrupted"], strict=True):  # recoverable: the original is known
        assert [r["head"], r["relation"], r["original_tail"]] == o == c["original"]
        assert c["corrupted"] == [o[0], o[1], r["corrupted_tail"]] and r["corrupted_tail"] != o[2]
    labels = np.zeros(len(nations.train), bool)
    labels[idx] = True
    selfs = _npz(svc, job["id"], "self_scores.npz")
    for name in ("tracin_last", "random"):
        got = res["estimators"][name]
        assert got["auc"] == pytest.approx(roc_auc_score(labels, selfs[name]), abs=1e-12)
        order = np.argsort(-selfs[name], kind="stable")
        assert got["found_at_10"] == pytest.approx(labels[order[:160]].sum() / 159)
        assert len(got["recall_curve"]["found"]) == 101
    # the same request again reuses the corrupted model
    _, again = _run(svc, "/evaluate/mislabel", {"fraction": 0.1, "recipe": TINY, "seed": 3,
                                                 "estimators": ["random"]})
    assert again["trainings"] == 0 and again["corrupted"] == res["corrupted"]
    assert svc.client.get(f"/jobs/{job['id']}/result", headers=BOB).status_code == 404
