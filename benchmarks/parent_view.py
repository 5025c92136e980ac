"""A fanned-out parent's view (what ``GET /jobs/{id}``, its events and the listing compute) from its counters against
the reference that reads every shard, over a private Redis.

For each N in ``--shards`` a parent with N fake shard records (job hashes as RQ writes them: 60 % finished, 2 %
failed, ``--running`` running with progress in their meta, the rest deferred) is built, its counters are brought
up to date by the same script the workers run (``fanout.shard_sync`` on every shard), and both views are checked to
be equal (ETA aside) before each is timed: the parent's job fields, then ``fanout.apply`` with ``scan=True`` (the
reference: one pipelined HMGET per shard) or without (the counters: one script call, reading the running shards
only). Each number is the median of ``--repeats`` calls.

    python benchmarks/parent_view.py --shards 10 100 1000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from redis import Redis  # noqa: E402

from core import fanout  # noqa: E402
from core.jobview import VIEW_FIELDS, fields_to_raw, job_view  # noqa: E402
from core.keys import JOB_PREFIX  # noqa: E402
from core.redis_server import EmbeddedRedis  # noqa: E402

TS = "2026-01-01T00:00:00.000000Z"


def build(r: Redis, parent: str, n: int, running: int, items_per_shard: int = 4) -> None:
    ranges = fanout.plan(n * items_per_shard, items_per_shard)
    plan = {"shards": n, "shard_size": items_per_shard, "items": n * items_per_shard, "unit": "samples",
            "ranges": ranges, "max_failed_fraction": 0.05, "shard_kind": "fan_shard", "reduce_kind": "fan_reduce"}
    with r.pipeline(transaction=False) as pipe:
        pipe.hset(JOB_PREFIX + parent, mapping={
            "status": "finished", "origin": "explain", "created_at": TS, "started_at": TS, "ended_at": TS,
            "meta": json.dumps({"kind": "fan", "owner": "bench", "fanout": plan})})
        pipe.hset(JOB_PREFIX + fanout.reduce_id(parent), mapping={"status": "deferred", "meta": "{}"})
        fanout.init_counters(pipe, parent, n, n * items_per_shard, 3600)
        for i in range(n):
            meta = {"kind": "fan_shard", "owner": "bench", "parent": parent, "shard": i}
            if i < int(0.6 * n):
                status = "finished"
            elif i < int(0.62 * n):
                status = "failed"
                meta["error"] = {"code": "bad_shard", "message": "fails on purpose"}
            elif i < int(0.62 * n) + running:
                status = "started"
                meta["progress"] = {"done": 2, "total": 4, "unit": "steps"}
            else:
                status = "deferred"
            pipe.hset(JOB_PREFIX + fanout.shard_id(parent, i), mapping={
                "status": status, "origin": "bulk", "created_at": TS, "meta": json.dumps(meta),
                "data": b"x" * 400, **({"started_at": TS} if status != "deferred" else {}),
                **({"ended_at": TS} if status in ("finished", "failed") else {})})
        pipe.execute()
    for i in range(n):
        fanout.shard_sync(r, fanout.shard_id(parent, i), parent)


def view(r: Redis, parent: str, scan: bool) -> dict:
    raw = fields_to_raw(r.hmget(JOB_PREFIX + parent, *VIEW_FIELDS))
    return fanout.apply(r, parent, job_view(parent, raw), raw, scan=scan)


def _without_eta(v: dict) -> dict:
    return {**v, "progress": {k: x for k, x in v["progress"].items() if k != "eta_s"}}


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--running", type=int, default=2, help="shards running (the owner's window)")
    ap.add_argument("--repeats", type=int, default=51)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as home:
        server = EmbeddedRedis(Path(home) / "redis", appendonly=False).start()
        try:
            r = Redis.from_url(server.url)
            print("| shards | scan (ms) | counters (ms) | scan / counters |")
            print("|---:|---:|---:|---:|")
            for n in args.shards:
                parent = f"bench{n}"
                build(r, parent, n, min(args.running, n))
                counted, scanned = view(r, parent, False), view(r, parent, True)
                if _without_eta(counted) != _without_eta(scanned):
                    raise SystemExit(f"N={n}: the counters' view differs from the scan's:\n{counted}\n{scanned}")
                scan_ms = _median_ms(lambda p=parent: view(r, p, True), args.repeats)
                counters_ms = _median_ms(lambda p=parent: view(r, p, False), args.repeats)
                print(f"| {n:,} | {scan_ms:.2f} | {counters_ms:.2f} | {scan_ms / counters_ms:.1f}x |")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
