"""Gradient feature store at FB15k-237 scale: featurize once, then one test triple against every training triple.

The graph is the deterministic synthetic one with FB15k-237's shape (``models.kg.synthetic``: 14,541 entities, 237
relations, 272,115 training triples). The model is a ConvE at its seeded initial weights (no training: neither the
time nor the equality depends on what the weights are), by default a small one (``--dim 20``, 4 filters) with
``--layers last`` so that featurizing 272k triples twice (stored, and the direct answer) fits a short run on a shared
2-core machine; the stored feature matrix is ``[272,115, k]`` per checkpoint whatever the model and layers, so the
query time does not depend on that choice. The loss and k default to what ``POST /featurize`` stores by default and
``POST /tracin``'s ``trak`` reads, the evaluated TRAK's (``models.kg.trak_config``: the margin, k 1024 at 272,115
training triples), and the query uses the evaluated damping. Printed:

- featurize: seconds to compute and store every training triple's features (``models.kg.stored.featurize``);
  a second call, which finds everything stored, and its rows computed (0);
- query (cold): open the stored features (memory-mapped segments and their Gram blocks) and answer one test triple:
  its features, the TRAK solve, the tiled product over all rows and the streaming top-k;
- query (warm): the same for other test triples with the index open (median of ``--repeats``);
- direct: ``models.kg.trak.trak_scores`` for the same test triple (features of every row recomputed), and the
  max abs difference between its score row and the stored one (and whether the top-k lists are identical).

    python benchmarks/featurize.py                        # full size (about two minutes on 2 busy cores)
    python benchmarks/featurize.py --train-triples 20000  # quick
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        info = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
        return f"{info.get('Model name', '?').strip()}, {info.get('CPU(s)', '?').strip()} CPUs"
    except (OSError, subprocess.SubprocessError):
        return platform.processor() or "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train-triples", type=int, default=272_115)
    ap.add_argument("--dim", type=int, default=20)
    ap.add_argument("--height", type=int, default=4)
    ap.add_argument("--filters", type=int, default=4)
    ap.add_argument("--layers", default="last")
    ap.add_argument("--loss", default=None, choices=["train", "score_bce", "margin"],
                    help="default: the evaluated TRAK's (margin)")
    ap.add_argument("--proj-dim", type=int, default=None,
                    help="default: the evaluated TRAK's k for the training triples (1024 at 272,115)")
    ap.add_argument("--damping", type=float, default=None, help="default: the evaluated TRAK's (0.3)")
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="where the gradients are computed and projected (features are fp32 on every device: "
                    "featurize has no reduced-precision path)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from core.filestore import Store
    from models.explain import features as F
    from models.explain.tracin import MemoryCheckpoint
    from models.kg import stored as KF
    from models.kg.checkpoint import KGBundle
    from models.kg.conve import ConvE, ConvEConfig
    from models.kg.synthetic import generate
    from models.kg.trak import trak_scores
    from models.kg.trak_config import TRAK_DAMPING, TRAK_LOSS, trak_proj_dim
    from models.kg.triples import load_triples_dir

    with tempfile.TemporaryDirectory(prefix="featurize-bench-") as tmp:
        root = Path(tmp)
        generate(root / "data", seed=0)
        ds = load_triples_dir(root / "data")
        train = ds.train[:args.train_triples]
        torch.manual_seed(0)
        model = ConvE(ConvEConfig(len(ds.entities), len(ds.relations), args.dim, args.height,
                                  args.filters)).eval()
        ckpt = MemoryCheckpoint({k: v.clone() for k, v in model.state_dict().items()}, lr=1e-3, label="init")
        bundle = KGBundle(model, ds, [ckpt], root)
        store = Store(str(root / "store"), root / "cache")
        loss = TRAK_LOSS if args.loss is None else args.loss
        k = trak_proj_dim(len(train)) if args.proj_dim is None else args.proj_dim
        damping = TRAK_DAMPING if args.damping is None else args.damping
        opts = {"layers": args.layers, "loss": loss, "proj_dim": k, "seed": 0}

        t0 = time.perf_counter()
        rep = KF.featurize(store, bundle, "all", train=train, batch_size=args.batch_size, device=args.device, **opts)
        t_feat = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = KF.featurize(store, bundle, "all", train=train, batch_size=args.batch_size, device=args.device,
                             **opts)
        t_again = time.perf_counter() - t0

        tests = ds.test[:args.repeats + 1]
        t0 = time.perf_counter()
        index = KF.feature_index(store, bundle, "all", train=train, **opts)
        top = index.top_k(index.queries(tests[:1], damping=damping), args.top_k)
        t_cold = time.perf_counter() - t0
        warm = []
        for i in range(1, len(tests)):
            t0 = time.perf_counter()
            index.top_k(index.queries(tests[i:i + 1], damping=damping), args.top_k)
            warm.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        direct = trak_scores(bundle, "all", tests[:1], train, batch_size=args.batch_size, device=args.device,
                             damping=damping, **opts)
        t_direct = time.perf_counter() - t0
        stored = index.scores(index.queries(tests[:1], damping=damping))
        diff = float((stored - direct).abs().max())
        ref = F.full_sort_top_k(direct, args.top_k)
        same_top = bool(torch.equal(top.pro_idx, ref.pro_idx) and torch.equal(top.opp_idx, ref.opp_idx))

    n = len(train)
    card = f"; device {torch.cuda.get_device_name(0)}" if args.device == "cuda" else "; device cpu"
    print(f"CPU: {cpu_model()}; torch threads {args.threads}; torch {torch.__version__}{card}")
    print(f"graph: synthetic FB15k-237 shape, {len(ds.entities):,} entities, {n:,} training triples; "
          f"ConvE dim {args.dim} ({args.height}x{args.dim // args.height}), {args.filters} filters, initial weights; "
          f"layers {args.layers}, loss {loss}, k {k}, damping {damping}, 1 checkpoint; "
          f"features {n * k * 4 / 2**20:.0f} MiB")
    print()
    print("| step | seconds | notes |")
    print("|---|---|---|")
    print(f"| featurize {n:,} triples | {t_feat:.1f} | {rep['rows_computed']:,} rows computed |")
    print(f"| featurize again | {t_again:.2f} | {again['rows_computed']} rows computed |")
    print(f"| query, cold (open + 1 test triple, top-{args.top_k}) | {t_cold:.3f} | |")
    print(f"| query, warm (1 test triple, top-{args.top_k}, median of {len(warm)}) | {statistics.median(warm):.3f} | "
          f"min {min(warm):.3f}, max {max(warm):.3f} |")
    print(f"| direct (un-featurized) trak_scores, 1 test triple | {t_direct:.1f} | max abs diff vs stored "
          f"{diff:.2e} (max |score| {float(direct.abs().max()):.2e}); top-{args.top_k} identical: {same_top} |")


if __name__ == "__main__":
    main()
