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

