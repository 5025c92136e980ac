"""The gradient feature store (:mod:`models.explain.features`) for classifiers of any format: featurize the
training examples once per checkpoint, append new rows, score a query in tiles with a streaming top-k.

:class:`ClassifierFeatures` is a classifier's :class:`models.explain.features.FeatureSource`: its training rows
(in order: segments chain over them), its checkpoints, its configuration (``Classifier.config``: what identifies
the architecture besides the weights, part of every feature key) and a :class:`models.explain.trak.FuncProjector`
of one of two losses: ``margin`` (the classification margin: TRAK's features, on both sides of its score) or
``train`` (the cross-entropy: projected TracIn's).

TRAK on a classifier weights each training column by Q (1 - p of the row's label under the trained model, TRAK's
out-to-loss term). Q is a forward pass over every training row, so the featurize job stores it too
(:func:`store_weights`, ``features/<feature key of the last checkpoint>/q/<digest of the training rows>.npy``),
and a query reads it (:func:`load_weights`) instead of running the model over the training set; a query of new
rows the store has no Q for is :class:`models.explain.features.NotFeaturized`.

Scoring (:func:`stored_top_k`, :func:`stored_self_scores`): the store's tiles ``Σ_c Q_c Φ_cᵀ`` with each tile's
columns times the stored Q (TRAK), merged into the running top-k (:func:`models.explain.features.streaming_top_k`).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from models.explain.classifier import Classifier
from models.explain.features import (
    PREFIX,
    FeatureIndex,
    FeatureSource,
    NotFeaturized,
    TopK,
    examples_digest,
    streaming_top_k,
)
from models.explain.gradients import resolve_parameters
from models.explain.tracin import CheckpointLike
from models.explain.trak import FuncProjector, Projector

LOSSES = ("margin", "train")
ESTIMATOR_LOSS = {"trak": "margin", "tracin_projected": "train"}  # the features each stored estimator reads


class ClassifierFeatures(FeatureSource):
    """A classifier's side of the feature store (module docstring)."""

    losses = LOSSES

    def __init__(self, clf: Classifier, train: torch.Tensor) -> None:
        self.clf = clf
        self._train = train

    @property
    def checkpoints(self) -> Sequence[CheckpointLike]:
        return self.clf.checkpoints

    def checkpoint(self, name: str) -> CheckpointLike:
        for c in self.clf.checkpoints:
            if c.name == str(name) or c.name == f"epoch-{name}":
                return c
        raise KeyError(f"no checkpoint {name!r}; the classifier has {[c.name for c in self.clf.checkpoints]}")

    @property
    def examples(self) -> torch.Tensor:
        return self._train

    @property
    def config(self) -> dict[str, Any]:
        return {"family": "classifier", **self.clf.config}

    def resolve_layers(self, layers: str | Sequence[str]) -> tuple[str, ...]:
        return resolve_parameters(self.clf.module, layers)

    def projector(self, layers: tuple[str, ...], loss: str, proj_dim: int, seed: int,
                  device: torch.device | str | None, dtype: torch.dtype, batch_size: int) -> Projector:
        fn = self.clf.margin if loss == "margin" else self.clf.loss
        return FuncProjector(self.clf.module, fn, layers=list(layers), proj_dim=proj_dim, seed=seed, device=device,
                             dtype=dtype, batch_size=batch_size)


def _weights_key(index_key: str, train: torch.Tensor) -> str:
    return f"{PREFIX}/{index_key}/q/{examples_digest(train)}.npy"


def trak_q(clf: Classifier, train: torch.Tensor, device: Any = None) -> torch.Tensor:
    """Q of every training row at the trained model (the last checkpoint), float32."""
    from models.explain.classifier_estimators import trak_weights

    return trak_weights(clf, train, device=device).float()


def store_weights(store: Any, source: ClassifierFeatures, key: str, device: Any = None) -> None:
    """Compute and keep Q of the source's training rows under the last checkpoint's feature ``key`` (once per set
    of rows: a stored one is kept)."""
    path = _weights_key(key, source.examples)
    if store.exists(path):
        return
    buf = io.BytesIO()
    np.save(buf, trak_q(source.clf, source.examples, device).numpy())
    store.put_bytes(buf.getvalue(), path)


def load_weights(store: Any, key: str, train: torch.Tensor) -> torch.Tensor:
    """The stored Q of ``train`` (:class:`NotFeaturized` when the store has none for these rows)."""
    path = _weights_key(key, train)
    if not store.exists(path):
        raise NotFeaturized("the training examples' TRAK weights (1 - p of their labels) are not stored for these "
                            "rows; run featurize with loss 'margin' first")
    return torch.from_numpy(np.load(io.BytesIO(store.read_bytes(path))))


def last_key(index: FeatureIndex) -> str:
    """The feature key of the index's last checkpoint (where Q is kept)."""
    return index.keys[-1]


def stored_top_k(store: Any, index: FeatureIndex, test: torch.Tensor, estimator: str, k: int,
                 damping: float = 0.01) -> TopK:
    """Each test row's top-``k`` proponents and opponents from the stored features: TRAK (columns times the stored
    Q) or projected TracIn, one tiled pass."""
    if estimator not in ESTIMATOR_LOSS:
        raise ValueError(f"estimator must be one of {tuple(ESTIMATOR_LOSS)}, got {estimator!r}")
    qs = index.queries(test, estimator, damping)
    if estimator != "trak":
        return index.top_k(qs, k)
    q = load_weights(store, last_key(index), index.train)
    tiles = ((r0, s * q[r0:r0 + s.shape[1]][None, :]) for r0, s in index.tiles(qs))
    return streaming_top_k(tiles, len(test), k)


def stored_self_scores(store: Any, index: FeatureIndex, estimator: str, damping: float = 0.01) -> torch.Tensor:
    """Every training row's self-influence from the stored features (TRAK: times Q)."""
    n = len(index.train)
    tile = 4096
    scores = torch.cat([index._self([v.rows(i, min(n, i + tile)) for v in index.views], estimator, damping, None)
                        for i in range(0, n, tile)]) if n else torch.zeros(0)
    if estimator == "trak":
        scores = scores * load_weights(store, last_key(index), index.train)
    return scores
