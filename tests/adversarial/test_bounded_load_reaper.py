"""A long bounded checkpoint load, through the real worker and RQ's registries: the reaper (run by ``GET /jobs/<id>``)
never marks the busy import ``worker_lost``; it ends with the load's own error.

Checked by loading in the worker's process instead (``load_state_file`` calling ``load_state_here``): the C
unpickler holds the GIL, the worker's liveness key and the job's heartbeat both expire, and the job is failed
``worker_lost`` while the worker is still busy.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.adversarial.test_bounded_load import _checkpoint_variant
from tests.service import Service

pytestmark = pytest.mark.slow
TTL_S = 1


def test_a_long_bounded_load_keeps_its_job_alive_through_the_reaper(tmp_path) -> None:
    data = tmp_path / "data" / "slow-kg"
    data.mkdir(parents=True)
    _checkpoint_variant(data / "model.pt", entries=100_000, copies=60, keep=False)
    (data / "train.txt").write_text("a\tr\tb\n")
    (data / "entities.dict").write_text("0\ta\n1\tb\n")
    (data / "relations.dict").write_text("0\tr\n")
    (data / "config.json").write_text(json.dumps({"embedding_dim": 20, "embedding_height": 4}))
    with Service(tmp_path, heartbeat_ttl_s=TTL_S, env={"OMP_NUM_THREADS": "1"}) as svc:
        time.sleep(TTL_S + 0.5)  # Redis up for longer than one TTL: the reaper is armed from here on
        r = svc.client.post("/models/import", json={"kind": "conve", "name": "slow-kg", "path": "slow-kg",
                                                    "weights": "model.pt",
                                                    "checkpoints": [{"file": "model.pt", "lr": 0.01}]})
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        started = svc.wait(job_id, statuses=("running", "failed", "succeeded"), timeout_s=120)
        assert started["status"] == "running", started
        t0 = time.monotonic()
        body = svc.wait(job_id, timeout_s=600, interval_s=0.2)  # each poll may reap
        took = time.monotonic() - t0
        assert body["status"] == "failed", body
        assert body["error"]["code"] == "invalid_model", (body["error"], svc.worker_logs())
        assert took > 3 * TTL_S, took  # the load outlived the heartbeat's TTL several times over
