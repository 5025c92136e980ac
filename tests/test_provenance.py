"""Every result says what produced it: the runner's provenance block (models with version and digest, datasets,
the request as run, seeds, device, software, worker, times) on each kind's result, the same shape for all;
``GET /jobs?model_digest=`` finds the caller's jobs by a model version; the job page and the SDK show it; results
stored before the block existed still validate."""

from __future__ import annotations

import re

import numpy as np
import pytest

from core import registry
from core.contract.results.influence import InfluenceResult
from core.contract.results.provenance import Provenance
from models.kg.train import TrainConfig, train_conve
from models.kg.triples import load_nations
from tests.export_fixtures import save_model_dir
from tests.result_examples import example
from workers.jobs.train_conve import register_shipped_dataset

KEYS = "alice:prov-key-alice-0123456789,bob:prov-key-bob-0123456789"
ALICE = {"Authorization": "Bearer prov-key-alice-0123456789"}
BOB = {"Authorization": "Bearer prov-key-bob-0123456789"}
TINY = {"epochs": 1, "batch_size": 256, "lr": 0.01, "embedding_dim": 20, "embedding_height": 4, "num_filters": 4,
        "checkpoint_every": 1, "seed": 3}


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    from tests.service import Service

    home = tmp_path_factory.mktemp("provenance")
    data = home / "data"
    save_model_dir(data / "image", "image", seed=0)
    save_model_dir(data / "image-b", "image", seed=1)
    service = Service(home, api_keys=KEYS, heartbeat_ttl_s=20, start=False)
    out = home / "models" / "conve-tiny"
    train_conve(load_nations(), TrainConfig(**TINY), out, device="cpu")
    registry.register_model(service.settings, "conve-tiny", kind="conve", loader="models.kg.checkpoint:load",
                            path=out)
    register_shipped_dataset(service.settings, "nations")
    service.start()
    try:
        yield service
    finally:
        service.stop()


def _run(svc, route: str, body: dict, headers=ALICE) -> tuple[str, dict]:
    r = svc.client.post(route, json=body, headers=headers)
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=240, headers=headers)
    assert job["status"] == "succeeded", (job, svc.worker_logs())
    return job["id"], svc.client.get(f"/jobs/{job['id']}/result", headers=headers).json()


@pytest.fixture(scope="module")
def runs(svc) -> dict[str, tuple[str, dict]]:
    """One job of each of four kinds, run end to end."""
    return {
        "import_model": _run(svc, "/models/import", {"name": "img", "kind": "export", "path": "image"}),
        "tracin": _run(svc, "/tracin", {"model": "conve-tiny", "test_triples": [["usa", "embassy", "uk"]],
                                        "top_k": 3, "layers": "last", "filter": {"n_hops": 1}}),
        "train_conve": _run(svc, "/train/conve", {"name": "conve-trained", "dataset": "nations", **TINY}),
    }


@pytest.fixture(scope="module")
def attributions(svc, runs) -> tuple[str, dict]:
    rng = np.random.default_rng(0)
    inputs = [{"id": "a", "values": rng.normal(size=(1, 8, 8)).round(3).tolist()}]
    return _run(svc, "/attributions", {"model": "img", "inputs": inputs, "n_steps": 8})


def _block(result: dict) -> dict:
    block = result["provenance"]
    Provenance.model_validate(block)  # one shape for every kind
    assert block["software"]["torch"] and block["software"]["python"] and block["worker"]
    assert block["started_at"] <= block["finished_at"] and block["device"] in ("cpu", "cuda", "cuda:0")
    assert re.fullmatch(r"[0-9a-f]{64}", block["request_sha256"])
    return block


@pytest.mark.parametrize("kind", ["import_model", "tracin", "train_conve", "attributions"])
def test_every_kinds_result_carries_the_provenance_block(svc, runs, attributions, kind):
    job_id, result = attributions if kind == "attributions" else runs[kind]
    block = _block(result)
    assert block["job_id"] == job_id and block["kind"] == kind
    request = svc.client.get(f"/jobs/{job_id}/request", headers=ALICE).json()
    assert {k: v for k, v in block["request"].items() if k in request} == request  # defaults filled in


def test_a_model_the_job_reads_is_named_with_its_version_and_the_digest_of_its_files(svc, runs):
    _, result = runs["tracin"]
    (model,) = _block(result)["models"]
    entry = registry.get_model(svc.settings, "conve-tiny")
    assert model["field"] == "model" and model["name"] == "conve-tiny"
    assert model["version"] == entry["location"].rsplit("/", 1)[-1]
    assert model["digest"] == entry["digest"] == registry.tree_digest(registry.local_path(svc.settings, entry))
    assert result["provenance"]["precision"] == result["precision"]


def test_training_records_its_dataset_seed_and_the_model_it_registered(svc, runs):
    _, result = runs["train_conve"]
    block = _block(result)
    (dataset,) = block["datasets"]
    entry = registry.get_dataset(svc.settings, "nations")
    assert dataset["name"] == "nations" and dataset["source"] == "registered" and dataset["digest"] == entry["digest"]
    assert block["seeds"]["seed"] == TINY["seed"]
    (made,) = block["registered"]
    assert made["name"] == "conve-trained" and made["digest"] == registry.get_model(svc.settings,
                                                                                   "conve-trained")["digest"]


def test_new_weights_under_the_same_name_have_another_digest(svc, runs, attributions):
    _, imported = runs["import_model"]
    first = imported["provenance"]["registered"][0]["digest"]
    assert attributions[1]["provenance"]["models"][0]["digest"] == first
    _, again = _run(svc, "/models/import", {"name": "img", "kind": "export", "path": "image-b", "overwrite": True})
    second = again["provenance"]["registered"][0]["digest"]
    assert second != first and registry.get_model(svc.settings, "img")["digest"] == second


def test_jobs_are_found_by_a_model_digest(svc, runs, attributions):
    digest = runs["tracin"][1]["provenance"]["models"][0]["digest"]
    found = svc.client.get("/jobs", params={"model_digest": digest}, headers=ALICE).json()["items"]
    assert [j["id"] for j in found] == [runs["tracin"][0]]
    img = attributions[1]["provenance"]["models"][0]["digest"]
    found = svc.client.get("/jobs", params={"model_digest": img[:12].upper()}, headers=ALICE).json()["items"]
    assert {j["id"] for j in found} >= {attributions[0], runs["import_model"][0]}
    assert runs["tracin"][0] not in {j["id"] for j in found}
    assert svc.client.get("/jobs", params={"model_digest": digest}, headers=BOB).json()["items"] == []


@pytest.mark.parametrize("bad", ["xyz", "abc", "g" * 64, "a" * 65])
def test_a_bad_model_digest_is_a_422_naming_it(svc, bad):
    r = svc.client.get("/jobs", params={"model_digest": bad}, headers=ALICE)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["query", "model_digest"]


def test_the_job_page_shows_a_provenance_section(svc, runs):
    job_id, result = runs["tracin"]
    c = svc.client
    c.cookies.clear()
    assert c.post("/ui/login", data={"api_key": ALICE["Authorization"].split()[1], "next": "/ui/jobs"},
                  follow_redirects=False).status_code == 303
    try:
        page = c.get(f"/ui/jobs/{job_id}").text
        assert 'id="provenance"' in page and "conve-tiny" in page
        digest = result["provenance"]["models"][0]["digest"]
        assert f"sha256 {digest[:12]}" in page and f"/ui/jobs?model_digest={digest}" in page
        listed = c.get("/ui/jobs", params={"model_digest": digest}).text
        assert job_id[:8] in listed
        bad = c.get("/ui/jobs", params={"model_digest": "not-hex"})
        assert bad.status_code == 422 and "model_digest" in bad.text
    finally:
        c.cookies.clear()


def test_the_sdk_gives_the_block_as_an_attribute(runs):
    from explainq_client.results import make_result

    _, result = runs["tracin"]
    res = make_result("influence", result, "tracin", "InfluenceResult")
    assert res.provenance["models"][0]["name"] == "conve-tiny"
    assert res.provenance.model_digest == result["provenance"]["models"][0]["digest"]
    assert "conve-tiny" in res.provenance.text() and "Provenance" in res.provenance._repr_html_()
    assert make_result("influence", {k: v for k, v in result.items() if k != "provenance"}).provenance is None


def test_a_result_stored_without_the_block_still_validates():
    old = example(InfluenceResult)
    old.pop("provenance", None)
    assert InfluenceResult.model_validate(old).provenance is None


def test_the_commit_is_read_from_git_files_without_running_git(tmp_path, monkeypatch):
    from workers.provenance import _read_commit

    monkeypatch.delenv("EXPLAINQ_GIT_COMMIT", raising=False)
    assert _read_commit(tmp_path) is None
    git = tmp_path / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "packed-refs").write_text("# pack-refs\n" + "ab" * 20 + " refs/heads/main\n")
    assert _read_commit(tmp_path) == "ab" * 20
    (git / "refs" / "heads" / "main").write_text("cd" * 20 + "\n")
    assert _read_commit(tmp_path) == "cd" * 20
    monkeypatch.setenv("EXPLAINQ_GIT_COMMIT", "feed")
    assert _read_commit(tmp_path) == "feed"


def test_a_job_lost_while_its_provenance_is_recorded_stops_as_lost(redis_settings):
    from core.contract.kind import load_kinds
    from workers.context import JobLost
    from workers.runner import _provenance_start

    class LostContext:
        owner, job_id = "alice", "j1"

        def update_meta(self, values):
            raise JobLost("failed as worker_lost meanwhile")

    spec = load_kinds()["tracin"]
    request = spec.request.model_validate({"model": "absent", "test_triples": [["a", "r", "b"]]})
    with pytest.raises(JobLost):
        _provenance_start(redis_settings, spec, request, LostContext())


def test_a_dataset_is_named_as_registered_a_directory_or_shipped_data(redis_settings):
    from core.contract.kind import load_kinds
    from workers.provenance import datasets_of

    (redis_settings.data_roots[0] / "my-graph").mkdir(parents=True)
    registry.register_dataset(redis_settings, "reg", kind="triples", path=redis_settings.data_roots[0] / "my-graph",
                              upload=True, owner="alice")
    spec = load_kinds()["train_conve"]
    got = {name: datasets_of(redis_settings, spec, {"dataset": name}, "alice")[0]
           for name in ("reg", "my-graph", "./my-graph", "digits")}
    assert got["reg"]["source"] == "registered" and got["reg"]["digest"] == registry.get_dataset(
        redis_settings, "reg")["digest"] and got["reg"]["version"]
    assert got["my-graph"]["source"] == got["./my-graph"]["source"] == "directory"
    assert got["digits"] == {"field": "dataset", "name": "digits", "source": "packaged"}


def test_every_public_kinds_result_model_has_the_provenance_field():
    """A kind added later gets the block too: the runner attaches it only where the result model names it."""
    from core.contract.kind import load_kinds

    missing = [k.name for k in load_kinds().values() if not k.internal and not k.name.startswith("test_")
               and k.result is not None and "provenance" not in k.result.model_fields]
    assert missing == []
