"""Trust nothing in Redis: foreign RQ jobs and unknown kinds never run; Redis needs a password."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from rq import Queue
from rq.serializers import JSONSerializer

from core.redis_server import EmbeddedRedis, free_port, redact_url, redis_client
from tests.service import ROOT, Service

NO_RETRY = Retry(NoBackoff(), 0)  # a refused password is final: redis-py's default retries only add seconds


def _ended(svc: Service, job_id: str, timeout_s: float = 60) -> dict:
    conn = svc.redis()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = conn.hget(f"rq:job:{job_id}", "status")
        if status in (b"finished", b"failed"):
            meta = conn.hget(f"rq:job:{job_id}", "meta")
            return {"status": status.decode(), "meta": json.loads(meta) if meta else {}}
        time.sleep(0.1)
    raise TimeoutError(svc.worker_logs())


def test_foreign_jobs_and_unknown_kinds_are_refused_without_running_anything(tmp_path):
    marker = Path("/tmp") / f"explainq-pwned-{uuid.uuid4().hex}"
    with Service(tmp_path, queues=("explain",)) as svc:
        conn = svc.redis()
        attacks = [
            Queue("explain", connection=conn, serializer=JSONSerializer).enqueue("os.system", f"touch {marker}"),
            Queue("explain", connection=conn).enqueue("os.system", f"touch {marker}"),  # pickled call data
            Queue("explain", connection=conn, serializer=JSONSerializer).enqueue(
                "workers.runner.execute", args=("no_such_kind", {"cmd": f"touch {marker}"})),
        ]
        for job in attacks:
            ended = _ended(svc, job.id)
            assert ended["status"] == "failed"
            assert ended["meta"]["error"]["code"] == "unknown_kind", ended
        bad = Queue("explain", connection=conn, serializer=JSONSerializer).enqueue(
            "workers.runner.execute", args=("test_sleep", {"steps": "many", "shell": "rm -rf /"}))
        ended = _ended(svc, bad.id)
        assert ended["status"] == "failed" and ended["meta"]["error"]["code"] == "invalid_payload"
        assert not marker.exists()
        # The worker is unharmed.
        r = svc.client.post("/test/sleep", json={"steps": 1, "step_s": 0})
        assert svc.wait(r.json()["id"])["status"] == "succeeded"
    assert not marker.exists()


def test_embedded_redis_requires_its_generated_password(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis").start()
    try:
        pw_file = tmp_path / "redis" / "password"
        assert stat.S_IMODE(pw_file.stat().st_mode) == 0o600
        password = pw_file.read_text().strip()
        assert len(password) >= 32 and password in server.url
        assert password not in server.redacted_url and "***" in server.redacted_url
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(port=server.port, password="wrong", retry=NO_RETRY).ping()
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(port=server.port, protocol=2, retry=NO_RETRY).set("k", "v")  # no password at all
        assert redis_client(server.url).ping()
        # The password never shows on redis-server's command line.
        assert password not in Path(f"/proc/{server.proc.pid}/cmdline").read_bytes().decode(errors="replace")
    finally:
        server.stop()
    again = EmbeddedRedis(tmp_path / "redis")
    assert again.password == password  # kept across restarts


def test_redis_urls_with_passwords_and_tls():
    assert redact_url("redis://:s3cret@h:6379/0") == "redis://:***@h:6379/0"
    assert redact_url("rediss://user:s3cret@h:6380/1") == "rediss://user:***@h:6380/1"
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"
    client = redis_client("rediss://:s3cret@example.invalid:6380/0")
    kwargs = client.connection_pool.connection_kwargs
    assert client.connection_pool.connection_class is redis.SSLConnection
    assert kwargs["password"] == "s3cret" and kwargs["socket_keepalive"] is True


def test_no_password_is_refused_off_loopback(tmp_path):
    with pytest.raises(ValueError, match="without a password"):
        EmbeddedRedis(tmp_path / "r", host="0.0.0.0", password="")
    env = {**os.environ, "EXPLAINQ_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "explainq.cli", "redis", "--host", "0.0.0.0", "--no-password"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "without a password" in r.stderr


def test_redis_command_serves_other_hosts_with_a_password_file_and_never_prints_it(tmp_path):
    pw_file = tmp_path / "secret"
    pw_file.write_text("correct-horse-battery-staple\n")
    port = free_port()
    env = {**os.environ, "EXPLAINQ_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "explainq.cli", "redis", "--host", "0.0.0.0", "--port", str(port),
                             "--password-file", str(pw_file)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        assert first.startswith("REDIS_URL=redis://:***@") and f":{port}/0" in first
        assert redis.Redis(port=port, password="correct-horse-battery-staple").ping()
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(port=port, password="guess", retry=NO_RETRY).ping()
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert "correct-horse-battery-staple" not in first + out + err
    records = [json.loads(line) for line in err.splitlines() if line.strip()]  # JSON log lines
    assert any("redis listening" in r["message"] for r in records)
