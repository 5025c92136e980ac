"""Attribution quality measured in one run: LDS per estimator x dataset, mislabel detection, time per estimator.

For each dataset: trains the recipe on all the training triples (the model the estimators run on) and on ``--m``
random ``--alpha``-subsets (the LDS ground truth), scores ``--n-test`` test triples with every estimator of
``models/kg/estimators.py`` and prints each one's LDS (mean and 95% bootstrap interval over test triples) and its
time; then corrupts ``--fraction`` of the training triples' tails, trains on them and prints each estimator's
mislabel-detection AUC and the fraction of corrupted triples found after inspecting 10% and 20% of the data. The
maths is the service's (``models/kg/evaluation.py``); only the orchestration (no store, no workers) is here.

dattri's published figures are printed beside ours as context, never as our measurement (they are other models
and datasets: MLPs and ResNets on MNIST / CIFAR).

    python benchmarks/quality.py                              # nations, m 16, ConvE-100 for 10 epochs
    python benchmarks/quality.py --datasets nations --m 8 --epochs 5 --n-test 50

Sections (``--sections``, all by default): ``lds``, ``mislabel``, ``featurize`` (the gradient feature store at
272k training triples, ``benchmarks/featurize.py``), ``faithfulness`` (IG against a random ranking and
occlusion, ``benchmarks/faithfulness.py``), ``counterfactual`` (removing each estimator's top ``--cf-k``
proponents of a test triple against removing as many random triples, ``models/kg/counterfactual.py``; not in the
default list: it retrains ``--cf-tests`` x (estimators + ``--cf-draws``) models) and ``classifiers`` (the classifier estimators beside dattri's on
digits, ``benchmarks/quality_classifiers.py`` with its own defaults; ``--classifier-quick``: its tiny run). A section is a function ``(args, datasets, work_dir) -> list of
lines`` in ``SECTIONS`` (``datasets``: name -> TriplesDataset; ``work_dir``: a temporary directory for the run).

``--compute-matched`` adds to the LDS section every ensemble-able estimator (``ENSEMBLE_BASES`` of
``models/kg/evaluation.py``) averaged over the first 1, 2, 4, ... of the full-data model and the ``--ensemble``
members, so that an estimator is compared with TracIn at the same number of trained models.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from models.kg import estimators as estimator_registry  # noqa: E402
from models.kg import evaluation as ev  # noqa: E402
from models.kg.checkpoint import load  # noqa: E402
from models.kg.train import TrainConfig  # noqa: E402
from models.kg.triples import TriplesDataset, load_kinships, load_nations, load_umls  # noqa: E402

# Datasets by name (a loader each): the knowledge graphs the service registers get one line here.
DATASETS: dict[str, Callable[[], TriplesDataset]] = {"nations": load_nations, "umls": load_umls,
                                                     "kinships": load_kinships}

# dattri (Deng et al. 2024, "dattri: A Library for Efficient Data Attribution", NeurIPS Datasets & Benchmarks),
# their benchmark tables: context for our numbers, not a measurement of this code.
PUBLISHED_LDS = {"tracin": "0.07-0.13", "trak": "0.26-0.37 (10-50 checkpoints)"}
PUBLISHED_AUC = {"tracin": "0.51", "trak": "0.66"}


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    return ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in [headers, *rows]]


def _fmt(v: Any, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def recipe(args: argparse.Namespace) -> TrainConfig:
    drop = {} if args.dropout is None else {"input_dropout": args.dropout, "feature_dropout": args.dropout,
                                             "hidden_dropout": args.dropout}
    return TrainConfig(epochs=args.epochs, batch_size=128, lr=0.01, embedding_dim=args.embedding_dim,
                       checkpoint_every=max(1, args.epochs // 5), seed=args.seed, **drop)


def _cache_dir(args: argparse.Namespace, work: Path, name: str, what: str) -> Path:
    """Where a trained model (or the subset models' masks and outputs) lives: under ``--cache-dir`` when given,
    keyed by everything that changes it (the LDS design version, dataset, recipe, alpha, m, seed, fraction), so
    that measuring another estimator retrains nothing; else in the run's temporary directory, under the same key
    (so each seed of ``--seeds`` trains its own full-data model there too)."""
    design = "" if what == "mislabel" else f"-v{ev.LDS_DESIGN}"  # the LDS's models follow its design's seeds
    state = "" if what == "subsets" else "-adam"  # models an estimator runs on keep Adam's state (tracin_adam)
    key = (f"{name}-{what}{design}{state}-d{args.embedding_dim}-e{args.epochs}-s{args.seed}"
           + ("" if args.dropout is None else f"-p{args.dropout}")
           + (f"-a{args.alpha}-m{args.m}" if what == "subsets" else "")
           + (f"-f{args.fraction}" if what == "mislabel" else ""))
    return (Path(args.cache_dir) if args.cache_dir else work) / key


def _full_model(ds: TriplesDataset, cfg: TrainConfig, out: Path) -> tuple[Any, float]:
    t0 = time.perf_counter()
    if not (out / "done").exists():
        ev.train_model(ds, cfg, out, device="cpu")
        (out / "done").touch()
    return load(out), time.perf_counter() - t0


def _subsets(ds: TriplesDataset, cfg: TrainConfig, args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """The ``m`` subset models' masks and margins on the whole test split (trained once per cache key), each
    subset drawn and trained with the seeds ``ev.subset_seeds`` and ``ev.subset_train_seeds`` give."""
    out.mkdir(parents=True, exist_ok=True)
    subsets = []
    for s, t in zip(ev.subset_seeds(args.seed, args.m), ev.subset_train_seeds(args.seed, args.m), strict=True):
        path = out / f"subset-{s}.npz"
        if not path.exists():
            sub = ev.train_subset(ds, cfg, args.alpha, s, "cpu", train_seed=t)
            np.savez(path, mask=sub["mask"], outputs=sub["outputs"])
        with np.load(path) as z:
            subsets.append({"mask": z["mask"], "outputs": z["outputs"]})
    return subsets


def _members(ds: TriplesDataset, cfg: TrainConfig, args: argparse.Namespace, work: Path, name: str,
             seconds: list[float] | None = None) -> list[Any]:
    """The ``--ensemble`` members the ensemble estimators average over: the recipe on all the training triples with
    the seeds ``models.kg.evaluation.member_seeds`` gives (as the service trains them), when one is measured or
    ``--compute-matched`` is given. ``seconds``, when given, receives each member's training (or loading) time."""
    if not (getattr(args, "compute_matched", False)
            or any(estimator_registry.get(e).ensemble for e in args.estimators)):
        return []
    out = []
    for s in ev.member_seeds(cfg.seed, args.ensemble):
        member_cfg = dataclasses.replace(cfg, seed=s)
        bundle, took = _full_model(ds, member_cfg, _cache_dir(args, work, name, f"member{s}"))
        out.append(bundle)
        if seconds is not None:
            seconds.append(took)
    return out


def _replicates(ds: TriplesDataset, cfg: TrainConfig, args: argparse.Namespace, out: Path) -> np.ndarray:
    """``[m, n_test_split]``: each subset model's replicate (the same subset trained with
    ``ev.subset_replicate_seeds``), its margins on the whole test split (trained once per cache key)."""
    outputs = []
    for s, t in zip(ev.subset_seeds(args.seed, args.m), ev.subset_replicate_seeds(args.seed, args.m), strict=True):
        path = out / f"replicate-{s}.npz"
        if not path.exists():
            sub = ev.train_subset(ds, cfg, args.alpha, s, "cpu", train_seed=t)
            np.savez(path, mask=sub["mask"], outputs=sub["outputs"])
        with np.load(path) as z:
            outputs.append(z["outputs"])
    return np.stack(outputs)


def _scaling_rows(name: str, bundle: Any, members: list[Any], masks: np.ndarray, outputs: np.ndarray,
                  test: torch.Tensor, reference: list[float | None], seed: int) -> list[list[str]]:
    """TRAK's LDS averaged over the first 1, 2, 4, ... models (the full-data model, then the members in order) and
    its ratio to TracIn's: what each further ensemble member buys. Each model's TRAK scores are computed once."""
    train = bundle.dataset.train
    per_model = [ev.trak_scores(b, b.checkpoints, test, train).double().numpy() for b in [bundle, *members]]
    rows = []
    sizes = sorted({1, len(per_model), *(2 ** i for i in range(len(per_model).bit_length()))} - {0})
    for k in (k for k in sizes if k <= len(per_model)):
        per = ev.lds_per_test(masks, outputs, sum(per_model[:k]) / k)
        lds = ev.mean_interval(per, seed)
        ratio = ev.ratio_interval(list(per), reference, seed)
        rows.append([name, str(k), _fmt(lds["mean"]), f"[{_fmt(lds['low'])}, {_fmt(lds['high'])}]",
                     _fmt(ratio["ratio"], 2), f"[{_fmt(ratio['low'], 2)}, {_fmt(ratio['high'], 2)}]"])
    return rows


def _ensemble_sizes(n_models: int) -> list[int]:
    """1, 2, 4, ... up to ``n_models``, and ``n_models`` itself."""
    return sorted({1, n_models, *(2 ** i for i in range(n_models.bit_length()))} & set(range(1, n_models + 1)))


def _compute_matched_rows(label: str, bundle: Any, members: list[Any], member_s: list[float], full_s: float,
                          masks: np.ndarray, outputs: np.ndarray, test: torch.Tensor, estimators: list[str],
                          full_scores: dict[str, np.ndarray], full_seconds: dict[str, float], seed: int,
                          output: str) -> list[list[str]]:
    """Every ensemble-able estimator of ``estimators`` (``ev.ENSEMBLE_BASES``) averaged over the first 1, 2, 4, ...
    models (the full-data model, then the members in order): LDS with its bootstrap interval, the training time of
    the models (the full-data model, then the extra members: shared by every estimator, counted once), the
    estimator's own scoring time over those models, and its ratio to TracIn's ensemble of the SAME size (paired
    bootstrap). Each model's scores are computed once (the full-data model's are the LDS table's) and reused
    across sizes."""
    train = bundle.dataset.train
    names = [e for e in estimators if e in ev.ENSEMBLE_BASES]
    per_model: dict[str, list[np.ndarray]] = {}
    per_seconds: dict[str, list[float]] = {}
    for e in names:
        runs = ev.member_runs(e, bundle, bundle.checkpoints, test, train, members, output)[1:] if members else []
        per_model[e] = [full_scores[e], *(r.values for r in runs)]
        per_seconds[e] = [full_seconds[e], *(r.seconds for r in runs)]
    sizes = _ensemble_sizes(1 + len(members))
    lds = {(e, k): ev.lds_per_test(masks, outputs, sum(per_model[e][:k]) / k) for e in names for k in sizes}
    rows = []
    for k in sizes:
        for e in names:
            per = lds[(e, k)]
            m = ev.mean_interval(per, seed)
            ratio = (ev.ratio_interval(list(per), list(lds[(ev.REFERENCE, k)]), seed)
                     if ev.REFERENCE in names and e != ev.REFERENCE else None)
            rows.append([label, str(k), e, _fmt(m["mean"]), f"[{_fmt(m['low'])}, {_fmt(m['high'])}]",
                         f"{full_s:.1f} + {sum(member_s[:k - 1]):.1f}", f"{sum(per_seconds[e][:k]):.2f}",
                         "-" if ratio is None else _fmt(ratio["ratio"], 2),
                         "-" if ratio is None else f"[{_fmt(ratio['low'], 2)}, {_fmt(ratio['high'], 2)}]"])
    return rows


def lds_section(args: argparse.Namespace, datasets: dict[str, TriplesDataset], work: Path) -> list[str]:
    seeds = args.seeds or [args.seed]
    rows: list[list[str]] = []
    ratios: list[list[str]] = []
    ceilings: list[list[str]] = []
    scaling: list[list[str]] = []
    matched: list[list[str]] = []
    # (dataset, estimator) -> per seed: (its per-test LDS, TracIn's per-test LDS, its ratio to TracIn)
    pooled: dict[tuple[str, str], list[tuple[list, list | None, float | None]]] = {}
    for name, ds in datasets.items():
        for seed in seeds:
            # another seed is an independent replicate: another full-data model, other subsets, other test triples
            one = argparse.Namespace(**{**vars(args), "seed": seed})
            label = name if len(seeds) == 1 else f"{name}/s{seed}"
            # the full-data model's seed is derived from the replicate's, as the service derives it
            cfg = dataclasses.replace(recipe(one), seed=ev.full_model_seed(seed, seed))
            bundle, full_s = _full_model(ds, cfg, _cache_dir(one, work, name, "full"))
            t0 = time.perf_counter()
            subsets = _subsets(ds, cfg, one, _cache_dir(one, work, name, "subsets"))
            train_s = time.perf_counter() - t0
            masks = np.stack([s["mask"] for s in subsets])
            sel = ev.test_selection(len(ds.test), one.n_test, seed)
            outputs = np.stack([s["outputs"] for s in subsets])[:, sel]
            member_s: list[float] = []
            members = _members(ds, cfg, one, work, name, member_s)
            test = ds.test[torch.from_numpy(sel)]
            full_scores: dict[str, np.ndarray] = {}
            report = ev.lds_report(bundle, masks, outputs, test, one.estimators, seed, members=members,
                                   output=one.output, scores=full_scores)
            print(f"# {label}: full model {full_s:.1f} s (test MRR "
                  f"{bundle.metrics.get('test', {}).get('mrr', 0):.3f}), {one.m} subset models {train_s:.1f} s "
                  f"({train_s / one.m:.1f} s each), {len(members)} ensemble members", flush=True)
            reference = report.get(ev.REFERENCE, {}).get("per_test")
            if one.ensemble_scaling and reference is not None:
                scaling.extend(_scaling_rows(label, bundle, members, masks, outputs, test, reference, seed))
            if one.compute_matched:
                matched.extend(_compute_matched_rows(
                    label, bundle, members, member_s, full_s, masks, outputs, test, one.estimators, full_scores,
                    {e: r["seconds"] for e, r in report.items()}, seed, one.output))
            if one.replicates:
                reps = _replicates(ds, cfg, one, _cache_dir(one, work, name, "subsets"))[:, sel]
                ceiling = ev.noise_ceiling(outputs, reps, seed)
                agree = ceiling["agreement"]
                best = max(report, key=lambda e: report[e]["lds"]["mean"] or -1.0)
                ref = report.get(ev.REFERENCE, {}).get("lds", {}).get("mean")
                ceilings.append([label, f"{agree['mean']:.3f}", f"[{agree['low']:.3f}, {agree['high']:.3f}]",
                                 f"{ceiling['ceiling']:.3f}", f"{best} {report[best]['lds']['mean']:.3f}",
                                 "-" if ref is None else f"{2 * ref:.3f}"])
            for est, r in report.items():
                ratio = r.get("ratio_to_" + ev.REFERENCE)
                pooled.setdefault((name, est), []).append((r["per_test"], reference, (ratio or {}).get("ratio")))
                if ratio and ratio["ratio"] is not None:
                    ratios.append([label, f"{est} / {ev.REFERENCE}", f"{ratio['ratio']:.2f}",
                                   f"[{_fmt(ratio['low'], 2)}, {_fmt(ratio['high'], 2)}]", str(ratio["n"])])
            for est, r in report.items():
                lds = r["lds"]
                rows.append([label, est, _fmt(lds["mean"]), f"[{_fmt(lds['low'])}, {_fmt(lds['high'])}]",
                             str(lds["n"]), f"{r['seconds']:.2f}", PUBLISHED_LDS.get(est, "")])
    head = [f"LDS: m={args.m} subset models, alpha={args.alpha}, n_test={args.n_test}, test-side output "
            f"{args.output} (TRAK: margin), recipe ConvE-"
            f"{args.embedding_dim} x {args.epochs} epochs"
            + ("" if args.dropout is None else f", dropout {args.dropout}")
            + f", seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}; 95% percentile bootstrap over "
            "test triples", ""]
    table = _table(["dataset", "estimator", "LDS", "95% interval", "n", "seconds", "published (dattri, context)"],
                   rows)
    if ratios:
        table += ["", "LDS relative to TracIn's: ratio of the means over the same test triples, 95% paired "
                  "percentile bootstrap", ""]
        table += _table(["dataset", "ratio", "value", "95% interval", "n"], ratios)
    if len(seeds) > 1:
        table += ["", f"Pooled over the {len(seeds)} seeds (independent replicates): the mean over all their test "
                  "triples and its ratio to TracIn's; 95% hierarchical percentile bootstrap (resampling the seeds, "
                  "then test triples within each, paired) and 95% t interval over the per-seed values (t, "
                  f"{len(seeds) - 1} degrees of freedom); the per-seed ratios are the last column", ""]
        table += _table(["dataset", "estimator", "LDS", "95% hier. bootstrap", "95% t", "n", "x TracIn",
                         "95% hier. bootstrap", "95% t", "x TracIn per seed"], _pooled_rows(pooled, seeds[0]))
    if scaling:
        table += ["", "TRAK's model ensemble by size: TRAK averaged over the first k models (the full-data model, "
                  "then the members), LDS and its ratio to TracIn's (paired bootstrap)", ""]
        table += _table(["dataset", "models", "LDS", "95% interval", "x TracIn", "95% interval"], scaling)
    if matched:
        table += ["", "Compute-matched ensembles: each ensemble-able estimator averaged over the first k models (the "
                  "full-data model, then the members, equal weights), k = 1, 2, 4, ...; training seconds = the "
                  "full-data model + the extra members (shared by every estimator, counted once); scoring seconds "
                  "= the estimator's own, over the k models; x TracIn = ratio to TracIn's ensemble of the same k "
                  "(95% paired percentile bootstrap over test triples)", ""]
        table += _table(["dataset", "models", "estimator", "LDS", "95% interval", "training s", "scoring s",
                         "x TracIn (same k)", "95% interval"], matched)
    if ceilings:
        table += ["", "Noise ceiling: each subset model trained again on the same subset with another seed; agreement "
                  "= Spearman between the two over the subsets (mean over test triples); no prediction from the "
                  "subset alone can correlate with one model's outputs above ~sqrt(agreement) (ceiling: the mean of "
                  "its per-test values)", ""]
        table += _table(["dataset", "agreement", "95% interval", "ceiling", "best estimator", "2x TracIn"], ceilings)
    return head + table


def _t_fmt(t: dict[str, Any] | None, digits: int) -> str:
    return "-" if t is None else f"[{_fmt(t['low'], digits)}, {_fmt(t['high'], digits)}]"


def _pooled_rows(pooled: dict[tuple[str, str], list[tuple[list, list | None, float | None]]],
                 seed: int) -> list[list[str]]:
    rows = []
    for (name, est), per_seed in pooled.items():
        lds = ev.pooled_interval([(a, None) for a, _, _ in per_seed], seed)
        row = [name, est, _fmt(lds["value"]), f"[{_fmt(lds['low'])}, {_fmt(lds['high'])}]",
               _t_fmt(lds["t_interval"], 3), str(lds["n"])]
        if est != ev.REFERENCE and all(ref is not None for _, ref, _ in per_seed):
            ratio = ev.pooled_interval([(a, ref) for a, ref, _ in per_seed], seed)
            row += [_fmt(ratio["value"], 2), f"[{_fmt(ratio['low'], 2)}, {_fmt(ratio['high'], 2)}]",
                    _t_fmt(ratio["t_interval"], 2), " ".join(_fmt(r, 2) for _, _, r in per_seed)]
        else:
            row += ["-", "-", "-", "-"]
        rows.append(row)
    return rows


def mislabel_section(args: argparse.Namespace, datasets: dict[str, TriplesDataset], work: Path) -> list[str]:
    if args.fraction <= 0:
        return []
    cfg = recipe(args)
    rows = []
    for name, ds in datasets.items():
        corrupted, idx, _ = ev.corrupt_tails(ds.train, len(ds.entities), args.fraction, args.seed)
        bundle, _ = _full_model(ev.with_train(ds, corrupted, keep_eval=True), cfg,
                                _cache_dir(args, work, name, "mislabel"))
        report = ev.mislabel_report(bundle, idx, [e for e in args.estimators
                                                  if not estimator_registry.get(e).ensemble])
        for est, r in report.items():
            rows.append([name, est, _fmt(r["auc"]), _fmt(r["found_at_10"]), _fmt(r["found_at_20"]),
                         f"{r['seconds']:.2f}", PUBLISHED_AUC.get(est, "")])
    head = ["", f"Mislabel detection: {args.fraction:.0%} of the training tails replaced (seed {args.seed}), "
            "ranked by self-influence; found@q = fraction of corrupted triples among the top q", ""]
    return head + _table(["dataset", "estimator", "AUC", "found@10%", "found@20%", "seconds",
                          "published AUC (dattri, context)"], rows)


def featurize_section(args: argparse.Namespace, datasets: dict[str, TriplesDataset], work: Path) -> list[str]:
    """The gradient feature store at the FB15k-237 shape: ``benchmarks/featurize.py`` in its own process (its
    memory and threads are its own), its table as printed."""
    import subprocess

    cmd = [sys.executable, str(Path(__file__).with_name("featurize.py")), "--threads", str(args.threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return ["", "Gradient feature store (benchmarks/featurize.py):", "", *out.rstrip().splitlines()]


def faithfulness_section(args: argparse.Namespace, datasets: dict[str, TriplesDataset], work: Path) -> list[str]:
    """IG's faithfulness against a random ranking and occlusion (``benchmarks/faithfulness.py``'s ``run``), on
    small demo news models trained once under ``--cache-dir`` (or the run's temporary directory)."""
    from benchmarks import faithfulness

    small = Path(args.cache_dir or work) / "faithfulness-models"
    text = faithfulness.run(["--small", str(small), "--samples", str(args.faithfulness_samples), "--rounds", "1",
                             "--threads", str(args.threads)])
    return ["", "IG faithfulness (benchmarks/faithfulness.py):", "", *text.rstrip().splitlines()]


def classifiers_section(args: argparse.Namespace, datasets: dict[str, TriplesDataset], work: Path) -> list[str]:
    """LDS and mislabel detection on a classifier against dattri's attributors on the same models
    (``benchmarks/quality_classifiers.py``'s ``run`` with its own defaults, this run's ``--seed`` and ``--threads``;
    ``--classifier-quick``: its ``--quick`` run)."""
    from benchmarks import quality_classifiers

    argv = ["--seed", str(args.seed), "--threads", str(args.threads)] + (["--quick"] if args.classifier_quick else [])
    lines = quality_classifiers.run(quality_classifiers.parse(argv))["lines"]
    return ["", "Classifiers against dattri (benchmarks/quality_classifiers.py):", "", *lines]


def counterfactual_section(args: argparse.Namespace, datasets: dict[str, TriplesDataset], work: Path) -> list[str]:
    """Counterfactual removal (``models/kg/counterfactual.py``): for ``--cf-tests`` test triples (the LDS's test
    draw for ``--seed``), remove each of ``--cf-estimators``' top ``--cf-k`` proponents, retrain from the full-data
    model's seed and compare the margin drop with removing ``--cf-k`` random triples (``--cf-draws`` draws)."""
    from models.kg import counterfactual as cf

    rows: list[list[str]] = []
    notes: list[str] = []
    for name, ds in datasets.items():
        cfg = dataclasses.replace(recipe(args), seed=ev.full_model_seed(args.seed, args.seed))
        bundle, full_s = _full_model(ds, cfg, _cache_dir(args, work, name, "full"))
        sel = ev.test_selection(len(ds.test), args.cf_tests, args.seed)
        test = ds.test[torch.from_numpy(sel)]
        scores, seconds = {}, {}
        for est in args.cf_estimators:
            run = ev.run_estimator(est, bundle, test, ds.train)
            scores[est], seconds[est] = run.values, run.seconds
        t0 = time.perf_counter()
        report = cf.counterfactual_report(ds, cfg, ev.margins(bundle.model, test), test, scores, args.cf_k,
                                          args.seed, draws=args.cf_draws, n_seeds=args.cf_seeds,
                                          disjoint=args.cf_disjoint, score_seconds=seconds,
                                          work_dir=work / f"{name}-cf")
        total_s = time.perf_counter() - t0
        rb = report["random_baseline"]["drop"]
        rows.append([name, f"random {args.cf_k} (baseline)", _fmt(rb["mean"]), f"[{_fmt(rb['low'])}, {_fmt(rb['high'])}]",
                     "-", "-", "-", "-", f"{report['random_baseline']['retrain_seconds']:.0f}"])
        for est, r in report["estimators"].items():
            d, diff, beat = r["drop"], r["minus_random"], r["beats_random"]
            rows.append([name, est, _fmt(d["mean"]), f"[{_fmt(d['low'])}, {_fmt(d['high'])}]", _fmt(diff["mean"]),
                         f"[{_fmt(diff['low'])}, {_fmt(diff['high'])}]", _fmt(beat["mean"], 2),
                         f"[{_fmt(beat['low'], 2)}, {_fmt(beat['high'], 2)}]",
                         f"{r['score_seconds']:.1f} + {r['retrain_seconds']:.0f}"])
        noise = report["noise"]
        notes.append(f"# {name}: full model {full_s:.1f} s; {report['retrainings']} retrainings in {total_s:.0f} s "
                     f"({total_s / max(report['retrainings'], 1):.1f} s each); training noise (nothing removed, "
                     f"another seed): mean |margin change| {noise['mean_abs']:.3f}, sd {_fmt(noise['sd'])}; "
                     f"removed per test triple (mean): "
                     + ", ".join(f"{e} {np.mean(r['n_removed']):.1f}" for e, r in report["estimators"].items()))
    head = ["", f"Counterfactual removal: top-{args.cf_k} proponents (highest positive margin scores) of each of "
            f"{args.cf_tests} test triples removed, retrained from the full-data model's seed"
            + (f" and {args.cf_seeds - 1} further seed(s)" if args.cf_seeds > 1 else "")
            + f"; baseline: {args.cf_k} random training triples ({args.cf_draws} draws"
            + (", disjoint from every estimator's removals" if args.cf_disjoint else ", uniform") + "); drop = full "
            f"margin - retrained margin; recipe ConvE-{args.embedding_dim} x {args.epochs} epochs, seed {args.seed}; "
            "95% percentile bootstrap over test triples (paired for the difference)", ""]
    table = _table(["dataset", "estimator", "drop", "95% interval", "- random", "95% interval", "> random",
                    "95% interval", "seconds (score + retrain)"], rows)
    return head + table + [""] + notes


SECTIONS: dict[str, Callable[[argparse.Namespace, dict[str, TriplesDataset], Path], list[str]]] = {
    "lds": lds_section, "mislabel": mislabel_section, "featurize": featurize_section,
    "faithfulness": faithfulness_section, "classifiers": classifiers_section,
    "counterfactual": counterfactual_section}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="nations", help=f"comma-separated, among {sorted(DATASETS)}")
    ap.add_argument("--m", type=int, default=16, help="subset models per dataset")
    ap.add_argument("--alpha", type=float, default=0.5)
    ap.add_argument("--n-test", type=int, default=100)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--embedding-dim", type=int, default=100)
    ap.add_argument("--dropout", type=float, default=None, help="input, feature-map and hidden dropout of the "
                    "recipe (default: ConvE's 0.2 / 0.2 / 0.3)")
    ap.add_argument("--estimators", default=",".join(estimator_registry.names()))
    ap.add_argument("--ensemble", type=int, default=4, help="ensemble members of trak_ensemble and of "
                    "--compute-matched (further full-data models of the recipe with other seeds)")
    ap.add_argument("--ensemble-scaling", action="store_true", help="also print TRAK's LDS averaged over the first "
                    "1, 2, 4, ... of the full-data model and the --ensemble members (needs tracin and an ensemble "
                    "estimator among --estimators)")
    ap.add_argument("--compute-matched", action="store_true", help="also print every ensemble-able estimator "
                    f"among --estimators ({', '.join(ev.ENSEMBLE_BASES)}) averaged over the first 1, 2, 4, ... of "
                    "the full-data model and the --ensemble members, with the training and scoring seconds and the "
                    "ratio to TracIn's ensemble of the same size (trains the members even without an ensemble "
                    "estimator)")
    ap.add_argument("--replicates", action="store_true", help="also train each subset model again with another "
                    "seed and print the ground truth's noise ceiling (doubles the subset trainings)")
    ap.add_argument("--output", default=ev.DEFAULT_OUTPUT, choices=ev.OUTPUTS, help="TracIn's test-side output: "
                    "the margin the LDS measures (default) or the training loss")
    ap.add_argument("--fraction", type=float, default=0.1, help="mislabel fraction (0: skip that section)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", default=None, help="comma-separated: measure the LDS once per seed (each an "
                    "independent replicate: another full-data model, other subsets and test triples) and also "
                    "pooled over them; the other sections use --seed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache-dir", default=None, help="keep the trained models here and reuse them in later runs "
                    "(the times printed are then of loading, not training)")
    ap.add_argument("--sections", default="lds,mislabel,featurize,faithfulness,classifiers",
                    help=f"comma-separated, in order, among {list(SECTIONS)}")
    ap.add_argument("--faithfulness-samples", type=int, default=24)
    ap.add_argument("--classifier-quick", action="store_true", help="the classifiers section's tiny run")
    ap.add_argument("--cf-k", type=int, default=10, help="counterfactual: training triples removed per test triple")
    ap.add_argument("--cf-tests", type=int, default=20, help="counterfactual: test triples")
    ap.add_argument("--cf-draws", type=int, default=2, help="counterfactual: random-removal draws per test triple")
    ap.add_argument("--cf-seeds", type=int, default=1, help="counterfactual: training seeds each removal is "
                    "retrained from (the full-data model's, then further ones), drops averaged")
    ap.add_argument("--cf-disjoint", action="store_true", help="counterfactual: draw the random removals among "
                    "the triples no estimator removed for that test triple")
    ap.add_argument("--cf-estimators", default="tracin,trak,graddot,random", help="counterfactual: estimators")
    args = ap.parse_args(argv)
    args.sections = [x for x in args.sections.split(",") if x]
    bad = [x for x in args.sections if x not in SECTIONS]
    if bad:
        ap.error(f"unknown section(s) {bad}; choose from {list(SECTIONS)}")
    args.estimators = [e for e in args.estimators.split(",") if e]
    args.cf_estimators = [e for e in args.cf_estimators.split(",") if e]
    for e in args.cf_estimators:
        single = [n for n in estimator_registry.names() if n not in estimator_registry.ensembles()]
        if e not in single:
            ap.error(f"--cf-estimators: {e!r} is not a single-model estimator; choose from {single}")
    if min(args.cf_k, args.cf_tests, args.cf_draws, args.cf_seeds) < 1:
        ap.error("--cf-k, --cf-tests, --cf-draws and --cf-seeds must be >= 1")
    try:
        args.seeds = [int(x) for x in args.seeds.split(",") if x] if args.seeds else None
    except ValueError:
        ap.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    for e in args.estimators:
        estimator_registry.get(e)
    names = [d for d in args.datasets.split(",") if d]
    unknown = [d for d in names if d not in DATASETS]
    if unknown:
        ap.error(f"unknown dataset(s) {unknown}; choose from {sorted(DATASETS)}")
    torch.set_num_threads(args.threads)
    datasets = {d: DATASETS[d]() for d in names}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="quality-") as tmp:
        for name in args.sections:
            lines = SECTIONS[name](args, datasets, Path(tmp))
            if lines:
                print("\n".join(lines), flush=True)
    print(f"\n(total {time.perf_counter() - t0:.0f} s, torch threads {args.threads})")


if __name__ == "__main__":
    main()
