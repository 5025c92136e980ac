"""API throughput: `GET /jobs/{id}` and `POST` submission against a bare FastAPI endpoint doing one HGETALL.

All three run in the same session against the same private redis-server, each server a single uvicorn process
with the same settings. The load generator is a minimal asyncio HTTP/1.1 keep-alive client (so the client, not
the server, is not the bottleneck) with 64 concurrent connections. Rounds alternate between the endpoints and the
median round is reported.

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

from app.redis_server import EmbeddedRedis, free_port  # noqa: E402

SERVICE_APP = '''
# The real app; the POST target is a test-only kind so the benchmark needs no model (the submission path is
# the same generic code for every kind: validation, idempotency bookkeeping, enqueue).
from tests.jobkinds import register_test_kinds

register_test_kinds()
from app.main import create_app

app = create_app()
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


def _get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: keep-alive\r\n\r\n".encode()


def _post(path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: bench\r\nConnection: keep-alive\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n")
    return head.encode() + data


def _serve(cmd: list[str], env: dict, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=1)
            return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"server {cmd} did not start")


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
    try:
        env = {**os.environ, "REDIS_URL": redis_server.url, "EXPLAINQ_HOME": str(tmp), "EXPLAINQ_API_KEYS": "",
               "PYTHONPATH": str(ROOT)}
        app_port, bare_port = free_port(), free_port()
        uvicorn = [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--no-access-log", "--log-level",
                   "warning"]
        (tmp / "service_app.py").write_text(SERVICE_APP)
        app_env = {**env, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp}"}
        procs.append(_serve([*uvicorn, "--port", str(app_port), "service_app:app"], app_env, app_port))
        # A real job submitted through the API; its hash is what both GET endpoints read.
        submit_route, submit_body = "/test/sleep", {"steps": 1, "step_s": 0}
        r = httpx.post(f"http://127.0.0.1:{app_port}{submit_route}", json=submit_body)
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        (tmp / "bare_app.py").write_text(BARE_APP)
        bare_env = {**env, "BENCH_KEY": f"rq:job:{job_id}", "PYTHONPATH": str(tmp)}
        procs.append(_serve([*uvicorn, "--port", str(bare_port), "bare_app:app"], bare_env, bare_port))

        targets = {
            "bare FastAPI + HGETALL": (bare_port, _get("/bare")),
            "GET /jobs/{id}": (app_port, _get(f"/jobs/{job_id}")),
            f"POST {submit_route}": (app_port, _post(submit_route, submit_body)),
        }
        rounds: dict[str, list[dict]] = {name: [] for name in targets}
        for port, req in targets.values():  # warm-up
            asyncio.run(_load("127.0.0.1", port, req, args.connections, 1.0))
        for _ in range(args.rounds):
            for name, (port, req) in targets.items():
                rounds[name].append(asyncio.run(_load("127.0.0.1", port, req, args.connections, args.seconds)))
        bare_rps = statistics.median(r["rps"] for r in rounds["bare FastAPI + HGETALL"])
        print(f"\nAPI load: {args.connections} connections, {args.rounds} round(s) x {args.seconds:.0f} s, "
              f"median round; 1 uvicorn process per server, {os.cpu_count()} CPU(s)\n")
        print("| endpoint | requests | errors | req/s | p50 ms | p99 ms | vs bare |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, rs in rounds.items():
            med = sorted(rs, key=lambda r: r["rps"])[len(rs) // 2]
            total = sum(r["requests"] for r in rs)
            errors = sum(r["errors"] for r in rs)
            print(f"| {name} | {total} | {errors} | {med['rps']:.0f} | {med['p50_ms']:.1f} | {med['p99_ms']:.1f} "
                  f"| {med['rps'] / bare_rps:.2f}x |")
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        redis_server.stop()


if __name__ == "__main__":
    main()
