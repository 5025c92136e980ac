"""``GET /usage``: a tenant sees their own stored bytes and work in flight, and nobody else's."""

from __future__ import annotations

from core import artifacts, registry
from tests.service import api_client

ALICE = {"Authorization": "Bearer key-a"}
BOB = {"Authorization": "Bearer key-b"}


def test_usage_shows_the_callers_own_bytes_and_work_in_flight(tmp_path) -> None:
    with api_client(tmp_path / "home", EXPLAINQ_API_KEYS="alice:key-a,bob:key-b",
                    EXPLAINQ_BACKLOG_UNKNOWN_COST_S="60") as client:
        settings = client.app.state.settings
        empty = client.get("/usage", headers=ALICE).json()
        assert empty["stored"]["bytes"] == 0 and empty["in_flight"]["jobs"] == 0

        weights = tmp_path / "model"
        weights.mkdir()
        (weights / "model.pt").write_bytes(b"\0" * 1000)
        (weights / "config.json").write_bytes(b"{}")
        registry.register_model(settings, "alice-model", kind="conve", loader="x", path=weights, owner="alice")
        r = client.post("/train/conve", json={"name": "usage-model", "epochs": 1, "batch_size": 128,
                                              "embedding_dim": 200, "num_filters": 32}, headers=ALICE)
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        registry.store(settings).put_bytes(b"x" * 300, artifacts.artifacts_key(job_id, "log.txt"))

        mine = client.get("/usage", headers=ALICE).json()
        assert mine["owner"] == "alice"
        assert mine["stored"]["models"] == {"count": 1, "bytes": 1002}
        assert mine["stored"]["artifacts"] == {"jobs": 1, "jobs_counted": 1, "complete": True, "bytes": 300,
                                               "results_bytes": 0}
        assert mine["stored"]["bytes"] == 1302
        flight = mine["in_flight"]
        assert (flight["jobs"], flight["queued"], flight["running"]) == (1, 1, 0)
        assert flight["items"] == [{"id": job_id, "kind": "train_conve", "state": "queued"}]
        assert flight["queued_estimated_seconds"] == 60 and flight["unestimated"] == 1  # no train_conve ran yet

        theirs = client.get("/usage", headers=BOB).json()
        assert theirs["owner"] == "bob" and theirs["stored"]["bytes"] == 0 and theirs["in_flight"]["jobs"] == 0
        assert job_id not in client.get("/usage", headers=BOB).text
        assert mine["budgets"] == {"store_bytes": None, "compute_s": None, "compute_in_flight_s": 60.0}


def _register(settings, tmp_path, name: str, size: int, owner: str = "alice") -> None:
    weights = tmp_path / name
    weights.mkdir()
    (weights / "model.pt").write_bytes(b"\0" * size)
    (weights / "config.json").write_bytes(b"{}")
    registry.register_model(settings, name, kind="conve", loader="x", path=weights, owner=owner)


TRAIN = {"epochs": 1, "batch_size": 128, "embedding_dim": 200, "num_filters": 32}


def test_a_tenant_at_its_store_budget_is_refused_new_jobs_with_the_figures_until_it_deletes(tmp_path) -> None:
    with api_client(tmp_path / "home", EXPLAINQ_API_KEYS="alice:key-a,bob:key-b",
                    EXPLAINQ_TENANT_STORE_BYTES="2000", EXPLAINQ_USAGE_CACHE_S="600") as client:
        settings = client.app.state.settings
        assert client.post("/train/conve", json={"name": "m1", **TRAIN}, headers=ALICE).status_code == 202
        _register(settings, tmp_path, "alice-big", 2500)
        # measured a moment ago (the first submission's check): the figure is reused until it expires...
        assert client.post("/train/conve", json={"name": "m2", **TRAIN}, headers=ALICE).status_code == 202
        # ...or until GET /usage (or a deletion) measures again
        assert client.get("/usage", headers=ALICE).json()["budgets"]["store_bytes"] == 2000
        r = client.post("/train/conve", json={"name": "m3", **TRAIN}, headers=ALICE)
        assert r.status_code == 413, r.text
        detail = r.json()["detail"]
        assert detail["code"] == "store_budget_exceeded" and detail["limit"] == 2000 and detail["value"] == 2502
        assert "EXPLAINQ_TENANT_STORE_BYTES" in detail["message"] and str(tmp_path) not in r.text
        assert client.post("/train/conve", json={"name": "b1", **TRAIN}, headers=BOB).status_code == 202  # not bob
        assert client.delete("/models/alice-big", headers=ALICE).status_code == 200
        assert client.post("/train/conve", json={"name": "m3", **TRAIN}, headers=ALICE).status_code == 202


def test_compute_in_flight_past_the_budget_is_a_429_with_retry_after(tmp_path) -> None:
    with api_client(tmp_path / "home", EXPLAINQ_API_KEYS="alice:key-a,bob:key-b",
                    EXPLAINQ_BACKLOG_UNKNOWN_COST_S="60", EXPLAINQ_TENANT_COMPUTE_S="150") as client:
        for name in ("c1", "c2"):  # 60 + 60 s estimated: within 150
            assert client.post("/train/conve", json={"name": name, **TRAIN}, headers=ALICE).status_code == 202
        r = client.post("/train/conve", json={"name": "c3", **TRAIN}, headers=ALICE)
        assert r.status_code == 429, r.text
        detail = r.json()["detail"]
        assert detail["code"] == "compute_budget_exceeded" and detail["limit"] == 150 and detail["value"] == 180
        assert r.headers["Retry-After"] == "30" and "EXPLAINQ_TENANT_COMPUTE_S" in detail["message"]
        assert client.get("/usage", headers=ALICE).json()["budgets"]["compute_in_flight_s"] == 120
        assert client.post("/train/conve", json={"name": "b1", **TRAIN}, headers=BOB).status_code == 202


def test_shared_entries_a_tenants_jobs_used_count_in_full_in_their_bytes_until_the_job_is_deleted(tmp_path) -> None:
    """Gradient features and evaluation caches are stored once per content and serve every tenant asking for it;
    each tenant whose job on record used or wrote one is charged its full size (core/lastuse.py's claims)."""
    from core import lastuse

    with api_client(tmp_path / "home", EXPLAINQ_API_KEYS="alice:key-a,bob:key-b",
                    EXPLAINQ_TENANT_STORE_BYTES="5000", EXPLAINQ_USAGE_CACHE_S="0") as client:
        settings = client.app.state.settings
        store = registry.store(settings)
        store.put_bytes(b"f" * 3000, "features/k1/segment-0.bin")
        store.put_bytes(b"f" * 1000, "features/k1/index.json")
        store.put_bytes(b"m" * 700, "cache/evaluation/models/d1/model.safetensors")
        a = client.post("/train/conve", json={"name": "m1", **TRAIN}, headers=ALICE).json()["id"]
        b = client.post("/train/conve", json={"name": "b1", **TRAIN}, headers=BOB).json()["id"]
        lastuse.claim(store, "alice", a, ["features/k1", "cache/evaluation/models/d1"])
        lastuse.claim(store, "bob", b, ["features/k1"])
        lastuse.claim(store, "bob", "0" * 32, ["cache/evaluation/models/d1"])  # a job no longer on record

        mine = client.get("/usage", headers=ALICE).json()["stored"]
        assert mine["shared"] == {"entries": 2, "bytes": 4700, "features": 1, "evaluation_caches": 1}
        assert mine["bytes"] == 4700
        theirs = client.get("/usage", headers=BOB).json()["stored"]
        assert theirs["shared"] == {"entries": 1, "bytes": 4000, "features": 1, "evaluation_caches": 0}

        store.put_bytes(b"f" * 400, "features/k1/segment-1.bin")  # the entry grew: both are charged in full
        r = client.post("/train/conve", json={"name": "m2", **TRAIN}, headers=ALICE)
        assert r.status_code == 413 and r.json()["detail"]["value"] == 5100, r.text
        assert client.post("/train/conve", json={"name": "b2", **TRAIN}, headers=BOB).status_code == 202

        assert client.delete(f"/jobs/{a}", headers=ALICE).status_code == 202  # canceled (it was queued)
        assert client.delete(f"/jobs/{a}", headers=ALICE).status_code == 200, "deleting the job releases its claims"
        assert client.get("/usage", headers=ALICE).json()["stored"]["shared"]["bytes"] == 0
        assert lastuse.claims(store, "alice") == {}  # released, not only ignored
        assert client.get("/usage", headers=BOB).json()["stored"]["shared"]["bytes"] == 4400
        store.delete("features/k1")  # collected: nobody is charged for it any more
        assert client.get("/usage", headers=BOB).json()["stored"]["shared"] == {
            "entries": 0, "bytes": 0, "features": 0, "evaluation_caches": 0}


def test_a_jobs_context_claims_what_it_uses_for_its_owner(tmp_path) -> None:
    from types import SimpleNamespace

    from core import lastuse
    from core.settings import Settings
    from workers.context import JobContext

    settings = Settings(EXPLAINQ_HOME=str(tmp_path))
    ctx = JobContext(settings, job=SimpleNamespace(id="j" * 32, meta={"owner": "alice"}), device="cpu")
    ctx.use_shared(f"features/{k}" for k in ("k1", "k2"))
    store = registry.store(settings)
    assert lastuse.claims(store, "alice") == {"features/k1": {"j" * 32}, "features/k2": {"j" * 32}}
    assert lastuse.last_used(store, "features/k1") is not None
