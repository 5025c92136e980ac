"""Vision-BDH training throughput: reference vs optimised (each optimisation's share) vs a same-width ViT-Tiny.

    PYTHONPATH=. python benchmarks/bdh.py            # D 192, 6 layers, multiplier 32, batch 32, fp32
    PYTHONPATH=. python benchmarks/bdh.py --quick    # a small configuration, about a minute

All variants are timed in one process, interleaved round-robin (one training step of each variant per round) so
that a busy machine slows them alike; the table reports the median step. A step is forward, cross-entropy,
backward, AdamW (fused) and ``zero_grad(set_to_none=True)``, in the chosen precision, on one fixed batch.

FLOPs are counted with ``torch.utils.flop_counter.FlopCounterMode`` on one forward+backward of each model
(matmuls, convolutions and attention; elementwise work is not counted), so "GFLOP/s" is the achieved matmul rate.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.common import autocast  # noqa: E402
from models.vision.bdh import VisionBDH  # noqa: E402
from models.vision.config import Optimizations, VisionBDHConfig  # noqa: E402
from models.vision.reference import ReferenceVisionBDH  # noqa: E402
from models.vision.vit import ViTTiny  # noqa: E402


@dataclasses.dataclass
class Variant:
    name: str
    model: torch.nn.Module
    step: Callable[[], float]
    flops: int
    times: list[float] = dataclasses.field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def count_flops(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> int:
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(images), labels).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def make_step(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, precision: str,
              compile_mode: str | None) -> Callable[[], float]:
    net = torch.compile(model, mode=compile_mode) if compile_mode else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step() -> float:
        t0 = time.perf_counter()
        with autocast(images.device, precision):
            logits = net(images)
        loss = F.cross_entropy(logits.float(), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    return step


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small model and batch, two timed rounds")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-embd", type=int, default=192)
    p.add_argument("--n-head", type=int, default=6)
    p.add_argument("--mult", type=int, default=32)
    p.add_argument("--softmax", action="store_true", help="softmax attention (SDPA) instead of linear")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up round")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--compile", default="default", help="torch.compile mode for the compiled variant, or 'off'")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.n_layer, args.rounds = 8, 2, 2
    if args.threads:
        torch.set_num_threads(args.threads)

    config = VisionBDHConfig(n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head, mlp_multiplier=args.mult,
                             softmax_attention=args.softmax, dropout=0.1)
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(args.batch, 3, 32, 32, generator=gen)
    labels = torch.randint(0, 10, (args.batch,), generator=gen)
    torch.manual_seed(0)
    reference = ReferenceVisionBDH(config)
    state = reference.state_dict()

    def bdh(opt: Optimizations) -> VisionBDH:
        model = VisionBDH(config, opt)
        model.load_state_dict(state)
        return model

    specs: list[tuple[str, torch.nn.Module, str | None]] = [
        ("reference", reference, None),
        ("optimized", bdh(Optimizations()), None),
    ]
    for name in Optimizations.names():
        if name == "sdpa" and not args.softmax:
            continue  # SDPA only acts on softmax attention
        specs.append((f"optimized - {name}", bdh(Optimizations().without(name)), None))
    if args.compile != "off":
        specs.append((f"optimized + compile({args.compile})", bdh(Optimizations()), args.compile))
    vit = ViTTiny(n_layer=args.n_layer, n_embd=args.n_embd, n_head=3, dropout=0.1)
    specs.append(("ViT-Tiny (same D, depth)", vit, None))

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, {args.precision}, "
          f"D {args.n_embd}, layers {args.n_layer}, heads {args.n_head}, multiplier {args.mult}, "
          f"N {config.neurons_per_head}, {'softmax' if args.softmax else 'linear'} attention", flush=True)
    variants = []
    for name, model, mode in specs:
        model.train()
        flops = count_flops(model, images, labels)
        variants.append(Variant(name, model, make_step(model, images, labels, args.precision, mode), flops))

    for r in range(args.rounds + 1):  # round 0 is warm-up (and compilation)
        for v in variants:
            t = v.step()
            if r > 0:
                v.times.append(t)
        print(f"round {r}: " + ", ".join(f"{v.name} {v.times[-1] if r else t:.2f}s" for v in variants[:2]) + " ...",
              file=sys.stderr, flush=True)

    ref = variants[0]
    opt = variants[1]
    vit_v = variants[-1]
    header = (f"{'variant':34s} {'s/step':>8s} {'img/s':>8s} {'x ref':>7s} {'GFLOP/step':>11s} {'GFLOP/s':>8s} "
              f"{'FLOP/s vs ViT':>13s}")
    print("\n" + header + "\n" + "-" * len(header))
    vit_rate = vit_v.flops / vit_v.median
    for v in variants:
        rate = v.flops / v.median
        print(f"{v.name:34s} {v.median:8.3f} {args.batch / v.median:8.1f} {ref.median / v.median:7.2f} "
              f"{v.flops / 1e9:11.1f} {rate / 1e9:8.1f} {rate / vit_rate:13.2f}")
    print("\nshare of each optimisation (slowdown when only it is switched off; share of the reference->optimized "
          "time saved):")
    saved = ref.median - opt.median
    for v in variants:
        if v.name.startswith("optimized - "):
            lost = v.median - opt.median
            print(f"  {v.name[12:]:18s} x{v.median / opt.median:5.2f}   {100 * lost / saved if saved > 0 else 0:6.1f}%")
    print(f"\ntime ratio optimized / ViT-Tiny: {opt.median / vit_v.median:.1f}x; FLOP ratio BDH / ViT: "
          f"{opt.flops / vit_v.flops:.1f}x")
    n_params = sum(p.numel() for p in opt.model.parameters())
    vit_params = sum(p.numel() for p in vit.parameters())
    print(f"parameters: Vision-BDH {n_params:,} (formula 3·mult·D² + conv + pos + head = "
          f"{config.expected_parameters():,}, BDH core {3 * args.mult * args.n_embd**2:,}); ViT-Tiny {vit_params:,}")


if __name__ == "__main__":
    main()
