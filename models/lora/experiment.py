"""The visual-only ablation: for each layer set and representation, ``num_runs`` MLP probes on a fixed seeded
split, aggregated as mean ± std, and the accuracy drop from all layers to the visual (attn1) layers.

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
from models.lora.keys import LAYER_SETS, DatasetFormatError
from models.lora.probe import ProbeConfig, run_probe
from models.lora.representations import FEATURE_CODE_VERSION, REPRESENTATIONS, SOURCE_REPRESENTATIONS

SCALAR_METRICS = (
    "train_acc", "val_acc", "test_acc", "val_f1", "test_f1", "val_precision", "test_precision",
    "val_recall", "test_recall", "best_epoch", "time_s",
)
RESULT_VERSION = 1


@dataclass
class AblationConfig:
    representations: list[str] = field(default_factory=lambda: list(SOURCE_REPRESENTATIONS))
    layer_sets: list[str] = field(default_factory=lambda: ["all", "visual"])
    num_runs: int = 10
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


def aggregate(runs: Sequence[dict]) -> dict:
    """Mean and population std of every scalar metric over runs, the per-run values and the summed confusion
    matrices."""
    out: dict = {}
    for key in SCALAR_METRICS:
        vals = np.array([r[key] for r in runs], dtype=np.float64)
        out[key] = {"mean": float(vals.mean()), "std": float(vals.std())}
    for split in ("val", "test"):
        out[f"{split}_confusion_sum"] = np.sum([np.array(r[f"{split}_confusion"]) for r in runs], axis=0).tolist()
    out["feature_dim"] = runs[0]["feature_dim"]
    out["runs"] = [dict(r) for r in runs]
    return out


def accuracy_drop(results: dict, metric: str = "test_acc") -> dict:
    """Per representation: absolute (all − visual) and relative ((all − visual)/all) drop of the mean."""
    drop: dict = {}
    if "all" not in results or "visual" not in results:
        return drop
    for rep, cell in results["all"].items():
        if rep not in results["visual"]:
            continue
        a = cell[metric]["mean"]
        v = results["visual"][rep][metric]["mean"]
        drop[rep] = {"metric": metric, "all": a, "visual": v, "absolute": a - v,
                     "relative": (a - v) / a if a > 0 else None}
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
    splits = stratified_split(dataset.labels, config.seed)
    layer_sets: dict[str, list] = {}
    for ls in config.layer_sets:
        layers = dataset.layer_set(ls)
        if not layers:
            raise DatasetFormatError(f"layer set {ls!r} matches no layer of the dataset", field="layer_sets")
        seed = int(np.random.SeedSequence([config.seed, LAYER_SETS.index(ls)]).generate_state(1)[0])
        layer_sets[ls] = sample_layers(layers, config.sample_layers, seed) if config.sample_layers < 1 else layers
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
    todo_sets = {ls: dataset.layer_set(ls) for ls in sorted({ls for ls, _ in todo})}
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
                runs.append(run_probe(x, y, splits, dataset.num_classes, probe_cfg, config.seed + run, device,
                                      on_epoch=on_epoch))
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
        "format": dataset.format,
        "num_items": len(dataset),
        "num_classes": dataset.num_classes,
        "classes": dataset.classes,
        "num_layers": counts,
        "layers_used": {ls: len(v) for ls, v in layer_sets.items()},
        "splits": {"train": len(splits.train), "val": len(splits.val), "test": len(splits.test)},
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
        head += f"{'drop abs':>10}{'drop rel':>10}"
    lines = [
        f"LoRA ablation on {result['dataset']}: {result['num_items']} adapters, {result['num_classes']} classes, "
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
        lines.append(row)
    return "\n".join(lines) + "\n"
