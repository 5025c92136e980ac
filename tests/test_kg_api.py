"""``POST /tracin`` and ``POST /train/conve`` end to end: real Redis, a real worker process, the real app."""

from __future__ import annotations

import csv
import io

import pytest

from core import registry
from models.kg.train import TrainConfig, train_conve
from models.kg.triples import load_nations

TINY = {"epochs": 2, "batch_size": 256, "lr": 0.01, "embedding_dim": 20, "embedding_height": 4, "num_filters": 4,
        "checkpoint_every": 1, "seed": 0}


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    from tests.service import Service

    home = tmp_path_factory.mktemp("kghome")
    service = Service(home, heartbeat_ttl_s=20, start=False)
    out = home / "models" / "conve-tiny"
    summary = train_conve(load_nations(), TrainConfig(**TINY), out, device="cpu")
    registry.register_model(service.settings, "conve-tiny", kind="conve", loader="models.kg.checkpoint:load",
                            path=out, parameters=summary["parameters"])
    service.start()
    try:
        yield service
    finally:
        service.stop()


def _run(svc, route, body):
    r = svc.client.post(route, json=body)
    assert r.status_code == 202, r.text
    assert r.headers["location"] == f"/jobs/{r.json()['id']}"
    job = svc.wait(r.json()["id"], timeout_s=180)
    assert job["status"] == "succeeded", (job, svc.worker_logs())
    return job, svc.client.get(job["result_url"]).json()


def test_tracin_end_to_end_with_csv(svc):
    body = {"model": "conve-tiny", "test_triples": [["usa", "embassy", "uk"], ["uk", "embassy", "usa"]],
            "top_k": 5, "layers": "all", "filter": {"n_hops": 1}}
    job, result = _run(svc, "/tracin", body)
    assert job["kind"] == "tracin" and job["progress"]["unit"] == "batches"
    assert [c["epoch"] for c in result["checkpoints"]] == [1, 2]
    assert len(result["results"]) == 2
    for r in result["results"]:
        assert 0 < r["n_candidates"] < 1592 and r["self_influence"] > 0
        assert len(r["proponents"]) == min(5, r["n_positive"]) and len(r["opponents"]) == min(5, r["n_negative"])
        for p in r["proponents"]:
            assert len(p["train_triple"]) == 3 and p["influence"] > 0
            assert "usa" in (p["train_triple"][0], p["train_triple"][2]) or \
                "uk" in (p["train_triple"][0], p["train_triple"][2])
    (art,) = [a for a in result["artifacts"] if a["name"] == "influence.csv"]
    assert art["media_type"] == "text/csv" and "path" not in art
    with io.StringIO(svc.artifact(job["id"], "influence.csv").decode()) as fh:
        rows = list(csv.DictReader(fh))
    assert rows[0]["TestHead"] == "usa" and {"TrainHead", "TracInScore", "SelfInfluence"} <= set(rows[0])
    n_listed = sum(len(r["proponents"]) + len(r["opponents"]) for r in result["results"])
    assert len(rows) == n_listed


def test_self_influence_mode_without_test_triples(svc):
    _, result = _run(svc, "/tracin", {"model": "conve-tiny", "mode": "self", "top_k": None, "layers": "last"})
    assert result["n_candidates"] == result["listed"]["ranking"]["total"] == len(result["ranking"]) == 1592
    values = [r["self_influence"] for r in result["ranking"]]
    assert values == sorted(values, reverse=True)


@pytest.mark.parametrize(("patch", "loc", "value"), [
    ({"test_triples": [["atlantis", "embassy", "uk"]]}, ["body", "test_triples", 0, 0], "atlantis"),
    ({"test_triples": [["usa", "hugs", "uk"]]}, ["body", "test_triples", 0, 1], "hugs"),
    ({"test_triples": [["usa", "embassy"]]}, ["body", "test_triples", 0], ["usa", "embassy"]),
    ({"test_triples": []}, ["body", "test_triples"], []),
    ({"top_k": -1}, ["body", "top_k"], -1),
    ({"model": "nope"}, ["body", "model"], "nope"),
    ({"checkpoints": ["epoch_0099"]}, ["body", "checkpoints", 0], "epoch_0099"),
    ({"layers": ["fc", "decoder"]}, ["body", "layers", 1], "decoder"),
    ({"mode": "single"}, ["body", "train_triples"], None),
    ({"mode": "sideways"}, ["body", "mode"], "sideways"),
])
def test_tracin_bad_input_is_422_naming_field_and_value(svc, patch, loc, value):
    body = {"model": "conve-tiny", "test_triples": [["usa", "embassy", "uk"]], **patch}
    r = svc.client.post("/tracin", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    hit = [d for d in detail if d["loc"] == loc]
    assert hit, detail
    assert hit[0]["input"] == value


def test_train_conve_end_to_end_then_tracin(svc):
    body = {"name": "conve-trained", "dataset": "nations", **TINY}
    job, result = _run(svc, "/train/conve", body)
    assert job["kind"] == "train_conve"
    assert [(c["epoch"], c["lr"]) for c in result["checkpoints"]] == [(1, 0.01), (2, 0.01)]
    for split in ("valid", "test"):
        assert set(result["metrics"][split]) >= {"mrr", "hits@1", "hits@3", "hits@10"}
    entry = registry.get_model(svc.settings, "conve-trained")
    assert entry["kind"] == "conve" and entry["meta"]["metrics"]["test"]["mrr"] == result["metrics"]["test"]["mrr"]
    models = svc.client.get("/models").json()
    assert "conve-trained" in str(models)
    _, inf = _run(svc, "/tracin", {"model": "conve-trained", "test_triples": [["usa", "embassy", "uk"]],
                                   "checkpoints": ["epoch_0002"], "top_k": 3})
    assert [c["epoch"] for c in inf["checkpoints"]] == [2] and inf["results"][0]["n_candidates"] == 1592
    # the same name again without overwrite is refused up front
    r = svc.client.post("/train/conve", json=body)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "name"]


@pytest.mark.parametrize(("patch", "loc"), [
    ({"dataset": "../../etc"}, ["body", "dataset"]),
    ({"dataset": "no-such-dataset"}, ["body", "dataset"]),
    ({"embedding_dim": 21, "embedding_height": 4}, ["body", "embedding_height"]),
    ({"epochs": 0}, ["body", "epochs"]),
    ({"lr": -1}, ["body", "lr"]),
    ({"name": "bad name!"}, ["body", "name"]),
])
def test_train_bad_input_is_422(svc, patch, loc):
    r = svc.client.post("/train/conve", json={"name": "x", **TINY, **patch})
    assert r.status_code == 422, r.text
    assert any(d["loc"] == loc for d in r.json()["detail"]), r.json()


def test_prepare_demo_registers_model_and_dataset_once(redis_settings, monkeypatch):
    from workers.jobs import train_conve as job

    for attr in ("DEMO_CONFIG", "UMLS_DEMO_CONFIG", "KINSHIPS_DEMO_CONFIG"):
        monkeypatch.setattr(job, attr, {**TINY, "epochs": 1})
    settings = redis_settings
    job.prepare_demo(settings, progress=False)
    entry = registry.get_model(settings, job.DEMO_NAME)
    assert entry["kind"] == "conve" and entry["meta"]["train_triples"] == 1592
    assert entry["owner"] == "system" and entry["preload"]
    nations = registry.get_dataset(settings, "nations")
    assert nations["kind"] == "triples"
    assert (registry.local_path(settings, nations) / "SOURCE.md").is_file()
    created = entry["created_at"]
    job.prepare_demo(settings, progress=False)  # idempotent: nothing retrained
    assert registry.get_model(settings, job.DEMO_NAME)["created_at"] == created
    from models.kg.checkpoint import load

    bundle = load(registry.absolute_path(settings, entry), "cpu")
    assert [c.epoch for c in bundle.checkpoints] == [1]


def test_train_conve_cancel_leaves_nothing_behind(svc):
    import time

    body = {"name": "conve-canceled", "dataset": "nations", **TINY, "epochs": 500, "batch_size": 64}
    r = svc.client.post("/train/conve", json=body)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    deadline = time.monotonic() + 180
    while True:
        job = svc.client.get(f"/jobs/{job_id}").json()
        if job["status"] == "running" and job["progress"] and job["progress"]["done"] > 0:
            break
        assert job["status"] in ("queued", "running") and time.monotonic() < deadline, job
        time.sleep(0.1)
    assert job["progress"]["unit"] == "batches" and job["progress"]["total"] == 500 * 25
    assert svc.client.delete(f"/jobs/{job_id}").status_code in (200, 202, 204)
    job = svc.wait(job_id, timeout_s=60)
    assert job["status"] == "canceled"
    assert registry.get_model(svc.settings, "conve-canceled") is None
    assert not registry.store(svc.settings).list_dirs("models/conve-canceled")
    assert not list(svc.settings.work_dir.glob("conve-conve-canceled*"))


def test_train_on_a_directory_under_the_data_roots(svc):
    root = svc.settings.data_roots[0] / "toy"
    root.mkdir(parents=True, exist_ok=True)
    people = ["ann", "bob", "cat", "dan", "eve"]
    train = [(a, "knows", b) for a in people for b in people if a < b]
    (root / "train.txt").write_text("".join(f"{h}\t{r}\t{t}\n" for h, r, t in train))
    (root / "test.txt").write_text("bob\tknows\tann\n")
    (root / "entity_labels.tsv").write_text("ann\tAnn Smith\n")
    _, result = _run(svc, "/train/conve", {"name": "conve-toy", "dataset": "toy", **TINY, "epochs": 1})
    assert result["metrics"]["test"]["n_queries"] == 2
    inf_job, inf = _run(svc, "/tracin", {"model": "conve-toy", "test_triples": [["bob", "knows", "ann"]],
                                         "top_k": None})
    r = inf["results"][0]
    assert r["n_candidates"] == len(train) and not r["truncated"]
    assert len(r["proponents"]) + len(r["opponents"]) == r["n_positive"] + r["n_negative"] > 0
    (art,) = [a for a in inf["artifacts"] if a["name"] == "influence.csv"]
    assert "Ann Smith" in svc.artifact(inf_job["id"], "influence.csv").decode()
