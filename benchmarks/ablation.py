"""LoRA ablation benchmark, measured side by side in one run.

1. The spectrum of ΔW = up·down for every layer of every adapter (the ``spectral_delta`` features): the exact
   factor method (QR of the factors, SVD of an r x r core) against ``torch.svd_lowrank`` and the full SVD of
   the materialised ΔW. The reference methods are slow, so they are timed on the first ``--full-items`` /
   ``--lowrank-items`` adapters and their time for the whole dataset is extrapolated linearly (labelled
   "est."); the exact method is timed on all adapters. Factors are preloaded on the device: I/O is excluded.
2. The quick (3-run) experiment over the 10 source representations on layer sets all + visual, first with an
   empty cache directory (features computed and the dataset fingerprinted), then again (features cached).

    python benchmarks/ablation.py            # 1,000 LoRAs x 128 layers, SD 1.5 shapes
    python benchmarks/ablation.py --quick    # 200 LoRAs x 128 layers at 1/4 width, for a fast check
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.common import default_device  # noqa: E402
from models.lora.data import LayerFactors, LoraDataset  # noqa: E402
from models.lora.experiment import AblationConfig, run_ablation  # noqa: E402
from models.lora.features import layer_features  # noqa: E402
from models.lora.representations import SOURCE_REPRESENTATIONS, delta_singular_values  # noqa: E402
from models.lora.synthetic import generate_dataset  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def dataset(args: argparse.Namespace) -> Path:
    spec = {"num_classes": 10, "per_class": args.items // 10, "rank": 1, "signal": {"visual": 0.3, "text": 0.6},
            "width_divisor": args.width_divisor, "seed": 7}
    root = Path(args.data_dir) / f"lora-{args.items}x128-w{args.width_divisor}"
    stamp = root / "bench.json"
    if not (stamp.is_file() and stamp.read_text() == json.dumps(spec, sort_keys=True)):
        t0 = time.perf_counter()
        generate_dataset(root, progress=True, **spec)
        stamp.write_text(json.dumps(spec, sort_keys=True))
        print(f"generated {root} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return root


def subset(factors: dict[str, LayerFactors], k: int) -> dict[str, LayerFactors]:
    return {n: LayerFactors(f.down[:k], f.up[:k], f.scale[:k]) for n, f in factors.items()}


def time_method(factors: dict[str, LayerFactors], method: str, device: torch.device) -> tuple[float, dict]:
    _sync(device)
    t0 = time.perf_counter()
    out = layer_features(factors, "spectral_delta", device, method=method)
    _sync(device)
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="200 LoRAs at 1/4 width (a fast check)")
    ap.add_argument("--items", type=int, default=1000)
    ap.add_argument("--width-divisor", type=int, default=1, help="1 = real SD 1.5 widths")
    ap.add_argument("--full-items", type=int, default=2, help="adapters timed with the full SVD")
    ap.add_argument("--lowrank-items", type=int, default=20, help="adapters timed with svd_lowrank")
    ap.add_argument("--max-epochs", type=int, default=200, help="probe epoch cap for the experiment part")
    ap.add_argument("--hidden-dim", type=int, default=512)
    ap.add_argument("--data-dir", default="var/bench")
    ap.add_argument("--skip-experiment", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.items, args.width_divisor = 200, 4
    device = default_device()
    root = dataset(args)
    ds = LoraDataset(root)
    n, n_layers = len(ds), len(ds.layers)

    t0 = time.perf_counter()
    factors = ds.load_layers(ds.layers)
    load_s = time.perf_counter() - t0
    # warm-up (kernel selection, allocator) on one adapter for each method
    for m in ("exact", "lowrank", "full"):
        time_method(subset(factors, 1), m, device)
    exact_s, exact = time_method(factors, "exact", device)
    torch.manual_seed(0)
    kl = min(args.lowrank_items, n)
    low_s, low = time_method(subset(factors, kl), "lowrank", device)
    kf = min(args.full_items, n)
    full_s, full = time_method(subset(factors, kf), "full", device)

    def max_rel(a: dict, b: dict, k: int) -> float:
        worst = 0.0
        for name in b:
            x, y = a[name][:k].double(), b[name][:k].double()
            worst = max(worst, float(((x - y).abs() / y.abs().clamp_min(1e-30)).max()))
        return worst

    # singular values themselves, exact vs full, on the same adapters
    sv_err = 0.0
    for f in subset(factors, kf).values():
        d, u, s = (t.to(device, torch.float32) for t in (f.down, f.up, f.scale))
        a = delta_singular_values(d, u, s, "exact").double()
        b = delta_singular_values(d, u, s, "full").double()
        sv_err = max(sv_err, float(((a - b).abs() / b.clamp_min(1e-30)).max()))

    per = {"full SVD": (full_s / kf, kf, max_rel(full, full, kf)),
           "svd_lowrank": (low_s / kl, kl, max_rel(low, full, min(kl, kf))),
           "exact (QR)": (exact_s / n, n, max_rel(exact, full, kf))}
    exact_per = exact_s / n
    lines = []
    lines.append(f"LoRA ablation benchmark: {n} LoRAs x {n_layers} layers (SD 1.5 attention shapes / "
                 f"{args.width_divisor}, rank 1, fp16 on disk), device {device}, torch threads "
                 f"{torch.get_num_threads()}")
    lines.append(f"load factors from {n} safetensors files: {load_s:.1f}s (not in the timings below)")
    lines.append("")
    lines.append("spectral_delta features (spectrum of ΔW = up·down, all layers)")
    head = f"{'method':<14}{'LoRAs timed':>12}{'ms / LoRA':>12}{f'{n} LoRAs (s)':>16}{'x slower':>10}" \
           f"{'max rel diff vs full':>22}"
    lines += [head, "-" * len(head)]
    for name, (sec, k, err) in per.items():
        total = f"{sec * n:.2f}" + ("" if k == n else " est.")
        lines.append(f"{name:<14}{k:>12}{1e3 * sec:>12.2f}{total:>16}{sec / exact_per:>10.0f}{err:>22.1e}")
    lines.append(f"exact vs full SVD singular values: max relative difference {sv_err:.1e} (fp32)")
    print("\n".join(lines), flush=True)

    if args.skip_experiment:
        return
    del factors, exact, low, full
    cache = Path(args.data_dir) / "cache-ablation"
    shutil.rmtree(cache, ignore_errors=True)
    cfg = AblationConfig(representations=list(SOURCE_REPRESENTATIONS), layer_sets=["all", "visual"], quick=True,
                         max_epochs=args.max_epochs, hidden_dim=args.hidden_dim, cache_features=True)
    rows = []
    for label in ("first (cold cache)", "second (cached)"):
        t0 = time.perf_counter()
        res = run_ablation(ds, cfg, device, cache_dir=cache)
        total = time.perf_counter() - t0
        rows.append((label, res["timing"]["features_s"], res["timing"]["training_s"], total,
                     len(res["timing"]["features_computed"]), len(res["timing"]["features_cached"])))
        ds = LoraDataset(root)  # a fresh object: no in-memory fingerprint carried over
    out = ["", f"quick experiment: 10 representations x layer sets all+visual x 3 runs, max_epochs "
               f"{args.max_epochs}, hidden {args.hidden_dim}, patience 15"]
    head = f"{'run':<20}{'features s':>12}{'training s':>12}{'total s':>10}{'computed':>10}{'cached':>8}"
    out += [head, "-" * len(head)]
    for label, fs, ts, tot, nc, nh in rows:
        out.append(f"{label:<20}{fs:>12.2f}{ts:>12.1f}{tot:>10.1f}{nc:>10}{nh:>8}")
    out.append(f"features: cached run {rows[0][1] / max(rows[1][1], 1e-9):.0f}x faster; "
               f"whole run {rows[0][3] / rows[1][3]:.2f}x")
    acc = {ls: {r: round(res["results"][ls][r]["test_acc"]["mean"], 3) for r in cfg.representations}
           for ls in cfg.layer_sets}
    out.append(f"test accuracy (second run), chance {1 / ds.num_classes:.2f}: {json.dumps(acc)}")
    print("\n".join(out), flush=True)


if __name__ == "__main__":
    main()
