"""Interactive job latency while a training job shares the host: with and without the CPU split and nice.

Runs the README's TracIn example (``POST /tracin`` on ``conve-nations-demo``) and attribution example
(``POST /attributions`` on ``nrms-minilm-demo``) through real workers, three ways:

  alone        one interactive worker, default threads, nothing else running
  contended    + a training worker running BDH on digits, both at default threads and priority
  split+nice   the same pair started as ``explainq up`` starts them (``explainq.cli.split_threads``: ``--threads`` per
               worker, the training worker at ``nice 10``)

Each job's time is the worker's own ``started_at -> ended_at`` (queueing excluded); the table shows the median of
``--reps`` runs and the ratio to ``alone`` (goal: <= 1.5x with split+nice).

Models: the demo models under ``--home`` when they are registered there (``explainq demo``); otherwise the script
builds its own small ones (``conve-nations-demo`` as the demo does, and a small ``nrms-minilm-demo`` from
``models.news.demo.build_small``) and says so.

    python benchmarks/interactive_latency.py [--home DIR] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core import registry  # noqa: E402
from core.settings import Settings  # noqa: E402
from explainq.cli import split_threads  # noqa: E402
from tests.service import Service  # noqa: E402

TRACIN = {"model": "conve-nations-demo", "test_triples": [["usa", "embassy", "uk"]],
          "mode": "test", "top_k": 10, "layers": "all", "filter": {"n_hops": 2}}
ATTRIBUTION = {
    "model": "nrms-minilm-demo",
    "samples": [{"id": "u1", "label": "fake",
                 "history": ["Lakers beat Celtics in overtime thriller", "Yankees rally to win the league title"],
                 "candidate": "SHOCKING: Dodgers sign star quarterback to record deal"}],
    "n_steps": 64, "method": "gausslegendre", "top_k": 5,
}
TRAINING = {"dataset": "digits", "epochs": 500, "batch_size": 64, "lr": 0.003, "warmup_steps": 50,
            "model": {"n_layer": 2, "n_embd": 64, "n_head": 4, "mlp_multiplier": 8, "dropout": 0.0}}
JOBS = {"tracin": ("/tracin", TRACIN), "attributions": ("/attributions", ATTRIBUTION)}


def ensure_models(home: Path) -> str:
    """Register the two models the examples need; returns where they came from."""
    settings = Settings(EXPLAINQ_HOME=str(home))
    have = {name for name in ("conve-nations-demo", "nrms-minilm-demo") if registry.get_model(settings, name)}
    if len(have) == 2:
        return f"demo models registered under {home}"
    from models.news.checkpoint import load
    from models.news.demo import build_small
    from workers.jobs.train_conve import prepare_demo

    if "conve-nations-demo" not in have:
        prepare_demo(settings, progress=False)
    if "nrms-minilm-demo" not in have:
        out = build_small(home / "small-news", names=("nrms-minilm-demo",))["nrms-minilm-demo"]
        registry.register_model(settings, "nrms-minilm-demo", kind="news", loader="models.news.checkpoint:load",
                                path=out, parameters=load(out, "cpu").parameters,
                                meta={"architecture": "nrms", "encoder": "bert", "small": True})
    return ("demo models absent: built conve-nations-demo (the demo recipe) and a small nrms-minilm-demo "
            "(models.news.demo.build_small: 240 news, 100 users) for this run")


def _ts(value: str) -> float:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()


def run_jobs(svc: Service, reps: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in JOBS}
    for _ in range(reps):
        for name, (route, body) in JOBS.items():
            r = svc.client.post(route, json=body)
            assert r.status_code == 202, r.text
            job = svc.wait(r.json()["id"], timeout_s=600)
            assert job["status"] == "succeeded", job
            times[name].append(_ts(job["finished_at"]) - _ts(job["started_at"]))
    return times


def scenario(home: Path, name: str, reps: int, worker_args: dict[str, tuple[str, ...]] | None,
             train: bool, cores: int) -> dict[str, list[float]]:
    env = {"OMP_NUM_THREADS": str(cores)}  # the default a worker gets: every core
    with Service(home, queues=(), env=env) as svc:
        args = worker_args or {}
        svc.start_worker("explain", args.get("explain", ()))
        n = 1
        if train:
            svc.start_worker("train", args.get("train", ()))
            n = 2
        svc.wait_for_workers(n)
        training_id = None
        if train:
            r = svc.client.post("/train/bdh", json=TRAINING)
            assert r.status_code == 202, r.text
            training_id = r.json()["id"]
            svc.wait(training_id, statuses=("running",))
            time.sleep(3)  # past data loading, into the training loop
        warm = svc.client.post("/attributions", json=ATTRIBUTION).json()["id"]  # warm-up: first-call costs
        svc.wait(warm, timeout_s=600)
        times = run_jobs(svc, reps)
        if training_id:
            body = svc.client.get(f"/jobs/{training_id}").json()
            assert body["status"] == "running", f"{name}: the training job ended early: {body}"
            svc.client.delete(f"/jobs/{training_id}")
        return times


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the workers and Redis on the way out
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, default=None, help="EXPLAINQ_HOME with the demo models")
    parser.add_argument("--reps", type=int, default=3)
    opts = parser.parse_args()
    home = opts.home or Path(tempfile.mkdtemp(prefix="explainq-latency-"))
    source = ensure_models(home)
    cores = len(os.sched_getaffinity(0))
    plan = split_threads(["explain", "train"], cores)
    split_args = {q: ("--threads", str(t), "--nice", str(n)) for q, (t, n) in plan.items()}
    print(f"models: {source}\ncores: {cores}; split+nice plan: {plan}\n", flush=True)
    results = {
        "alone": scenario(home, "alone", opts.reps, None, train=False, cores=cores),
        "contended": scenario(home, "contended", opts.reps, None, train=True, cores=cores),
        "split+nice": scenario(home, "split+nice", opts.reps, split_args, train=True, cores=cores),
    }
    print("| job | alone (s) | contended (s) | x alone | split+nice (s) | x alone |")
    print("|---|---:|---:|---:|---:|---:|")
    for job in JOBS:
        base = statistics.median(results["alone"][job])
        cont = statistics.median(results["contended"][job])
        split = statistics.median(results["split+nice"][job])
        print(f"| {job} | {base:.3f} | {cont:.3f} | {cont / base:.2f} | {split:.3f} | {split / base:.2f} |")


if __name__ == "__main__":
    main()
