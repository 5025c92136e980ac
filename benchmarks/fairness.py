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

``--api``: the API itself under a hostile tenant. The API runs as its own process (``explainq api``, one uvicorn
process) beside the same workers and private Redis, with the two keys. Tenant B's requests are timed over HTTP
(response time of each request, keep-alive connection):

  GET /jobs            the first page of B's jobs list,
  GET /jobs/<id>       one of B's finished jobs,
  submit               ``POST /attributions`` of 2 samples (the 202; canceled right after, untimed),
  fan-out submit       ``POST /attributions`` of 8 samples with ``shard_size: 2`` (the 202; canceled after),

``--rounds`` times each, first alone, then while tenant A, all at once and without pause, runs the heaviest
requests the limits allow: ``POST /models/import`` of a crafted ConvE ``.pt`` (the OrderedDict-copying pickle of
tests/adversarial/test_bounded_parser.py, a few MiB, refused once the bounded parser reaches its memory limit), in
a loop; ``POST /datasets`` of a ``--triples-mib`` MiB ``train.txt`` (64 MiB: about 4M triples), in a loop, under
fresh names; one ``POST /evaluate/attribution`` (the defaults: Nations, 64 subset models, fanned out over the
workers); and 16 SSE streams (``GET /jobs/<id>/events?interval_s=0.05``, the fastest allowed) on that evaluation.
The table shows B's median and p95 per request, alone and loaded, and their ratios (goal <= 1.5x), and the API
process's peak resident memory (``VmHWM`` of its ``/proc/<pid>/status``; goal <= 300 MiB; the bounded parser's
children are processes of their own and not counted in it).

    python benchmarks/fairness.py --api                # 30 rounds
    python benchmarks/fairness.py --api --quick        # 10 rounds: a few minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.scale import _ts, cpu_name  # noqa: E402
from core import registry  # noqa: E402
from explainq.cli import WORKER_NICE  # noqa: E402
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


def start(home: Path, workers: int, model: Path, max_shards: int, client: bool = True, nice: int = 0) -> Service:
    """Redis, the model registered, ``workers`` workers; ``client``: the app in this process too (``svc.client``),
    else the caller runs the API (:func:`start_api`)."""
    svc = Service(home, queues=(), start=False, heartbeat_ttl_s=60, api_keys="a:key-a,b:key-b",
                  env={"EXPLAINQ_MAX_SHARDS": str(max_shards)})  # A's run is one shard a sample
    registry.register_model(svc.settings, MODEL, kind="news", loader="models.news.checkpoint:load", path=model,
                            preload=True)
    if client:
        svc.start()
    for _ in range(workers):
        svc.start_worker("explain,bulk", ("--threads", "1", "--nice", str(nice)))
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


# ------------------------------------------------------------------------------------------------ --api
MiB = 1 << 20
SSE_STREAMS = 16


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` percentile (``q`` in 0..100) of ``values``."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def status_kib(pid: int, field: str) -> int:
    """``VmHWM``, ``VmRSS``... of process ``pid`` in KiB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def write_triples(path: Path, mib: int) -> int:
    """A ``train.txt`` of about ``mib`` MiB of distinct triples; returns its number of lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    n, size, target = 0, 0, mib * MiB
    with open(path, "wb") as fh:
        while size < target:
            block = b"".join(b"e%d\tr%d\te%d\n" % (j, j % 7, j + 1) for j in range(n, n + 10_000))
            fh.write(block)
            n, size = n + 10_000, size + len(block)
    return n


def write_crafted_import(directory: Path, entries: int = 100_000, copies: int = 400) -> int:
    """A ConvE import directory whose ``model.pt`` is the OrderedDict-copying pickle (``copies`` copies of an
    ``entries``-item dict: far past the bounded parser's memory limit); returns the ``.pt``'s size in bytes."""
    from tests.adversarial.test_bounded_parser import _zip, ordered_dict_bomb

    directory.mkdir(parents=True, exist_ok=True)
    _zip(directory / "model.pt", ordered_dict_bomb(entries=entries, copies=copies))
    (directory / "train.txt").write_text("a\tr\tb\n")
    (directory / "config.json").write_text(json.dumps({"embedding_dim": 20, "embedding_height": 4}))
    return (directory / "model.pt").stat().st_size


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_api(svc: Service, port: int, timeout_s: float = 60) -> subprocess.Popen:
    """``explainq api`` as a process of its own, on the service's Redis and keys; returns once /health answers."""
    import httpx

    log = open(svc.home / "api.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "explainq.cli", "api", "--host", "127.0.0.1", "--port", str(port)],
                            env=svc.env, cwd=Path(__file__).resolve().parent.parent, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the API exited: " + (svc.home / "api.log").read_text()[-3000:])
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise TimeoutError("the API did not answer /health")


def stop_api(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class InFlight:
    """How many of A's heavy requests are in flight now (each B request notes whether any was)."""

    def __init__(self) -> None:
        self.n, self.lock = 0, threading.Lock()

    def __enter__(self) -> InFlight:
        with self.lock:
            self.n += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.n -= 1


def b_round(client: Any, requests: list[tuple[str, str, str, dict | None]], times: dict[str, list[float]],
            busy: InFlight | None = None, overlapped: list[bool] | None = None) -> None:
    """One round of B's requests ``(label, method, path, body)``, each timed (response fully read); a submit
    (202) is canceled after its timing."""
    for label, method, path, body in requests:
        t0 = time.perf_counter()
        r = client.request(method, path, json=body)
        times.setdefault(label, []).append(time.perf_counter() - t0)
        assert r.status_code in (200, 202), (label, r.status_code, r.text[:500])
        if overlapped is not None and busy is not None:
            overlapped.append(busy.n > 0)
        if r.status_code == 202:
            client.delete(f"/jobs/{r.json()['id']}")


class Loop(threading.Thread):
    """Tenant A sending one request again and again until ``stop``; statuses and durations recorded."""

    def __init__(self, base: str, make: Any, busy: InFlight, stop: threading.Event):
        super().__init__(daemon=True)
        self.base, self.make, self.busy, self.stop = base, make, busy, stop
        self.statuses: list[int] = []
        self.seconds: list[float] = []

    def run(self) -> None:
        import httpx

        with httpx.Client(base_url=self.base, headers=ALICE, timeout=600) as client:
            i = 0
            while not self.stop.is_set():
                method, path, body = self.make(i)
                t0 = time.perf_counter()
                with self.busy:
                    try:
                        status = client.request(method, path, json=body).status_code
                    except httpx.HTTPError:  # the API stopped while the request was in flight
                        status = 0
                self.seconds.append(time.perf_counter() - t0)
                self.statuses.append(status)
                i += 1


class Streams(threading.Thread):
    """One SSE stream on ``job``, reconnected until ``stop``; counts the lines read."""

    def __init__(self, base: str, job: str, stop: threading.Event):
        super().__init__(daemon=True)
        self.base, self.job, self.stop, self.lines = base, job, stop, 0

    def run(self) -> None:
        import httpx

        with httpx.Client(base_url=self.base, headers=ALICE, timeout=httpx.Timeout(30, read=60)) as client:
            while not self.stop.is_set():
                try:
                    with client.stream("GET", f"/jobs/{self.job}/events", params={"interval_s": 0.05}) as r:
                        for _ in r.iter_lines():
                            self.lines += 1
                            if self.stop.is_set():
                                return
                except httpx.HTTPError:
                    time.sleep(0.1)


def _counts(statuses: list[int]) -> str:
    """``422 x3, 201 x1`` (0: cut off when the run ended)."""
    return ", ".join(f"{c or 'cut off'} x{statuses.count(c)}" for c in sorted(set(statuses))) or "none ended"


def api_table(alone: dict[str, list[float]], loaded: dict[str, list[float]], goal: float = 1.5) -> list[str]:
    """B's medians and p95s alone and loaded, and their ratios, as Markdown rows."""
    rows = ["| B's request | alone median (ms) | alone p95 (ms) | loaded median (ms) | loaded p95 (ms) | "
            "median ratio | p95 ratio | goal |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for label in alone:
        a50, a95 = statistics.median(alone[label]), percentile(alone[label], 95)
        l50, l95 = statistics.median(loaded[label]), percentile(loaded[label], 95)
        verdict = "met" if l50 / a50 <= goal and l95 / a95 <= goal else "NOT met"
        rows.append(f"| {label} | {a50 * 1e3:.1f} | {a95 * 1e3:.1f} | {l50 * 1e3:.1f} | {l95 * 1e3:.1f} | "
                    f"{l50 / a50:.2f}x | {l95 / a95:.2f}x | <= {goal}x ({verdict}) |")
    return rows


def api_main(args: argparse.Namespace) -> None:
    import httpx

    from models.news.demo import build_small

    rounds = args.rounds or (10 if args.quick else 30)
    print(f"CPU: {cpu_name()}", flush=True)
    model = build_small(args.cache, ("nrms-word-demo",), n_news=240, n_users=60)["nrms-word-demo"]
    data = args.cache / "data" / "news-synthetic"
    common = {"model": MODEL, "n_steps": 32, "method": "gausslegendre", "top_k": 5}
    small = {**common, "samples": samples(data, 2, "i")}
    fan = {**common, "samples": samples(data, 8, "f"), "shard_size": 2}
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="fairness-api-") as home:
        home_path = Path(home)
        roots = home_path / "data"
        triples = write_triples(roots / "a-big" / "train.txt", args.triples_mib)
        pt_bytes = write_crafted_import(roots / "a-crafted")
        svc = start(home_path, args.workers, model, 1000, client=False, nice=args.worker_nice)
        port = free_port()
        api = start_api(svc, port)
        base = f"http://127.0.0.1:{port}"
        stop = threading.Event()
        threads: list[threading.Thread] = []
        try:
            with httpx.Client(base_url=base, headers=BOB, timeout=120) as bob:
                r = bob.post("/attributions", json=small)
                assert r.status_code == 202, r.text
                seen = r.json()["id"]
                t_wait = time.monotonic()
                while bob.get(f"/jobs/{seen}").json()["status"] not in ("succeeded", "failed", "canceled"):
                    assert time.monotonic() - t_wait < 300, "B's first job never ended"
                    time.sleep(0.2)
                requests = [("GET /jobs", "GET", "/jobs?limit=20", None),
                            ("GET /jobs/<id>", "GET", f"/jobs/{seen}", None),
                            ("submit: POST /attributions, 2 samples", "POST", "/attributions", small),
                            ("fan-out submit: 8 samples, shard_size 2", "POST", "/attributions", fan)]
                alone: dict[str, list[float]] = {}
                b_round(bob, requests, {})  # warm
                for _ in range(rounds):
                    b_round(bob, requests, alone)
                    time.sleep(args.pause_s)
                hwm_alone = status_kib(api.pid, "VmHWM")

                busy = InFlight()
                with httpx.Client(base_url=base, headers=ALICE, timeout=120) as alice:
                    r = alice.post("/evaluate/attribution", json={})
                    evaluation = r.status_code
                    assert r.status_code == 202, r.text
                    target = r.json()["id"]
                importing = Loop(base, lambda i: ("POST", "/models/import", {
                    "kind": "conve", "name": "a-crafted", "path": "a-crafted", "weights": "model.pt",
                    "checkpoints": [{"file": "model.pt", "lr": 0.01}]}), busy, stop)
                registering = Loop(base, lambda i: ("POST", "/datasets", {"name": f"a-big-{i}", "path": "a-big"}),
                                   busy, stop)
                streams = [Streams(base, target, stop) for _ in range(SSE_STREAMS)]
                threads = [importing, registering, *streams]
                for t in threads:
                    t.start()
                t_wait = time.monotonic()
                while busy.n < 2 and time.monotonic() - t_wait < 30:  # A's heavy requests under way
                    time.sleep(0.05)
                loaded: dict[str, list[float]] = {}
                overlapped: list[bool] = []
                t_loaded = time.monotonic()
                for _ in range(rounds):
                    b_round(bob, requests, loaded, busy, overlapped)
                    time.sleep(args.pause_s)
                loaded_s = time.monotonic() - t_loaded
                hwm_loaded = status_kib(api.pid, "VmHWM")
                stop.set()
                for t in (importing, registering):
                    t.join(args.drain_s)
                hwm_end = status_kib(api.pid, "VmHWM")
                with httpx.Client(base_url=base, headers=ALICE, timeout=60) as alice:
                    alice.delete(f"/jobs/{target}")
        finally:
            stop.set()
            stop_api(api)
            svc.stop()

    print()
    print(f"CPU: {cpu_name()}; API: one `explainq api` process; {args.workers} workers (explain,bulk, --threads 1 "
          f"each, nice {args.worker_nice}); private Redis; keys a and b; load average {load_before} before, {load_average()} after")
    print(f"B: {rounds} rounds of 4 requests ({args.pause_s:g} s apart) alone, then {rounds} while A loads the service "
          f"({loaded_s:.0f} s); "
          f"{sum(overlapped)} of B's {len(overlapped)} loaded requests had one of A's imports or registrations in "
          "flight")
    print(f"A, all at once: POST /models/import of a crafted {pt_bytes / MiB:.1f} MiB .pt (statuses "
          f"{_counts(importing.statuses)}; median {statistics.median(importing.seconds or [0]):.1f} s); "
          f"POST /datasets of a {args.triples_mib} MiB train.txt ({triples:,} triples; statuses "
          f"{_counts(registering.statuses)}; median {statistics.median(registering.seconds or [0]):.1f} s); "
          f"POST /evaluate/attribution ({evaluation}); {SSE_STREAMS} SSE streams at interval_s 0.05 on it "
          f"({sum(s.lines for s in streams):,} lines read)")
    for row in api_table(alone, loaded):
        print(row)
    goal = 300 * 1024
    print(f"API process peak memory (VmHWM): {hwm_alone / 1024:.0f} MiB after B alone; {hwm_loaded / 1024:.0f} MiB "
          f"when B's loaded rounds ended; {hwm_end / 1024:.0f} MiB once A's last requests ended (goal <= 300 MiB: "
          f"{'met' if hwm_end <= goal else 'NOT met'})")


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "explainq-fairness")
    ap.add_argument("--a-shards", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--steps", type=int, default=256, help="IG steps of every request (Gauss-Legendre)")
    ap.add_argument("--api", action="store_true", help="B's API latency while A sends the heaviest requests")
    ap.add_argument("--quick", action="store_true", help="--api with 10 rounds")
    ap.add_argument("--rounds", type=int, default=0, help="--api: rounds of B's requests (30; --quick 10)")
    ap.add_argument("--triples-mib", type=int, default=64, help="--api: size of A's dataset's train.txt")
    ap.add_argument("--pause-s", type=float, default=0.5, help="--api: pause between two of B's rounds")
    ap.add_argument("--drain-s", type=float, default=150, help="--api: how long to wait for A's last requests")
    ap.add_argument("--worker-nice", type=int, default=WORKER_NICE,
                    help="--api: the workers' nice increment (default: what `explainq up` gives them, below the API)")
    args = ap.parse_args()
    if args.api or args.quick:
        api_main(args)
        return
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
