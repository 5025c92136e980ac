"""What the per-checkpoint and per-layer-group breakdown of the listed scores costs a TracIn report (ConvE on
Nations, every training triple a candidate): the streaming top-k pass and the breakdown of its listed pairs, each
timed separately, best of ``--repeat`` (timing them apart keeps a shared machine's noise out of the ratio).

    nice -n 10 .venv/bin/python benchmarks/tracin_breakdown.py --tests 5 --top-k 10 --dim 50
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests", type=int, default=5)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--dim", type=int, default=50, help="ConvE embedding dimension")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(2)

    from models.kg import influence
    from models.kg.checkpoint import load
    from models.kg.train import TrainConfig, train_conve
    from models.kg.triples import load_nations

    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(epochs=args.epochs, batch_size=256, lr=0.01, embedding_dim=args.dim,
                          embedding_height=5 if args.dim % 5 == 0 else 4, num_filters=8, checkpoint_every=1,
                          seed=0)
        train_conve(load_nations(), cfg, Path(tmp), device="cpu")
        bundle = load(Path(tmp), "cpu")
        tests = bundle.dataset.decode(bundle.dataset.test[:args.tests])
        p = influence.plan(bundle, tests, top_k=args.top_k)
        listed: dict = {}
        original = influence.add_breakdown
        influence.add_breakdown = lambda plan, entries: listed.setdefault("entries", entries)
        times = {"without": float("inf"), "breakdown": float("inf")}
        try:
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                influence.score_test(p, bundle, args.top_k)
                times["without"] = min(times["without"], time.perf_counter() - t0)
                t0 = time.perf_counter()
                original(p, listed["entries"])
                times["breakdown"] = min(times["breakdown"], time.perf_counter() - t0)
        finally:
            influence.add_breakdown = original
        n_pairs = sum(len(e[k]) for e in listed["entries"] for k in ("proponents", "opponents"))
    n_ck = len(bundle.checkpoints)
    print(f"{args.tests} test triples x {len(bundle.dataset.train)} candidates, {n_ck} checkpoints, top_k "
          f"{args.top_k}, ConvE dim {args.dim}: scoring {times['without']:.3f} s, the breakdown of its {n_pairs} "
          f"listed pairs {times['breakdown']:.3f} s ({100 * times['breakdown'] / times['without']:.1f} % more)")


if __name__ == "__main__":
    main()
