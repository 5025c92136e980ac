"""``POST /evaluate/classifier/attribution`` and ``/evaluate/classifier/mislabel`` on a tiny exported classifier:
the service's LDS equals the LDS ``models.export.evaluation`` computes directly on the same subset models (the same
seeds), a fanned-out and a whole run give the same numbers, a second request reuses the stored models, the
mislabel AUC is the one of the stored self-scores, and a bad field is a 422 naming it; the same for a tiny
Hugging Face classifier (``models.hf.evaluation``)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

LABELS = ["a", "b", "c"]
SPEC = {"input": {"kind": "tabular", "features": ["f0", "f1", "f2", "f3"], "mean": [0.0] * 4}, "labels": LABELS}
RECIPE = {"epochs": 2, "batch_size": 8, "lr": 0.1, "checkpoint_every": 1}
BODY = {"model": "mlp", "dataset": "blobs", "m": 3, "alpha": 0.5, "n_test": 6, "recipe": RECIPE, "seed": 3}


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 6)
        self.fc2 = torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture
def like_the_workers():
    """The direct computations run with the workers' torch threads (their ``OMP_NUM_THREADS``): the exact
    equalities below hold for one thread count, and an earlier test in this process may have set another."""
    before = torch.get_num_threads()

    def match(service) -> None:
        torch.set_num_threads(int(service.env["OMP_NUM_THREADS"]))

    yield match
    torch.set_num_threads(before)


def _write_data(home):
    from safetensors.torch import save_file

    from tests.export_fixtures import export

    torch.manual_seed(0)
    model = MLP().eval()
    export(model, torch.randn(2, 4), home / "data" / "mlp" / "model.pt2")
    (home / "data" / "mlp" / "spec.json").write_text(json.dumps(SPEC))
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 4)) * 2
    directory = home / "data" / "blobs"
    directory.mkdir(parents=True)
    for split, n in (("train", 24), ("test", 8)):
        y = rng.integers(0, 3, size=n)
        x = (centres[y] + rng.normal(size=(n, 4))).astype(np.float32)
        save_file({"inputs": torch.tensor(x), "labels": torch.tensor(y)}, str(directory / f"{split}.safetensors"))


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    from tests.service import Service

    home = tmp_path_factory.mktemp("clf-eval") / "home"
    _write_data(home)
    with Service(home, heartbeat_ttl_s=30) as service:
        r = service.client.post("/models/import", json={"name": "mlp", "kind": "export", "path": "mlp"})
        assert r.status_code == 202, r.text
        assert service.wait(r.json()["id"], timeout_s=120)["status"] == "succeeded", service.worker_logs()
        r = service.client.post("/datasets", json={"name": "blobs", "path": "blobs"})
        assert r.status_code == 201, r.text
        yield service


def _run(svc, route: str, body: dict) -> tuple[dict, dict]:
    r = svc.client.post(route, json=body)
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=300)
    assert job["status"] == "succeeded", (job, svc.worker_logs())
    return job, svc.client.get(f"/jobs/{job['id']}/result").json()


def _splits(svc):
    from models.export.train import read_split

    d = svc.home / "data" / "blobs"
    return read_split(d / "train.safetensors"), read_split(d / "test.safetensors")


def test_lds_equals_the_direct_computation_on_the_same_subset_models(svc, like_the_workers):
    like_the_workers(svc)
    from models.export import evaluation as ef
    from models.export.influence import rows
    from models.export.train import Split
    from models.kg import evaluation as ev
    from models.training import TrainOptions

    job, res = _run(svc, "/evaluate/classifier/attribution", {**BODY, "estimators": ["tracin", "graddot", "random"]})
    assert res["shards"] == {"total": 4, "failed": []} and res["trainings"] == 4  # 3 subset models + full model
    assert res["seeds"] == ev.subset_seeds(3, 3) and res["train_seeds"] == ev.subset_train_seeds(3, 3)
    assert str(svc.home) not in json.dumps(res)

    # directly: the same subset models and full-data model, trained by models.export.evaluation with the same seeds
    train, test = _splits(svc)
    init = svc.home / "data" / "mlp" / "model.pt2"
    opts = TrainOptions(**{**RECIPE, "optimizer": "sgd", "momentum": 0.9, "weight_decay": 0.0, "seed": 0})
    sel = ev.test_selection(len(test.labels), 6, 3)
    tsel = Split(test.inputs[torch.from_numpy(sel)], test.labels[torch.from_numpy(sel)])
    subs = [ef.train_subset(init, SPEC, train, opts, 0.5, s, t, tsel)
            for s, t in zip(res["seeds"], res["train_seeds"], strict=True)]
    masks, outputs = np.stack([s["mask"] for s in subs]), np.stack([s["outputs"] for s in subs])
    gt = np.load(io.BytesIO(svc.artifact(job["id"], "ground_truth.npz")))
    np.testing.assert_array_equal(gt["masks"], masks)
    np.testing.assert_array_equal(gt["outputs"], outputs)
    full = svc.home / "direct-full"
    ef.train_recipe(init, SPEC, train, opts, ev.full_model_seed(3, 0), out=full)
    clf = ef.read_classifier(full)
    want = ef.lds_report(clf, masks, outputs, rows(tsel.inputs, tsel.labels), rows(train.inputs, train.labels),
                         ["tracin", "graddot", "random"], 3)
    for name in ("tracin", "graddot", "random"):
        assert res["estimators"][name]["per_test"] == want[name]["per_test"], name
        assert res["estimators"][name]["lds"] == want[name]["lds"], name
    assert res["estimators"]["graddot"]["ratio_to_tracin"] == want["graddot"]["ratio_to_tracin"]
    assert res["estimators"]["tracin"]["output"] == "margin"

    from app.ui.views import num
    from tests.analysis_pages import job_page

    page = job_page(res, kind="evaluate_classifier_attribution")  # the job page draws the real result
    for name in ("tracin", "graddot", "random"):
        lds = res["estimators"][name]["lds"]
        assert f'<th scope="row">{name}</th><td>{num(lds["mean"], 3)}</td><td>[{num(lds["low"], 3)}, ' in page
    assert "3 subset models of" in page and "<h2>Result</h2>" not in page



def test_sharded_then_whole_give_one_result_and_the_second_reuses_every_model(svc):
    from models.kg import evaluation as ev

    body = {**BODY, "seed": 4, "estimators": ["tracin", "graddot"], "replicates": True}
    job, res = _run(svc, "/evaluate/classifier/attribution", body)
    assert res["shards"] == {"total": 7, "failed": []}  # 3 subset models, their 3 replicates, the full model
    assert res["trainings"] == 7 and res["replicate_seeds"] == ev.subset_replicate_seeds(4, 3)
    ceiling = res["noise_ceiling"]
    assert ceiling is not None and len(ceiling["per_test"]) == res["n_test"]
    assert res["estimators"]["graddot"]["ratio_to_tracin"] is not None
    # the same evaluation again: every model is stored, it runs whole and trains nothing, the same numbers
    job2, res2 = _run(svc, "/evaluate/classifier/attribution", body)
    assert res2["shards"] is None and res2["trainings"] == 0 and res2["ground_truth"]["reused"] == 7
    assert not job2.get("shards")
    differ = {"shards", "trainings", "ground_truth", "estimators", "artifacts", "provenance"}
    assert {k: v for k, v in res2.items() if k not in differ} == {k: v for k, v in res.items() if k not in differ}
    assert res2["ground_truth"]["key"] == res["ground_truth"]["key"]
    # the shared models count in the caller's stored bytes while a job that used them is on record
    from core import lastuse
    from core.filestore import get_store

    claimed = lastuse.claims(get_store(svc.settings), "anonymous")
    for entry in (f"cache/evaluation/lds/clf-{res['ground_truth']['key']}",
                  f"cache/evaluation/models/clf-{res['ground_truth']['full_model']}"):
        assert job2["id"] in claimed.get(entry, set()), (entry, sorted(claimed))
    for name in ("tracin", "graddot"):
        a, b = res["estimators"][name], res2["estimators"][name]
        assert {**a, "seconds": 0} == {**b, "seconds": 0}, name


def test_mislabel_auc_is_the_stored_self_scores_auc(svc):
    from models.export import evaluation as ef
    from models.kg import evaluation as ev

    body = {"model": "mlp", "dataset": "blobs", "recipe": RECIPE, "fraction": 0.25, "seed": 2,
            "estimators": ["tracin", "random"]}
    job, res = _run(svc, "/evaluate/classifier/mislabel", body)
    train, _ = _splits(svc)
    _, flipped = ef.flip_labels(train.labels, 3, 0.25, 2)
    assert res["flipped"] == flipped.tolist() and res["n_flipped"] == 6 and res["trainings"] == 1
    saved = np.load(io.BytesIO(svc.artifact(job["id"], "self_scores.npz")))
    truth = np.zeros(24, dtype=bool)
    truth[flipped] = True
    for name in ("tracin", "random"):
        auc = res["estimators"][name]["auc_interval"]
        assert auc["auc"] == ev.roc_auc(truth, saved[name])
        assert auc == {**ef.auc_interval(truth, saved[name], 2), "n_resamples": ev.N_RESAMPLES}
    from app.ui.views import num
    from tests.analysis_pages import job_page

    page = job_page(res, kind="evaluate_classifier_mislabel")  # the job page draws the real result
    for name in ("tracin", "random"):
        auc = res["estimators"][name]["auc_interval"]
        assert f'<th scope="row">{name}</th><td>{num(auc["auc"], 3)}</td><td>[{num(auc["low"], 3)}, ' in page
    assert "6 of 24 training labels flipped" in page
    _, again = _run(svc, "/evaluate/classifier/mislabel", body)
    assert again["trainings"] == 0 and again["estimators"] == res["estimators"] | {
        n: {**e, "seconds": again["estimators"][n]["seconds"]} for n, e in res["estimators"].items()}


@pytest.mark.parametrize("route, body, loc", [
    ("attribution", {"m": 2}, ["body", "m"]),
    ("attribution", {"alpha": 1.0}, ["body", "alpha"]),
    ("attribution", {"recipe": {"epochs": 0}}, ["body", "recipe", "epochs"]),
    ("attribution", {"recipe": {"max_length": 1}}, ["body", "recipe", "max_length"]),
    ("attribution", {"recipe": {"optimizer": "lbfgs"}}, ["body", "recipe", "optimizer"]),
    ("attribution", {"estimators": ["tracin_adam"]}, ["body", "estimators", 0]),
    ("attribution", {"estimators": ["tracin", "tracin"]}, ["body", "estimators", 1]),
    ("attribution", {"model": "nope"}, ["body", "model"]),
    ("attribution", {"dataset": "nope"}, ["body", "dataset"]),
    ("attribution", {"m": 256, "recipe": {"epochs": 200}}, ["body", "m"]),
    ("mislabel", {"fraction": 0.9}, ["body", "fraction"]),
    ("mislabel", {"estimators": ["trak_ensemble"]}, ["body", "estimators", 0]),
])
def test_a_bad_field_is_a_422_naming_it(svc, route, body, loc):
    base = {"model": "mlp", "dataset": "blobs"}
    r = svc.client.post(f"/evaluate/classifier/{route}", json={**base, **body})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    locs = [d["loc"] for d in detail] if isinstance(detail, list) else [detail["loc"]]
    assert loc in locs, detail


def test_the_estimate_counts_every_training(svc):
    r = svc.client.post("/kinds/evaluate_classifier_attribution/estimate",
                        json={**BODY, "replicates": True, "estimators": ["tracin", "trak_ensemble"], "ensemble": 2})
    assert r.status_code == 200, r.text
    est = r.json()
    assert est["trainings"] == 3 + 3 + 1 + 2, est
    assert [g["what"] for g in est["models"]] == ["subset model", "subset replicate", "full-data model",
                                                  "ensemble member"]
    assert est["models"][0]["examples"] == 3 * 12 * RECIPE["epochs"]  # ceil(0.5 x 24) examples per subset model
    assert "examples per epoch" in est["formula"] and "evaluate_classifier_attribution" in est["formula"]


# ------------------------------------------------------------------------------------------- Hugging Face
@pytest.fixture(scope="module")
def svc_text(tmp_path_factory):
    from tests.hf_fixtures import save_classifier
    from tests.service import Service
    from tests.test_hf_train import _write_csv

    home = tmp_path_factory.mktemp("clf-eval-text") / "home"
    save_classifier(home / "data" / "bert", "bert", hidden=32, scale=None)
    _write_csv(home / "data" / "reviews", {"train": 16, "test": 6})
    with Service(home, heartbeat_ttl_s=30) as service:
        r = service.client.post("/models/import", json={"name": "bert", "kind": "huggingface", "path": "bert"})
        assert r.status_code == 202, r.text
        assert service.wait(r.json()["id"], timeout_s=120)["status"] == "succeeded", service.worker_logs()
        r = service.client.post("/datasets", json={"name": "reviews", "path": "reviews"})
        assert r.status_code == 201, r.text
        yield service


TEXT_RECIPE = {"epochs": 1, "batch_size": 8, "optimizer": "adamw", "lr": 5e-3, "max_length": 16}


@pytest.mark.slow
def test_a_hugging_face_lds_equals_the_direct_computation_and_its_mislabel_auc_the_stored_scores(svc_text, like_the_workers):
    like_the_workers(svc_text)
    from models.hf import evaluation as hf_ev
    from models.kg import evaluation as ev
    from models.textdata import read_split
    from models.training import TrainOptions

    body = {"model": "bert", "dataset": "reviews", "m": 3, "n_test": 4, "recipe": TEXT_RECIPE, "seed": 1,
            "estimators": ["tracin", "random"]}
    job, res = _run(svc_text, "/evaluate/classifier/attribution", body)
    assert res["shards"] == {"total": 4, "failed": []} and res["n_train"] == 16

    d = svc_text.home / "data" / "reviews"
    train, test = read_split(d / "train.csv"), read_split(d / "test.csv")
    source = svc_text.home / "data" / "bert"
    opts = TrainOptions(**{**TEXT_RECIPE, "momentum": 0.9, "weight_decay": 0.0, "checkpoint_every": 1, "seed": 0})
    subs = [hf_ev.train_subset(source, train, opts, 0.5, s, t, test)
            for s, t in zip(res["seeds"], res["train_seeds"], strict=True)]
    sel = ev.test_selection(len(test.labels), 4, 1)
    masks, outputs = np.stack([s["mask"] for s in subs]), np.stack([s["outputs"] for s in subs])[:, sel]
    gt = np.load(io.BytesIO(svc_text.artifact(job["id"], "ground_truth.npz")))
    np.testing.assert_array_equal(gt["masks"], masks)
    np.testing.assert_array_equal(gt["outputs"], outputs)
    from models.export.evaluation import lds_report
    from models.hf.evaluation import subset

    full = svc_text.home / "direct-full"
    hf_ev.train_recipe(source, train, opts, ev.full_model_seed(1, 0), out=full)
    clf, hf = hf_ev.read_classifier(full)
    want = lds_report(clf, masks, outputs, hf_ev.rows(hf, subset(test, sel), 16), hf_ev.rows(hf, train, 16),
                      ["tracin", "random"], 1)
    for name in ("tracin", "random"):
        assert res["estimators"][name]["per_test"] == want[name]["per_test"], name

    job, res = _run(svc_text, "/evaluate/classifier/mislabel", {**{k: body[k] for k in ("model", "dataset",
                                                                 "recipe", "estimators")}, "fraction": 0.25})
    saved = np.load(io.BytesIO(svc_text.artifact(job["id"], "self_scores.npz")))
    truth = np.zeros(16, dtype=bool)
    truth[res["flipped"]] = True
    assert res["n_flipped"] == 4
    for name in ("tracin", "random"):
        assert res["estimators"][name]["auc_interval"]["auc"] == ev.roc_auc(truth, saved[name])

