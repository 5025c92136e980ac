"""Faithfulness of IG's word attributions on the demo recommenders, against a random ranking and occlusion.

    python benchmarks/faithfulness.py                     # the demo models under EXPLAINQ_HOME (explainq demo)
    python benchmarks/faithfulness.py --small /tmp/demo   # or small demo models trained there (same recipe)
    python benchmarks/faithfulness.py --quick --small /tmp/demo

For each model, ``--samples`` balanced test samples of the planted-topic synthetic data (models/news/demo.py) are
attributed by ``models.news.attribution.explain`` with ``faithfulness`` on (the service's defaults otherwise:
Gauss-Legendre, ``--n-steps`` steps, fp32 on a CPU). The table gives, per word ranking (IG, seeded random,
occlusion), the mean comprehensiveness and sufficiency at 10/20/50% of the words and the mean deletion and
insertion areas (models/explain/faithfulness.py), then the Wilcoxon signed-rank tests of IG against the random
ranking and occlusion (one-sided: IG more faithful), and the time of the faithfulness numbers against the
attribution's own (a warm-up request first; the median ratio of ``--rounds`` timed rounds).

``run(args) -> str`` returns the whole report, so another script can print it with its own.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODELS = ("nrms-minilm-demo", "naml-demo")
DATASET = "news-synthetic"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="8 samples, one round, first model only")
    p.add_argument("--home", default=os.environ.get("EXPLAINQ_HOME", str(ROOT / "var")))
    p.add_argument("--small", default=None, help="train (once) and use small demo models in this directory when "
                   "the demo models are not registered under --home")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--n-steps", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0, help="of the samples drawn and of the random ranking")
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    return p


def find_models(home: Path, small: str | None, names: Sequence[str]) -> tuple[dict[str, Path], Path]:
    """({name: checkpoint dir}, dataset dir): the registered demo, else small demo models under ``small``."""
    from core import registry
    from core.settings import Settings

    settings = Settings(EXPLAINQ_HOME=str(home))
    entries = {n: registry.get_model(settings, n) for n in names}
    ds = registry.get_dataset(settings, DATASET)
    if ds is not None and all(entries.values()):
        return ({n: registry.absolute_path(settings, e) for n, e in entries.items()},
                registry.absolute_path(settings, ds))
    if small is None:
        raise SystemExit(f"{', '.join(names)} are not all registered under {home}; run `explainq demo` first, or "
                         "pass --small DIR to train small ones")
    from models.news.demo import build_small

    return build_small(small, tuple(names)), Path(small) / "data" / DATASET


def _num(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1e-3 and v != 0 else f"{v:.{digits}f}"
    return str(v)


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[str(h) for h in headers], *[[_num(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def measure(name: str, path: Path, data: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One model: the faithfulness section of the last round, and every round's times."""
    import time

    import torch

    from models.news import checkpoint
    from models.news.attribution import IGOptions, explain
    from models.news.data import load_samples

    model = checkpoint.load(path).model
    with_bodies = "body" in model.views
    samples = load_samples(data, "test", args.samples, balanced=True, seed=args.seed, with_bodies=with_bodies)
    opts = IGOptions(n_steps=args.n_steps, faithfulness=True, faithfulness_seed=args.seed)
    explain(model, samples[:2], opts)  # warm-up: memory probe, baseline cache, kernels
    rounds = []
    report: dict[str, Any] = {}
    for _ in range(args.rounds):
        c0 = time.process_time()
        report = explain(model, samples, opts)
        cpu = time.process_time() - c0
        f = report["faithfulness"]
        rounds.append((f["attribution_seconds"], f["seconds"], cpu - f["cpu_seconds"], f["cpu_seconds"]))
    return {"name": name, "device": str(model.device), "threads": torch.get_num_threads(),
            "n": len(report["samples"]), "section": report["faithfulness"], "rounds": rounds,
            "precision": report["summary"]["precision"], "method": report["summary"]["method"]}


def render(results: Sequence[dict[str, Any]], args: argparse.Namespace) -> str:
    out = []
    for r in results:
        f = r["section"]
        pct = [f"{round(q * 100)}%" for q in f["fractions"]]
        rows = []
        for order in ("ig", "random", "occlusion"):
            o = f["orders"].get(order)
            if o is None:
                continue
            rows.append([order, *o["comprehensiveness"], *o["sufficiency"], o["deletion_auc"], o["insertion_auc"]])
        out.append(f"### {r['name']}: {r['n']} samples, IG {r['method']} {args.n_steps} steps {r['precision']}, "
                   f"{r['device']}, {r['threads']} threads, view {f['view']}")
        out.append(table(rows, ["ranking", *(f"comp@{p}" for p in pct), *(f"suff@{p}" for p in pct),
                                "deletion AUC", "insertion AUC"]))
        out.append("")
        trows = [[t["metric"] + (" (mean over fractions)" if t["metric"] in ("comprehensiveness", "sufficiency")
                                 else ""), f"IG vs {t['against']}", t["alternative"], t["n"],
                  t["median_difference"], t["statistic"], t["p_value"]] for t in f["tests"]]
        out.append(table(trows, ["metric", "pair", "IG better if", "n", "median diff", "W", "p"]))
        out.append("")
        wall = statistics.median(fs / at for at, fs, _, _ in r["rounds"])
        cpu = statistics.median(fc / ac for _, _, ac, fc in r["rounds"])
        out.append(table([[i + 1, at, fs, fs / at, ac, fc, fc / ac] for i, (at, fs, ac, fc) in enumerate(r["rounds"])],
                         ["round", "attribution s", "faithfulness s", "wall ratio", "attribution CPU s",
                          "faithfulness CPU s", "CPU ratio"]))
        out.append(f"median time ratio faithfulness / attribution: wall {wall:.3f}, process CPU {cpu:.3f} "
                   "(goal <= 1.5)")
        out.append("")
    return "\n".join(out)


def run(args: argparse.Namespace | Sequence[str] | None = None) -> str:
    """The report as text (markdown tables); ``args`` as parsed by :func:`parser`, or its argument list."""
    if not isinstance(args, argparse.Namespace):
        args = parser().parse_args(list(args) if args is not None else [])
    else:  # another script's namespace: this script's defaults for what it does not set
        args = argparse.Namespace(**{**vars(parser().parse_args([])), **vars(args)})
    if args.quick:
        args.samples, args.rounds = min(args.samples, 8), 1
    import torch

    torch.set_num_threads(args.threads)
    names = [n for n in args.models.split(",") if n][: 1 if args.quick else None]
    paths, data = find_models(Path(args.home), args.small, names)
    results = [measure(n, paths[n], data, args) for n in names]
    return render(results, args)


def main() -> None:
    print(run(parser().parse_args()), flush=True)


if __name__ == "__main__":
    main()
