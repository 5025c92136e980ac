"""Two tenants on the shared ``bulk`` queue: does one tenant's dataset-scale run hold the other one back?

Tenant A submits ``POST /attributions`` of ``--a-shards`` samples with ``shard_size: 1`` (that many shards). While
A's shards run, tenant B submits

  interactive  ``POST /attributions`` of 2 samples (one job, on the ``explain`` queue), and
  fan-out      ``POST /attributions`` of 8 samples with ``shard_size: 2`` (a parent, 4 shards on ``bulk``, a reduce
               step),

each ``--repeats`` times one after the other; the same requests are timed alone (nothing else running) first, in
the same run. A job's time is its own timestamps: creation to end (a fan-out's end is its reduce step's). The table
shows the medians and their ratios (goal: interactive <= 1.5x alone, B's fan-out <= 2x alone), how many of A's
shards ran meanwhile, and the most of A's shards ever seen on ``bulk`` at once (the window bounds it).

Model and samples: the small synthetic news demo (``models.news.demo.build_small``: 240 news, 60 users) and its
``nrms-word-demo``; samples are the test split's, repeated under fresh ids. Workers are ``explainq worker --queues
explain,bulk --threads 1`` (``--workers`` of them, 2 by default: this is a 2-core machine), the shard window is the
default (``EXPLAINQ_SHARD_WINDOW`` unset: as many as live bulk workers).

    python benchmarks/fairness.py                      # 2,000 shards of A, 9 repeats, 256 steps
    python benchmarks/fairness.py --a-shards 400 --repeats 3 --steps 1024
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.scale import _ts, cpu_name  # noqa: E402
from core import registry  # noqa: E402
from tests.service import Service  # noqa: E402

ALICE = {"Authorization": "Bearer key-a"}
BOB = {"Authorization": "Bearer key-b"}
MODEL = "news-model"


def load_average() -> str:
    """The 1-minute load average (other work on the machine shows here)."""
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def samples(root: Path, n: int, prefix: str) -> list[dict]:
    """``n`` samples of the small dataset's test split (repeated under fresh ids; the last 10 history titles)."""
    from models.news.data import load_samples

    base = load_samples(root, "test", 10_000, False, 0, False, 50)
    out = []
    for i in range(n):
        s = base[i % len(base)]
        out.append({"id": f"{prefix}{i}", "history": list(s.history)[-10:], "candidate": s.candidate, "label": s.label})
    return out


def start(home: Path, workers: int, model: Path, max_shards: int) -> Service:
    svc = Service(home, queues=(), start=False, heartbeat_ttl_s=60, api_keys="a:key-a,b:key-b",
                  env={"EXPLAINQ_MAX_SHARDS": str(max_shards)})  # A's run is one shard a sample
    registry.register_model(svc.settings, MODEL, kind="news", loader="models.news.checkpoint:load", path=model,
                            preload=True)
    svc.start()
    for _ in range(workers):
        svc.start_worker("explain,bulk", ("--threads", "1"))
    svc.wait_for_workers(workers)
    return svc


def run(svc: Service, body: dict, headers: dict, timeout_s: float = 600) -> float:
    """Submit, wait, and return the job's creation-to-end time from its own timestamps."""
    r = svc.client.post("/attributions", json=body, headers=headers)
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=timeout_s, headers=headers, interval_s=0.2)
    assert job["status"] == "succeeded", (job, svc.worker_logs()[-3000:])
    return _ts(job["finished_at"]) - _ts(job["created_at"])


class BulkWatch(threading.Thread):
    """Samples the ``bulk`` queue every 100 ms: the most of one parent's shards seen there at once."""

    def __init__(self, svc: Service, parent: str):
        super().__init__(daemon=True)
        self.r, self.prefix, self.peak, self.stop = svc.redis(), f"{parent}-s", 0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            ids = self.r.lrange("rq:queue:bulk", 0, -1)
            self.peak = max(self.peak, sum(1 for m in ids if m.decode().startswith(self.prefix)))


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "explainq-fairness")
    ap.add_argument("--a-shards", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--steps", type=int, default=256, help="IG steps of every request (Gauss-Legendre)")
    args = ap.parse_args()
    from models.news.demo import build_small

    print(f"CPU: {cpu_name()}", flush=True)
    model = build_small(args.cache, ("nrms-word-demo",), n_news=240, n_users=60)["nrms-word-demo"]
    data = args.cache / "data" / "news-synthetic"
    common = {"model": MODEL, "n_steps": args.steps, "method": "gausslegendre", "top_k": 5}
    interactive = {**common, "samples": samples(data, 2, "i")}
    fan = {**common, "samples": samples(data, 8, "f"), "shard_size": 2}
    bulk = {**common, "samples": samples(data, args.a_shards, "a"), "shard_size": 1}
    alone: dict[str, list[float]] = {"interactive": [], "fan-out": []}
    shared: dict[str, list[float]] = {"interactive": [], "fan-out": []}
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="fairness-") as home:
        svc = start(Path(home), args.workers, model, max(args.a_shards, 1000))
        try:
            for _ in range(args.workers):  # warm: first-call costs on every worker
                run(svc, fan, BOB)
            for _ in range(args.repeats):
                alone["interactive"].append(run(svc, interactive, BOB))
                alone["fan-out"].append(run(svc, fan, BOB))
            r = svc.client.post("/attributions", json=bulk, headers=ALICE)
            assert r.status_code == 202, r.text
            parent = r.json()["id"]
            watch = BulkWatch(svc, parent)
            watch.start()
            t_plan = time.monotonic()
            redis = svc.redis()
            # A has planned (its parent's own job ended) and its shards are running on every worker
            while not (redis.hget(f"rq:job:{parent}", "status") == b"finished" and
                       (svc.client.get(f"/jobs/{parent}", headers=ALICE).json().get("shards") or {}).get("succeeded")):
                assert time.monotonic() - t_plan < 600, "A's shards never ran"
                time.sleep(0.1)
            started, ended = (_ts(redis.hget(f"rq:job:{parent}", f).decode()) for f in ("started_at", "ended_at"))
            before = svc.client.get(f"/jobs/{parent}", headers=ALICE).json()["shards"]
            for _ in range(args.repeats):
                shared["interactive"].append(run(svc, interactive, BOB))
                shared["fan-out"].append(run(svc, fan, BOB))
            after = svc.client.get(f"/jobs/{parent}", headers=ALICE).json()["shards"]
            watch.stop.set()
            watch.join()
            still_running = after["succeeded"] < after["total"]
            svc.client.delete(f"/jobs/{parent}", headers=ALICE)
            shard_times = [_ts(s["finished_at"]) - _ts(s["started_at"])
                           for s in svc.client.get(f"/jobs?parent={parent}&limit=500", headers=ALICE).json()["items"]
                           if s["status"] == "succeeded" and s["id"] != f"{parent}-reduce"]
        finally:
            svc.stop()

    print()
    print(f"CPU: {cpu_name()}; {args.workers} workers (explain,bulk, --threads 1 each); shard window: default "
          f"(live bulk workers); {args.steps} Gauss-Legendre steps; nrms-word-demo (small); load average "
          f"{load_before} before, {load_average()} after")
    shard_s = statistics.median(shard_times)
    print(f"A: POST /attributions of {args.a_shards} samples, shard_size 1 ({args.a_shards} shards, planned in "
          f"{ended - started:.1f} s, median shard {shard_s:.2f} s); B's requests {args.repeats}x each, alone and "
          f"while A runs (medians)")
    print("| B's request | alone (s) | while A's run goes on (s) | ratio | goal |")
    print("|---|---:|---:|---:|---|")
    for name, label, goal in (("interactive", "interactive: 2 samples, one job", 1.5),
                              ("fan-out", "fan-out: 8 samples, shard_size 2 (4 shards + reduce)", 2.0)):
        a, s = statistics.median(alone[name]), statistics.median(shared[name])
        verdict = "met" if s / a <= goal else "NOT met"
        print(f"| {label} | {a:.2f} | {s:.2f} | {s / a:.2f}x | <= {goal}x ({verdict}) |")
    print()
    print(f"A's shards done when B started: {before['succeeded']}; when B's last request ended: "
          f"{after['succeeded']} of {after['total']} ({'A still running' if still_running else 'A had finished'})")
    print(f"most of A's shards on bulk at once: {watch.peak}")
    waiting = before["total"] - before["succeeded"] - before["running"]
    print(f"for scale: behind A's {waiting} waiting shards in one FIFO queue (each owner's shards enqueued at once), "
          f"B's fan-out would have waited about {waiting * shard_s / args.workers:.0f} s (estimate: waiting shards x "
          f"median shard / workers)")
    print("every run (s): " + "; ".join(f"{k} alone {', '.join(f'{t:.2f}' for t in alone[k])} / shared "
                                        f"{', '.join(f'{t:.2f}' for t in shared[k])}" for k in alone))


if __name__ == "__main__":
    main()
