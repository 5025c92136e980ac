"""The visual-only ablation: for each layer set and representation, ``num_runs`` MLP probes, aggregated as mean ±
sample std (ddof = 1), and the accuracy drop from all layers to the visual (attn1) layers.

Uncertainty. Run r uses split r mod ``n_splits`` (default: a new seeded stratified split per run) and probe seed
seed + r, the same for every layer set, so the drop is paired: drop_r = acc_all,r − acc_visual,r on the same
test items with the same initialisation, reported as mean ± std with a Student-t 95% confidence interval over
the runs. Split-to-split variation is thereby part of the spread, as it should be for a claim about the data.

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

from models.lora.data import LoraDataset, sample_layers, stratified_split
from models.lora.features import FeatureCache, compute_features
from models.lora.keys import LAYER_SETS, DatasetFormatError, select_layers
from models.lora.probe import ProbeConfig, run_probe
from models.lora.representations import FEATURE_CODE_VERSION, REPRESENTATIONS, SOURCE_REPRESENTATIONS

SCALAR_METRICS = (
    "train_acc", "val_acc", "test_acc", "val_f1", "test_f1", "val_precision", "test_precision",
    "val_recall", "test_recall", "best_epoch", "time_s",
)
RESULT_VERSION = 2


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


def mean_ci(values: Sequence[float], level: float = 0.95) -> dict:
    """Mean, sample std (ddof = 1) and the Student-t confidence interval of the mean; n = 1 has no spread."""
    from scipy import stats as st

    v = np.asarray(values, dtype=np.float64)
    n = len(v)
    mean = float(v.mean())
    if n < 2:
        return {"mean": mean, "std": None, "n": n, "ci": None, "ci_level": level}
    std = float(v.std(ddof=1))
    half = float(st.t.ppf(0.5 + level / 2, n - 1) * std / np.sqrt(n))
    return {"mean": mean, "std": std, "n": n, "ci": [mean - half, mean + half], "ci_level": level}


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


def accuracy_drop(results: dict, metric: str = "test_acc") -> dict:
    """Per representation: absolute (all − visual) and relative ((all − visual)/all) drop of the mean, and the
    paired drop over runs (same split and probe seed in both layer sets): mean, sample std, 95% CI."""
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
        paired = mean_ci([x - y for x, y in zip(pa, pv, strict=True)]) if len(pa) == len(pv) else None
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
    split_list = [stratified_split(dataset.labels, split_seed(config.seed, k)) for k in range(config.splits)]
    splits = split_list[0]
    pool = dataset.layer_set("all")
    if config.sample_layers < 1:
        pool = sample_layers(pool, config.sample_layers,
                             int(np.random.SeedSequence([config.seed, 0]).generate_state(1)[0]))
    layer_sets: dict[str, list] = {}
    for ls in config.layer_sets:
        layers = select_layers(pool, ls)
        if not layers:
            where = "the sampled layers" if config.sample_layers < 1 else "the dataset"
            raise DatasetFormatError(f"layer set {ls!r} matches no layer of {where}",
                                     field="sample_layers" if config.sample_layers < 1 else "layer_sets")
        layer_sets[ls] = layers
    reps = list(config.representations)
    total = len(layer_sets) * len(reps) * config.runs
    memo = cache_dir / "fingerprints.json" if cache_dir is not None else None
    fingerprint = dataset.fingerprint(memo)
    names = {ls: [layer.name for layer in layers] for ls, layers in layer_sets.items()}
    state_path = None
    done_cells: dict = {}
    if state_dir is not None:
        state_path = state_dir / f"{_state_key(fingerprint, config, names)}.json"
        if state_path.is_file():
            done_cells = json.loads(state_path.read_text()).get("cells", {})

    def report(done: int, message: str) -> None:
        if progress is not None:
            progress(done, total, message)

    done = sum(config.runs for ls in layer_sets for rep in reps if rep in done_cells.get(ls, {}))
    report(done, "computing features")
    todo = [(ls, rep) for ls in layer_sets for rep in reps if rep not in done_cells.get(ls, {})]
    resumed = len(layer_sets) * len(reps) - len(todo)
    todo_reps = sorted({rep for _, rep in todo})
    todo_sets = {ls: layer_sets[ls] for ls in sorted({ls for ls, _ in todo})}  # sampled layers only
    cache = FeatureCache(cache_dir, shared_cache) if (cache_dir is not None and config.cache_features) else None
    feats, fstats = compute_features(
        dataset, todo_sets, todo_reps, device, cache=cache, memo_path=memo,
        progress=lambda d, t: report(done, f"features: {d}/{t} layers"),
    ) if todo else ({}, None)
    y = torch.as_tensor(dataset.labels).to(device)
    probe_cfg = config.probe()
    results: dict = {ls: {} for ls in layer_sets}
    t_train = 0.0
    for ls in layer_sets:
        for rep in reps:
            if rep in done_cells.get(ls, {}):
                results[ls][rep] = done_cells[ls][rep]
                continue
            x = feats[(ls, rep)].select(names[ls]).to(device)  # once per cell, not once per run
            if not torch.isfinite(x).all():
                bad = int((~torch.isfinite(x)).any(0).sum())
                raise FloatingPointError(f"{rep} on {ls}: {bad} feature column(s) are not finite")
            runs = []
            for run in range(config.runs):
                t0 = time.perf_counter()
                runs.append(run_probe(x, y, split_list[run % len(split_list)], dataset.num_classes, probe_cfg,
                                      config.seed + run, device, on_epoch=on_epoch))
                runs[-1]["split"] = run % len(split_list)
                t_train += time.perf_counter() - t0
                done += 1
                message = f"{ls}/{rep} run {run + 1}/{config.runs}: test acc {runs[-1]['test_acc']:.3f}"
                if run + 1 < config.runs:
                    report(done, message)
            results[ls][rep] = aggregate(runs)
            if state_path is not None:
                done_cells.setdefault(ls, {})[rep] = results[ls][rep]
                _write_json(state_path, {"cells": done_cells})
            report(done, message)  # after saving: a cancel raised here keeps the finished cell
    counts = dataset.num_layers()
    return {
        "dataset": dataset_name or str(dataset.root),
        "synthetic": dataset.synthetic,
        "format": dataset.format,
        "num_items": len(dataset),
        "num_classes": dataset.num_classes,
        "classes": dataset.classes,
        "num_layers": counts,
        "layers_used": {ls: len(v) for ls, v in layer_sets.items()},
        "splits": {"train": len(splits.train), "val": len(splits.val), "test": len(splits.test),
                   "n_splits": len(split_list)},
        "config": {**asdict(config), "runs": config.runs},
        "device": str(device),
        "results": results,
        "drop": accuracy_drop(results),
        "timing": {
            "total_s": time.perf_counter() - t_start,
            "features_s": (fstats.compute_s + fstats.load_s) if fstats else 0.0,
            "training_s": t_train,
            "features_computed": [list(k) for k in fstats.computed] if fstats else [],
            "features_cached": [list(k) for k in fstats.cached] if fstats else [],
            "resumed_cells": resumed,
        },
    }


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
    return "\n".join(lines) + "\n"
