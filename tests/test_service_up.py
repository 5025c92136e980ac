"""`explainq up` as a user runs it: embedded Redis, supervised workers, the API, clean shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from core.redis_server import free_port
from tests.service import ROOT


def _children(pid: int) -> dict[int, str]:
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                out[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
    return out


def _workers(pid: int) -> set[int]:
    return {p for p, cmd in _children(pid).items() if "explainq.cli worker" in cmd}


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise TimeoutError(what)


@pytest.mark.slow
def test_up_serves_restarts_dead_workers_and_stops_cleanly(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(EXPLAINQ_HOME=str(tmp_path), EXPLAINQ_HEARTBEAT_TTL_S="5", PYTHONPATH=str(ROOT))
    log = open(tmp_path / "up.log", "wb")
    up = subprocess.Popen([sys.executable, "-m", "explainq.cli", "up", "--no-demo", "--port", str(port)],
                          cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        def ready():
            try:
                return httpx.get(f"{base}/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        _wait(ready, 90, "service never became ready:\n" + (tmp_path / "up.log").read_text())
        assert httpx.get(f"{base}/docs").status_code == 200
        assert f"dashboard {base}/ui" in (tmp_path / "up.log").read_text()
        # Embedded Redis keeps an append-only file under EXPLAINQ_HOME/redis.
        assert (tmp_path / "redis").is_dir()
        _wait(lambda: any((tmp_path / "redis").rglob("*.aof*")), 10, "no AOF file")

        def two_workers(exclude: int | None = None):
            found = _workers(up.pid)
            return found if len(found) == 2 and exclude not in found else None

        workers = _wait(two_workers, 30, "two workers")
        victim = sorted(workers)[0]
        os.kill(victim, signal.SIGKILL)
        replaced = _wait(lambda: two_workers(exclude=victim), 30, "killed worker was not restarted")
        assert victim not in replaced
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            code = up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
            raise
    assert code == 0, (tmp_path / "up.log").read_text()
    assert not _children(up.pid)
    out = (tmp_path / "up.log").read_text()
    assert "restarting it" in out


def test_api_refuses_public_bind_without_keys(tmp_path):
    env = {**os.environ, "EXPLAINQ_HOME": str(tmp_path), "EXPLAINQ_API_KEYS": "", "PYTHONPATH": str(ROOT)}
    for cmd in (["api", "--host", "0.0.0.0"], ["up", "--host", "0.0.0.0", "--no-demo"]):
        r = subprocess.run([sys.executable, "-m", "explainq.cli", *cmd], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0 and "refusing to listen" in r.stderr


def test_up_prints_the_dashboard_url_first_and_starts_workers_once_the_first_demo_model_is_ready(tmp_path, monkeypatch, capsys):
    import socket

    from explainq import cli

    monkeypatch.setenv("EXPLAINQ_HOME", str(tmp_path))
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")  # no embedded Redis
    listener = socket.create_server(("127.0.0.1", 0))  # the API, listening
    port = listener.getsockname()[1]
    args = cli.build_parser().parse_args(["up", "--port", str(port)])
    sup = cli.Supervisor(args)
    spawned: list[str] = []

    class Running:
        def poll(self):
            return None

    def spawn(name: str) -> None:
        spawned.append(name)
        sup.procs[name] = Running()

    printed_before_demo: list[str] = []

    def demo():
        printed_before_demo.append(capsys.readouterr().out)
        return Running()

    monkeypatch.setattr(sup, "_spawn", spawn)
    monkeypatch.setattr(sup, "_start_demo", demo)
    try:
        sup.start()
    finally:
        listener.close()
    assert f"http://127.0.0.1:{port}/ui" in printed_before_demo[0]
    assert "explainq is up" in printed_before_demo[0]
    assert spawned == ["api"]  # the demo runs in the background; the workers wait for its first model
    plan = {"steps": [{"name": "lora-demo", "models": [], "state": "ready"},
                      {"name": "m", "models": ["m"], "state": "preparing"}]}
    monkeypatch.setattr(sup, "_demo_plan", lambda: plan)
    sup.check_demo()
    assert spawned == ["api"]
    plan["steps"][1]["state"] = "ready"
    sup._next_demo_poll = 0.0
    sup.check_demo()
    assert spawned[0] == "api" and len(spawned) > 1  # the first model is ready: the workers start
    # a demo step that never ends holds the workers back for WORKERS_AT_LATEST_S at most
    late = cli.Supervisor(args)
    late_spawned: list[str] = []
    monkeypatch.setattr(late, "_spawn", late_spawned.append)
    monkeypatch.setattr(late, "_demo_plan", lambda: {"steps": [{"name": "m", "models": ["m"], "state": "preparing"}]})
    late.demo, late.demo_started_at = Running(), time.monotonic()
    late.check_demo()
    assert late_spawned == []
    late.demo_started_at, late._next_demo_poll = time.monotonic() - cli.WORKERS_AT_LATEST_S, 0.0
    late.check_demo()
    assert late_spawned and all(name.startswith("worker:") for name in late_spawned)
    assert cli.banner("::", 8000).split()[4] == "http://[::]:8000/ui"
