"""A kind with ``recheck`` is checked again by the worker before it allocates anything: admission's memory
estimate is made again from the data as it is when the job runs, against the worker's own budget. Here a dataset's
registration grows between submission and pick-up (a re-registration with many more entities): admission
accepted the ConvE, the worker refuses it with ``refused_on_worker`` naming what it would need."""

from __future__ import annotations

import pytest

from core import registry
from core.settings import Settings

ALICE = {"Authorization": "Bearer recheck-key-alice-0123456789"}


def _triples(root, n_entities: int):
    root.mkdir(parents=True, exist_ok=True)
    lines = [f"e{i}\tr{i % 3}\te{(i + 1) % n_entities}" for i in range(n_entities)]
    for split in ("train", "valid", "test"):
        (root / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return root


def _register(settings, path, entities: int) -> None:
    registry.register_dataset(settings, "growing-kg", kind="triples", path=path, owner="alice",
                              meta={"format": "triples", "counts": {"entities": entities, "relations": 3,
                                                                    "train_triples": 20, "test_triples": 20}})


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    from tests.service import Service

    home = tmp_path_factory.mktemp("recheck")
    # the train worker starts later, so that the registration can change while the job waits
    with Service(home, queues=("explain",), api_keys="alice:recheck-key-alice-0123456789",
                 env={"EXPLAINQ_WORKER_MEMORY_BYTES": str(2 * 1024**3)}) as s:
        yield s


def test_the_worker_refuses_a_job_whose_data_grew_past_its_budget_since_admission(svc, tmp_path):
    path = _triples(svc.home / "data" / "growing", 20)
    _register(svc.settings, path, 20)
    body = {"dataset": "growing-kg", "name": "grown", "epochs": 1, "embedding_dim": 200, "batch_size": 128}
    r = svc.client.post("/train/conve", json=body, headers=ALICE)
    assert r.status_code == 202, r.text  # 20 entities: a few MiB
    _register(svc.settings, path, 20_000_000)  # now 20M entities: the embedding table alone is 16 GB
    svc.start_worker("train")
    job = svc.wait(r.json()["id"], headers=ALICE, timeout_s=120)
    assert job["status"] == "failed", job
    assert job["error"]["code"] == "refused_on_worker", job["error"]
    assert "checked again on the worker" in job["error"]["message"] and "20000000 entities" in job["error"]["message"]
    assert str(svc.home) not in job["error"]["message"]
    assert registry.get_model(svc.settings, "grown") is None


def test_a_job_that_still_fits_runs(svc):
    path = _triples(svc.home / "data" / "small", 20)
    registry.register_dataset(svc.settings, "small-kg", kind="triples", path=path, owner="alice",
                              meta={"format": "triples", "counts": {"entities": 20, "relations": 3,
                                                                    "train_triples": 20, "test_triples": 20}})
    r = svc.client.post("/train/conve", json={"dataset": "small-kg", "name": "fits", "epochs": 1,
                                              "embedding_dim": 20, "num_filters": 4, "batch_size": 8}, headers=ALICE)
    assert r.status_code == 202, r.text
    if not any(p.poll() is None for p in svc.workers[1:]):
        svc.start_worker("train")
    assert svc.wait(r.json()["id"], headers=ALICE, timeout_s=300)["status"] == "succeeded"


def test_the_recheck_uses_the_workers_own_budget(tmp_path):
    from core import placement

    settings = Settings(EXPLAINQ_HOME=str(tmp_path), EXPLAINQ_WORKER_MEMORY_BYTES=8 * 1024**3)
    try:
        placement.set_worker_budget(1024)
        assert placement.memory_budget(settings, 10) == 1024  # outside an admission, in a worker
        with placement.admitting(settings, "train", None):
            assert placement.memory_budget(settings, 10) == 8 * 1024**3  # admission: the API's view
    finally:
        placement.set_worker_budget(None)
    assert placement.memory_budget(settings, 10) == 8 * 1024**3
