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
        assert mine["stored"]["artifacts"] == {"jobs": 1, "jobs_counted": 1, "complete": True, "bytes": 300}
        assert mine["stored"]["bytes"] == 1302
        flight = mine["in_flight"]
        assert (flight["jobs"], flight["queued"], flight["running"]) == (1, 1, 0)
        assert flight["items"] == [{"id": job_id, "kind": "train_conve", "state": "queued"}]
        assert flight["queued_estimated_seconds"] == 60 and flight["unestimated"] == 1  # no train_conve ran yet

        theirs = client.get("/usage", headers=BOB).json()
        assert theirs["owner"] == "bob" and theirs["stored"]["bytes"] == 0 and theirs["in_flight"]["jobs"] == 0
        assert job_id not in client.get("/usage", headers=BOB).text
