"""The service on a real object store, as a team runs it across hosts: moto's S3 server (started by the tests, through
s3fs), one Redis, the API, and two workers with homes of their own (so caches of their own, as on hosts with no
shared disk).

- A TracIn job fanned out over both workers equals the unsharded run, every entry and every CSV row; each worker
  copied the model from the store into its own cache; the files download by pre-signed URL.
- With the store paused for the workers (a proxy in front of moto that stops forwarding: connections open, no
  answers; the API, on a host of its own, reaches moto directly), a job fails
  as ``store_unavailable`` within the store's bounds instead of hanging, and a fan-out's shards that met the pause
  are retried once the store answers again, so the fan-out still succeeds and equals the unsharded run.
"""

from __future__ import annotations

import csv
import io
import json
import socket
import threading
import time
import uuid

import fsspec
import httpx
import pytest

from core import registry
from tests.test_filestore import s3_server  # noqa: F401  (the fixture: moto's S3 server)
from tests.test_tracin_fanout import MODEL, N_TRAIN, TESTS, TINY, _same_entries, _same_result

pytestmark = pytest.mark.slow
BODY = {"test_triples": TESTS[:2], "top_k": 4}


class PausableProxy:
    """A TCP proxy to ``target``; :meth:`pause` stops forwarding both ways (connections stay open and nothing is
    answered, like a paused server), :meth:`resume` goes on."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.running = threading.Event()
        self.running.set()
        self.server = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self.server.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def pause(self) -> None:
        self.running.clear()

    def resume(self) -> None:
        self.running.set()

    def close(self) -> None:
        self.closed = True
        self.running.set()
        self.server.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.running.wait()
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                self.running.wait()
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.fixture(scope="module")
def team(tmp_path_factory, s3_server):  # noqa: F811  (the imported fixture)
    """Redis, a fresh bucket behind the proxy, the API (its own home) and two workers (homes of their own)."""
    from models.kg.train import TrainConfig, train_conve
    from models.kg.triples import load_nations
    from tests.service import Service

    base = tmp_path_factory.mktemp("s3team")
    moto = httpx.URL(s3_server)
    proxy = PausableProxy((moto.host, moto.port))
    bucket = f"explainq-e2e-{uuid.uuid4().hex[:12]}"
    fsspec.filesystem("s3").mkdir(bucket)
    env = {"EXPLAINQ_STORE": f"s3://{bucket}/store", "AWS_ENDPOINT_URL": proxy.url,
           "EXPLAINQ_STORE_TIMEOUT_S": "2", "EXPLAINQ_STORE_RETRIES": "1"}
    svc = Service(base / "host-api", queues=(), heartbeat_ttl_s=20, env=env, start=False)
    out = base / "trained" / MODEL
    summary = train_conve(load_nations(), TrainConfig(**TINY), out, device="cpu")
    registry.register_model(svc.settings, MODEL, kind="conve", loader="models.kg.checkpoint:load", path=out,
                            parameters=summary["parameters"], preload=True)
    svc.start()
    hosts = [base / "host-a", base / "host-b"]
    for home in hosts:
        home.mkdir()
        svc.start_worker("explain,bulk", env={"EXPLAINQ_HOME": str(home)})
    svc.wait_for_workers(2)
    svc.hosts, svc.proxy = hosts, proxy
    try:
        yield svc
    finally:
        proxy.resume()
        svc.stop()
        proxy.close()
        fsspec.filesystem("s3").rm(bucket, recursive=True)


def _run(svc, body: dict, timeout_s: float = 300) -> tuple[dict, dict]:
    r = svc.client.post("/tracin", json={"model": MODEL, **body})
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=timeout_s)
    assert job["status"] == "succeeded", (job, svc.worker_logs()[-4000:])
    return job, svc.client.get(f"/jobs/{job['id']}/result").json()


def _download(svc, job_id: str, name: str) -> bytes:
    """A job's file as a client gets it: the API redirects to the store's pre-signed URL."""
    r = svc.client.get(f"/jobs/{job_id}/artifacts/{name}", follow_redirects=False)
    assert r.status_code == 307, r.text
    fetched = httpx.get(r.headers["location"])
    assert fetched.status_code == 200, fetched.text
    return fetched.content


def _jsonl(svc, job_id: str, name: str) -> list[dict]:
    return [json.loads(line) for line in _download(svc, job_id, name).decode().splitlines() if line.strip()]


def _rows(svc, job_id: str) -> list[tuple]:
    rows = csv.DictReader(io.StringIO(_download(svc, job_id, "influence.csv").decode()))
    return [(r["TestHead"], r["TrainHead"], r["TrainTail"], r["Role"]) for r in rows]


def _compare(svc, fan_job: dict, fan: dict, one_job: dict, one: dict) -> None:
    _same_result(fan, one)
    _same_entries(_jsonl(svc, fan_job["id"], "results.jsonl"), one["results"])
    assert _rows(svc, fan_job["id"]) == _rows(svc, one_job["id"])


def test_a_fan_out_over_two_hosts_on_s3_equals_the_unsharded_run(team):
    one_job, one = _run(team, {**BODY, "shard_size": N_TRAIN})
    fan_job, fan = _run(team, {**BODY, "shard_size": 400})
    assert fan_job["shards"]["total"] == fan_job["shards"]["succeeded"] > 1
    _compare(team, fan_job, fan, one_job, one)
    children = team.client.get(f"/jobs?parent={fan_job['id']}").json()["items"]
    ran_on = {team.redis().hget(f"rq:job:{c['id']}", "worker_name") for c in children[:-1]}
    assert len(ran_on) == 2, ran_on  # both hosts took shards
    for home in team.hosts:  # each read the model from the store into its own cache
        assert list((home / "cache" / "store" / "models" / MODEL).glob("*/.complete")), home
        assert not (home / "store").exists()  # nothing went to a local store
    assert not (team.home / "store").exists()
    team.one = (one_job, one)


def test_a_paused_store_fails_a_job_in_its_bounds_and_shards_are_retried_when_it_returns(team):
    one_job, one = getattr(team, "one", None) or _run(team, {**BODY, "shard_size": N_TRAIN})
    r = team.redis()
    outages = sum(int(v) for v in r.hgetall("explainq:metrics:store_unavailable").values())
    team.proxy.pause()
    try:
        # a job whose only store call is the upload of its file at its end
        t0 = time.monotonic()
        job = team.client.post("/test/sleep", json={"steps": 1, "step_s": 0}).json()["id"]
        failed = team.wait(job, timeout_s=60)
        took = time.monotonic() - t0
        assert failed["status"] == "failed" and failed["error"]["code"] == "store_unavailable", failed
        # 2 attempts of 2 s and 0.5 s of backoff: failed within the store's bounds, never "running" for ever
        assert took < 20, took

        r_fan = team.client.post("/tracin", json={"model": MODEL, **BODY, "shard_size": 400, "shard_retries": 5})
        assert r_fan.status_code == 202, r_fan.text
        fan = r_fan.json()["id"]
        deadline = time.monotonic() + 90
        while sum(int(v) for v in r.hgetall("explainq:metrics:store_unavailable").values()) <= outages + 1:
            assert time.monotonic() < deadline, team.worker_logs()[-4000:]
            time.sleep(0.2)
    finally:
        team.proxy.resume()
    fan_job = team.wait(fan, timeout_s=300)
    assert fan_job["status"] == "succeeded", (fan_job, team.worker_logs()[-4000:])
    children = team.client.get(f"/jobs?parent={fan}").json()["items"][:-1]
    retried = [c["id"] for c in children if int(r.hget(f"rq:job:{c['id']}", "retries_left") or 5) < 5]
    assert retried, "no shard met the paused store"
    _compare(team, fan_job, team.client.get(f"/jobs/{fan}/result").json(), one_job, one)
