"""Vision-BDH training throughput: reference vs optimised (each optimisation's share) vs a same-width ViT-Tiny.

    PYTHONPATH=. python benchmarks/bdh.py            # D 192, 6 layers, multiplier 32, batch 32, fp32
    PYTHONPATH=. python benchmarks/bdh.py --quick    # a small configuration, about a minute

A step is forward, cross-entropy, backward, AdamW (fused) and ``zero_grad(set_to_none=True)``, in fp32 (or the
chosen precision), on one fixed batch; every model starts from the same weights.

**Each variant runs in its own fresh process**, for ``--rounds`` rounds; a round starts every variant once, in a new
random order, and each process takes ``--warmup`` untimed steps (compilation, first-touch page faults) before
``--steps`` timed ones. The table gives the median timed step. Separate processes matter for two reasons: the
trainer's process-wide allocator setting (:mod:`models.vision.perf`) is one of the optimisations, so the reference
must run without it, as the plain source does; and in one shared process later variants inherit a heap that earlier
ones already grew, which biases per-variant shares.

- ``reference``: the plain model (:mod:`models.vision.reference`) with the allocator tuned, as the trainer runs
  any model: the headline baseline, like with like, so "x reference" is what the model changes alone give;
- ``optimized``: the trainer's configuration: every model optimisation on, allocator tuned;
- ``optimized - X``: the same with one optimisation off, so the slowdown is X's share (``allocator`` = the
  process-wide setting; ``sdpa`` only with ``--softmax``);
- ``reference - allocator``: the plain source in a plain process, for the total against the source;
- ``optimized + compile``: ``torch.compile`` of the optimised model (its compile time is in the warm-up);
- ``optimized, bf16 autocast``: what ``precision: auto`` picks for training on a CPU with native bf16 (shown only
  there; not part of the fp32 comparison);
- ``ViT-Tiny``: a plain pre-norm transformer encoder of the same width, depth and patching, in the trainer's process
  settings.

FLOPs are counted with ``torch.utils.flop_counter.FlopCounterMode`` on one forward+backward of each model
(matmuls, convolutions and attention; elementwise work is not counted), so "GFLOP/s" is the achieved matmul rate.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# ------------------------------------------------------------------------------------------------- the child
def child(spec: dict) -> dict:
    """Build one variant, warm it up, time its steps; runs in its own process."""
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from models.common import autocast
    from models.vision.bdh import VisionBDH
    from models.vision.config import Optimizations, VisionBDHConfig
    from models.vision.perf import tune_cpu_allocator
    from models.vision.reference import ReferenceVisionBDH
    from models.vision.vit import ViTTiny

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    device = torch.device(spec.get("device", "cpu"))
    # the allocator setting is glibc's, for CPU training processes only
    allocator = bool(spec["allocator"]) and device.type == "cpu" and tune_cpu_allocator()
    cfg = spec["config"]
    config = VisionBDHConfig(n_layer=cfg["n_layer"], n_embd=cfg["n_embd"], n_head=cfg["n_head"],
                             mlp_multiplier=cfg["mult"], softmax_attention=cfg["softmax"], dropout=0.1)
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(cfg["batch"], 3, 32, 32, generator=gen)
    labels = torch.randint(0, 10, (cfg["batch"],), generator=gen)
    torch.manual_seed(0)
    reference = ReferenceVisionBDH(config)
    model: torch.nn.Module
    if spec["model"] == "reference":
        model = reference
    elif spec["model"] == "vit":
        model = ViTTiny(n_layer=cfg["n_layer"], n_embd=cfg["n_embd"], n_head=3, dropout=0.1)
    else:
        opts = Optimizations()
        for name in spec["without"]:
            opts = opts.without(name)
        model = VisionBDH(config, opts)
        model.load_state_dict(reference.state_dict())
    model.train()
    model.to(device)
    images, labels = images.to(device), labels.to(device)
    if device.type == "cuda":  # the trainer's fast mode
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True

    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(images), labels).backward()
    model.zero_grad(set_to_none=True)
    flops = counter.get_total_flops()

    net = torch.compile(model, mode=spec["compile"]) if spec["compile"] else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    precision = spec["precision"]

    def step() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        with autocast(images.device, precision):
            logits = net(images)
        loss = F.cross_entropy(logits.float(), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    warm = [step() for _ in range(spec["warmup"])]
    times = [step() for _ in range(spec["steps"])]
    return {"times": times, "warmup": warm, "flops": flops, "allocator": allocator,
            "parameters": sum(p.numel() for p in model.parameters()), "threads": torch.get_num_threads()}


def run_child(spec: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                          env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"variant {spec['name']} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -------------------------------------------------------------------------------------------------- the parent
def variants(args: argparse.Namespace, native_bf16: bool) -> list[dict]:
    from models.vision.config import Optimizations

    base = {"without": [], "allocator": True, "compile": None, "precision": args.precision, "device": args.device}
    out = [
        {**base, "name": "reference", "model": "reference"},
        {**base, "name": "optimized", "model": "bdh"},
    ]
    if args.shares and args.device == "cpu":
        out.append({**base, "name": "optimized - allocator", "model": "bdh", "allocator": False})
    if args.shares:
        for name in Optimizations.names():
            if name == "sdpa" and not args.softmax:
                continue  # SDPA only acts on softmax attention
            out.append({**base, "name": f"optimized - {name}", "model": "bdh", "without": [name]})
        if args.device == "cpu":
            out.append({**base, "name": "reference - allocator", "model": "reference", "allocator": False})
    if args.compile != "off":
        out.append({**base, "name": f"optimized + compile({args.compile})", "model": "bdh", "compile": args.compile})
    if native_bf16 and args.precision == "fp32" and not args.no_bf16:
        out.append({**base, "name": "optimized, bf16 autocast", "model": "bdh", "precision": "bf16"})
    out.append({**base, "name": "ViT-Tiny (same D, depth)", "model": "vit"})
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small model and batch, two rounds of one step")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-embd", type=int, default=192)
    p.add_argument("--n-head", type=int, default=6)
    p.add_argument("--mult", type=int, default=32)
    p.add_argument("--softmax", action="store_true", help="softmax attention (SDPA) instead of linear")
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per variant, in shuffled order")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per process")
    p.add_argument("--steps", type=int, default=2, help="timed steps per process")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--compile", default="default", help="torch.compile mode for the compiled variant, or 'off'")
    p.add_argument("--no-shares", dest="shares", action="store_false",
                   help="skip the 'optimized - X' variants (reference, optimized, compile, ViT only)")
    p.add_argument("--no-bf16", action="store_true", help="skip the bf16 row on CPUs with native bf16")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffled variant order")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.quick:
        args.batch, args.n_layer, args.rounds, args.steps = 8, 2, 2, 1

    import torch

    from models.common import cpu_has_native_bf16
    from models.vision.config import VisionBDHConfig

    config = {"batch": args.batch, "n_layer": args.n_layer, "n_embd": args.n_embd, "n_head": args.n_head,
              "mult": args.mult, "softmax": args.softmax}
    specs = variants(args, cpu_has_native_bf16() if args.device == "cpu" else torch.cuda.is_bf16_supported())
    for s in specs:
        s.update(config=config, threads=args.threads, warmup=args.warmup, steps=args.steps)
    vc = VisionBDHConfig(n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head, mlp_multiplier=args.mult)
    print(f"torch {torch.__version__}, {args.threads or torch.get_num_threads()} threads, batch {args.batch}, "
          f"{args.precision}, D {args.n_embd}, layers {args.n_layer}, heads {args.n_head}, multiplier {args.mult}, "
          f"N {vc.neurons_per_head}, {'softmax' if args.softmax else 'linear'} attention; {args.rounds} rounds x "
          f"{len(specs)} processes ({args.warmup} warm-up + {args.steps} timed steps each); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)

    rng = random.Random(args.seed)
    results: dict[str, dict] = {s["name"]: {"times": [], "warmup": []} for s in specs}
    for r in range(args.rounds):
        order = specs[:]
        rng.shuffle(order)
        took = []
        for s in order:
            res = run_child(s)
            agg = results[s["name"]]
            agg["times"] += res["times"]
            agg["warmup"] += res["warmup"]
            agg.update(flops=res["flops"], parameters=res["parameters"], allocator=res["allocator"])
            took.append(f"{s['name']} {statistics.median(res['times']):.2f}s")
        print(f"round {r + 1}: " + ", ".join(took), file=sys.stderr, flush=True)

    med = {name: statistics.median(r["times"]) for name, r in results.items()}
    ref, opt = med["reference"], med["optimized"]
    vit_name = specs[-1]["name"]
    vit_rate = results[vit_name]["flops"] / med[vit_name]
    print()
    print("| variant | allocator | s/step (median) | img/s | x reference | GFLOP/step | GFLOP/s | FLOP/s vs ViT |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for s in specs:
        name, r = s["name"], results[s["name"]]
        rate = r["flops"] / med[name]
        print(f"| {name} | {'tuned' if r['allocator'] else 'default'} | {med[name]:.3f} | {args.batch / med[name]:.1f} "
              f"| {ref / med[name]:.2f} | {r['flops'] / 1e9:.1f} | {rate / 1e9:.1f} | {rate / vit_rate:.2f} |")
    compiled = [s["name"] for s in specs if s["compile"]]
    if compiled:
        warm = statistics.median(results[compiled[0]]["warmup"])
        print(f"\n{compiled[0]}: first step (compilation) {warm:.1f}s")
    if args.shares:
        print("\nshare of each optimisation (slowdown of the optimized step when only it is off; share of the "
              "reference -> optimized time saved):")
        saved = ref - opt
        print("| switched off | x optimized | share of time saved |")
        print("|---|---:|---:|")
        for s in specs:
            if s["name"].startswith("optimized - "):
                lost = med[s["name"]] - opt
                print(f"| {s['name'][12:]} | {med[s['name']] / opt:.2f} | "
                      f"{100 * lost / saved if saved > 0 else 0:.1f}% |")
    print(f"\nmodel changes alone (both with the trainer's process settings): reference / optimized = "
          f"{ref / opt:.2f}x")
    if "reference - allocator" in med:
        print(f"against the plain source (reference without the allocator setting): "
              f"{med['reference - allocator'] / opt:.2f}x")
    print(f"\ntime ratio optimized / ViT-Tiny: {opt / med[vit_name]:.1f}x; FLOP ratio BDH / ViT: "
          f"{results['optimized']['flops'] / results[vit_name]['flops']:.1f}x")
    goals = [f"optimized >= 3x reference (eager): {ref / opt:.2f}x -> {'met' if ref >= 3 * opt else 'NOT met'}"]
    if compiled:
        c = med[compiled[0]]
        goals.append(f">= 4x with compile: {ref / c:.2f}x -> {'met' if ref >= 4 * c else 'NOT met'}")
    o_rate = results["optimized"]["flops"] / opt
    goals.append(f"FLOP/s >= 0.9x ViT: {o_rate / vit_rate:.2f}x -> {'met' if o_rate >= 0.9 * vit_rate else 'NOT met'}")
    print("goals: " + "; ".join(goals))
    print(f"parameters: Vision-BDH {results['optimized']['parameters']:,} (formula 3·mult·D² + conv + pos + head = "
          f"{vc.expected_parameters():,}, BDH core {3 * args.mult * args.n_embd**2:,}); "
          f"ViT-Tiny {results[vit_name]['parameters']:,}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
