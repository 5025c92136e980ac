"""The visual-only ablation: for each layer set and representation, ``num_runs`` MLP probes, aggregated as mean ±
sample std (ddof = 1), and the accuracy drop from all layers to the visual (attn1) layers.

Uncertainty. Run r uses split r mod ``n_splits`` (default: a new seeded stratified split per run) and probe seed
seed + r, the same for every layer set, so the drop is paired: drop_r = acc_all,r − acc_visual,r on the same
test items with the same initialisation, reported as mean ± std with a Student-t 95% confidence interval over
the runs, its variance corrected for overlapping splits (Nadeau & Bengio 2003: σ²·(1/J + n_test/n_train)).
Split-to-split variation is thereby part of the spread, as it should be for a claim about the data.

Leakage. Adapters with identical tensors are used once (the rest are reported in ``duplicates`` and
``warnings``), and a ``group`` column in labels.csv keeps related adapters on one side of every split.

Layer sampling. ``sample_layers < 1`` draws one seeded subset of all layers; each layer set is that subset's
part (so "visual" is the sampled set's visual layers, and the all → visual drop compares nested sets, not two
independent draws), and features are computed for the sampled layers only.

Resume: with a ``state_dir``, each finished (layer set, representation) is written to ``partial.json`` under a
key that covers the dataset fingerprint and every setting that changes results; re-running the same
experiment after a failure skips those cells.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.lora.data import LoraDataset, Splits, group_split, sample_layers
from models.lora.features import FeatureCache, compute_features
from models.lora.keys import LAYER_SETS, DatasetFormatError, select_layers
from models.lora.probe import ProbeConfig, run_probe
from models.lora.representations import FEATURE_CODE_VERSION, REPRESENTATIONS, SOURCE_REPRESENTATIONS

SCALAR_METRICS = (
    "train_acc", "val_acc", "test_acc", "val_f1", "test_f1", "val_precision", "test_precision",
    "val_recall", "test_recall", "best_epoch", "time_s",
)
RESULT_VERSION = 3  # 3: duplicates removed, group-aware splits, corrected intervals


@dataclass
class AblationConfig:
    representations: list[str] = field(default_factory=lambda: list(SOURCE_REPRESENTATIONS))
    layer_sets: list[str] = field(default_factory=lambda: ["all", "visual"])
    num_runs: int = 10
    n_splits: int | None = None  # distinct data splits over the runs; None = one per run
    quick: bool = False
    sample_layers: float = 1.0
    cache_features: bool = True
    batch_size: int = 256
    max_epochs: int = 200
    patience: int = 15
    hidden_dim: int = 512
    dropout: float = 0.5
    weight_decay: float = 1e-4
    precision: str = "auto"
    seed: int = 42

    @property
    def runs(self) -> int:
        """``quick`` means 3 runs."""
        return 3 if self.quick else self.num_runs

    @property
    def splits(self) -> int:
        return self.runs if self.n_splits is None else max(1, min(self.n_splits, self.runs))

    def probe(self) -> ProbeConfig:
        return ProbeConfig(hidden_dim=self.hidden_dim, dropout=self.dropout, weight_decay=self.weight_decay,
                           batch_size=self.batch_size, max_epochs=self.max_epochs, patience=self.patience,
                           precision=self.precision)

    def validate(self) -> None:
        unknown = [r for r in self.representations if r not in REPRESENTATIONS]
        if unknown:
            raise ValueError(f"unknown representation(s) {unknown}; known: {list(REPRESENTATIONS)}")
        bad = [ls for ls in self.layer_sets if ls not in LAYER_SETS]
        if bad:
            raise ValueError(f"unknown layer set(s) {bad}; known: {list(LAYER_SETS)}")
        if self.n_splits is not None and self.n_splits < 1:
            raise ValueError("n_splits must be >= 1")


def split_seed(seed: int, index: int) -> int:
    """Seed of the ``index``-th data split (index 0 is the historical fixed split, ``seed`` itself)."""
    return seed if index == 0 else int(np.random.SeedSequence([seed, 7919, index]).generate_state(1)[0])


def mean_ci(values: Sequence[float], level: float = 0.95, test_train_ratio: float | None = None) -> dict:
    """Mean, sample std (ddof = 1) and the Student-t confidence interval of the mean; n = 1 has no spread.

    With ``test_train_ratio`` = n_test/n_train, ``ci`` is the Nadeau–Bengio corrected resampled t interval
    (Nadeau & Bengio 2003, "Inference for the generalization error", Machine Learning 52): the J values come from
    J random train/test splits of one data set, which overlap, so the variance of their mean is not σ²/J but
    σ²·(1/J + n_test/n_train). ``ci_naive`` keeps the uncorrected σ²/J interval for comparison.
    """
    from scipy import stats as st

    v = np.asarray(values, dtype=np.float64)
    n = len(v)
    mean = float(v.mean())
    if n < 2:
        return {"mean": mean, "std": None, "n": n, "ci": None, "ci_level": level}
    std = float(v.std(ddof=1))
    t = float(st.t.ppf(0.5 + level / 2, n - 1))
    naive = t * std / np.sqrt(n)
    out = {"mean": mean, "std": std, "n": n, "ci": [mean - naive, mean + naive], "ci_level": level}
    if test_train_ratio is not None:
        half = t * float(np.sqrt(std ** 2 * (1 / n + test_train_ratio)))
        out.update(ci=[mean - half, mean + half], ci_naive=[mean - naive, mean + naive],
                   ci_method="nadeau_bengio", test_train_ratio=test_train_ratio)
    return out


def aggregate(runs: Sequence[dict]) -> dict:
    """Mean and sample std (ddof = 1; 0 for a single run) of every scalar metric over runs, the per-run values
    and the summed confusion matrices."""
    out: dict = {}
    for key in SCALAR_METRICS:
        vals = np.array([r[key] for r in runs], dtype=np.float64)
        out[key] = {"mean": float(vals.mean()), "std": float(vals.std(ddof=1)) if len(vals) > 1 else 0.0}
    for split in ("val", "test"):
        out[f"{split}_confusion_sum"] = np.sum([np.array(r[f"{split}_confusion"]) for r in runs], axis=0).tolist()
    out["feature_dim"] = runs[0]["feature_dim"]
    out["runs"] = [dict(r) for r in runs]
    return out


def accuracy_drop(results: dict, metric: str = "test_acc", test_train_ratio: float | None = None) -> dict:
    """Per representation: absolute (all − visual) and relative ((all − visual)/all) drop of the mean, and the
    paired drop over runs (same split and probe seed in both layer sets): mean, sample std, 95% CI (the
    Nadeau–Bengio corrected one with ``test_train_ratio``, see ``mean_ci``)."""
    drop: dict = {}
    if "all" not in results or "visual" not in results:
        return drop
    for rep, cell in results["all"].items():
        if rep not in results["visual"]:
            continue
        a = cell[metric]["mean"]
        v = results["visual"][rep][metric]["mean"]
        pa = [r[metric] for r in cell["runs"]]
        pv = [r[metric] for r in results["visual"][rep]["runs"]]
        paired = (mean_ci([x - y for x, y in zip(pa, pv, strict=True)], test_train_ratio=test_train_ratio)
                  if len(pa) == len(pv) else None)
        drop[rep] = {"metric": metric, "all": a, "visual": v, "absolute": a - v,
                     "relative": (a - v) / a if a > 0 else None, "paired": paired}
    return drop


def _state_key(fingerprint: str, config: AblationConfig, layer_names: dict[str, list[str]]) -> str:
    cfg = asdict(config)
    cfg.pop("cache_features")
    cfg.pop("representations")
    cfg.pop("layer_sets")
    payload = json.dumps({"dataset": fingerprint, "config": cfg, "runs": config.runs, "layers": layer_names,
                          "code": FEATURE_CODE_VERSION, "result": RESULT_VERSION}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def _write_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj))
    tmp.replace(path)


ProgressFn = Callable[[int, int, str], None]


@dataclass
class _Plan:
    """What one ablation covers: the data splits, each layer set's layers (and their names), the
    representations, and the (layer set, representation) cells an earlier attempt already finished."""

    split_list: list
    duplicates: list[dict]
    layer_sets: dict[str, list]
    names: dict[str, list[str]]
    reps: list[str]
    runs: int
    memo: Path | None
    state_path: Path | None
    done_cells: dict  # with a state_path, each cell is added as it finishes
    todo: list[tuple[str, str]] = field(init=False)  # the cells left at the start

    def __post_init__(self) -> None:
        self.todo = [(ls, rep) for ls in self.layer_sets for rep in self.reps if not self.is_done(ls, rep)]

    def is_done(self, ls: str, rep: str) -> bool:
        return rep in self.done_cells.get(ls, {})

    @property
    def total_units(self) -> int:
        return len(self.layer_sets) * len(self.reps) * self.runs

    @property
    def resumed_cells(self) -> int:
        return len(self.layer_sets) * len(self.reps) - len(self.todo)

    @property
    def resumed_units(self) -> int:
        return self.resumed_cells * self.runs


class _Progress:
    """``progress(done, total, message)`` with ``done`` the finished (layer set, representation, run) units."""

    def __init__(self, progress: ProgressFn | None, total: int, done: int) -> None:
        self.progress, self.total, self.done = progress, total, done

    def report(self, message: str) -> None:
        if self.progress is not None:
            self.progress(self.done, self.total, message)


def _select_layer_sets(dataset: LoraDataset, config: AblationConfig) -> dict[str, list]:
    """Each requested layer set's layers, taken from one seeded sample of all layers when ``sample_layers < 1``;
    a layer set with no layer is a ``DatasetFormatError``."""
    sampled = config.sample_layers < 1
    pool = dataset.layer_set("all")
    if sampled:
        pool = sample_layers(pool, config.sample_layers,
                             int(np.random.SeedSequence([config.seed, 0]).generate_state(1)[0]))
    layer_sets: dict[str, list] = {}
    for ls in config.layer_sets:
        layers = select_layers(pool, ls)
        if not layers:
            where = "the sampled layers" if sampled else "the dataset"
            raise DatasetFormatError(f"layer set {ls!r} matches no layer of {where}",
                                     field="sample_layers" if sampled else "layer_sets")
        layer_sets[ls] = layers
    return layer_sets


def _finished_cells(
    state_dir: Path | None, fingerprint: str, config: AblationConfig, names: dict[str, list[str]]
) -> tuple[Path | None, dict]:
    """The resume file of this experiment (``None`` without a ``state_dir``) and the cells it already holds."""
    if state_dir is None:
        return None, {}
    state_path = state_dir / f"{_state_key(fingerprint, config, names)}.json"
    done_cells = json.loads(state_path.read_text()).get("cells", {}) if state_path.is_file() else {}
    return state_path, done_cells


def deduplicate(dataset: LoraDataset, memo_path: Path | None = None) -> tuple[np.ndarray, list[dict]]:
    """The indices of the adapters an experiment uses (the first of each set of identical ones, by content
    digest) and, per set of duplicates, which was kept, which were dropped and their labels."""
    dropped: set[int] = set()
    report = []
    for idx in dataset.duplicates(memo_path):
        dropped.update(idx[1:])
        report.append({"kept": dataset.names[idx[0]], "removed": [dataset.names[i] for i in idx[1:]],
                       "labels": sorted({dataset.classes[dataset.labels[i]] for i in idx})})
    return np.array([i for i in range(len(dataset)) if i not in dropped], dtype=np.int64), report


def make_splits(dataset: LoraDataset, config: AblationConfig,
                memo_path: Path | None = None) -> tuple[list[Splits], list[dict]]:
    """The experiment's splits over the de-duplicated adapters (indices into the dataset), group-aware, and the
    duplicates report (adapter digests memoised in ``memo_path``)."""
    keep, dups = deduplicate(dataset, memo_path)
    labels = dataset.labels[keep]
    groups = [dataset.groups[i] for i in keep]
    splits = []
    for k in range(config.splits):
        s = group_split(labels, groups, split_seed(config.seed, k))
        splits.append(Splits(keep[s.train], keep[s.val], keep[s.test]))
    return splits, dups


def _plan(dataset: LoraDataset, config: AblationConfig, cache_dir: Path | None, state_dir: Path | None) -> _Plan:
    """Splits, layer sets and the resume state; the dataset fingerprint is memoised under ``cache_dir``."""
    split_list, duplicates = make_splits(dataset, config,
                                         cache_dir / "adapter_digests.json" if cache_dir is not None else None)
    layer_sets = _select_layer_sets(dataset, config)
    memo = cache_dir / "fingerprints.json" if cache_dir is not None else None
    fingerprint = dataset.fingerprint(memo)
    names = {ls: [layer.name for layer in layers] for ls, layers in layer_sets.items()}
    state_path, done_cells = _finished_cells(state_dir, fingerprint, config, names)
    return _Plan(split_list=split_list, duplicates=duplicates, layer_sets=layer_sets, names=names, reps=list(config.representations),
                 runs=config.runs, memo=memo, state_path=state_path, done_cells=done_cells)


def _missing_features(
    dataset: LoraDataset, plan: _Plan, device: torch.device, cache: FeatureCache | None, tracker: _Progress
) -> tuple[dict, Any]:
    """Features of the unfinished cells only, for the sampled layers only (``({}, None)`` when all are done)."""
    todo = plan.todo
    if not todo:
        return {}, None
    todo_reps = sorted({rep for _, rep in todo})
    todo_sets = {ls: plan.layer_sets[ls] for ls in sorted({ls for ls, _ in todo})}
    return compute_features(
        dataset, todo_sets, todo_reps, device, cache=cache, memo_path=plan.memo,
        progress=lambda d, t: tracker.report(f"features: {d}/{t} layers"),
    )


def _cell_features(feats: dict, plan: _Plan, ls: str, rep: str, device: torch.device) -> torch.Tensor:
    """The cell's feature matrix on ``device`` (moved once per cell, not once per run); non-finite columns raise."""
    x = feats[(ls, rep)].select(plan.names[ls]).to(device)
    if not torch.isfinite(x).all():
        bad = int((~torch.isfinite(x)).any(0).sum())
        raise FloatingPointError(f"{rep} on {ls}: {bad} feature column(s) are not finite")
    return x


def _run_message(ls: str, rep: str, run: int, runs: int, test_acc: float) -> str:
    return f"{ls}/{rep} run {run + 1}/{runs}: test acc {test_acc:.3f}"


@dataclass
class _Prober:
    """Trains the probes of each unfinished cell: run r on split r mod n_splits with probe seed seed + r."""

    dataset: LoraDataset
    config: AblationConfig
    plan: _Plan
    device: torch.device
    tracker: _Progress
    on_epoch: Callable[[int, float], None] | None
    training_s: float = 0.0
    y: torch.Tensor = field(init=False)
    probe_cfg: ProbeConfig = field(init=False)

    def __post_init__(self) -> None:
        self.y = torch.as_tensor(self.dataset.labels).to(self.device)
        self.probe_cfg = self.config.probe()

    def run_all(self, feats: dict) -> dict:
        """Results per layer set and representation; finished cells are taken over from the resume file."""
        results: dict = {ls: {} for ls in self.plan.layer_sets}
        for ls in self.plan.layer_sets:
            for rep in self.plan.reps:
                if self.plan.is_done(ls, rep):
                    results[ls][rep] = self.plan.done_cells[ls][rep]
                    continue
                runs = self.probe_runs(_cell_features(feats, self.plan, ls, rep, self.device), ls, rep)
                results[ls][rep] = aggregate(runs)
                self.save(ls, rep, results[ls][rep])
                # after saving: a cancel raised here keeps the finished cell
                self.tracker.report(_run_message(ls, rep, self.config.runs - 1, self.config.runs,
                                                 runs[-1]["test_acc"]))
        return results

    def probe_runs(self, x: torch.Tensor, ls: str, rep: str) -> list[dict]:
        """``config.runs`` probes on ``x``; progress after each but the last (reported once the cell is saved)."""
        split_list = self.plan.split_list
        runs = []
        for run in range(self.config.runs):
            t0 = time.perf_counter()
            runs.append(run_probe(x, self.y, split_list[run % len(split_list)], self.dataset.num_classes,
                                  self.probe_cfg, self.config.seed + run, self.device, on_epoch=self.on_epoch))
            runs[-1]["split"] = run % len(split_list)
            self.training_s += time.perf_counter() - t0
            self.tracker.done += 1
            if run + 1 < self.config.runs:
                self.tracker.report(_run_message(ls, rep, run, self.config.runs, runs[-1]["test_acc"]))
        return runs

    def save(self, ls: str, rep: str, cell: dict) -> None:
        if self.plan.state_path is not None:
            self.plan.done_cells.setdefault(ls, {})[rep] = cell
            _write_json(self.plan.state_path, {"cells": self.plan.done_cells})


def _assemble_result(
    dataset: LoraDataset, config: AblationConfig, plan: _Plan, device: torch.device, results: dict,
    fstats: Any, dataset_name: str | None, t_start: float, training_s: float,
) -> dict:
    splits = plan.split_list[0]
    warnings = []
    if plan.duplicates:
        removed = sum(len(d["removed"]) for d in plan.duplicates)
        warnings.append(f"{removed} duplicate adapter(s) (identical tensors) removed before splitting: "
                        + "; ".join(f"{', '.join(d['removed'])} = {d['kept']}" for d in plan.duplicates[:10])
                        + ("; ..." if len(plan.duplicates) > 10 else ""))
        mixed = [d for d in plan.duplicates if len(d["labels"]) > 1]
        if mixed:
            warnings.append(f"{len(mixed)} set(s) of identical adapters carry different labels, e.g. "
                            f"{mixed[0]['kept']} ({', '.join(mixed[0]['labels'])}); the first row's label is used")
    return {
        "dataset": dataset_name or str(dataset.root),
        "synthetic": dataset.synthetic,
        "format": dataset.format,
        "num_items": int(sum(len(getattr(splits, k)) for k in ("train", "val", "test"))),
        "num_listed": len(dataset),
        "duplicates": plan.duplicates,
        "grouped": any(g is not None for g in dataset.groups),
        "warnings": warnings,
        "num_classes": dataset.num_classes,
        "classes": dataset.classes,
        "num_layers": dataset.num_layers(),
        "layers_used": {ls: len(v) for ls, v in plan.layer_sets.items()},
        "splits": {"train": len(splits.train), "val": len(splits.val), "test": len(splits.test),
                   "n_splits": len(plan.split_list)},
        "config": {**asdict(config), "runs": config.runs},
        "device": str(device),
        "results": results,
        "drop": accuracy_drop(results, test_train_ratio=len(splits.test) / len(splits.train)),
        "timing": {
            "total_s": time.perf_counter() - t_start,
            "features_s": (fstats.compute_s + fstats.load_s) if fstats else 0.0,
            "training_s": training_s,
            "features_computed": [list(k) for k in fstats.computed] if fstats else [],
            "features_cached": [list(k) for k in fstats.cached] if fstats else [],
            "resumed_cells": plan.resumed_cells,
        },
    }


def run_ablation(
    dataset: LoraDataset,
    config: AblationConfig,
    device: torch.device,
    cache_dir: Path | None = None,
    state_dir: Path | None = None,
    progress: ProgressFn | None = None,
    on_epoch: Callable[[int, float], None] | None = None,
    dataset_name: str | None = None,
    shared_cache: Any = None,
) -> dict:
    """Run the ablation and return the JSON-ready result (see ``format_table`` for the text form).

    ``progress(done, total, message)`` counts (layer set, representation, run) units. ``cache_dir`` enables
    the feature cache (when ``config.cache_features``); its ``fingerprints.json`` memoises file digests.
    ``shared_cache`` is the cache's optional second tier, seen by other hosts (see ``FeatureCache``).
    """
    config.validate()
    t_start = time.perf_counter()
    plan = _plan(dataset, config, cache_dir, state_dir)
    tracker = _Progress(progress, plan.total_units, plan.resumed_units)
    tracker.report("computing features")
    cache = FeatureCache(cache_dir, shared_cache) if (cache_dir is not None and config.cache_features) else None
    feats, fstats = _missing_features(dataset, plan, device, cache, tracker)
    prober = _Prober(dataset, config, plan, device, tracker, on_epoch)
    results = prober.run_all(feats)
    return _assemble_result(dataset, config, plan, device, results, fstats, dataset_name, t_start,
                            prober.training_s)


def format_table(result: dict) -> str:
    """A fixed-width text table: test accuracy mean ± std per representation and layer set, and the drop."""
    sets = list(result["results"])
    reps = list(next(iter(result["results"].values())).keys()) if sets else []
    head = f"{'representation':<16}" + "".join(f"{ls + ' test acc':>22}" for ls in sets)
    has_drop = bool(result.get("drop"))
    if has_drop:
        head += f"{'drop abs':>10}{'drop rel':>10}{'paired drop (95% CI)':>32}"
    synthetic = "SYNTHETIC data; " if result.get("synthetic") else ""
    lines = [
        f"LoRA ablation on {result['dataset']} ({synthetic}{result['splits'].get('n_splits', 1)} split(s)): "
        f"{result['num_items']} adapters, {result['num_classes']} classes, "
        f"layers all/visual/text = {result['num_layers']['all']}/{result['num_layers']['visual']}/"
        f"{result['num_layers']['text']}, {result['config']['runs']} runs, chance = {1 / result['num_classes']:.3f}",
        head,
        "-" * len(head),
    ]
    for rep in reps:
        row = f"{rep:<16}"
        for ls in sets:
            m = result["results"][ls][rep]["test_acc"]
            row += f"{m['mean']:>15.4f} ± {m['std']:.3f}"
        if has_drop and rep in result["drop"]:
            d = result["drop"][rep]
            rel = f"{100 * d['relative']:>9.1f}%" if d["relative"] is not None else f"{'n/a':>10}"
            row += f"{d['absolute']:>10.4f}{rel}"
            p = d.get("paired")
            if p and p["ci"] is not None:
                row += f"{p['mean']:>10.4f} ± {p['std']:.3f} [{p['ci'][0]:.3f}, {p['ci'][1]:.3f}]"
        lines.append(row)
    lines += [f"warning: {w}" for w in result.get("warnings", [])]
    return "\n".join(lines) + "\n"
