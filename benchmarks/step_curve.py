"""Per-step running-loss curves (models/curves.py), measured side by side in one run.

1. The recorder alone over runs of 1e3 to 1e6 steps: points kept (the bound), loss reads a training loop makes
   (a device synchronisation each on CUDA), time per step, the size of the live metrics' JSON, and the largest
   difference from the plain computation (``reference_rows``: every point's mean recomputed from all the steps).
2. Vision-BDH on digits, the same run with the curve recorded as shipped and with its per-step reads turned off
   (points only at each epoch's end), CPU seconds per epoch after a warm-up run, the two interleaved.

    python benchmarks/step_curve.py
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.curves import MAX_POINTS, StepCurve, reference_rows  # noqa: E402


def recorder(n_steps: int, per_epoch: int) -> dict:
    rng = random.Random(0)
    losses = [(rng.uniform(0.1, 3.0) * 32, 32.0) for _ in range(n_steps)]
    curve, reads = StepCurve(per_epoch), 0
    pending = [0.0, 0.0]
    t0 = time.perf_counter()
    for i, (s, w) in enumerate(losses, 1):
        pending[0] += s
        pending[1] += w
        last = i % per_epoch == 0
        if last or curve.due(i):
            reads += 1
            curve.add(i, pending[0], pending[1], force=last)
            pending = [0.0, 0.0]
    seconds = time.perf_counter() - t0
    rows = curve.rows()
    ref = reference_rows(losses, [r["step"] for r in rows], per_epoch)
    diff = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(rows, ref, strict=True))
    return {"steps": n_steps, "points": len(rows), "reads": reads, "us_per_step": 1e6 * seconds / n_steps,
            "json_bytes": len(json.dumps(rows)), "max_rel_diff": diff}


def bdh(epochs: int = 2) -> dict:
    import torch

    from models.vision import train as vt
    from models.vision.config import VisionBDHConfig

    torch.set_num_threads(1)
    cfg = vt.TrainConfig(dataset="digits", epochs=epochs, batch_size=16, lr=3e-3, warmup_steps=2, precision="fp32",
                         model=VisionBDHConfig.from_dict({"n_layer": 2, "n_embd": 32, "n_head": 2,
                                                          "mlp_multiplier": 4, "dropout": 0.0}),
                         augment=False, num_workers=0, seed=0)
    out: dict[str, dict] = {}
    due = StepCurve.due
    # a warm-up run first (data set, allocator), then the two interleaved twice; CPU seconds of this process
    # (the machine is shared: wall time measures the neighbours too), the lower of the two
    for name, off in (("warm-up", False), ("per-step reads off", True), ("curve as shipped", False),
                      ("per-step reads off", True), ("curve as shipped", False)):
        StepCurve.due = (lambda self, step: False) if off else due
        with tempfile.TemporaryDirectory() as d:
            t0 = time.process_time()
            result = vt.train(cfg, Path(d), device="cpu")
            cpu = (time.process_time() - t0) / epochs
        if name == "warm-up":
            continue
        best = out.get(name, {}).get("cpu_s_per_epoch", float("inf"))
        out[name] = {"cpu_s_per_epoch": min(best, cpu), "points": len(result.steps),
                     "train_loss": result.history[-1]["train_loss"]}
    StepCurve.due = due
    return out


def main() -> None:
    print(f"1. recorder, at most {MAX_POINTS} points")
    print("| steps | points | loss reads | µs / step | live JSON bytes | max rel. diff vs reference |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n, per_epoch in ((1_000, 100), (10_000, 1_000), (100_000, 1_000), (1_000_000, 10_000)):
        r = recorder(n, per_epoch)
        print(f"| {r['steps']:,} | {r['points']} | {r['reads']:,} | {r['us_per_step']:.2f} | {r['json_bytes']:,} "
              f"| {r['max_rel_diff']:.1e} |")
    print("\n2. Vision-BDH, digits, batch 16 (102 steps per epoch), CPU, 1 thread")
    print("| run | CPU s / epoch (best of 2) | points | last train loss |")
    print("|---|---:|---:|---:|")
    for name, r in bdh().items():
        print(f"| {name} | {r['cpu_s_per_epoch']:.2f} | {r['points']} | {r['train_loss']:.6f} |")


if __name__ == "__main__":
    main()
