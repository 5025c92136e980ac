"""The shipped knowledge graphs and their ConvE demo models: sizes, training cost, filtered test metrics.

For each dataset (``nations``, ``umls``, ``kinships`` by default) this loads the shipped copy (SHA-256 checked),
trains ConvE with the demo configuration demo preparation uses (``workers.jobs.train_conve.demo_models``) on one
CPU thread, as demo preparation does, and evaluates the test split (filtered ranks, both directions, ties counted
half). It prints one table: the split sizes and vocabulary, training wall time and CPU time (the process's CPU
seconds: on a shared machine the wall time also counts waiting for a core), this project's filtered MRR and
Hits@1/3/10, and ConvE's published figures (Dettmers et al. 2018), labelled as published: they are the paper's
200-dimensional model trained to convergence on a GPU, not a measurement of this run.

    python benchmarks/kg_datasets.py                       # the three demos, their demo configurations
    python benchmarks/kg_datasets.py --datasets umls       # one of them
    python benchmarks/kg_datasets.py --epochs 5            # every configuration cut to 5 epochs (a quick look)
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from models.kg.shipped import CONVE_SOURCE, SHIPPED  # noqa: E402
from models.kg.train import TrainConfig, train_conve  # noqa: E402
from models.kg.triples import load_shipped  # noqa: E402
from workers.jobs.train_conve import TRAIN_FIELDS, demo_models  # noqa: E402


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run(name: str, config: dict, epochs: int | None) -> dict:
    ds = load_shipped(name)
    params = {k: config[k] for k in TRAIN_FIELDS if k in config}
    if epochs is not None:
        params.update(epochs=epochs, checkpoint_every=min(params.get("checkpoint_every", 1), epochs))
    cfg = TrainConfig(**params)
    with tempfile.TemporaryDirectory() as tmp:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        summary = train_conve(ds, cfg, Path(tmp) / "model", device="cpu")
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    test = summary["metrics"]["test"]
    return {"dataset": name, "splits": (len(ds.train), len(ds.valid), len(ds.test)), "entities": len(ds.entities),
            "relations": len(ds.relations), "epochs": cfg.epochs, "dim": cfg.embedding_dim,
            "parameters": summary["parameters"], "wall": wall, "cpu": cpu, **{k: test[k] for k in
                                                                         ("mrr", "hits@1", "hits@3", "hits@10")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="nations,umls,kinships", help="comma-separated shipped datasets")
    ap.add_argument("--epochs", type=int, default=None, help="override every demo configuration's epochs")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (demo preparation uses 1)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    configs = {dataset: config for _, dataset, config in demo_models()}
    wanted = [d.strip() for d in args.datasets.split(",") if d.strip()]
    unknown = [d for d in wanted if d not in configs]
    if unknown:
        raise SystemExit(f"unknown datasets {unknown}; shipped: {', '.join(configs)}")
    rows = []
    for name in wanted:
        print(f"training ConvE on {name} ...", file=sys.stderr, flush=True)
        rows.append(run(name, configs[name], args.epochs))
    head = (f"{'dataset':9s} {'train/valid/test':>17s} {'ent':>4s} {'rel':>4s} {'epochs':>6s} {'params':>7s} "
            f"{'wall s':>7s} {'CPU s':>6s} | {'MRR':>5s} {'H@1':>5s} {'H@3':>5s} {'H@10':>5s} | "
            f"{'pub MRR':>7s} {'pub H@1':>7s} {'pub H@3':>7s} {'pub H@10':>8s}")
    print(head)
    print("-" * len(head))
    for r in rows:
        p = SHIPPED[r["dataset"]].published
        print(f"{r['dataset']:9s} {'/'.join(map(str, r['splits'])):>17s} {r['entities']:4d} {r['relations']:4d} "
              f"{r['epochs']:6d} {r['parameters'] / 1e3:6.0f}k {r['wall']:7.1f} {r['cpu']:6.1f} | "
              f"{r['mrr']:5.3f} {r['hits@1']:5.3f} {r['hits@3']:5.3f} {r['hits@10']:5.3f} | "
              f"{p['mrr']:7.2f} {p['hits@1']:7.2f} {p['hits@3']:7.2f} {p['hits@10']:8.2f}")
    print(f"\nours: ConvE-{rows[0]['dim'] if rows else ''} (demo configuration), filtered, test split, both "
          f"directions, ties counted half; torch {torch.__version__}, {args.threads} thread(s)")
    print(f"pub (published, not ours): {CONVE_SOURCE}")
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} logical cores; load average at the end {load[0]:.1f}")


if __name__ == "__main__":
    main()
