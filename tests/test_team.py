"""A team service: several hosts sharing one Redis and one store, tenants who cannot touch each other's models.

The scale-out test runs the README's recipe on loopback: ``explainq api`` and two ``explainq worker`` processes,
each with its own ``EXPLAINQ_HOME`` (as on hosts with no shared disk), one Redis and one store.
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from core.redis_server import EmbeddedRedis, free_port
from models.kg.influence import CSV_COLUMNS

ROOT = Path(__file__).resolve().parent.parent
TINY = {"epochs": 2, "batch_size": 256, "lr": 0.01, "embedding_dim": 20, "embedding_height": 4, "num_filters": 4,
        "checkpoint_every": 1, "seed": 0}
ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"Authorization": "Bearer key-bob"}


class Hosts:
    """Redis, one shared store directory, and processes that each get their own home."""

    def __init__(self, base: Path):
        self.base = base
        self.redis = EmbeddedRedis(base / "redis").start()
        self.store = base / "store"
        self.procs: list[tuple[subprocess.Popen, Path]] = []

    def env(self, home: Path) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "EXPLAINQ_HOME": str(home),
            "REDIS_URL": self.redis.url,
            "EXPLAINQ_STORE": str(self.store),
            "EXPLAINQ_STORE_CACHE": "always",  # copy what a host needs into its own home, as on separate disks
            "EXPLAINQ_API_KEYS": "alice:key-alice,bob:key-bob",
            "EXPLAINQ_HEARTBEAT_TTL_S": "20",
            "PYTHONPATH": str(ROOT),
            "OMP_NUM_THREADS": "1",
        })
        return env

    def start(self, home: Path, *argv: str) -> subprocess.Popen:
        home.mkdir(parents=True, exist_ok=True)
        log = home / "process.log"
        proc = subprocess.Popen([sys.executable, "-m", "explainq.cli", *argv], env=self.env(home), cwd=ROOT,
                                stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((proc, log))
        return proc

    def logs(self) -> str:
        return "\n".join(f"--- {log}\n{log.read_text()[-3000:]}" for _, log in self.procs if log.exists())

    def stop(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc, _ in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.redis.stop()


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    base = tmp_path_factory.mktemp("team")
    h = Hosts(base)
    port = free_port()
    h.start(base / "host-api", "api", "--port", str(port))
    h.start(base / "host-train", "worker", "--queues", "train")
    h.start(base / "host-explain", "worker", "--queues", "explain,bulk")
    h.url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    with httpx.Client(base_url=h.url, timeout=10) as client:
        while True:
            try:
                r = client.get("/ready", headers=ALICE)
                if r.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                h.stop()
                pytest.fail(f"the service did not become ready:\n{h.logs()}")
            time.sleep(0.3)
    yield h
    h.stop()


def _wait(client: httpx.Client, job_id: str, headers: dict, logs, timeout_s: float = 180) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = client.get(f"/jobs/{job_id}", headers=headers).json()
        if body["status"] in ("succeeded", "failed", "canceled"):
            return body
        time.sleep(0.2)
    raise TimeoutError(f"job {job_id} did not finish: {body}\n{logs()}")


def test_a_model_trained_on_one_host_is_explained_on_another(hosts):
    with httpx.Client(base_url=hosts.url, timeout=30) as client:
        r = client.post("/train/conve", json={"name": "conve-team", **TINY}, headers=ALICE)
        assert r.status_code == 202, r.text
        trained = _wait(client, r.json()["id"], ALICE, hosts.logs)
        assert trained["status"] == "succeeded", (trained, hosts.logs())
        models = {m["name"]: m for m in client.get("/models", headers=BOB).json()["models"]}
        assert models["conve-team"]["owner"] == "alice"  # every key sees (and may use) every model

        r = client.post("/tracin", json={"model": "conve-team", "test_triples": [["usa", "embassy", "uk"]],
                                         "top_k": 3}, headers=BOB)
        assert r.status_code == 202, r.text
        explained = _wait(client, r.json()["id"], BOB, hosts.logs)
        assert explained["status"] == "succeeded", (explained, hosts.logs())
        assert explained["queue"] == "explain"

        # The explaining host copied the model from the store into its own home; the training host never did.
        cached = list((hosts.base / "host-explain" / "cache" / "store" / "models" / "conve-team").glob("*/config.json"))
        assert len(cached) == 1
        assert not (hosts.base / "host-train" / "cache" / "store" / "models").exists()

        # Artifacts written on the explaining host download through the API process (a third home).
        items = client.get(f"/jobs/{explained['id']}/artifacts", headers=BOB).json()["items"]
        by_name = {i["name"]: i for i in items}
        assert {"influence.csv", "result.json"} <= set(by_name)
        assert by_name["influence.csv"]["media_type"] == "text/csv"
        r = client.get(by_name["influence.csv"]["url"], headers=BOB)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
        assert int(r.headers["content-length"]) == by_name["influence.csv"]["size"] == len(r.content)
        rows = list(csv.DictReader(io.StringIO(r.text)))
        assert rows and set(CSV_COLUMNS) == set(rows[0])
        # Another key sees neither the job nor its files.
        assert client.get(f"/jobs/{explained['id']}/artifacts", headers=ALICE).status_code == 404
        assert client.get(by_name["influence.csv"]["url"], headers=ALICE).status_code == 404
        assert client.get(f"/jobs/{explained['id']}/artifacts/../../x", headers=BOB).status_code == 404
        assert client.get(f"/jobs/{explained['id']}/artifacts/nope.txt", headers=BOB).status_code == 404


def test_only_the_owner_replaces_or_deletes_a_model(hosts):
    with httpx.Client(base_url=hosts.url, timeout=30) as client:
        r = client.post("/train/conve", json={"name": "conve-owned", **TINY, "epochs": 1}, headers=ALICE)
        assert r.status_code == 202, r.text
        assert _wait(client, r.json()["id"], ALICE, hosts.logs)["status"] == "succeeded"

        r = client.post("/train/conve", json={"name": "conve-owned", **TINY, "overwrite": True}, headers=BOB)
        assert r.status_code == 409, r.text
        assert r.json()["detail"]["loc"] == ["body", "name"] and "alice" in r.json()["detail"]["message"]
        r = client.post("/train/bdh", json={"epochs": 1, "register_as": "conve-owned"}, headers=BOB)
        assert r.status_code == 409 and r.json()["detail"]["loc"] == ["body", "register_as"], r.text
        r = client.delete("/models/conve-owned", headers=BOB)
        assert r.status_code == 409 and r.json()["detail"]["code"] == "owned_by_other"

        # The owner may replace it (a new version) and delete it.
        before = {m["name"]: m for m in client.get("/models", headers=ALICE).json()["models"]}["conve-owned"]
        r = client.post("/train/conve", json={"name": "conve-owned", **TINY, "epochs": 1, "overwrite": True},
                        headers=ALICE)
        assert _wait(client, r.json()["id"], ALICE, hosts.logs)["status"] == "succeeded"
        after = {m["name"]: m for m in client.get("/models", headers=ALICE).json()["models"]}["conve-owned"]
        assert after["created_at"] != before["created_at"]
        assert client.delete("/models/conve-owned", headers=ALICE).status_code == 200
        assert client.delete("/models/conve-owned", headers=ALICE).status_code == 404
        assert "conve-owned" not in {m["name"] for m in client.get("/models", headers=ALICE).json()["models"]}
        assert client.delete("/models/bad name!", headers=ALICE).status_code in (404, 422)


def test_resume_from_accepts_only_the_callers_own_jobs(hosts):
    body = {"epochs": 1, "batch_size": 64, "max_train_samples": 64, "warmup_steps": 0, "augment": False,
            "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "mlp_multiplier": 2, "dropout": 0.0}}
    with httpx.Client(base_url=hosts.url, timeout=30) as client:
        r = client.post("/train/bdh", json=body, headers=ALICE)
        assert r.status_code == 202, r.text
        job = _wait(client, r.json()["id"], ALICE, hosts.logs)
        assert job["status"] == "succeeded", (job, hosts.logs())
        r = client.post("/train/bdh", json={**body, "epochs": 2, "resume_from": job["id"]}, headers=BOB)
        assert r.status_code == 404, r.text
        assert r.json()["detail"]["loc"] == ["body", "resume_from"]
        r = client.post("/train/bdh", json={**body, "epochs": 2, "resume_from": job["id"]}, headers=ALICE)
        assert r.status_code == 202, r.text
        resumed = _wait(client, r.json()["id"], ALICE, hosts.logs)
        assert resumed["status"] == "succeeded", (resumed, hosts.logs())
        result = client.get(f"/jobs/{resumed['id']}/result", headers=ALICE).json()
        assert [row["epoch"] for row in result["history"]] == [1, 2]
