"""Which loss TracIn's default should be: the sign of its scores and its mislabel detection, loss by loss.

For each shipped graph (``nations``, ``kinships``, ``umls``) this trains ConvE with the recipe of
``benchmarks/quality.py`` (ConvE-100, 10 epochs, batch 128, lr 0.01, a checkpoint every 2 epochs, seed 0; the
project's own training code, ``models.kg.evaluation.train_model``) and, for each loss TracIn's gradients can use
(``models.kg.tracin.LOSSES``: ``train``, ``score_bce``, ``margin``), measures:

- the share of negative influences: over ``--n-test`` test triples (a seeded draw,
  ``models.kg.evaluation.test_selection``), the fraction of the (test, train) TracIn scores below zero over every
  training triple, and the fraction of those test triples with at least one opponent among their top
  ``--top-k`` (a listed opponent is a negative score, as ``POST /tracin`` lists them);
- mislabel detection: ``--fraction`` of the training tails replaced (``models.kg.evaluation.corrupt_tails``,
  seeded), ConvE trained on the corrupted graph with the same recipe, the training triples ranked by TracIn
  self-influence with that loss, ROC AUC with its stratified bootstrap interval
  (``models.kg.evaluation.auc_interval``).

TracIn here is ``POST /tracin``'s computation (``models.kg.tracin.ConvETracIn``: every layer, every checkpoint,
learning-rate weighted, exact ghost dot products, fp32), with the same loss on the test and the training side.

    OMP_NUM_THREADS=1 python benchmarks/tracin_loss.py
    OMP_NUM_THREADS=1 python benchmarks/tracin_loss.py --datasets nations --n-test 20   # a quick look
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from models.kg import evaluation as ev  # noqa: E402
from models.kg.checkpoint import load  # noqa: E402
from models.kg.influence import checkpoint_weights  # noqa: E402
from models.kg.tracin import LOSSES, ConvETracIn  # noqa: E402
from models.kg.train import TrainConfig  # noqa: E402
from models.kg.triples import load_shipped  # noqa: E402

DATASETS = ("nations", "kinships", "umls")


def recipe(epochs: int, embedding_dim: int, seed: int) -> TrainConfig:
    """``benchmarks/quality.py``'s recipe."""
    return TrainConfig(epochs=epochs, batch_size=128, lr=0.01, embedding_dim=embedding_dim,
                       checkpoint_every=max(1, epochs // 5), seed=seed)


def sign_shares(scores: np.ndarray, top_k: int) -> dict[str, float]:
    """Of a ``[n_test, n_train]`` score matrix: the fraction of scores below zero (``negative``), of scores above
    zero (``positive``), and the fraction of rows with at least one opponent among their ``top_k`` most negative
    scores, i.e. with any negative score when ``top_k >= 1`` (``with_opponents``; rows with none list no
    opponents, as ``POST /tracin`` lists only negative scores as opponents)."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 2 or scores.size == 0:
        raise ValueError("scores must be a non-empty [n_test, n_train] matrix")
    neg = scores < 0
    return {"negative": float(neg.mean()), "positive": float((scores > 0).mean()),
            "with_opponents": float(neg.any(1).mean()) if top_k >= 1 else 0.0}


def tracin(bundle, loss: str) -> ConvETracIn:
    ckpts = list(bundle.checkpoints)
    return ConvETracIn(bundle.model, ckpts, layers="all", loss=loss,
                       weights=checkpoint_weights(bundle, ckpts, "last"))


def trained(ds, cfg: TrainConfig, out: Path):
    if not (out / "done").exists():
        ev.train_model(ds, cfg, out, device="cpu")
        (out / "done").touch()
    return load(out)


def measure(name: str, args: argparse.Namespace, work: Path) -> list[dict]:
    ds = load_shipped(name)
    cfg = recipe(args.epochs, args.embedding_dim, args.seed)
    t0 = time.perf_counter()
    clean = trained(ds, cfg, work / f"{name}-clean")
    t_clean = time.perf_counter() - t0
    corrupted, idx, _ = ev.corrupt_tails(ds.train, len(ds.entities), args.fraction, args.seed)
    t0 = time.perf_counter()
    dirty = trained(ev.with_train(ds, corrupted, keep_eval=True), cfg, work / f"{name}-mislabel")
    t_dirty = time.perf_counter() - t0
    print(f"{name}: trained clean {t_clean:.0f} s, corrupted {t_dirty:.0f} s", file=sys.stderr, flush=True)
    sel = ev.test_selection(len(ds.test), args.n_test, args.seed)
    test = ds.test[torch.from_numpy(np.asarray(sel))]
    labels = np.zeros(len(corrupted), dtype=bool)
    labels[idx] = True
    rows = []
    for loss in args.losses:
        t0 = time.perf_counter()
        scores = tracin(clean, loss).influence(test, clean.dataset.train)[0].double().numpy()
        shares = sign_shares(scores, args.top_k)
        self_scores = tracin(dirty, loss).self_influence(dirty.dataset.train).double().numpy()
        auc = ev.roc_auc(labels, self_scores)
        iv = ev.auc_interval(labels, self_scores, args.seed)
        rows.append({"dataset": name, "loss": loss, **shares, "auc": auc, "low": iv["low"], "high": iv["high"],
                     "seconds": time.perf_counter() - t0, "n_test": len(test), "n_train": len(ds.train)})
        print(f"{name} {loss}: {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def cpu_line() -> str:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model name":
                model = value.strip()
            elif key.strip() == "Flags":
                flags = set(value.split())
    except (OSError, subprocess.CalledProcessError):
        pass
    have = ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in ("avx2", "avx512_bf16"))
    return f"CPU: {model} ({have}), {os.cpu_count()} logical cores, torch threads {torch.get_num_threads()}"


def table(rows: list[dict]) -> list[str]:
    head = ["graph", "loss", "negative share", "with opponents", "mislabel AUC [95% interval]", "seconds"]
    body = [[r["dataset"], r["loss"], f"{r['negative']:.3f}", f"{r['with_opponents']:.2f}",
             f"{r['auc']:.3f} [{r['low']:.3f}, {r['high']:.3f}]", f"{r['seconds']:.0f}"] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    return ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in [head, *body]]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--losses", default=",".join(LOSSES))
    ap.add_argument("--n-test", type=int, default=50)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--embedding-dim", type=int, default=100)
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache-dir", default=None, help="keep the trained models here and reuse them")
    args = ap.parse_args(argv)
    args.losses = [x for x in args.losses.split(",") if x]
    bad = [x for x in args.losses if x not in LOSSES]
    if bad:
        ap.error(f"unknown loss(es) {bad}; choose from {list(LOSSES)}")
    names = [d for d in args.datasets.split(",") if d]
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tracin-loss-") as tmp:
        work = Path(args.cache_dir) if args.cache_dir else Path(tmp)
        rows = [r for name in names for r in measure(name, args, work)]
    n_test = sorted({r["n_test"] for r in rows})
    print(f"TracIn by loss: ConvE-{args.embedding_dim}, {args.epochs} epochs, batch 128, lr 0.01, a checkpoint "
          f"every {max(1, args.epochs // 5)} epochs, seed {args.seed}; every layer and checkpoint, fp32, ghost.")
    print(f"negative share: (test, train) scores < 0 over {'/'.join(map(str, n_test))} test triples x every "
          f"training triple; with opponents: test triples whose top-{args.top_k} opponents list is non-empty;")
    print(f"mislabel AUC: {args.fraction:.0%} of the training tails replaced (seed {args.seed}), self-influence "
          "ranking, stratified bootstrap 95% interval; seconds: TracIn for that loss (both measurements).\n")
    print("\n".join(table(rows)))
    print(f"\n{cpu_line()}; total {time.perf_counter() - t0:.0f} s")
    print("command: OMP_NUM_THREADS=1 python benchmarks/tracin_loss.py " + " ".join(argv or sys.argv[1:]))


if __name__ == "__main__":
    main()
