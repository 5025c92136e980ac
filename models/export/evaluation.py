"""The LDS and mislabel evaluations for exported classifiers: the recipe (``models.export.train.train`` from the
program's own initial weights), its subset models and their ground truth, and the two statistics the classifier
comparisons add to those of ``models.kg.evaluation`` (whose LDS, intervals, seeds and noise ceiling they reuse).

- :func:`train_recipe` trains a fresh copy of the initial program (the archive as given, so every model of one
  evaluation starts from the same weights) on the given rows with the recipe's options and a seed of its own.
- :func:`train_subset`: the recipe on a seeded ``alpha``-subset of the training rows (``models.kg.evaluation
  .subset_mask``), and that model's margins on the test rows: the LDS's ground truth.
- :func:`margins`: TRAK's classification margin ``log p / (1 - p)`` of each row's label
  (``models.explain.gradients.classification_margin``, the output the estimators' ``output="margin"`` traces).
- :func:`flip_labels`: a seeded fraction of the labels replaced by another class, drawn uniformly.
- :func:`difference_interval` (mean of a - b over test examples, paired bootstrap) and :func:`auc_interval` (the
  ROC AUC with a percentile bootstrap over training examples, stratified so each resample keeps both classes).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.explain.gradients import classification_margin
from models.export.program import ExportedClassifier, build
from models.export.train import Split, save_model, train
from models.kg import evaluation as ev
from models.training import TrainOptions


def margins(clf: ExportedClassifier, split: Split, batch: int = 512) -> np.ndarray:
    """``float64[N]``: each row's classification margin under ``clf``."""
    with torch.no_grad():
        logits = clf.logits(split.inputs, batch).double()
        return np.array([float(classification_margin(logits[i:i + 1], split.labels[i:i + 1]))
                         for i in range(len(logits))])


def train_recipe(init: Path, spec: dict[str, Any], data: Split, opts: TrainOptions, seed: int,
                 out: Path | None = None) -> ExportedClassifier:
    """The recipe from the initial program ``init`` (a ``model.pt2``) on ``data`` with training seed ``seed``;
    with ``out``, the model directory (``save_model``: final weights and checkpoints) is written there too."""
    clf = build(init, spec)
    trained = train(clf, data, dataclasses.replace(opts, seed=int(seed)))
    if out is not None:
        save_model(out, clf, trained)
    return clf


def train_subset(init: Path, spec: dict[str, Any], data: Split, opts: TrainOptions, alpha: float, seed: int,
                 train_seed: int, test: Split) -> dict[str, Any]:
    """The recipe on the ``alpha``-subset drawn with ``seed`` (trained with ``train_seed``): its mask ``bool[n]``
    and its margins on ``test`` ``float64[m]``."""
    mask = ev.subset_mask(len(data.labels), alpha, seed)
    keep = torch.from_numpy(np.flatnonzero(mask))
    clf = train_recipe(init, spec, Split(data.inputs[keep], data.labels[keep]), opts, train_seed)
    return {"mask": mask, "outputs": margins(clf, test)}


def flip_labels(labels: torch.Tensor, n_classes: int, fraction: float, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """``labels`` with ``ceil(fraction * n)`` of them (a seeded draw) replaced by another class drawn uniformly;
    returns the new labels and the flipped indices (sorted)."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    rng = np.random.default_rng([seed, 0xF11B])
    n = len(labels)
    idx = np.sort(rng.choice(n, size=math.ceil(fraction * n), replace=False))
    out = labels.clone()
    shift = torch.from_numpy(rng.integers(1, n_classes, size=len(idx)))
    out[torch.from_numpy(idx)] = (labels[torch.from_numpy(idx)] + shift) % n_classes
    return out, idx


def difference_interval(a: Sequence[float | None], b: Sequence[float | None], seed: int,
                        confidence: float = ev.CONFIDENCE, n_resamples: int = ev.N_RESAMPLES) -> dict[str, Any]:
    """mean(a - b) of two estimators' per-test LDS over the test examples where both are defined, with a paired
    percentile bootstrap interval (``models.kg.evaluation.mean_interval`` of the differences)."""
    x, y = ev._defined(a, b)
    out = ev.mean_interval(x - y, seed, confidence, n_resamples)
    return {"difference": out["mean"], "low": out["low"], "high": out["high"], "n": out["n"],
            "confidence": confidence, "seed": seed}


def auc_interval(labels: np.ndarray, scores: np.ndarray, seed: int, confidence: float = ev.CONFIDENCE,
                 n_resamples: int = ev.N_RESAMPLES) -> dict[str, Any]:
    """``models.kg.evaluation.roc_auc`` of ``scores`` against ``labels`` with a percentile bootstrap interval:
    each resample draws the positives and the negatives with replacement, each as many as there are (seeded)."""
    labels = np.asarray(labels, dtype=bool)
    scores = np.asarray(scores, dtype=np.float64)
    pos, neg = scores[labels], scores[~labels]
    auc = ev.roc_auc(labels, scores)
    rng = np.random.default_rng(seed)
    boots = np.empty(n_resamples)
    lab = np.r_[np.ones(len(pos), dtype=bool), np.zeros(len(neg), dtype=bool)]
    for k in range(n_resamples):
        boots[k] = ev.roc_auc(lab, np.r_[rng.choice(pos, len(pos)), rng.choice(neg, len(neg))])
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(boots, [tail, 100 - tail])
    return {"auc": auc, "low": float(low), "high": float(high), "n": int(len(labels)),
            "positives": int(labels.sum()), "confidence": confidence, "seed": seed}



# ------------------------------------------------------------------------------------------ the service's reports
def data_version(splits: dict[str, Split]) -> str:
    """A digest of a tensors dataset's splits (inputs and labels, as read): the address part of its data."""
    import hashlib

    h = hashlib.sha256()
    for name in sorted(splits):
        x, y = splits[name].inputs.contiguous(), splits[name].labels.to(torch.int64).contiguous()
        h.update(f"\0{name}\0{tuple(x.shape)}\0".encode())
        h.update(x.numpy().tobytes())
        h.update(y.numpy().tobytes())
    return h.hexdigest()


def read_classifier(directory: Path, name: str = "classifier", device: Any = "cpu") -> Any:
    """A model directory ``save_model`` wrote, as the estimators take it (``models.export.influence.classifier``,
    every checkpoint)."""
    from models.export.influence import ProgramModule, classifier, read_checkpoints
    from models.export.program import load

    module = ProgramModule(load(Path(directory), device))
    return classifier(module, read_checkpoints(Path(directory), module, device=device).states, name=name)


def run_estimator(name: str, clf: Any, test: torch.Tensor | None, train: torch.Tensor, self_scores: bool = False,
                  members: Sequence[Any] = ()) -> ev.EstimatorRun:
    """One classifier estimator (``models.explain.classifier_estimators``) on ``clf``, every checkpoint: its
    scores ``[m, n]`` of the test rows (the margin traced where the estimator takes an output, as the LDS
    measures) or its self-scores ``[n]``, timed, shape and finiteness checked."""
    import time

    from models.explain.classifier_estimators import get as get_estimator

    estimator = get_estimator(name)
    scores_fn, self_fn = estimator.load()
    extra: dict[str, Any] = {}
    if not self_scores and estimator.ensemble:
        extra["members"] = list(members)
    if not self_scores and len(estimator.outputs) > 1:
        extra["output"] = "margin"
    t0 = time.perf_counter()
    out = self_fn(clf, "all", train) if self_scores else scores_fn(clf, "all", test, train, **extra)
    values = out.detach().double().cpu().numpy()
    seconds = time.perf_counter() - t0
    expected = (len(train),) if self_scores else (len(test), len(train))
    if values.shape != expected:
        raise ValueError(f"estimator {name!r} returned shape {values.shape}, expected {expected}")
    if not np.isfinite(values).all():
        raise ValueError(f"estimator {name!r} returned non-finite scores")
    return ev.EstimatorRun(name, values, seconds)


def lds_report(clf: Any, masks: np.ndarray, outputs: np.ndarray, test: torch.Tensor, train: torch.Tensor,
               estimators: Sequence[str], seed: int, members: Sequence[Any] = (),
               progress: Any = None, scores: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """``models.kg.evaluation.lds_report`` for a classifier: each estimator's LDS per test row
    (``lds_per_test``), its mean with ``mean_interval``, its time and output, and its ratio to TracIn
    (``ratio_interval``, paired over the same test rows) when TracIn is measured. ``test`` and ``train`` are rows
    (``models.export.influence.rows``); ``outputs`` ``[M, m]`` the subset models' margins on ``test``."""
    from models.explain.classifier_estimators import get as get_estimator

    out: dict[str, Any] = {}
    for k, name in enumerate(estimators):
        if progress is not None:
            progress(k, len(estimators), f"estimator {name}")
        run = run_estimator(name, clf, test, train, members=members)
        per = ev.lds_per_test(masks, outputs, run.values)
        if scores is not None:
            scores[name] = run.values
        outs = get_estimator(name).outputs
        out[name] = {"lds": ev.mean_interval(per, seed),
                     "per_test": [None if not np.isfinite(x) else float(x) for x in per],
                     "seconds": round(run.seconds, 4), "n_undefined": int((~np.isfinite(per)).sum()),
                     "output": ("margin" if "margin" in outs else outs[0]) if outs else None}
    if ev.REFERENCE in out:
        for name in out:
            if name != ev.REFERENCE:
                out[name]["ratio_to_" + ev.REFERENCE] = ev.ratio_interval(out[name]["per_test"],
                                                                          out[ev.REFERENCE]["per_test"], seed)
    if progress is not None:
        progress(len(estimators), len(estimators), "estimators done")
    return out


def mislabel_report(clf: Any, train: torch.Tensor, flipped: np.ndarray, estimators: Sequence[str], seed: int,
                    progress: Any = None, scores: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Each estimator's self-influence ranking of the training rows ``train`` against the ``flipped`` indices:
    ROC AUC with :func:`auc_interval`, found@10%/20% and the recall curve (``models.kg.evaluation``), its time."""
    labels = np.zeros(len(train), dtype=bool)
    labels[np.asarray(flipped, dtype=np.int64)] = True
    out: dict[str, Any] = {}
    for k, name in enumerate(estimators):
        if progress is not None:
            progress(k, len(estimators), f"estimator {name}")
        run = run_estimator(name, clf, None, train, self_scores=True)
        if scores is not None:
            scores[name] = run.values
        out[name] = {"auc_interval": auc_interval(labels, run.values, seed),
                     "found_at_10": ev.found_at(labels, run.values, 0.10),
                     "found_at_20": ev.found_at(labels, run.values, 0.20),
                     "recall_curve": ev.recall_curve(labels, run.values), "seconds": round(run.seconds, 4)}
    if progress is not None:
        progress(len(estimators), len(estimators), "estimators done")
    return out
