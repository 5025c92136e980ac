"""Dataset-scale jobs fanned out over real workers: one worker against two, side by side in one run.

  tracin       ``POST /tracin``, mode test, exact, all layers, ``top_k`` 10, of ``--tracin-test`` test triples against
               the training triples of a deterministic graph with FB15k-237's shape (``models.kg.synthetic``:
               14,541 entities, 237 relations, 272,115 training triples, Zipf-skewed degrees) and a ConvE-200
               (10x20, 32 filters, the paper's configuration) trained on it for 3 epochs, a checkpoint each.
               ``--train-triples N`` keeps the first N training triples (the entity table, and so every per-pair
               cost, stays FB15k-237's): the per-candidate rate, the memory and the 1-vs-2 ratio are measured at
               that size, and the full-size time is extrapolated from the measured rate (the table says so).
  ig           ``POST /attributions`` of ``--ig-samples`` samples of the synthetic news dataset, 32 Gauss-Legendre
               steps, on ``--ig-model``.
  interactive  during a two-worker IG bulk run of its own (not one of the timed runs), ``POST /attributions`` of 2
               samples: its time from submission to result, against one shard's duration plus its own time alone.

Workers are ``explainq worker --queues explain,bulk --threads 1`` (one thread each: this is a 2-core machine); the
same shard plan (``--shards``) is used for one and for two workers, so the ratio compares like with like. Time is
the parent's submission to its reduce step's end (the job's own timestamps; the parent is polled once a second so
that polling takes no CPU from the workers); peak memory is each worker process's VmHWM (peak RSS). ``--repeats N``
runs each configuration N times, 1 and 2 workers alternating, and reports the median run.

    python benchmarks/scale.py                                   # the issue's sizes (hours on 2 CPU cores)
    python benchmarks/scale.py --train-triples 4096 --ig-samples 400 --tracin-test 1000
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core import registry  # noqa: E402
from tests.service import Service  # noqa: E402


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                flags = Path("/proc/cpuinfo").read_text()
                simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
                return f"{line.split(':', 1)[1].strip()} ({simd}, {os.cpu_count()} cores)"
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _ts(value: str) -> float:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()


def peak_rss_gib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


# ------------------------------------------------------------------------------------------------ setup
def ensure_graph_model(cache: Path, n_train: int | None, epochs: int) -> tuple[Path, Path, int]:
    """The synthetic FB15k-237-shaped graph (train cut to ``n_train``) and a ConvE-200 trained on it."""
    from models.kg.synthetic import generate
    from models.kg.train import TrainConfig, train_conve
    from models.kg.triples import load_triples_dir

    full = cache / "fb15k237-shaped"
    if not (full / "train.txt").is_file():
        print("generating the FB15k-237-shaped graph ...", flush=True)
        generate(full, seed=0)
    tag = "all" if n_train is None else str(n_train)
    data = cache / f"graph-{tag}"
    if not (data / "train.txt").is_file():
        data.mkdir(parents=True, exist_ok=True)
        lines = (full / "train.txt").read_text().splitlines(keepends=True)
        (data / "train.txt").write_text("".join(lines if n_train is None else lines[:n_train]))
        # entity and relation ids of the whole graph, so the model has FB15k-237's 14,541 entities
        ents = sorted({x for f in ("train", "valid", "test") for line in (full / f"{f}.txt").read_text().splitlines()
                       for x in (line.split("\t")[0], line.split("\t")[2])})
        rels = sorted({line.split("\t")[1] for f in ("train", "valid", "test")
                       for line in (full / f"{f}.txt").read_text().splitlines()})
        (data / "entities.dict").write_text("".join(f"{i}\t{e}\n" for i, e in enumerate(ents)))
        (data / "relations.dict").write_text("".join(f"{i}\t{r}\n" for i, r in enumerate(rels)))
        shutil.copy(full / "test.txt", data / "test.txt")
    model = cache / f"conve200-{tag}-e{epochs}"
    if not (model / "config.json").is_file():
        ds = load_triples_dir(data)
        print(f"training ConvE-200 on {len(ds.train):,} triples x {len(ds.entities):,} entities for {epochs} "
              "epochs ...", flush=True)
        t0 = time.perf_counter()
        train_conve(ds, TrainConfig(epochs=epochs, batch_size=512, lr=0.003, embedding_dim=200,
                                    embedding_height=10, num_filters=32, checkpoint_every=1, seed=0),
                    model, device="cpu")
        print(f"  trained in {time.perf_counter() - t0:.0f}s", flush=True)
    n = sum(1 for _ in open(data / "train.txt", encoding="utf-8"))
    return data, model, n


def ensure_news(cache: Path, n_samples: int, model_name: str) -> tuple[Path, Path]:
    from models.news.demo import build_small

    n_users = max(100, n_samples // 2)
    root = cache / f"news-{n_users}"
    paths = build_small(root, (model_name,), n_news=400, n_users=n_users)
    return paths[model_name], root / "data" / "news-synthetic"


# ------------------------------------------------------------------------------------------------ runs
POLL_S = 1.0  # the parent's time comes from its own timestamps; polling slowly keeps the API off the workers' cores


def _submit(svc: Service, route: str, body: dict) -> str:
    r = svc.client.post(route, json=body)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def _finished(svc: Service, job_id: str, timeout_s: float, interval_s: float = POLL_S) -> dict:
    job = svc.wait(job_id, timeout_s=timeout_s, interval_s=interval_s)
    assert job["status"] == "succeeded", (job, svc.worker_logs()[-3000:])
    return job


def _run_parent(svc: Service, route: str, body: dict, timeout_s: float, interval_s: float = POLL_S
                ) -> tuple[float, dict]:
    job = _finished(svc, _submit(svc, route, body), timeout_s, interval_s)
    return _ts(job["finished_at"]) - _ts(job["created_at"]), job


def _shards(svc: Service, parent: str) -> list[dict]:
    """A parent's shard jobs (the listing ends with its reduce step, left out)."""
    return svc.client.get(f"/jobs?parent={parent}&limit=500").json()["items"][:-1]


def _shard_median_s(shards: list[dict]) -> float:
    return statistics.median(_ts(s["finished_at"]) - _ts(s["started_at"]) for s in shards)


def _phases(job: dict, shards: list[dict]) -> tuple[float, float, float]:
    """Where a parent's wall time went: before its first shard started (the parent's own planning and the
    queue), from the first shard's start to the last one's end, and after it (the reduce step)."""
    first = min(_ts(s["started_at"]) for s in shards)
    last = max(_ts(s["finished_at"]) for s in shards)
    return first - _ts(job["created_at"]), last - first, _ts(job["finished_at"]) - last


def start(home: Path, workers: int, models: dict[str, Path], dataset: Path | None) -> Service:
    svc = Service(home, queues=(), start=False, heartbeat_ttl_s=60)
    for name, path in models.items():
        kind = "conve" if name.startswith("conve") else "news"
        loader = "models.kg.checkpoint:load" if kind == "conve" else "models.news.checkpoint:load"
        registry.register_model(svc.settings, name, kind=kind, loader=loader, path=path, preload=True)
    if dataset is not None:
        registry.register_dataset(svc.settings, "news-scale", kind="news", path=dataset)
    svc.start()
    for _ in range(workers):
        svc.start_worker("explain,bulk", ("--threads", "1"))
    svc.wait_for_workers(workers)
    return svc


def _median_row(workers: int, runs: list[dict]) -> dict:
    """The repeat with the median wall time (its shard time and memory with it), and every repeat's wall time."""
    runs = sorted(runs, key=lambda r: r["seconds"])
    return {**runs[len(runs) // 2], "workers": workers, "all_s": [r["seconds"] for r in runs]}


def bench_tracin(args: argparse.Namespace, cache: Path) -> list[dict]:
    from models.kg.triples import load_triples_dir

    data, model, n_train = ensure_graph_model(cache, args.train_triples, args.epochs)
    ds = load_triples_dir(data)
    tests = [list(t) for t in ds.decode(ds.test[:args.tracin_test])]
    shard = -(-n_train // args.shards)
    body = {"model": "conve-fb", "test_triples": tests, "top_k": 10, "layers": "all", "shard_size": shard}
    train = [list(t) for t in ds.decode(ds.train[:8])]
    warm = {"model": "conve-fb", "mode": "single", "test_triples": tests[:8], "train_triples": train,
            "layers": "all"}
    runs: dict[int, list[dict]] = {1: [], 2: []}
    for _ in range(args.repeats):  # 1 and 2 workers alternate, so slow drift on the machine hits both alike
        for workers in (1, 2):
            with tempfile.TemporaryDirectory(prefix="scale-tracin-") as home:
                svc = start(Path(home), workers, {"conve-fb": model}, None)
                try:
                    for _ in range(workers):  # warm, as for IG: first-call costs on every worker (8 x 8 pairs)
                        _run_parent(svc, "/tracin", warm, 600, interval_s=0.05)
                    seconds, job = _run_parent(svc, "/tracin", body, timeout_s=48 * 3600)
                    mem = max(peak_rss_gib(w.pid) for w in svc.workers)
                    shards = _shards(svc, job["id"])
                    shard_s, phases = _shard_median_s(shards), _phases(job, shards)
                finally:
                    svc.stop()
            runs[workers].append({"seconds": seconds, "peak_gib": mem, "shard_s": shard_s, "phases": phases})
            print(f"  tracin, {workers} worker(s): {seconds:.1f}s, peak {mem:.2f} GiB", flush=True)
    rows = [_median_row(w, runs[w]) for w in (1, 2)]
    rows[0]["n_train"], rows[0]["n_test"] = n_train, len(tests)
    return rows


IG_BODY = {"n_steps": 32, "method": "gausslegendre", "top_k": 10}


def bench_ig(args: argparse.Namespace, cache: Path) -> tuple[list[dict], dict]:
    """1 vs 2 workers on the bulk run; then, in a run of its own with 2 workers (so that the 1-vs-2 times compare
    the bulk run alone), a 2-sample request submitted while the bulk run is going."""
    model, data = ensure_news(cache, args.ig_samples, args.ig_model)
    body = {"model": "news-model", **IG_BODY, "shard_size": -(-args.ig_samples // args.shards),
            "dataset": {"name": "news-scale", "split": "test", "n_samples": args.ig_samples, "seed": 0}}
    small = {"model": "news-model", **IG_BODY, "shard_size": 2,
             "dataset": {"name": "news-scale", "split": "test", "n_samples": 2, "seed": 7}}
    runs: dict[int, list[dict]] = {1: [], 2: []}
    interactive: dict = {}
    for repeat in range(args.repeats):
        for workers in (1, 2):
            with tempfile.TemporaryDirectory(prefix="scale-ig-") as home:
                svc = start(Path(home), workers, {"news-model": model}, data)
                try:
                    for _ in range(workers):  # warm: first-call costs on every worker
                        _run_parent(svc, "/attributions", small, 600, interval_s=0.05)
                    seconds, job = _run_parent(svc, "/attributions", body, timeout_s=48 * 3600)
                    shards = _shards(svc, job["id"])
                    shard_s, phases = _shard_median_s(shards), _phases(job, shards)
                    mem = max(peak_rss_gib(w.pid) for w in svc.workers)
                    if workers == 2 and repeat == args.repeats - 1:
                        interactive = _interactive(svc, body, small)
                finally:
                    svc.stop()
            runs[workers].append({"seconds": seconds, "peak_gib": mem, "shard_s": shard_s, "phases": phases})
            print(f"  ig, {workers} worker(s): {seconds:.1f}s", flush=True)
    return [_median_row(w, runs[w]) for w in (1, 2)], interactive


def _interactive(svc: Service, body: dict, small: dict) -> dict:
    """A 2-sample request while a bulk run keeps both workers busy: submission to result, against one shard of
    that run plus the request's own time alone (median of 3, measured just before)."""
    alone = [_run_parent(svc, "/attributions", small, 600, interval_s=0.05)[0] for _ in range(3)]
    parent = _submit(svc, "/attributions", body)
    svc.wait(parent, statuses=("running",), timeout_s=600, interval_s=0.5)
    time.sleep(5)
    t0 = time.time()
    job = _finished(svc, _submit(svc, "/attributions", small), 3600, interval_s=0.05)
    latency = time.time() - t0
    _finished(svc, parent, 48 * 3600)
    return {"latency_s": latency, "own_s": statistics.median(alone), "shard_s": _shard_median_s(_shards(svc, parent)),
            "run_s": _ts(job["finished_at"]) - _ts(job["started_at"])}


def _runs(row: dict) -> str:
    return ", ".join(f"{s:.1f}" for s in row["all_s"])


def _phase_cells(row: dict) -> str:
    return " / ".join(f"{s:.1f}" for s in row["phases"])


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "explainq-scale")
    ap.add_argument("--tracin-test", type=int, default=1000)
    ap.add_argument("--train-triples", type=int, default=None, help="first N training triples (default: all)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--ig-samples", type=int, default=2000)
    ap.add_argument("--ig-model", default="nrms-word-demo", choices=("nrms-word-demo", "nrms-minilm-demo"))
    ap.add_argument("--shards", type=int, default=8, help="shards per run (the same plan for 1 and 2 workers)")
    ap.add_argument("--skip", choices=("tracin", "ig"), action="append", default=[])
    ap.add_argument("--repeats", type=int, default=1, help="runs per configuration, 1 and 2 workers alternating; "
                    "the table shows the median run and lists every run's wall time")
    args = ap.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    print(f"CPU: {cpu_name()}", flush=True)
    tracin = bench_tracin(args, args.cache) if "tracin" not in args.skip else None
    ig = bench_ig(args, args.cache) if "ig" not in args.skip else None

    print()
    print(f"CPU: {cpu_name()}; workers: explain,bulk, --threads 1 each; {args.shards} shards per run")
    print(f"{args.repeats} run(s) per row, the median shown (every run's wall time in the last column)")
    print("before / during / after shards: the median run's wall time before its first shard started (planning),"
          " from then to the last shard's end, and after it (the reduce step)")
    print("| run | workers | wall (s) | before / during / after shards (s) | median shard (s) |"
          " peak RSS per worker (GiB) | speed-up | runs (s) |")
    print("|---|---:|---:|---|---:|---:|---:|---|")
    if tracin:
        n_train, n_test = tracin[0]["n_train"], tracin[0]["n_test"]
        for r in tracin:
            print(f"| TracIn {n_test} test x {n_train:,} train, 3 ckpts, all layers | {r['workers']} | "
                  f"{r['seconds']:.1f} | {_phase_cells(r)} | {r['shard_s']:.1f} | {r['peak_gib']:.2f} | "
                  f"{tracin[0]['seconds'] / r['seconds']:.2f}x | {_runs(r)} |")
    if ig:
        rows, _ = ig
        for r in rows:
            print(f"| IG {args.ig_samples} samples x 32 GL steps ({args.ig_model}) | {r['workers']} | "
                  f"{r['seconds']:.1f} | {_phase_cells(r)} | {r['shard_s']:.1f} | {r['peak_gib']:.2f} | "
                  f"{rows[0]['seconds'] / r['seconds']:.2f}x | {_runs(r)} |")
    print()
    if tracin:
        r2 = tracin[1]
        rate = n_test * n_train / r2["seconds"]
        full = n_test * 272_115 / rate
        note = "" if n_train == 272_115 else " (extrapolated from the measured rate)"
        print(f"TracIn: {rate:,.0f} (test x train) pairs/s with 2 workers; {n_test} test triples against all "
              f"272,115 training triples: {full / 3600:.1f} h{note}")
    if ig:
        rows, inter = ig
        rate = args.ig_samples / rows[1]["seconds"]
        print(f"IG: {rate:.2f} samples/s with 2 workers ({rate * 32:.0f} sample-steps/s); the IG guide's 40,000 "
              f"samples at 32 steps: {40_000 / rate / 3600:.1f} h on this machine")
        print(f"interactive POST /attributions (2 samples) during a 2-worker bulk run (a run of its own): {inter['latency_s']:.1f}s from "
              f"submission to result; bound = one shard ({inter['shard_s']:.1f}s) + its own run alone "
              f"({inter['own_s']:.1f}s) = {inter['shard_s'] + inter['own_s']:.1f}s "
              f"({'within' if inter['latency_s'] <= inter['shard_s'] + inter['own_s'] else 'OVER'})")


if __name__ == "__main__":
    main()
