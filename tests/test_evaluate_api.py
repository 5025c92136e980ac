"""``POST /evaluate/attribution`` and ``POST /evaluate/mislabel``: bounds and names refused with the field named,
and (slow) the jobs end to end through real workers: the LDS recomputed independently from the stored ground
truth, the ground truth reused without training, the corrupted triples recovered, the AUC against scikit-learn,
another owner's evaluation invisible."""

from __future__ import annotations

import csv
import io
import json
import re

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score

from tests.results_compare import assert_renders
from tests.service import api_client

TINY = {"epochs": 1, "batch_size": 256, "lr": 0.01, "embedding_dim": 20, "embedding_height": 4, "num_filters": 4,
        "checkpoint_every": 1, "seed": 0}
ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"Authorization": "Bearer key-bob"}


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
    ("/evaluate/attribution", {"recipe": {"embedding_dim": 7}}, ("body", "recipe", "embedding_dim")),
    ("/evaluate/attribution", {"recipe": {"no_such": 1}}, ("body", "recipe", "no_such")),
    ("/evaluate/attribution", {"n_test": 10**9}, ("body", "n_test")),
    ("/evaluate/attribution", {"n_test": 0}, ("body", "n_test")),
    ("/evaluate/attribution", {"estimators": ["nope"]}, ("body", "estimators", 0)),
    ("/evaluate/attribution", {"estimators": ["random", "random"]}, ("body", "estimators", 1)),
    ("/evaluate/attribution", {"estimators": []}, ("body", "estimators")),
    ("/evaluate/attribution", {"estimators": ["random"] * 17}, ("body", "estimators")),
    ("/evaluate/attribution", {"seed": -1}, ("body", "seed")),
    ("/evaluate/attribution", {"output": "logit"}, ("body", "output")),
    ("/evaluate/mislabel", {"output": "margin"}, ("body", "output")),
    ("/evaluate/mislabel", {"fraction": 0.9}, ("body", "fraction")),
    ("/evaluate/mislabel", {"fraction": 0}, ("body", "fraction")),
    ("/evaluate/mislabel", {"recipe": {"epochs": 1000}}, ("body", "recipe", "epochs")),
    ("/evaluate/mislabel", {"estimators": ["tracin", "trak?"]}, ("body", "estimators", 1)),
    ("/evaluate/mislabel", {"estimators": ["trak", "trak_ensemble"]}, ("body", "estimators", 1)),
    ("/evaluate/attribution", {"ensemble": 0}, ("body", "ensemble")),
    ("/evaluate/attribution", {"ensemble": 17}, ("body", "ensemble")),
    ("/evaluate/attribution", {"replicates": "sometimes"}, ("body", "replicates")),
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
    # the default estimators include trak_ensemble: its 4 members count, (196 + 4) x 100 = 20,000
    assert client.post("/evaluate/attribution", json={"m": 196, "recipe": {"epochs": 100}}).status_code == 202
    assert client.post("/evaluate/attribution", json={"m": 197, "recipe": {"epochs": 100}}).status_code == 422


def test_ensemble_members_count_in_the_training_budget_only_when_an_ensemble_estimator_is_asked(client):
    body = {"m": 200, "recipe": {"epochs": 100}, "ensemble": 16}  # (200 + 16) x 100 > 20,000 >= 200 x 100
    r = client.post("/evaluate/attribution", json={**body, "estimators": ["trak_ensemble"]})
    assert r.status_code == 422, r.text
    assert {("body", "m"), ("body", "recipe", "epochs"), ("body", "ensemble")} <= _locs(r), r.text
    assert "ensemble 16" in r.text
    r = client.post("/evaluate/attribution", json={**body, "estimators": ["trak"]})
    assert r.status_code == 202, r.text
    # replicates train every subset twice: 2 x 150 x 100 > 20,000 >= 150 x 100
    r = client.post("/evaluate/attribution", json={"m": 150, "recipe": {"epochs": 100}, "estimators": ["trak"],
                                                   "replicates": True})
    assert r.status_code == 422 and ("body", "replicates") in _locs(r) and "2 x m 150" in r.text, r.text
    assert client.post("/evaluate/attribution", json={"m": 150, "recipe": {"epochs": 100},
                                                      "estimators": ["trak"]}).status_code == 202


def test_a_recipe_over_the_worker_memory_names_its_sizes(client):
    r = client.post("/evaluate/mislabel", json={"recipe": {"embedding_dim": 4096, "num_filters": 1024,
                                                           "embedding_height": 64}})
    assert r.status_code == 422, r.text
    assert {("body", "recipe", "embedding_dim"), ("body", "recipe", "num_filters")} <= _locs(r)
    assert "EXPLAINQ_WORKER_MEMORY_BYTES" in r.text


def test_another_owners_evaluation_is_not_found(tmp_path):
    keys = {"EXPLAINQ_API_KEYS": "alice:key-alice,bob:key-bob"}
    with api_client(tmp_path, **keys) as c:
        r = c.post("/evaluate/attribution", json={"m": 3, "recipe": TINY}, headers=ALICE)
        assert r.status_code == 202, r.text
        job = r.json()["id"]
        assert c.get(f"/jobs/{job}", headers=ALICE).status_code == 200
        for path in (f"/jobs/{job}", f"/jobs/{job}/request", f"/jobs/{job}/artifacts"):
            assert c.get(path, headers=BOB).status_code == 404, path
        assert c.delete(f"/jobs/{job}", headers=BOB).status_code == 404  # the cancel route
        assert c.get(f"/jobs/{job}", headers=ALICE).json()["status"] == "queued"  # not canceled by Bob
        assert c.post("/evaluate/attribution", json={"m": 3}).status_code == 401


def test_unknown_dataset_names_the_field(client):
    r = client.post("/evaluate/attribution", json={"dataset": "no-such-graph"})
    assert r.status_code in (404, 422), r.text
    body = r.json()["detail"]
    locs = [tuple(d["loc"]) for d in body] if isinstance(body, list) else [tuple(body["loc"])]
    assert ("body", "dataset") in locs
    assert "/" not in json.dumps(body).replace("no-such-graph", "")  # no server path in the answer


def test_a_dataset_without_test_triples_cannot_be_evaluated_by_lds(tmp_path):
    with api_client(tmp_path) as c:
        graph = tmp_path / "data" / "kg-no-test"
        graph.mkdir(parents=True)
        (graph / "train.txt").write_text("a\tr\tb\nb\tr\tc\nc\tr\ta\n")
        r = c.post("/evaluate/attribution", json={"dataset": "kg-no-test/"})
        assert r.status_code == 422, r.text
        assert _locs(r) == {("body", "dataset")} and "test.txt" in r.text and str(tmp_path) not in r.text
        assert c.post("/evaluate/mislabel", json={"dataset": "kg-no-test/"}).status_code == 202
        (graph / "test.txt").write_text("a\tr\tc\n")
        assert c.post("/evaluate/attribution", json={"dataset": "kg-no-test/"}).status_code == 202


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
    from models.kg.evaluation import LDS_DESIGN, full_model_seed, subset_seeds, subset_train_seeds

    assert res["seeds"] == subset_seeds(5, 3) and res["train_seeds"] == subset_train_seeds(5, 3)
    assert res["design"] == LDS_DESIGN and res["full_model"]["seed"] == full_model_seed(5, TINY["seed"])
    assert res["n_test"] == 8 and res["subset_size"] == 796
    assert res["shards"] == {"total": 4, "failed": []}
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
    assert [int(z["train_seed"]) for z in stored] == res["train_seeds"]
    np.testing.assert_array_equal(gt["masks"], masks)
    for name in ("tracin_last", "random"):
        scores = np.load(io.BytesIO(svc.artifact(job["id"], f"scores-{name}.npy", headers=ALICE)))
        assert scores.shape == (8, 1592)
        want = [stats.spearmanr(masks.astype(float) @ scores[j], outputs[:, j]).statistic for j in range(8)]
        got = res["estimators"][name]["per_test"]
        np.testing.assert_allclose(np.array(got, dtype=float), want, rtol=1e-12, atol=1e-12)
        lds = res["estimators"][name]["lds"]
        assert lds["mean"] == pytest.approx(np.nanmean(want), abs=1e-12)
        assert res["estimators"][name]["output"] == {"tracin_last": "margin", "random": None}[name]
        assert lds["low"] <= lds["mean"] <= lds["high"]
        assert res["estimators"][name]["seconds"] >= 0

    # another estimator on the same ground truth: nothing is trained, no fan-out
    job2, res2 = _run(svc, "/evaluate/attribution", {**body, "estimators": ["tracin"]})
    assert "shards" not in job2 and res2["shards"] is None
    assert res2["trainings"] == 0 and res2["ground_truth"]["reused"] == 4
    assert res2["ground_truth"]["key"] == key and res2["test_triples"] == res["test_triples"]
    np.testing.assert_array_equal(_npz(svc, job2["id"], "ground_truth.npz")["outputs"], outputs)
    assert set(res2["estimators"]) == {"tracin"}

    # TRAK's model ensemble: only the two members are trained (the rest is reused), and its scores are the mean of
    # TRAK over the full-data model and the members as stored
    import torch

    from models.kg.checkpoint import load
    from models.kg.evaluation import trak_scores

    job_e, res_e = _run(svc, "/evaluate/attribution", {**body, "estimators": ["trak_ensemble", "tracin"],
                                                       "ensemble": 2})
    assert job_e["shards"]["total"] == 2 and res_e["trainings"] == 2 and res_e["ground_truth"]["reused"] == 4
    assert res_e["ensemble"]["members"] == 2 and len(set(res_e["ensemble"]["models"])) == 2
    models = [load(store.local_dir(f"cache/evaluation/models/{k}"))
              for k in [res["ground_truth"]["full_model"], *res_e["ensemble"]["models"]]]
    assert [m.training["seed"] for m in models] == [res["full_model"]["seed"], *res_e["ensemble"]["seeds"]]
    test = models[0].dataset.test[torch.from_numpy(_npz(svc, job_e["id"], "ground_truth.npz")["test_index"])]
    assert models[0].dataset.decode(test) == res_e["test_triples"]
    want = sum(trak_scores(m, m.checkpoints, test, m.dataset.train).double().numpy() for m in models) / 3
    got = np.load(io.BytesIO(svc.artifact(job_e["id"], "scores-trak_ensemble.npy", headers=ALICE)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9)
    ratio = res_e["estimators"]["trak_ensemble"]["ratio_to_tracin"]
    a, b = (np.array(res_e["estimators"][n]["per_test"], dtype=float) for n in ("trak_ensemble", "tracin"))
    ok = np.isfinite(a) & np.isfinite(b)
    if b[ok].mean() == 0:  # three subsets: TracIn's per-test Spearman values can average to exactly 0
        assert ratio["ratio"] is None
    else:
        assert ratio["ratio"] == pytest.approx(a[ok].mean() / b[ok].mean())

    # the noise ceiling: each subset trained again with another seed (three more models, nothing else), and the
    # agreement is the Spearman between the stored outputs of the two
    job_r, res_r = _run(svc, "/evaluate/attribution", {**body, "estimators": ["random"], "replicates": True})
    assert job_r["shards"]["total"] == 3 and res_r["trainings"] == 3 and res_r["ground_truth"]["reused"] == 4
    reps = [np.load(io.BytesIO(store.read_bytes(f"cache/evaluation/lds/{key}/replicate-{i:05d}.npz")))
            for i in range(3)]
    for z, s in zip(reps, stored, strict=True):
        np.testing.assert_array_equal(z["mask"], s["mask"])
        assert int(z["train_seed"]) == res_r["replicate_seeds"][int(z["index"])] != int(s["train_seed"])
    rep_out = np.stack([z["outputs"] for z in reps])[:, sel]
    agree = [stats.spearmanr(outputs[:, j], rep_out[:, j]).statistic for j in range(8)]
    ceiling = res_r["noise_ceiling"]
    np.testing.assert_allclose(np.array(ceiling["per_test"], dtype=float), agree, rtol=1e-12, atol=1e-12)
    assert ceiling["ceiling"] == pytest.approx(np.nanmean(np.sqrt(np.clip(agree, 0, None))))
    np.testing.assert_array_equal(_npz(svc, job_r["id"], "ground_truth.npz")["replicate_outputs"], rep_out)
    assert res["noise_ceiling"] is None and "noise ceiling" in _dashboard_page(svc, job_r["id"])

    # one stored subset model gone: only that one is trained again, and the LDS is what it was
    store.delete(f"cache/evaluation/lds/{key}/subset-00001.npz")
    job3, res3 = _run(svc, "/evaluate/attribution", {**body, "estimators": ["tracin_last", "random"]})
    assert job3["shards"]["total"] == 1 and res3["trainings"] == 1 and res3["ground_truth"]["reused"] == 3
    for name in ("tracin_last", "random"):
        assert res3["estimators"][name]["per_test"] == res["estimators"][name]["per_test"]
        assert res3["estimators"][name]["lds"] == res["estimators"][name]["lds"]

    from core.contract.results.evaluation import LdsResult

    for r in (res, res2, res_e, res_r, res3):  # every one of them is exactly the kind's result model
        assert LdsResult.model_validate(r).model_dump(mode="json") == r

    # another owner sees none of it
    for path in (f"/jobs/{job['id']}", f"/jobs/{job['id']}/result", f"/jobs/{job['id']}/artifacts",
                 f"/jobs/{job['id']}/artifacts/ground_truth.npz"):
        assert svc.client.get(path, headers=BOB).status_code == 404, path

    # the dashboard's job page draws the evaluation (signed in as alice)
    page = _dashboard_page(svc, job["id"])
    assert "Linear datamodeling score" in page and "<svg" in page
    lds = res["estimators"]["tracin_last"]["lds"]
    assert re.search(r'<th scope="row">tracin_last</th><td>' + re.escape(_num3(lds["mean"])), page), page[-3000:]


def _num3(v):
    from app.ui.views import num

    return num(v, 3)


def _dashboard_page(svc, job_id):
    c = svc.client
    c.cookies.clear()
    r = c.post("/ui/login", data={"api_key": "key-alice", "next": "/ui/jobs"}, follow_redirects=False)
    assert r.status_code == 303, r.text
    try:
        page = c.get(f"/ui/jobs/{job_id}")
        assert page.status_code == 200, page.text
        return page.text
    finally:
        c.cookies.clear()


@pytest.mark.slow
@pytest.mark.slow  # a whole evaluation through the service: about 30 s on a shared 2-core machine
def test_tracin_adam_runs_end_to_end_on_the_full_data_model_s_stored_adam_state(svc):
    """The evaluation's full-data model keeps Adam's state with each checkpoint in the store, and tracin_adam's
    scores there are the estimator's on that model."""
    import torch

    from core.filestore import get_store
    from models.kg import evaluation
    from models.kg.checkpoint import load
    from workers.jobs.evaluate import _model_key

    job, res = _run(svc, "/evaluate/attribution", {"m": 3, "alpha": 0.5, "n_test": 4, "recipe": TINY, "seed": 11,
                                                   "estimators": ["tracin_adam", "tracin"]})
    assert res["estimators"]["tracin_adam"]["output"] == "margin"
    assert res["estimators"]["tracin_adam"]["lds"]["n"] >= 1
    full = load(get_store(svc.settings).local_dir(_model_key(res["ground_truth"]["full_model"])))
    assert full.checkpoints and all(c.optimizer is not None and c.optimizer.is_file() for c in full.checkpoints)
    gt = _npz(svc, job["id"], "ground_truth.npz")
    test = full.dataset.test[torch.from_numpy(gt["test_index"])]
    scores = np.load(io.BytesIO(svc.artifact(job["id"], "scores-tracin_adam.npy", headers=ALICE)))
    want = evaluation.run_estimator("tracin_adam", full, test, full.dataset.train).values
    np.testing.assert_allclose(scores, want, rtol=1e-6, atol=1e-9)


def test_mislabel_end_to_end_records_the_corrupted_triples_and_its_auc_is_scikit_learns(svc):
    from models.kg.triples import load_nations

    job, res = _run(svc, "/evaluate/mislabel", {"fraction": 0.1, "recipe": TINY, "seed": 3,
                                                "estimators": ["tracin_last", "random"]})
    assert res["n_corrupted"] == 159 and res["trainings"] == 1
    from core.contract.results.evaluation import MislabelResult

    assert MislabelResult.model_validate(res).model_dump(mode="json") == res
    assert _result_schema(svc, job["id"]) == "MislabelResult"
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
    page = _dashboard_page(svc, job["id"])
    assert "Mislabel detection" in page and "<polyline" in page and "Suspected training triples" in page
    assert len(res["estimators"]["tracin_last"]["suspects"]) == res["suspects_listed"] == 50

    # a stored model whose corruption record disagrees with the request is never used
    from core.filestore import get_store

    store = get_store(svc.settings)
    key = f"cache/evaluation/models/{res['model']['key']}/corruption.json"
    record = json.loads(store.read_text(key))
    record["indices"][0] += 1
    store.put_bytes(json.dumps(record).encode(), key)
    r = svc.client.post("/evaluate/mislabel", json={"fraction": 0.1, "recipe": TINY, "seed": 3,
                                                    "estimators": ["random"]}, headers=ALICE)
    failed = svc.wait(r.json()["id"], timeout_s=300, headers=ALICE)
    assert failed["status"] == "failed" and failed["error"]["code"] == "cache_mismatch", failed
    assert svc.client.get(f"/jobs/{job['id']}/result", headers=BOB).status_code == 404


def test_a_mislabel_job_lists_each_estimators_suspects_and_writes_the_whole_ranking(tmp_path):
    """Run in process (no service): each estimator's top ``suspects_listed`` training triples by self-influence
    are the ranking of its ``self_scores.npz`` (an independent sort), flagged corrupted exactly where the tail
    was replaced, with the original tail of ``corrupted.tsv``; ``suspects.csv`` holds every triple of every
    ranking; the job's last progress report is "1 / 1 estimators"."""
    from core.kinds.evaluate import EvaluateMislabelRequest
    from core.settings import Settings
    from workers.context import JobContext
    from workers.jobs.evaluate import MAX_LISTED_SUSPECTS, SUSPECT_COLUMNS, run_mislabel

    class Recording(JobContext):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.reports: list[tuple] = []

        def progress(self, done, total, unit, message=None, metrics=None):
            if unit == "estimators":
                self.reports.append((done, total))
            super().progress(done, total, unit, message, metrics)

    ctx = Recording(Settings(EXPLAINQ_HOME=str(tmp_path)), device="cpu")
    res = run_mislabel(EvaluateMislabelRequest(recipe=TINY, estimators=["random"], fraction=0.1, seed=3), ctx)
    assert ctx.reports[-1] == (1, 1)
    assert res.suspects_listed == MAX_LISTED_SUSPECTS == 50 and {a.name for a in res.artifacts} >= {"suspects.csv"}
    scores = np.load(ctx.artifact_path("self_scores.npz"))["random"]
    rows = list(csv.DictReader(io.StringIO(ctx.artifact_path("corrupted.tsv").read_text()), delimiter="\t"))
    corrupted = {int(r["train_index"]): r for r in rows}
    want = [i for _, i in sorted((-float(v), i) for i, v in enumerate(scores))]
    listed = res.estimators["random"].suspects
    assert [s.rank for s in listed] == list(range(1, 51)) and [s.train_index for s in listed] == want[:50]
    assert [s.self_influence for s in listed] == [float(scores[i]) for i in want[:50]]
    table = list(csv.DictReader(io.StringIO(ctx.artifact_path("suspects.csv").read_text())))
    assert list(table[0]) == SUSPECT_COLUMNS and len(table) == res.n_train == len(scores)
    assert [int(r["train_index"]) for r in table] == want and {r["estimator"] for r in table} == {"random"}
    for s, r in zip(listed, table, strict=False):  # the inline list is the file's head
        assert [r["head"], r["relation"], r["tail"]] == s.triple and float(r["self_influence"]) == s.self_influence
    flagged = {int(r["train_index"]): r for r in table if r["corrupted"] == "True"}
    assert set(flagged) == set(corrupted) and len(flagged) == res.n_corrupted == 159
    for i, r in flagged.items():
        assert r["original_tail"] == corrupted[i]["original_tail"] and r["tail"] == corrupted[i]["corrupted_tail"]
    assert all(r["original_tail"] == "" for r in table if r["corrupted"] == "False")
    for s in listed:
        assert s.corrupted == (s.train_index in corrupted)
        assert s.original_tail == (corrupted[s.train_index]["original_tail"] if s.corrupted else None)


def _result_schema(svc, job_id):
    """The result model the worker validated the job's result against (the result route's header)."""
    r = svc.client.get(f"/jobs/{job_id}/result", headers=ALICE)
    assert r.status_code == 200, r.text
    return r.headers["X-Explainq-Result-Schema"]


def _timing_free(res):
    """An LDS result without what legitimately differs between a sharded run and a whole one: how many models this
    job trained (``trainings``, ``ground_truth.trainings``/``reused``), how it was split (``shards``), the
    estimators' ``seconds`` (timing), the file list (compared on its own) and the job's own provenance (its id and
    times)."""
    out = json.loads(json.dumps(res))
    for name in ("trainings", "shards", "artifacts", "provenance"):
        del out[name]
    for name in ("trainings", "reused"):
        del out["ground_truth"][name]
    for est in out["estimators"].values():
        del est["seconds"]
    return out


@pytest.mark.slow
def test_an_lds_evaluation_has_one_shape_sharded_or_whole(svc):
    """The same request twice: first fanned out (nothing stored: one shard per model, the reduce step computes
    the LDS), then whole (everything stored: no shard, no training). Both results are LdsResult and equal field by
    field except trainings, ground_truth.trainings/reused, shards, the estimators' seconds and the size of
    result.json (which holds those)."""
    from core.contract.results.evaluation import LdsResult

    # a recipe seed of its own: its full-data model and ensemble member are not stored by the other tests
    body = {"m": 3, "alpha": 0.5, "n_test": 6, "recipe": {**TINY, "seed": 7}, "seed": 21, "replicates": True,
            "estimators": ["tracin", "random", "trak_ensemble"], "ensemble": 1}
    sharded_job, sharded = _run(svc, "/evaluate/attribution", body)
    whole_job, whole = _run(svc, "/evaluate/attribution", body)
    # 3 subset models, their 3 replicates, the full-data model and 1 ensemble member: one shard each
    assert sharded_job["shards"]["total"] == 8 and "shards" not in whole_job
    assert sharded["shards"] == {"total": 8, "failed": []} and whole["shards"] is None
    assert (sharded["trainings"], sharded["ground_truth"]["trainings"], sharded["ground_truth"]["reused"]) == (8, 8, 0)
    assert (whole["trainings"], whole["ground_truth"]["trainings"], whole["ground_truth"]["reused"]) == (0, 0, 8)
    for job, res in ((sharded_job, sharded), (whole_job, whole)):
        assert LdsResult.model_validate(res).model_dump(mode="json") == res
        assert _result_schema(svc, job["id"]) == "LdsResult"
    assert sharded["noise_ceiling"] is not None and sharded["ensemble"]["members"] == 1
    assert sharded["estimators"]["random"]["ratio_to_tracin"] is not None
    assert sharded["estimators"]["tracin"]["ratio_to_tracin"] is None
    assert _timing_free(sharded) == _timing_free(whole)
    # the same files; of the same sizes but result.json (trainings and shards differ, and the timings)
    files = [{a["name"]: (a["size"], a["media_type"]) for a in res["artifacts"]} for res in (sharded, whole)]
    assert set(files[0]) == set(files[1]) >= {"result.json", "ground_truth.npz", "lds_per_test.csv",
                                              "scores-tracin.npy", "scores-random.npy", "scores-trak_ensemble.npy"}
    for f in files:
        del f["result.json"]
    assert files[0] == files[1]
    for job in (sharded_job, whole_job):  # the files hold the same numbers
        np.testing.assert_array_equal(_npz(svc, sharded_job["id"], "ground_truth.npz")["outputs"],
                                      _npz(svc, job["id"], "ground_truth.npz")["outputs"])
    assert svc.artifact(sharded_job["id"], "lds_per_test.csv", headers=ALICE) == svc.artifact(
        whole_job["id"], "lds_per_test.csv", headers=ALICE)
    stored = json.loads(svc.artifact(whole_job["id"], "result.json", headers=ALICE))
    # the job writes result.json before the runner attaches the provenance block (the served result has it)
    assert stored.pop("provenance") is None and whole["provenance"]["job_id"] == whole_job["id"]
    assert stored == {k: v for k, v in whole.items() if k not in ("artifacts", "provenance")}
    # the SDK's renderers and the CLI's table draw both
    from explainq_client import EvaluationResult

    assert_renders(svc.settings, (sharded_job["id"], whole_job["id"]), EvaluationResult, api_key="key-alice")


def test_result_models_are_strict_and_the_recipe_echoes_the_request_recipe():
    from pydantic import ValidationError

    from core.contract.kind import load_kinds
    from core.contract.results.evaluation import EvaluationRecipe, EvaluationResult, LdsResult, MislabelResult
    from core.kinds.evaluate import Recipe

    kinds = load_kinds()
    assert kinds["evaluate_attribution"].result is LdsResult is kinds["evaluate_attribution_reduce"].result
    assert kinds["evaluate_mislabel"].result is MislabelResult
    assert list(EvaluationRecipe.model_fields) == list(Recipe.model_fields)
    for model in (EvaluationResult, LdsResult, MislabelResult):
        assert model.model_config.get("extra") == "forbid", model
    recipe = Recipe().model_dump(mode="json")
    mislabel = {"metric": "mislabel", "dataset": "nations", "data_version": "v", "recipe": recipe, "seed": 0,
                "n_train": 10, "trainings": 0, "fraction": 0.1, "n_corrupted": 1, "corrupted_listed": 1,
                "corrupted": [{"train_index": 3, "original": ["a", "r", "b"], "corrupted": ["a", "r", "c"]}],
                "model": {"key": "k"}, "model_metrics": {"valid": None, "test": {
                    "mrr": 0.5, "mr": 3.0, "hits@1": 0.25, "hits@3": 0.5, "hits@10": 1.0, "n_queries": 4}},
                "estimators": {"random": {"auc": 0.5, "found_at_10": 0.1, "found_at_20": 0.2, "seconds": 0.1,
                                          "recall_curve": {"inspected": [0, 1], "found": [0, 1]}}}}
    assert MislabelResult.model_validate(mislabel).model_dump(mode="json") == {
        **mislabel, "artifacts": [], "provenance": None, "suspects_listed": None,  # a result from before both
        "estimators": {"random": {**mislabel["estimators"]["random"], "auc_interval": None, "suspects": []}}}
    for bad in ({**mislabel, "extra": 1}, {**mislabel, "metric": "lds"},
                {**mislabel, "estimators": {"trak_ensemble": mislabel["estimators"]["random"]}},
                {**mislabel, "estimators": {"random": {**mislabel["estimators"]["random"], "lds": 1}}}):
        with pytest.raises(ValidationError):
            MislabelResult.model_validate(bad)


def test_a_shard_trains_the_model_the_parent_planned_whatever_is_stored_later(tmp_path, monkeypatch):
    """The parent plans one shard per missing model and gives each the model's position in the evaluation's fixed
    list of models, so what a shard trains does not depend on what other evaluations store in the meantime."""
    from types import SimpleNamespace

    from core.filestore import get_store
    from core.kinds.evaluate import EvaluateAttributionRequest
    from core.settings import Settings
    from models.kg.triples import load_nations
    from workers.jobs import evaluate

    settings = Settings(EXPLAINQ_HOME=str(tmp_path))
    request = EvaluateAttributionRequest.model_validate({"m": 3, "recipe": TINY, "estimators": ["trak_ensemble"],
                                                         "ensemble": 2})
    ident = evaluate._identity(request, load_nations())
    models = evaluate._models(request)
    assert models == [0, 1, 2, evaluate.FULL, evaluate.FULL - 1, evaluate.FULL - 2]
    store = get_store(settings)
    for item in (1, evaluate.FULL - 1):  # subset model 1 and ensemble member 0 are stored already
        store.put_bytes(b"x", evaluate._stored_at(ident, 3, item))
    seen = {}

    def fan_out(ctx, kind, req, n_items, shard_size, **kw):
        seen.update(kind=kind, n_items=n_items, shard_size=shard_size, **kw)
        return "planned"

    monkeypatch.setattr(evaluate, "fan_out", fan_out)
    meta = {}
    ctx = SimpleNamespace(settings=settings, owner="system", set_meta=meta.__setitem__, use_shared=list)
    assert evaluate.run_attribution(request, ctx) == "planned"
    assert meta == {evaluate.PLAN_META: {"data_version": ident["data_version"]}}
    assert (seen["kind"], seen["n_items"], seen["shard_size"], seen["retries"]) == ("evaluate_attribution", 4, 1, 1)
    ranges = [seen["shard_items"]({}, i, i + 1)[1:] for i in range(4)]
    assert ranges == [(0, 1), (2, 3), (3, 4), (5, 6)]  # subset 0, subset 2, the full-data model, member 1
    assert [models[a] for a, _ in ranges] == [0, 2, evaluate.FULL, evaluate.FULL - 2]
    # another evaluation stores subset model 0 before shard 0 runs: the shard's payload still names it (position
    # 0, not "the first missing model", which would now be subset 2), and it finds it stored and trains nothing
    store.put_bytes(b"x", evaluate._stored_at(ident, 3, 0))
    assert evaluate._train_item(SimpleNamespace(settings=settings), request, None, ident, models[0]) is False


# ------------------------------------------------------------------------------------------- SDK and CLI
LDS_RESULT = {"metric": "lds", "dataset": "nations", "m": 16, "alpha": 0.5, "n_test": 50,
              "estimators": {"tracin": {"lds": {"mean": 0.09, "low": 0.01, "high": 0.17, "n": 50},
                                        "n_undefined": 0, "seconds": 3.9},
                             "<b>rnd</b>": {"lds": {"mean": -0.03, "low": -0.11, "high": 0.05, "n": 50},
                                            "n_undefined": 0, "seconds": 0.001}}}
MISLABEL_RESULT = {"metric": "mislabel", "dataset": "nations", "n_train": 100, "n_corrupted": 10,
                   "estimators": {"tracin": {"auc": 0.61, "found_at_10": 0.3, "found_at_20": 0.5, "seconds": 1.0,
                                             "recall_curve": {"inspected": [0, 0.5, 1], "found": [0, 0.7, 1]}}}}


def _kinds_description():
    from core.contract.kind import load_kinds as load_all

    return {"kinds": [k.describe() for k in load_all().values() if not k.internal]}


def test_sdk_methods_post_to_the_routes_and_results_render_as_evaluations():
    import httpx
    from explainq_client import AsyncClient, Client
    from explainq_client.results import EvaluationResult, make_result

    seen = []

    def handler(request):
        seen.append(request)
        kind = "evaluate_attribution" if request.url.path.endswith("attribution") else "evaluate_mislabel"
        return httpx.Response(202, json={"id": "j1", "kind": kind, "status": "queued", "progress": None,
                                         "error": None})

    with Client("http://x", transport=httpx.MockTransport(handler)) as c:
        c.evaluate_attribution(m=8, estimators=["tracin", "random"], recipe={"epochs": 1})
        c.evaluate_mislabel(fraction=0.2)
    assert [r.url.path for r in seen] == ["/evaluate/attribution", "/evaluate/mislabel"]
    assert json.loads(seen[0].content) == {"m": 8, "estimators": ["tracin", "random"], "recipe": {"epochs": 1}}
    assert json.loads(seen[1].content) == {"fraction": 0.2}
    assert callable(AsyncClient.evaluate_attribution) and callable(AsyncClient.evaluate_mislabel)

    lds = make_result("evaluation", LDS_RESULT, "evaluate_attribution")
    assert isinstance(lds, EvaluationResult) and set(lds.estimators) == {"tracin", "<b>rnd</b>"}
    html = lds._repr_html_()
    assert "<svg" in html and "&lt;b&gt;rnd&lt;/b&gt;" in html and "<b>rnd</b>" not in html
    assert "tracin: 0.09 [0.01, 0.17]" in html  # the bar's accessible title: mean and interval
    lines = lds.text().splitlines()
    assert lines[2].split()[:2] == ["estimator", "LDS"] and lines[3].split()[:4] == ["tracin", "0.09", "[0.01,",
                                                                                      "0.17]"]
    assert "noise ceiling" not in lds.text() and "noise ceiling" not in html
    # the ratio to TracIn and the noise ceiling, when the result has them
    richer = make_result("evaluation", {**LDS_RESULT, "estimators": {**LDS_RESULT["estimators"], "trak": {
        "lds": {"mean": 0.2, "low": 0.15, "high": 0.25, "n": 50}, "n_undefined": 0, "seconds": 1.0,
        "ratio_to_tracin": {"ratio": 2.2222, "low": 1.61, "high": 3.05, "n": 50}}},
        "noise_ceiling": {"agreement": {"mean": 0.49, "low": 0.459, "high": 0.522}, "ceiling": 0.688}},
        "evaluate_attribution")
    text = richer.text()
    assert [line.split()[-3:] for line in text.splitlines() if line.startswith("trak ")] == [["2.2", "[1.6,", "3]"]]
    assert "no LDS can be expected above about 0.688" in text and "0.688" in richer._repr_html_()
    mis = make_result("evaluation", MISLABEL_RESULT, "evaluate_mislabel")
    assert "polyline" in mis._repr_html_() and "fraction inspected" in mis._repr_html_()
    assert mis.text().splitlines()[3].split() == ["tracin", "0.61", "0.3", "0.5", "1"]


def test_cli_submits_an_evaluation_through_the_generic_submit_and_prints_its_table(monkeypatch, tmp_path, capsys):
    import httpx
    from explainq_client import Client, cli

    posted = []
    view = {"id": "j1", "kind": "evaluate_attribution", "status": "succeeded", "progress": None, "error": None}

    def handler(request):
        if request.url.path == "/kinds":
            return httpx.Response(200, json=_kinds_description())
        if request.method == "POST":
            posted.append((request.url.path, json.loads(request.content)))
            return httpx.Response(202, json={**view, "status": "queued"})
        if request.url.path == "/jobs/j1/result":
            return httpx.Response(200, json=LDS_RESULT)
        return httpx.Response(200, json=view)

    monkeypatch.setattr(cli, "Client", lambda *a, **k: Client("http://x", transport=httpx.MockTransport(handler)))
    body = tmp_path / "req.json"
    body.write_text(json.dumps({"m": 8, "recipe": {"epochs": 1}}))
    assert cli.run(["submit", "evaluate-attribution", str(body)]) == cli.EXIT_OK
    assert posted == [("/evaluate/attribution", {"m": 8, "recipe": {"epochs": 1}})]
    capsys.readouterr()
    assert cli.run(["result", "j1", "--table"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "LDS on nations: 16 subset models" in out and "tracin" in out


# ------------------------------------------------------------------------------------------- dashboard
def _page(result):
    from app.ui.evaluation import evaluation_view
    from app.ui.router import templates

    return templates.env.get_template("_evaluation.html").render(result=result,
                                                                 evaluation=evaluation_view(result))


def test_dashboard_draws_lds_bars_with_whiskers_and_a_table():
    import re

    result = {**LDS_RESULT, "dataset": "<script>x</script>", "subset_size": 796, "n_train": 1592,
              "output": "margin", "trainings": 0, "ground_truth": {"reused": 17}}
    page = _page(result)
    assert "<script>x</script>" not in page and "&lt;script&gt;" in page
    assert "&lt;b&gt;rnd&lt;/b&gt;" in page and "<b>rnd</b>" not in page
    rows = re.findall(r'<tr><th scope="row">([^<]+)</th>(.*?)</tr>', page, re.S)
    assert [r for r, _ in rows] == ["tracin", "&lt;b&gt;rnd&lt;/b&gt;"]
    assert "0.09" in rows[0][1] and "[0.01, 0.17]" in rows[0][1]
    # bars start at zero and the whiskers span the interval, on one axis from -0.11 to 0.17
    from app.ui.evaluation import lds_bars

    b = lds_bars(LDS_RESULT["estimators"])["rows"]
    assert b[0]["bar_x"] == pytest.approx(lds_bars(LDS_RESULT["estimators"])["zero_x"])
    assert b[0]["low_x"] < b[0]["bar_x"] + b[0]["bar_w"] < b[0]["high_x"]
    assert b[1]["bar_x"] + b[1]["bar_w"] == pytest.approx(lds_bars(LDS_RESULT["estimators"])["zero_x"], abs=0.2)
    assert f'x1="{b[0]["low_x"]}"' in page and "reused" in page and "17" in page
    # each estimator's LDS relative to TracIn's, with its paired interval; TracIn itself has none
    with_ratio = {**result, "estimators": {**LDS_RESULT["estimators"], "trak": {
        "lds": {"mean": 0.2, "low": 0.15, "high": 0.25, "n": 50}, "n_undefined": 0, "seconds": 1.0,
        "ratio_to_tracin": {"ratio": 2.2222, "low": 1.61, "high": 3.05, "n": 50}}}}
    rows = dict(re.findall(r'<tr><th scope="row">([^<]+)</th>(.*?)</tr>', _page(with_ratio), re.S))
    assert rows["trak"].endswith("<td>2.22 [1.61, 3.05]</td>") and rows["tracin"].endswith("<td>–</td>")


def test_dashboard_draws_the_mislabel_recall_curve_and_table():
    page = _page({**MISLABEL_RESULT, "fraction": 0.1, "seed": 0})
    assert "<polyline" in page and "Mislabel detection" in page
    assert "0.61" in page and "corrupted.tsv" in page
    from app.ui.evaluation import PAD, recall_curves

    pts = recall_curves(MISLABEL_RESULT["estimators"])["series"][0]["points"].split()
    assert len(pts) == 3 and pts[0] == f"{PAD:.1f},{260 - PAD:.1f}"  # (0 inspected, 0 found) at the origin


def test_the_mislabel_page_lists_each_estimators_suspects_as_text():
    import re

    from app.ui.evaluation import evaluation_view
    from app.ui.router import templates

    suspects = [{"rank": 1, "train_index": 7, "triple": ["<b>usa</b>", "embassy", "uk"], "self_influence": 0.0123,
                 "corrupted": True, "original_tail": "china"},
                {"rank": 2, "train_index": 3, "triple": ["cuba", "aid", "usa"], "self_influence": -0.5,
                 "corrupted": False, "original_tail": None}]
    est = MISLABEL_RESULT["estimators"]["tracin"]
    result = {**MISLABEL_RESULT, "fraction": 0.1, "seed": 0, "suspects_listed": 2,
              "estimators": {"tracin": {**est, "suspects": suspects}, "random": {**est, "suspects": suspects[1:]}}}
    page = templates.env.get_template("_evaluation.html").render(
        result=result, evaluation=evaluation_view(result), job={"id": "j/1"}, downloadable=True)
    assert "Suspected training triples" in page and "<b>usa</b>" not in page
    assert 'href="/jobs/j/1/artifacts/suspects.csv"' in page or 'href="/jobs/j%2F1/artifacts/suspects.csv"' in page
    tables = re.findall(r'<summary>([^<]+)</summary>.*?<tbody>(.*?)</tbody>', page, re.S)
    assert [t[0] for t in tables] == ["tracin: 1 of its top 2 were corrupted", "random: 0 of its top 1 were corrupted"]
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr[^>]*>(.*?)</tr>", tables[0][1])]
    assert cells == [["1", "&lt;b&gt;usa&lt;/b&gt; · embassy · uk", "0.0123", "yes (was china)"],
                     ["2", "cuba · aid · usa", "-0.5", "no"]]
    # a result written before suspects existed draws no list
    old = {**MISLABEL_RESULT, "fraction": 0.1, "seed": 0}
    assert "Suspected" not in templates.env.get_template("_evaluation.html").render(
        result=old, evaluation=evaluation_view(old))


def test_the_dashboard_form_submits_an_evaluation(client):
    import re

    page = client.get("/ui/new/evaluate_mislabel")
    assert page.status_code == 200
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)
    form = {"csrf_token": token, "dataset": "nations", "estimators": ["tracin_last", "random"], "fraction": "0.2",
            "recipe.epochs": "1", "recipe.embedding_dim": "20", "recipe.embedding_height": "4", "seed": "3"}
    r = client.post("/ui/new/evaluate_mislabel", data=form, headers={"Origin": "http://testserver"},
                    follow_redirects=False)
    assert r.status_code == 303, r.text
    job_id = r.headers["location"].rsplit("/", 1)[-1]
    body = client.get(f"/jobs/{job_id}/request").json()
    assert body["estimators"] == ["tracin_last", "random"] and body["fraction"] == 0.2 and body["seed"] == 3
    assert body["recipe"]["epochs"] == 1 and body["recipe"]["embedding_dim"] == 20
    assert body["recipe"]["checkpoint_every"] == 2  # more than epochs: the last epoch's checkpoint is kept


# ------------------------------------------------------------------------------------------- estimates
def _estimate(client, kind, body):
    r = client.post(f"/kinds/{kind}/estimate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_an_lds_estimate_counts_the_trainings_the_request_asks_for(client):
    from core.estimates import CONVE_SECONDS_PER_EXAMPLE_PARAMETER

    base = {"estimators": ["tracin", "random"], "recipe": {"epochs": 4}, "n_test": 50}
    small, large = (_estimate(client, "evaluate_attribution", {**base, "m": m}) for m in (8, 16))
    # nations: 1,592 training triples, subsets of ceil(0.5 x 1,592) = 796, each twice with reciprocal relations
    assert [(g["what"], g["count"], g["per_epoch"]) for g in small["models"]] == [
        ("subset model", 8, 2 * 796), ("full-data model", 1, 2 * 1592)]
    assert (small["trainings"], large["trainings"]) == (9, 17)
    assert small["examples"] == 4 * (8 * 1592 + 3184) and large["examples"] == 4 * (16 * 1592 + 3184)
    # twice the subset models: twice their examples, and the time follows the examples (one model, one k)
    assert large["models"][0]["examples"] == 2 * small["models"][0]["examples"]
    assert large["seconds"] / small["seconds"] == pytest.approx(large["examples"] / small["examples"])
    assert small["basis"] == "model" and small["rate"] is None
    assert small["seconds"] == pytest.approx(CONVE_SECONDS_PER_EXAMPLE_PARAMETER * small["examples"]
                                             * small["parameters"])
    assert large["disk"]["ground_truth"] == 2 * small["disk"]["ground_truth"] > 0
    assert large["disk"]["models"] == small["disk"]["models"] > 0
    # replicates double the subset models; an ensemble estimator adds its members
    both = _estimate(client, "evaluate_attribution", {**base, "m": 8, "replicates": True,
                                                      "estimators": ["tracin", "trak_ensemble"], "ensemble": 3})
    assert [(g["what"], g["count"]) for g in both["models"]] == [
        ("subset model", 8), ("subset replicate", 8), ("full-data model", 1), ("ensemble member", 3)]
    assert both["trainings"] == 20 and both["disk"]["models"] == 4 * small["disk"]["models"]
    # a larger recipe: more parameters, more time per example
    wide = _estimate(client, "evaluate_attribution", {**base, "m": 8, "recipe": {"epochs": 4, "num_filters": 64}})
    assert wide["parameters"] > small["parameters"] and wide["seconds"] > small["seconds"]


def test_a_mislabel_estimate_is_one_training_and_its_rankings(client):
    one = _estimate(client, "evaluate_mislabel", {"estimators": ["random"], "recipe": {"epochs": 3}})
    two = _estimate(client, "evaluate_mislabel", {"estimators": ["random", "tracin"], "recipe": {"epochs": 3}})
    assert [(g["what"], g["count"], g["per_epoch"]) for g in one["models"]] == [("corrupted-graph model", 1, 3184)]
    assert one["trainings"] == 1 and one["examples"] == 3 * 3184 and one["steps"] == 3 * 25
    assert two["disk"]["artifacts"] == 2 * one["disk"]["artifacts"] and two["seconds"] == one["seconds"]


@pytest.mark.parametrize("kind, body, loc", [
    ("evaluate_attribution", {"m": 2}, ["body", "m"]),
    ("evaluate_attribution", {"alpha": 1.5}, ["body", "alpha"]),
    ("evaluate_attribution", {"m": 200, "recipe": {"epochs": 200}}, ["body", "m"]),  # the training budget
    ("evaluate_attribution", {"estimators": ["tracin", "tracin"]}, ["body", "estimators", 1]),
    ("evaluate_mislabel", {"fraction": 0.9}, ["body", "fraction"]),
    ("evaluate_mislabel", {"estimators": ["trak_ensemble"]}, ["body", "estimators", 0]),
    ("evaluate_mislabel", {"dataset": "no-such-graph"}, ["body", "dataset"]),
])
def test_a_bad_evaluation_estimate_is_422_naming_the_field(client, kind, body, loc):
    r = client.post(f"/kinds/{kind}/estimate", json=body)
    assert r.status_code == 422, r.text
    assert [d["loc"] for d in r.json()["detail"]][0] == loc


def test_an_evaluation_estimate_takes_its_speed_from_the_callers_last_conve_training(tmp_path):
    import redis

    from core.keys import JOB_PREFIX

    with api_client(tmp_path) as c:
        run = {"name": "speed", "epochs": 2, "embedding_dim": 100, "num_filters": 32}  # the recipe's sizes
        job = c.post("/train/conve", json=run).json()
        trained = _estimate(c, "train_conve", run)
        redis.Redis.from_url(c.app.state.settings.redis_url).hset(JOB_PREFIX + job["id"], mapping={
            "status": "finished", "started_at": "2026-01-01T00:00:00.000000Z",
            "ended_at": "2026-01-01T00:01:00.000000Z"})
        got = _estimate(c, "evaluate_mislabel", {"estimators": ["random"], "recipe": {"epochs": 3}})
        assert got["basis"] == "measured" and got["rate"]["job_id"] == job["id"]
        # k = 60 s over that run's examples x parameters, here the recipe's (dim 100, 32 filters, nations)
        assert got["rate"]["parameters"] == got["parameters"] and got["rate"]["examples"] == trained["examples"]
        assert got["seconds_per_example_parameter"] == pytest.approx(60 / (trained["examples"] * got["parameters"]))
        assert got["seconds"] == pytest.approx(60 * 3 / 2)  # 3 epochs of what took 60 s for 2
        # a wider recipe takes longer in proportion to its parameters
        wide = _estimate(c, "evaluate_mislabel", {"estimators": ["random"], "recipe": {"epochs": 3,
                                                                                      "num_filters": 64}})
        assert wide["seconds"] == pytest.approx(got["seconds"] * wide["parameters"] / got["parameters"])


def test_the_evaluation_forms_show_their_estimate(client):
    page = client.get("/ui/new/evaluate_attribution").text
    assert 'hx-post="/ui/new/evaluate_attribution/estimate"' in page
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    form = {"csrf_token": token, "dataset": "nations", "estimators": ["tracin", "random"], "m": "8",
            "recipe.epochs": "4", "recipe.reciprocal": "on"}  # a checked box, as a browser sends it
    shown = client.post("/ui/new/evaluate_attribution/estimate", data=form, headers={"Origin": "http://testserver"})
    assert shown.status_code == 200, shown.text
    text = re.sub(r"\s+", " ", shown.text)
    assert "at most 9 ConvE trainings (8 subset models of 1,592 triples × 4 epochs, 1 full-data model of 3,184 " \
           "triples × 4 epochs)" in text
    assert "by the stated model" in text and 'id="estimate-disk"' in text and "An estimate, not a promise" in text
    bad = client.post("/ui/new/evaluate_attribution/estimate", data={**form, "m": "2"},
                      headers={"Origin": "http://testserver"})
    assert "Fill in the fields above" in bad.text
    page = client.get("/ui/new/evaluate_mislabel").text
    assert 'hx-post="/ui/new/evaluate_mislabel/estimate"' in page
