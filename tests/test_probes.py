"""Kubernetes probes of the API pod: ``/livez`` and ``/readyz`` answer without a key, never look at workers, and
say why in a body that holds no address, path or secret (issue 38, part 5)."""

from __future__ import annotations

import socket

from fastapi.testclient import TestClient

from tests.service import api_client

KEYS = "alice:key-a"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed once the socket is: nothing listens there


def test_probes_answer_without_a_key_and_without_workers(tmp_path):
    with api_client(tmp_path, EXPLAINQ_API_KEYS=KEYS) as client:
        assert client.get("/jobs").status_code == 401  # keys are configured
        assert client.get("/ready").status_code == 401  # /ready keeps its behaviour
        for headers in ({}, {"Authorization": "Bearer wrong"}):  # a probe never authenticates
            r = client.get("/livez", headers=headers)
            assert r.status_code == 200 and r.json() == {"status": "ok"}
            assert client.get("/readyz", headers=headers).status_code == 200
        r = client.get("/readyz")  # no worker listens on any queue
        assert r.status_code == 200 and r.json() == {"status": "ready"}
        assert r.headers["x-content-type-options"] == "nosniff"
        # /ready with a key still wants a worker on every queue
        ready = client.get("/ready", headers={"Authorization": "Bearer key-a"})
        assert ready.status_code == 503 and ready.json()["reasons"]


def test_readyz_is_503_when_redis_is_unreachable_and_livez_stays_200(tmp_path):
    from app.main import create_app
    from core.settings import Settings

    port = _closed_port()
    app = create_app(Settings(EXPLAINQ_HOME=str(tmp_path), REDIS_URL=f"redis://:s3cret@127.0.0.1:{port}/0",
                              EXPLAINQ_API_KEYS=KEYS, EXPLAINQ_REDIS_TIMEOUT_S=0.5))
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/livez").status_code == 200
        r = client.get("/readyz")
        assert r.status_code == 503
        body = r.json()
        assert body["status"] == "unavailable" and body["reasons"], body
        assert body["reasons"][0].startswith("redis")
        for leak in (str(port), "127.0.0.1", "s3cret", str(tmp_path)):
            assert leak not in r.text
        assert client.get("/livez").json() == {"status": "ok"}
        assert client.get("/health").json() == {"status": "ok"}  # unchanged


def test_readyz_is_503_on_a_unix_socket_url_without_naming_the_socket(tmp_path):
    from app.main import create_app
    from core.settings import Settings

    sock = tmp_path / "no-such-redis.sock"
    app = create_app(Settings(EXPLAINQ_HOME=str(tmp_path), REDIS_URL=f"unix://{sock}", EXPLAINQ_API_KEYS=KEYS))
    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.get("/readyz")
        assert r.status_code == 503 and str(sock) not in r.text and "no-such-redis" not in r.text
        assert client.get("/livez").status_code == 200


def test_readyz_gives_up_quickly_on_a_redis_that_never_answers(tmp_path):
    import time

    from app.main import create_app
    from core.settings import Settings

    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        app = create_app(Settings(EXPLAINQ_HOME=str(tmp_path), REDIS_URL=f"redis://127.0.0.1:{port}/0",
                                  EXPLAINQ_API_KEYS=KEYS, EXPLAINQ_REDIS_TIMEOUT_S=5))
        with TestClient(app, raise_server_exceptions=False) as client:
            for _ in range(2):
                t0 = time.monotonic()
                r = client.get("/readyz")
                assert r.status_code == 503 and r.json()["reasons"] == ["redis timed out"], r.text
                assert time.monotonic() - t0 < 3  # the probe's own 1 s limit, not the client's 5 s ones
            assert client.get("/livez").status_code == 200
