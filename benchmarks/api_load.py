"""API throughput: `GET /jobs/{id}` and `POST` submission against a bare FastAPI endpoint doing one HGETALL.

Two configurations of the service are measured in the same run, against the same private redis-server:

- ``service``: the app alone, no API keys, uvicorn quiet (the earlier measurement, kept for comparison);
- ``as up``: the app as ``explainq up`` runs it, started through ``explainq api`` itself (``explainq.cli``, so with the
  server settings a user gets: its event loop and HTTP parser, its garbage-collector tuning, its JSON log lines):
  API keys on (every request authenticated), log level info with the access log (to /dev/null here), and a worker
  per queue started the way ``up`` starts them, idle (RQ-suspended, so submitted jobs stay queued and the worker
  takes no CPU from the API).

The bare endpoint and ``service`` run under ``python -m uvicorn`` with its defaults, which pick the same event loop
and HTTP parser as ``explainq api`` (uvloop and httptools, dependencies of the package; asyncio and h11 where they
are missing): the table's heading names the pair in use.

Quotas are on in both, with limits raised above what the run submits (``EXPLAINQ_MAX_ACTIVE_JOBS`` and
``EXPLAINQ_MAX_QUEUE_LENGTH``) so that every request is admitted: the admission check still runs on every POST.
Every server is a single uvicorn process. The load generator is a minimal asyncio HTTP/1.1 keep-alive client (so
the client, not the server, is not the bottleneck) with 64 concurrent connections. Rounds alternate between the
endpoints and the median round is reported, with each server process's own CPU time per request (from /proc), a
cost that load from other processes on a shared machine disturbs less than req/s.

    python benchmarks/api_load.py [--connections 64] [--seconds 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.redis_server import EmbeddedRedis, free_port  # noqa: E402
from explainq.cli import server_implementations  # noqa: E402

SERVICE_APP = '''
# The real app; the POST target is a test-only kind so the benchmark needs no model (the submission path is
# the same generic code for every kind: validation, idempotency bookkeeping, enqueue).
from tests.jobkinds import register_test_kinds

register_test_kinds()
from app.main import create_app

app = create_app()
'''

# `explainq api` as a user runs it, with the test kinds registered first (the POST target).
UP_API = '''
import sys

from tests.jobkinds import register_test_kinds

register_test_kinds()
from explainq.cli import main

main(["api", "--host", "127.0.0.1", "--port", sys.argv[1]])
'''

BARE_APP = '''
import os
import redis.asyncio as aioredis
from fastapi import FastAPI

app = FastAPI()
r = aioredis.Redis.from_url(os.environ["REDIS_URL"], max_connections=256)
KEY = os.environ["BENCH_KEY"]


@app.get("/bare")
async def bare():
    # The job hash holds binary fields (RQ compresses the call data), so return it latin-1 decoded.
    return {k.decode(): v.decode("latin-1") for k, v in (await r.hgetall(KEY)).items()}
'''


async def _worker(host, port, request: bytes, deadline: float, latencies: list, errors: list):
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            writer.write(request)
            await writer.drain()
            status_line = await reader.readline()
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            code = int(status_line.split()[1])
            latencies.append(time.perf_counter() - t0)
            if code >= 400:
                errors.append(code)
    finally:
        writer.close()


async def _load(host, port, request: bytes, connections: int, seconds: float):
    latencies: list[float] = []
    errors: list[int] = []
    deadline = time.perf_counter() + seconds
    t0 = time.perf_counter()
    await asyncio.gather(*[_worker(host, port, request, deadline, latencies, errors) for _ in range(connections)])
    elapsed = time.perf_counter() - t0
    latencies.sort()
    n = len(latencies)
    return {
        "requests": n, "errors": len(errors), "rps": n / elapsed,
        "p50_ms": 1000 * latencies[n // 2] if n else float("nan"),
        "p99_ms": 1000 * latencies[min(n - 1, int(n * 0.99))] if n else float("nan"),
    }


API_KEY = "bench-key-0123456789"


def _auth(token: str | None) -> str:
    return f"Authorization: Bearer {token}\r\n" if token else ""


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc), the load-independent cost measure."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(pid: int, host, port, request: bytes, connections: int, seconds: float) -> dict:
    cpu0 = _cpu_s(pid)
    out = asyncio.run(_load(host, port, request, connections, seconds))
    out["cpu_ms"] = 1000 * (_cpu_s(pid) - cpu0) / max(out["requests"], 1)
    return out


def _get(path: str, token: str | None = None) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: keep-alive\r\n{_auth(token)}\r\n".encode()


def _post(path: str, body: dict, token: str | None = None) -> bytes:
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: bench\r\nConnection: keep-alive\r\nContent-Type: application/json\r\n"
            f"{_auth(token)}Content-Length: {len(data)}\r\n\r\n")
    return head.encode() + data


def _serve(cmd: list[str], env: dict, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"server {cmd} did not start")


def _idle_workers(env: dict, redis_url: str) -> list[subprocess.Popen]:
    """One worker per queue, started as ``explainq up`` starts them, then RQ-suspended (idle)."""
    import redis
    from rq import Worker
    from rq.suspension import suspend

    from core.contract.kind import QUEUES

    conn = redis.Redis.from_url(redis_url)
    suspend(conn)
    procs = [subprocess.Popen([sys.executable, "-m", "explainq.cli", "worker", "--queues", q], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for q in QUEUES]
    deadline = time.monotonic() + 120
    while len(Worker.all(connection=conn)) < len(QUEUES):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError("workers did not start")
        time.sleep(0.2)
    return procs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 round of 2 s")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 2.0

    tmp = Path(tempfile.mkdtemp(prefix="explainq-bench-"))
    redis_server = EmbeddedRedis(tmp / "redis", appendonly=False).start()
    procs: list[subprocess.Popen] = []
    load_before = os.getloadavg()[0]
    try:
        limits = {"EXPLAINQ_MAX_ACTIVE_JOBS": str(10**9), "EXPLAINQ_MAX_QUEUE_LENGTH": str(10**9)}
        env = {**os.environ, "REDIS_URL": redis_server.url, "EXPLAINQ_HOME": str(tmp), "EXPLAINQ_API_KEYS": "",
               "PYTHONPATH": str(ROOT), **limits}
        app_port, up_port, bare_port = free_port(), free_port(), free_port()
        uvicorn = [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1"]
        quiet = ["--no-access-log", "--log-level", "warning"]
        (tmp / "service_app.py").write_text(SERVICE_APP)
        app_env = {**env, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp}"}
        app_proc = _serve([*uvicorn, *quiet, "--port", str(app_port), "service_app:app"], app_env, app_port)
        procs.append(app_proc)
        # As `explainq up` runs `explainq api`: log level info, access log on, API keys on; idle workers.
        up_env = {**app_env, "EXPLAINQ_API_KEYS": f"bench:{API_KEY},other:another-key-0123456789"}
        procs += _idle_workers(up_env, redis_server.url)
        (tmp / "up_api.py").write_text(UP_API)
        up_proc = _serve([sys.executable, str(tmp / "up_api.py"), str(up_port)], up_env, up_port)
        procs.append(up_proc)
        # A real job submitted through the API; its hash is what both GET endpoints read.
        submit_route, submit_body = "/test/sleep", {"steps": 1, "step_s": 0}
        r = httpx.post(f"http://127.0.0.1:{app_port}{submit_route}", json=submit_body)
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        r = httpx.post(f"http://127.0.0.1:{up_port}{submit_route}", json=submit_body,
                       headers={"Authorization": f"Bearer {API_KEY}"})
        assert r.status_code == 202, r.text
        up_job_id = r.json()["id"]
        (tmp / "bare_app.py").write_text(BARE_APP)
        bare_env = {**env, "BENCH_KEY": f"rq:job:{job_id}", "PYTHONPATH": str(tmp)}
        bare_proc = _serve([*uvicorn, *quiet, "--port", str(bare_port), "bare_app:app"], bare_env, bare_port)
        procs.append(bare_proc)

        targets = {
            "bare FastAPI + HGETALL": (bare_proc.pid, bare_port, _get("/bare")),
            "GET /jobs/{id} (service)": (app_proc.pid, app_port, _get(f"/jobs/{job_id}")),
            f"POST {submit_route} (service)": (app_proc.pid, app_port, _post(submit_route, submit_body)),
            "GET /jobs/{id} (as up)": (up_proc.pid, up_port, _get(f"/jobs/{up_job_id}", API_KEY)),
            f"POST {submit_route} (as up)": (up_proc.pid, up_port, _post(submit_route, submit_body, API_KEY)),
        }
        rounds: dict[str, list[dict]] = {name: [] for name in targets}
        for _, port, req in targets.values():  # warm-up
            asyncio.run(_load("127.0.0.1", port, req, args.connections, 1.0))
        for _ in range(args.rounds):
            for name, (pid, port, req) in targets.items():
                rounds[name].append(_measure(pid, "127.0.0.1", port, req, args.connections, args.seconds))
        bare_rps = statistics.median(r["rps"] for r in rounds["bare FastAPI + HGETALL"])
        load = os.getloadavg()
        loop, http = server_implementations()
        print(f"\nAPI load: {args.connections} connections, {args.rounds} round(s) x {args.seconds:.0f} s, "
              f"median round; 1 uvicorn process per server ({loop} + {http}), {os.cpu_count()} CPU(s), "
              f"load average {load_before:.1f} before, {load[0]:.1f} at the end\n")
        bare_cpu = statistics.median(r["cpu_ms"] for r in rounds["bare FastAPI + HGETALL"])
        print("| endpoint | requests | errors | req/s | p50 ms | p99 ms | vs bare | server CPU ms/req | "
              "bare CPU / CPU |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name, rs in rounds.items():
            med = sorted(rs, key=lambda r: r["rps"])[len(rs) // 2]
            total = sum(r["requests"] for r in rs)
            errors = sum(r["errors"] for r in rs)
            cpu = statistics.median(r["cpu_ms"] for r in rs)
            print(f"| {name} | {total} | {errors} | {med['rps']:.0f} | {med['p50_ms']:.1f} | {med['p99_ms']:.1f} "
                  f"| {med['rps'] / bare_rps:.2f}x | {cpu:.2f} | {bare_cpu / cpu:.2f}x |")
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        redis_server.stop()


if __name__ == "__main__":
    main()
