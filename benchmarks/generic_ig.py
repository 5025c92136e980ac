"""Integrated Gradients on exported classifiers: explainq against Captum on the same inputs, side by side.

    python benchmarks/generic_ig.py            # every model, 3 rounds each
    python benchmarks/generic_ig.py --quick    # fewer samples, 1 round

Models (deterministic, built here, exported with ``torch.export`` and loaded by the service's interpreter): the
tests' 8x8 digit CNN, a 3x12x12 colour CNN, a 6-feature tabular MLP with self-attention, and a 3x64x64 five-layer
CNN (the one where compute dominates). Per model, every method attributes the same inputs to the same targets with
Gauss-Legendre at 50 steps, fp32, zero baseline:

- ``captum (eager)``: Captum ``IntegratedGradients`` on the eager ``nn.Module`` the program was exported from, all
  steps in one pass (``internal_batch_size`` unset): how a Captum user runs it;
- ``captum (program)``: the same on explainq's interpreted program (isolates the interpreter's cost);
- ``explainq``: :func:`models.export.attribution.explain` on the interpreted program.

Each runs in its own process (spawned) so that its peak memory (RSS growth, or CUDA peak allocation) is its own;
the table gives the median round's wall and process-CPU time per sample-step. Then the steps to 1e-3: explainq's
adaptive Clenshaw-Curtis (``tolerance=1e-3``: per-token error estimate and completeness, from 16 steps, per
sample) against Captum's Gauss-Legendre at 50 steps and at the fewest of 8, 16, 32, ... steps that bring every
token within 1e-3 (of the sample's largest attribution) of one reference, Captum's Gauss-Legendre at 2048 steps,
with completeness within 1e-3 too; explainq's result is scored against the same reference. Goals (issue "Bring any PyTorch model"): >= 1.0x Captum per step, >= 2x fewer evaluations.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEPS = 50
TOLERANCE = 1e-3
REFERENCE_STEPS = 2048


def _big_cnn():
    import torch

    class Big(torch.nn.Module):
        def __init__(self):
            super().__init__()
            chans = [3, 16, 32, 32, 64, 64]
            self.convs = torch.nn.ModuleList(torch.nn.Conv2d(a, b, 3, padding=1, stride=2 if i % 2 else 1)
                                             for i, (a, b) in enumerate(zip(chans, chans[1:], strict=False)))
            self.head = torch.nn.Linear(64, 10)

        def forward(self, x):
            for c in self.convs:
                x = torch.relu(c(x))
            return self.head(x.mean((2, 3)))

    torch.manual_seed(0)
    return Big().eval()


def models(quick: bool) -> dict[str, dict[str, Any]]:
    from tests.export_fixtures import colour_cnn, digit_cnn, tabular_net

    return {
        "digit-cnn 1x8x8": {"model": digit_cnn(), "shape": (1, 8, 8), "kind": "image", "n": 8 if quick else 32},
        "colour-cnn 3x12x12": {"model": colour_cnn(), "shape": (3, 12, 12), "kind": "image",
                               "n": 8 if quick else 32},
        "tabular-mlp 6": {"model": tabular_net(), "shape": (6,), "kind": "tabular", "n": 8 if quick else 64},
        "cnn5 3x64x64": {"model": _big_cnn(), "shape": (3, 64, 64), "kind": "image", "n": 2 if quick else 8},
    }


def _setup(name: str, quick: bool, tmp: Path):
    import torch

    from models.export.program import build
    from tests.export_fixtures import export

    m = models(quick)[name]
    model, shape, n = m["model"], m["shape"], m["n"]
    path = export(model, torch.randn(2, *shape), tmp / f"{name.split()[0]}.pt2")
    labels = [str(i) for i in range(int(model(torch.zeros(1, *shape)).shape[1]))]
    clf = build(path, {"input": {"kind": m["kind"]}, "labels": labels})
    g = torch.Generator().manual_seed(7)
    x = torch.randn((n, *shape), generator=g)
    targets = [i % len(labels) for i in range(n)]
    return model, clf, x, targets


def _one(args: tuple[str, str, bool, int, str]) -> dict[str, Any]:
    """One method on one model in this (spawned) process: median round wall and CPU seconds, peak memory."""
    name, method, quick, rounds, tmp = args
    import torch
    from captum.attr import IntegratedGradients

    from models.common import default_device
    from models.export.attribution import ExportOptions, TensorSample, explain

    device = default_device()
    model, clf, x, targets = _setup(name, quick, Path(tmp))
    model.to(device)
    clf.program.to(device)
    x = x.to(device)
    samples = [TensorSample(f"s{i}", x[i].cpu().numpy(), target=t) for i, t in enumerate(targets)]

    def run() -> None:
        if method == "explainq":
            explain(clf, samples, ExportOptions(n_steps=STEPS, method="gausslegendre", precision="fp32",
                                                baseline="zero"))
        else:
            fn = model if method == "captum (eager)" else clf.forward
            IntegratedGradients(fn).attribute(x, baselines=torch.zeros_like(x), target=targets, n_steps=STEPS,
                                              method="gausslegendre")
        if device.type == "cuda":
            torch.cuda.synchronize()

    run()  # warm-up
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    walls, cpus = [], []
    for _ in range(rounds):
        w0, c0 = time.perf_counter(), time.process_time()
        run()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    peak = (torch.cuda.max_memory_allocated() if device.type == "cuda"
            else (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024)
    steps = len(samples) * STEPS
    return {"wall_ms": 1000 * statistics.median(walls) / steps, "cpu_ms": 1000 * statistics.median(cpus) / steps,
            "peak_mib": peak / 2**20, "device": str(device)}


def evaluations(name: str, quick: bool, tmp: str) -> dict[str, Any]:
    """Steps to TOLERANCE on every token and on completeness: explainq's adaptive rule against Captum's
    Gauss-Legendre, both scored against one reference (Captum's Gauss-Legendre at REFERENCE_STEPS on the eager
    model): a token's error is its distance to the reference over the sample's largest reference attribution."""
    import torch
    from captum.attr import IntegratedGradients

    from models.export.attribution import ExportOptions, TensorSample, explain

    model, clf, x, targets = _setup(name, quick, Path(tmp))
    n = len(targets)
    rows = torch.arange(n)
    with torch.no_grad():
        gap = (model(x)[rows, targets] - model(torch.zeros_like(x))[rows, targets]).double()  # F(x) - F(x')
    size = gap.abs().clamp_min(1e-12)

    def captum(steps: int) -> torch.Tensor:
        a = IntegratedGradients(model).attribute(x, baselines=torch.zeros_like(x), target=targets, n_steps=steps,
                                                 method="gausslegendre")
        return (a.sum(1) if a.ndim == 4 else a).reshape(n, -1).double()  # per pixel or feature

    ref = captum(REFERENCE_STEPS)
    scale = ref.abs().amax(1).clamp_min(1e-12)

    def scores(cells: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        token = (cells - ref).abs().amax(1) / scale
        complete = (cells.sum(1) - gap).abs() / size
        return token, complete

    samples = [TensorSample(f"s{i}", x[i].numpy(), target=t) for i, t in enumerate(targets)]
    rep = explain(clf, samples, ExportOptions(n_steps=1024, tolerance=TOLERANCE, precision="fp32", baseline="zero"))
    ours = torch.tensor([r["word_attributions"] for r in rep["samples"]], dtype=torch.float64)
    token, _ = scores(ours)
    met = sum(bool(r["tolerance_met"]) for r in rep["samples"])
    at50, _ = scores(captum(STEPS))
    needed = None
    for steps in (8, 16, 32, 64, 128, 256, 512, 1024):
        t, c = scores(captum(steps))
        if float(t.max()) <= TOLERANCE and float(c.max()) <= TOLERANCE:
            needed = steps
            break
    return {"ours": rep["summary"]["gradient_evaluations"] / n, "met": met, "n": n,
            "ours_token_max": float(token.max()), "captum50_token_median": float(at50.median()),
            "captum50_met": int((at50 <= TOLERANCE).sum()), "captum_needed": needed}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                flags = Path("/proc/cpuinfo").read_text()
                isa = "AVX-512 BF16" if "avx512_bf16" in flags else "AVX-512" if "avx512f" in flags else \
                    "AVX2" if "avx2" in flags else "no AVX2"
                return f"{line.split(':', 1)[1].strip()} ({isa}, {os.cpu_count()} CPUs)"
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = ap.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    import torch

    names = args.models or list(models(args.quick))
    methods = ("captum (eager)", "captum (program)", "explainq")
    print(f"# generic IG: torch {torch.__version__}, {cpu_name()}, "
          f"device {'cuda: ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}, "
          f"threads {torch.get_num_threads()}, {STEPS} Gauss-Legendre steps, fp32, median of {rounds} rounds")
    out: dict[str, Any] = {}
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        print("\n| model | method | ms / sample-step (wall) | ms / sample-step (CPU) | peak MiB | vs captum (eager) |")
        print("|---|---|---:|---:|---:|---:|")
        for name in names:
            res = {}
            for method in methods:
                with ctx.Pool(1) as pool:
                    res[method] = pool.apply(_one, ((name, method, args.quick, rounds, tmp),))
            base = res["captum (eager)"]["wall_ms"]
            for method in methods:
                r = res[method]
                print(f"| {name} | {method} | {r['wall_ms']:.4f} | {r['cpu_ms']:.4f} | {r['peak_mib']:.1f} | "
                      f"{base / r['wall_ms']:.2f}x |")
            out[name] = {"timing": res}
        print(f"\n| model | explainq adaptive: evaluations / sample (met) | its max token error vs reference | "
              f"Captum GL 50: median token error (met) | Captum GL steps for every token and completeness <= "
              f"{TOLERANCE:g} | explainq vs 50 | explainq vs Captum's needed |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name in names:
            e = evaluations(name, args.quick, tmp)
            needed = e["captum_needed"]
            print(f"| {name} | {e['ours']:.1f} ({e['met']}/{e['n']}) | {e['ours_token_max']:.1e} | "
                  f"{e['captum50_token_median']:.1e} ({e['captum50_met']}/{e['n']}) | "
                  f"{needed if needed else '> 1024'} | {STEPS / e['ours']:.2f}x | "
                  f"{(needed / e['ours']) if needed else float('inf'):.2f}x |")
            out[name]["evaluations"] = e
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
