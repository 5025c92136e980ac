"""The gradient feature store (:mod:`models.explain.features`) for classifiers of any format: featurize the
training examples once per checkpoint, append new rows, score a query in tiles with a streaming top-k.

:class:`ClassifierFeatures` is a classifier's :class:`models.explain.features.FeatureSource`: its training rows
(in order: segments chain over them), its checkpoints, its configuration (``Classifier.config``: what identifies
the architecture besides the weights, part of every feature key) and a :class:`models.explain.trak.FuncProjector`
of one of two losses: ``margin`` (the classification margin: TRAK's features, on both sides of its score) or
``train`` (the cross-entropy: projected TracIn's).

TRAK's features (``margin``) are projected with an independent projection per checkpoint, as the direct estimator
(:func:`models.explain.classifier_estimators.trak_scores`) draws them: :meth:`ClassifierFeatures.projection_seed`,
which puts each checkpoint's projection seed into its feature key (so features of one shared projection, stored
before, are never read as these).

TRAK on a classifier weights each training column by Q (1 - p of the row's label, TRAK's out-to-loss term)
averaged over the checkpoints, each at its own weights. Q is a forward pass over every training row, so the
featurize job stores it per checkpoint (:func:`store_weights`, ``features/<the checkpoint's feature key>/q/<digest
of the training rows>.npy``), and a query averages the stored ones (:func:`load_weights`) instead of running the
model over the training set; a query of new rows the store has no Q for is
:class:`models.explain.features.NotFeaturized`.

Scoring (:func:`stored_top_k`, :func:`stored_self_scores`): the store's tiles ``Σ_c Q_c Φ_cᵀ`` with each tile's
columns times the mean stored Q (TRAK), merged into the running top-k
(:func:`models.explain.features.streaming_top_k`).
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

    def projection_seed(self, loss: str, seed: int, ckpt: CheckpointLike) -> int | None:
        """TRAK's features (``margin``): checkpoint ``ckpt``'s own projection, as the direct estimator draws it
        (:func:`models.explain.trak.checkpoint_seed` of ``seed`` and its position among the classifier's
        checkpoints); projected TracIn's (``train``): ``seed`` for every checkpoint."""
        if loss != "margin":
            return None
        from models.explain.classifier_estimators import checkpoint_index
        from models.explain.trak import checkpoint_seed

        return checkpoint_seed(seed, checkpoint_index(self.clf, ckpt))


def _weights_key(index_key: str, train: torch.Tensor) -> str:
    return f"{PREFIX}/{index_key}/q/{examples_digest(train)}.npy"


def trak_q(clf: Classifier, train: torch.Tensor, ckpt: CheckpointLike, device: Any = None) -> torch.Tensor:
    """Q of every training row at checkpoint ``ckpt``'s weights, float32."""
    from models.explain.classifier_estimators import trak_weights

    return trak_weights(clf, train, ckpt, device=device).float()


def store_weights(store: Any, source: ClassifierFeatures, stored: dict[str, Any], device: Any = None) -> None:
    """Compute and keep Q of the source's training rows at each checkpoint :func:`models.explain.features.featurize`
    reported (``stored``, its result), under that checkpoint's feature key (once per set of rows: a stored one is
    kept)."""
    for c in stored["checkpoints"]:
        path = _weights_key(c["key"], source.examples)
        if store.exists(path):
            continue
        buf = io.BytesIO()
        np.save(buf, trak_q(source.clf, source.examples, source.checkpoint(c["checkpoint"]), device).numpy())
        store.put_bytes(buf.getvalue(), path)


def load_weights(store: Any, index: FeatureIndex) -> torch.Tensor:
    """Q of the index's training rows averaged over its checkpoints (float64; each checkpoint's Q as stored under
    its feature key; :class:`NotFeaturized` when the store lacks one)."""
    total = torch.zeros(len(index.train), dtype=torch.float64)
    for ck, key in zip(index.ckpts, index.keys, strict=True):
        path = _weights_key(key, index.train)
        if not store.exists(path):
            raise NotFeaturized(f"checkpoint {ck.name!r}: the training examples' TRAK weights (1 - p of their "
                                "labels) are not stored for these rows; run featurize with loss 'margin' first")
        total += torch.from_numpy(np.load(io.BytesIO(store.read_bytes(path)))).double()
    return total / len(index.keys)


def stored_top_k(store: Any, index: FeatureIndex, test: torch.Tensor, estimator: str, k: int,
                 damping: float = 0.01) -> TopK:
    """Each test row's top-``k`` proponents and opponents from the stored features: TRAK (columns times the stored
    Q averaged over the checkpoints) or projected TracIn, one tiled pass."""
    if estimator not in ESTIMATOR_LOSS:
        raise ValueError(f"estimator must be one of {tuple(ESTIMATOR_LOSS)}, got {estimator!r}")
    qs = index.queries(test, estimator, damping)
    if estimator != "trak":
        return index.top_k(qs, k)
    q = load_weights(store, index).float()
    tiles = ((r0, s * q[r0:r0 + s.shape[1]][None, :]) for r0, s in index.tiles(qs))
    return streaming_top_k(tiles, len(test), k)


def stored_self_scores(store: Any, index: FeatureIndex, estimator: str, damping: float = 0.01) -> torch.Tensor:
    """Every training row's self-influence from the stored features (TRAK: times the mean Q)."""
    n = len(index.train)
    tile = 4096
    scores = torch.cat([index._self([v.rows(i, min(n, i + tile)) for v in index.views], estimator, damping, None)
                        for i in range(0, n, tile)]) if n else torch.zeros(0)
    if estimator == "trak":
        scores = scores * load_weights(store, index).float()
    return scores
