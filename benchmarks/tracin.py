"""TracIn influence throughput on ConvE / Nations, every method measured side by side in one run.

Trains the paper's ConvE (200 = 10x20, 32 filters, 2.1M parameters) on Nations for ``--epochs`` epochs with a
checkpoint every epoch (or reuses ``--model-dir``), then scores ``--n-test`` test triples against every training
triple over the checkpoints, in fp32:

  (a) loop      one backward per triple, flattened gradients, dot products (the source's way)
  (b) captum    Captum TracInCP (per-example loss, all layers)
  (v) vmap      torch.func vmap(grad), materialised per-example gradients (the exact reference path)
  (c) ghost     explainq layers=all, factorised exact dot products
  (d) last      explainq layers=last, factorised fc + output entity table

Every method scores the same (test, train) pairs; ``--vmap-train`` limits (v) to the first N training triples (its
rate is per pair, so it stays comparable). Also reported: agreement with (a), self-influence ranking time for the
whole training set, and the projection error against ``projection_dim``.

    python benchmarks/tracin.py            # full: 1,592 train x 64 test, 3 checkpoints
    python benchmarks/tracin.py --quick    # 128 train x 8 test, 2 checkpoints, ConvE-50
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from models.kg.checkpoint import KGBundle, load  # noqa: E402
from models.kg.conve import triple_loss  # noqa: E402
from models.kg.tracin import ConvETracIn  # noqa: E402
from models.kg.train import TrainConfig, train_conve  # noqa: E402
from models.kg.triples import load_nations  # noqa: E402
from tests.captum_oracle import captum_tracincp  # noqa: E402


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a - ref).abs().max() / ref.abs().max())


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    def ranks(x: torch.Tensor) -> torch.Tensor:
        r = torch.empty_like(x)
        r[x.argsort()] = torch.arange(len(x), dtype=x.dtype)
        return r

    ra, rb = ranks(a.flatten().double()), ranks(b.flatten().double())
    return float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])


def loop_tracin(bundle: KGBundle, test: torch.Tensor, train: torch.Tensor) -> torch.Tensor:
    """(a): one backward per triple, all parameters, test gradients cached per checkpoint."""
    model = copy.deepcopy(bundle.model).eval()
    params = list(model.parameters())

    def grad_of(trip: torch.Tensor) -> torch.Tensor:
        loss = triple_loss(model, trip[None]).sum()
        return torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)])

    scores = torch.zeros(len(test), len(train))
    for ckpt in bundle.checkpoints:
        model.load_state_dict(ckpt.state_dict())
        model.eval()
        g_test = torch.stack([grad_of(t) for t in test])
        for j, trip in enumerate(train):
            scores[:, j] += ckpt.lr * (g_test @ grad_of(trip))
    return scores


def captum_tracin(bundle: KGBundle, test: torch.Tensor, train: torch.Tensor, batch_size: int) -> torch.Tensor:
    """(b): Captum TracInCP on the same model, checkpoints, learning rates, loss and layers (all)."""
    return captum_tracincp(bundle, train, batch_size=batch_size).influence((test, test), k=None)


def timed(fn, label: str | None = None):
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    if label:
        print(f"  {label}: {dt:.2f}s", flush=True)
    return out, dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small model and subsets")
    ap.add_argument("--threads", type=int, default=1,
                    help="intra-op threads (1: on a shared 2-core machine, 2 OpenMP threads were 3-8x slower)")
    ap.add_argument("--n-test", type=int, default=None)
    ap.add_argument("--n-train", type=int, default=None, help="default: all training triples")
    ap.add_argument("--vmap-train", type=int, default=None)
    ap.add_argument("--ref-train", type=int, default=None,
                    help="limit (a) loop and (b) Captum to the first N training triples (rates are per pair)")
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--dim", type=int, default=None)
    ap.add_argument("--model-dir", type=Path, default=None, help="reuse (or create) the trained model here")
    ap.add_argument("--skip", default="", help="comma list of a,b,v to skip")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="device of explainq's rows (the loop and Captum stay on the CPU)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    quick = args.quick
    n_test = args.n_test or (8 if quick else 64)
    epochs = args.epochs or (2 if quick else 3)
    dim = args.dim or (50 if quick else 200)
    vmap_train = args.vmap_train or (32 if quick else 256)
    skip = set(args.skip.split(",")) - {""}

    ds = load_nations()
    model_dir = args.model_dir or Path(tempfile.mkdtemp(prefix="tracin-bench-"))
    if not (model_dir / "config.json").is_file():
        cfg = TrainConfig(epochs=epochs, embedding_dim=dim, lr=0.003, checkpoint_every=1, seed=0)
        _, t_train = timed(lambda: train_conve(ds, cfg, model_dir, device="cpu"))
        print(f"trained ConvE-{dim} for {epochs} epochs in {t_train:.1f}s -> {model_dir}")
    bundle = load(model_dir, "cpu")
    train = ds.train if args.n_train is None else ds.train[:args.n_train]
    if quick and args.n_train is None:
        train = ds.train[:128]
    test = ds.test[:n_test]
    n_ck = len(bundle.checkpoints)
    print(f"ConvE-{bundle.model.config.embedding_dim}: {bundle.parameters:,} parameters, {len(train)} train x "
          f"{len(test)} test triples, {n_ck} checkpoints, fp32, {torch.get_num_threads()} threads "
          f"({os.cpu_count()} CPUs visible)")

    rows: list[tuple[str, int, float, str]] = []

    def ghost(layers: str, **kw):
        return ConvETracIn(bundle.model, bundle.checkpoints, layers=layers, batch_size=256, device=args.device,
                      **kw).influence(test, train)[0]

    # warm-up (allocator, kernels) so the first measured method is not penalised
    ConvETracIn(bundle.model, bundle.checkpoints[:1], layers="all").influence(test[:2], train[:8])
    full, t_c = timed(lambda: ghost("all"), "(c) ghost all")
    last, t_d = timed(lambda: ghost("last"), "(d) last")
    ref_train = train if args.ref_train is None else train[:args.ref_train]
    ref, t_a = (None, None) if "a" in skip else timed(lambda: loop_tracin(bundle, test, ref_train), "(a) loop")
    cap, t_b = (None, None) if "b" in skip else timed(lambda: captum_tracin(bundle, test, ref_train, 64), "(b) captum")
    vm_train = train[:vmap_train]
    vm, t_v = (None, None) if "v" in skip else timed(
        lambda: ConvETracIn(bundle.model, bundle.checkpoints, layers="all", method="vmap", batch_size=32)
        .influence(test, vm_train)[0], "vmap")
    # the exact reference: the loop where it ran, else the ghost path itself
    exact = ref if ref is not None else full[:, :len(ref_train)]
    n_ref = exact.shape[1]

    def err(x: torch.Tensor) -> str:
        m = min(n_ref, x.shape[1])
        return f"max rel err {rel_err(x[:, :m], exact[:, :m]):.1e} vs (a)" if ref is not None else "-"

    if ref is not None:
        rows.append(("(a) per-example backward loop", len(ref_train), t_a, "reference"))
    if cap is not None:
        rows.append(("(b) Captum TracInCP", len(ref_train), t_b, err(cap)))
    if vm is not None:
        rows.append(("    vmap(grad), materialised", len(vm_train), t_v, err(vm)))
    note_c = err(full)
    if cap is not None:
        note_c += f", {rel_err(full[:, :cap.shape[1]], cap):.1e} vs (b)"
    rows.append(("(c) explainq layers=all (ghost)", len(train), t_c, note_c))
    rows.append(("(d) explainq layers=last", len(train), t_d, f"Spearman vs all {spearman(last, full):.3f}"))
    for precision in ("fp16", "bf16") if args.device == "cuda" else ():
        half, t_h = timed(lambda p=precision: ghost("all", precision=p), f"(c) {precision}")
        rows.append((f"(c) layers=all, {precision}" + (" (scaled loss)" if precision == "fp16" else ""),
                     len(train), t_h, f"rel. Frobenius err vs fp32 {float((half - full).norm() / full.norm()):.1e}"))

    base_rate = {name: len(test) * n / t for name, n, t, _ in rows}
    loop_rate = base_rate.get("(a) per-example backward loop")
    cap_rate = base_rate.get("(b) Captum TracInCP")
    print()
    print("| method | train triples | seconds | pairs/s | x loop | x Captum | agreement |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, n, t, note in rows:
        rate = len(test) * n / t
        xl = f"{rate / loop_rate:.1f}" if loop_rate else "-"
        xc = f"{rate / cap_rate:.1f}" if cap_rate else "-"
        print(f"| {name.strip()} | {n} | {t:.2f} | {rate:,.0f} | {xl} | {xc} | {note} |")

    print()
    for layers in ("all", "last"):
        si, t_s = timed(lambda layers=layers: ConvETracIn(bundle.model, bundle.checkpoints, layers=layers)
                        .self_influence(ds.train))
        print(f"self-influence ranking, layers={layers}: {len(ds.train)} training triples x {n_ck} checkpoints "
              f"in {t_s:.2f}s ({len(ds.train) / t_s:,.0f} triples/s)")

    print()
    print("| projection_dim | seconds | max rel err | median rel err (|s|>1e-3 max) | Spearman |")
    print("|---:|---:|---:|---:|---:|")
    big = full.abs() > 1e-3 * full.abs().max()
    for k in (64, 256, 1024, 4096):
        proj, t_p = timed(lambda k=k: ghost("all", projection_dim=k, seed=0))
        med = float(((proj - full).abs()[big] / full.abs()[big]).median())
        print(f"| {k} | {t_p:.2f} | {rel_err(proj, full):.1e} | {med:.1e} | {spearman(proj, full):.4f} |")


if __name__ == "__main__":
    main()
