"""Test harness: a private redis-server, real worker subprocesses and an HTTP client on the real app.

    with Service(tmp_path) as svc:
        r = svc.client.post("/tracin", json={...})
        job = svc.wait(r.json()["id"])             # polls GET /jobs/{id} until it ends
        result = svc.client.get(f"/jobs/{job['id']}/result").json()

Register test models in ``svc.settings`` (``core.registry.register_model``; Redis runs from construction on) before
``start()`` (pass ``start=False`` to the constructor and call ``svc.start()``) with ``preload=True`` so that workers
preload them; other models load on first use.

Redis runs with a password (generated under ``<home>/redis/password``); ``svc.redis_server.url`` carries it. The
workers register the test kinds of ``tests/jobkinds.py`` through ``EXPLAINQ_KIND_PLUGINS``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from fastapi.testclient import TestClient

from core.redis_server import EmbeddedRedis
from core.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def api_client(home: Path, **settings: Any) -> Iterator[TestClient]:
    """The real app in this process (FastAPI's TestClient, server exceptions answered as 500s) over a private Redis
    under ``home``; ``settings`` are extra Settings fields (``EXPLAINQ_API_KEYS=...``). No workers."""
    server = EmbeddedRedis(home / "redis", appendonly=False).start()
    try:
        from app.main import create_app

        app = create_app(Settings(EXPLAINQ_HOME=str(home), REDIS_URL=server.url, **settings))
        with TestClient(app, raise_server_exceptions=False) as client:
            yield client
    finally:
        server.stop()


class Service:
    def __init__(
        self,
        home: Path,
        queues: tuple[str, ...] = ("explain,bulk,train",),
        env: dict[str, str] | None = None,
        api_keys: str = "",
        heartbeat_ttl_s: int = 60,
        redis_server: EmbeddedRedis | None = None,
        start: bool = True,
    ):
        self.home = Path(home)
        self.queues = queues
        self.own_redis = redis_server is None
        self.redis_server = redis_server or EmbeddedRedis(self.home / "redis")
        self.heartbeat_ttl_s = heartbeat_ttl_s
        self.api_keys = api_keys
        self.extra_env = env or {}
        self.workers: list[subprocess.Popen] = []
        self.client: TestClient | None = None
        # Redis starts now, so models and datasets can be registered before the workers start.
        if self.own_redis and not self.redis_server.alive():
            self.redis_server.start()
        self.settings = Settings(EXPLAINQ_HOME=str(self.home), REDIS_URL=self.redis_server.url,
                                 EXPLAINQ_API_KEYS=api_keys, EXPLAINQ_HEARTBEAT_TTL_S=heartbeat_ttl_s,
                                 **self.extra_env)
        if start:
            self.start()

    # ---- lifecycle
    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "EXPLAINQ_HOME": str(self.home),
            "REDIS_URL": self.redis_server.url,
            "EXPLAINQ_API_KEYS": self.api_keys,
            "EXPLAINQ_HEARTBEAT_TTL_S": str(self.heartbeat_ttl_s),
            "PYTHONPATH": str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "2"),
            "EXPLAINQ_KIND_PLUGINS": "tests.jobkinds:register_test_kinds",
        })
        env.update(self.extra_env)
        return env

    def start(self) -> Service:
        if self.own_redis and not self.redis_server.alive():
            self.redis_server.start()
        self.settings = Settings(EXPLAINQ_HOME=str(self.home), REDIS_URL=self.redis_server.url,
                                 EXPLAINQ_API_KEYS=self.api_keys, EXPLAINQ_HEARTBEAT_TTL_S=self.heartbeat_ttl_s,
                                 **{"EXPLAINQ_KIND_PLUGINS": self.env["EXPLAINQ_KIND_PLUGINS"], **self.extra_env})
        for queues in self.queues:
            self.start_worker(queues)
        self.wait_for_workers(len(self.queues))
        from app.main import create_app

        # One event loop for the client's lifetime (the async Redis pool is bound to it).
        self.client = TestClient(create_app(self.settings))
        self.client.__enter__()
        return self

    def start_worker(self, queues: str, args: tuple[str, ...] = (), env: dict[str, str] | None = None
                     ) -> subprocess.Popen:
        """Start one worker on ``queues`` (extra ``explainq worker`` arguments in ``args``, extra variables of
        its own in ``env``)."""
        log = open(self.home / f"worker-{len(self.workers)}.log", "ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "explainq.cli", "worker", "--queues", queues, *args],
            env={**self.env, **(env or {})}, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.workers.append(proc)
        return proc

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_server.url)

    def wait_for_workers(self, n: int, timeout_s: float = 90.0) -> None:
        from rq import Worker

        conn = self.redis()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(Worker.all(connection=conn)) >= n:
                return
            dead = [p for p in self.workers if p.poll() is not None]
            if dead:
                raise RuntimeError(f"worker exited early:\n{self.worker_logs()}")
            time.sleep(0.2)
        raise TimeoutError(f"{n} worker(s) did not register in {timeout_s}s:\n{self.worker_logs()}")

    def worker_logs(self) -> str:
        return "\n".join(p.read_text()[-4000:] for p in sorted(self.home.glob("worker-*.log")))

    def stop(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.workers:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self.client is not None:
            self.client.__exit__(None, None, None)
            self.client = None
        if self.own_redis:
            self.redis_server.stop()

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- helpers
    def wait(self, job_id: str, timeout_s: float = 120.0, statuses=("succeeded", "failed", "canceled"),
             headers: dict[str, str] | None = None, interval_s: float = 0.1) -> dict[str, Any]:
        """Poll ``GET /jobs/{id}`` every ``interval_s`` until the status is one of ``statuses``; returns the job."""
        deadline = time.monotonic() + timeout_s
        body: dict[str, Any] = {}
        while time.monotonic() < deadline:
            r = self.client.get(f"/jobs/{job_id}", headers=headers)
            if r.status_code == 200:
                body = r.json()
                if body["status"] in statuses:
                    return body
            time.sleep(interval_s)
        raise TimeoutError(f"job {job_id} not in {statuses} after {timeout_s}s: {body}\n{self.worker_logs()}")

    def artifact(self, job_id: str, name: str, headers: dict[str, str] | None = None) -> bytes:
        """Download one of a job's files through ``GET /jobs/{id}/artifacts/{name}``."""
        r = self.client.get(f"/jobs/{job_id}/artifacts/{name}", headers=headers)
        assert r.status_code == 200, (r.status_code, r.text)
        return r.content
