"""The gradient feature store for ConvE: :class:`ConvEFeatures`, a bundle's
:class:`models.explain.features.FeatureSource`, the store's functions taking a
:class:`models.kg.checkpoint.KGBundle`, and :func:`stored_report`, a TracIn mode-``test`` report scored against the
stored features (it encodes and decodes triples by name).

The store itself (layout, keys, which rows are new, tiled scoring, streaming top-k) is model-agnostic:
:mod:`models.explain.features`. The features are :class:`models.kg.trak.GradientProjector`'s; the key holds the
bundle's ``ConvEConfig`` as a dict, and the segment digests the triples' int64 ids.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from models.explain.features import (
    FeatureIndex,
    FeatureSettings,
    FeatureSource,
    streaming_top_k,
    threads_for,
    tile_rows_for,
)
from models.explain.features import featurize as featurize_source
from models.explain.features import settings_for as settings_for_source
from models.explain.tracin import CheckpointLike, NonFiniteScores
from models.explain.trak import DEFAULT_DAMPING
from models.kg.checkpoint import KGBundle
from models.kg.influence import TestReport, raise_non_finite
from models.kg.tracin import resolve_layers
from models.kg.trak import LOSSES, GradientProjector
from models.kg.trak_config import stored_configuration, trak_configuration, trak_proj_dim


def projection_size(n_train: int, proj_dim: int | None) -> int:
    """``proj_dim``, or when None the evaluated TRAK's k for ``n_train`` training triples
    (:func:`models.kg.trak_config.trak_proj_dim`): what ``POST /featurize`` stores and ``POST /tracin``'s
    stored-feature estimators read by default."""
    return trak_proj_dim(n_train) if proj_dim is None else int(proj_dim)


def run_configuration(bundle: KGBundle, index: Any, estimator: str, loss: str, proj_dim: int, seed: int,
                      damping: float) -> dict[str, Any]:
    """The configuration a stored-feature report ran (``ran``) and, for ``trak``, the one the evaluations measure
    (``evaluated``, :func:`models.kg.trak_config.trak_configuration` for this training set) and whether they match;
    ``tracin_projected`` is not evaluated (``evaluated`` and ``matches_evaluated`` None)."""
    every = [c.name for c in bundle.checkpoints]
    ran = {"checkpoints": "all" if [c.name for c in index.ckpts] == every else [c.name for c in index.ckpts],
           "layers": "all" if tuple(index.settings.layers) == resolve_layers(bundle.model, "all")
           else list(index.settings.layers),
           "loss": loss, "projection_dim": int(proj_dim), "damping": float(damping) if estimator == "trak" else None,
           "seed": int(seed), "projection": GradientProjector.projection}
    if estimator != "trak":
        return {"ran": ran, "evaluated": None, "matches_evaluated": None}
    evaluated = trak_configuration(len(index.train))
    return {"ran": ran, "evaluated": evaluated, "matches_evaluated": ran == evaluated}


def _differs_warning(configuration: dict[str, Any]) -> str:
    ran, evaluated = configuration["ran"], configuration["evaluated"]
    diff = ", ".join(f"{k} {ran[k]!r} (evaluated: {evaluated[k]!r})" for k in evaluated if ran[k] != evaluated[k])
    return (f"estimator 'trak' ran another configuration than the one the attribution-quality evaluations measure "
            f"(docs/quality.md): {diff}; its measured LDS does not apply to this result")


@dataclass
class ConvEFeatures(FeatureSource):
    """A ConvE bundle as the feature store sees it: its training triples, checkpoints and configuration, its
    layer names (:func:`models.kg.tracin.resolve_layers`) and :class:`models.kg.trak.GradientProjector`."""

    bundle: KGBundle
    losses = LOSSES

    @property
    def checkpoints(self) -> Sequence[CheckpointLike]:
        return self.bundle.checkpoints

    def checkpoint(self, name: str) -> CheckpointLike:
        return self.bundle.checkpoint(name)

    @property
    def examples(self) -> torch.Tensor:
        return self.bundle.dataset.train

    @property
    def config(self) -> dict[str, Any]:
        return self.bundle.model.config.to_dict()

    def resolve_layers(self, layers: str | Sequence[str]) -> tuple[str, ...]:
        return resolve_layers(self.bundle.model, layers)

    def projector(self, layers: tuple[str, ...], loss: str, proj_dim: int, seed: int,
                  device: torch.device | str | None, dtype: torch.dtype, batch_size: int) -> GradientProjector:
        return GradientProjector(self.bundle.model, layers, loss, proj_dim, seed, device, dtype, batch_size)


def featurize(store: Any, bundle: KGBundle, checkpoints: Any = "all", *, proj_dim: int | None = None,
              **kwargs: Any) -> dict[str, Any]:
    """:func:`models.explain.features.featurize` of a ConvE bundle (default: its training triples), ``proj_dim``
    None the evaluated TRAK's (:func:`projection_size`). The report adds ``projection`` and ``configuration``: the
    features' configuration (``ran``: checkpoints, layers, loss, projection_dim, seed, projection), the one the
    evaluated ``trak`` reads (``evaluated``: :func:`models.kg.trak_config.stored_configuration`) and whether they
    are equal, so that a default ``trak`` query of these features runs the evaluated configuration."""
    train = kwargs.get("train")
    n_train = len(bundle.dataset.train if train is None else train)
    k = projection_size(n_train, proj_dim)
    report = featurize_source(store, ConvEFeatures(bundle), checkpoints, proj_dim=k, **kwargs)
    every = [c.name for c in bundle.checkpoints]
    names = [c["checkpoint"] for c in report["checkpoints"]]
    ran = {"checkpoints": "all" if names == every else names,
           "layers": "all" if tuple(report["layers"]) == resolve_layers(bundle.model, "all") else report["layers"],
           "loss": report["loss"], "projection_dim": int(k), "seed": report["seed"],
           "projection": GradientProjector.projection}
    evaluated = stored_configuration(n_train)
    return {**report, "projection": GradientProjector.projection,
            "configuration": {"ran": ran, "evaluated": evaluated, "matches_evaluated": ran == evaluated}}


def feature_index(store: Any, bundle: KGBundle, checkpoints: Any = "all", *, proj_dim: int | None = None,
                  **kwargs: Any) -> FeatureIndex:
    """:class:`models.explain.features.FeatureIndex` of a ConvE bundle's stored features (``proj_dim`` None: the
    evaluated TRAK's, :func:`projection_size`)."""
    train = kwargs.get("train")
    k = projection_size(len(bundle.dataset.train if train is None else train), proj_dim)
    return FeatureIndex(store, ConvEFeatures(bundle), checkpoints, proj_dim=k, **kwargs)


def settings_for(bundle: KGBundle, layers: str | Sequence[str], loss: str, proj_dim: int,
                 seed: int) -> FeatureSettings:
    """:func:`models.explain.features.settings_for` of a ConvE bundle."""
    return settings_for_source(ConvEFeatures(bundle), layers, loss, proj_dim, seed)


def stored_report(store: Any, bundle: KGBundle, test_triples: Sequence[Sequence[str]], *, estimator: str = "trak",
                  top_k: int = 10, checkpoints: Any = "all", layers: str | Sequence[str] = "all",
                  loss: str = "train", proj_dim: int | None = 256, seed: int = 0, damping: float = DEFAULT_DAMPING,
                  weights: Sequence[float] | None = None, lr_weight: str = "last", train: torch.Tensor | None = None,
                  tile_rows: int | None = None, progress: Callable[[int, int, str], None] | None = None,
                  out_dir: Path | None = None,
                  on_index: Callable[[FeatureIndex], None] | None = None) -> tuple[dict, list[dict]]:
    """A TracIn mode-``test`` report scored against the stored features of every training triple (``train``,
    default the model's): ``estimator`` ``trak`` or ``tracin_projected`` (checkpoint weights ``weights``, default
    the stored learning rates; ``lr_weight`` names how they were chosen; ``proj_dim`` None: the evaluated TRAK's k,
    :func:`projection_size`). The same builder as the direct path
    (:class:`models.kg.influence.TestReport`) makes the report, so the result has the same fields;
    ``train_self_influence`` of a listed training triple is its own score under the same estimator. Returns the
    result's fields and the CSV rows (empty when written under ``out_dir``). ``on_index`` is called with the opened
    feature index (the worker records the use of its keys). Raises
    :class:`models.explain.features.NotFeaturized` when the features are not all stored."""
    t0 = time.perf_counter()
    ds = bundle.dataset
    test = ds.encode(test_triples)
    proj_dim = projection_size(len(ds.train if train is None else train), proj_dim)
    index = feature_index(store, bundle, checkpoints, layers=layers, loss=loss, proj_dim=proj_dim, seed=seed,
                          train=train)
    if on_index is not None:
        on_index(index)
    qs = index.queries(test, estimator, damping, weights)
    tile_rows = tile_rows_for(len(test)) if tile_rows is None else tile_rows
    n_tiles = max(1, -(-len(index.train) // tile_rows))

    def tiles() -> Iterator[tuple[int, torch.Tensor]]:
        for i, (c0, tile) in enumerate(index.tiles(qs, tile_rows)):
            bad = ~torch.isfinite(tile)
            if bool(bad.any()):  # a NaN would silently drop out of both rankings
                raise NonFiniteScores(torch.nonzero(bad.any(1)).flatten().tolist(),
                                      (torch.nonzero(bad.any(0)).flatten() + c0).tolist())
            if progress is not None:
                progress(i + 1, n_tiles, f"tile {i + 1}/{n_tiles}")
            yield c0, tile

    try:
        with threads_for(len(test)):
            top = streaming_top_k(tiles(), len(test), top_k)
        listed = sorted({int(j) for j in torch.cat([top.pro_idx.flatten(), top.opp_idx.flatten()]).tolist()
                         if j >= 0})
        listed_self = index.self_scores(listed, estimator, damping, weights)
        test_self = index.self_scores_of(test, estimator, damping, weights)
        for values, rows, cols in ((test_self, True, False), (listed_self, False, True)):
            bad = torch.nonzero(~torch.isfinite(values)).flatten().tolist()
            if bad:
                raise NonFiniteScores(bad if rows else [], [listed[j] for j in bad] if cols else [])
    except NonFiniteScores as exc:
        raise_non_finite(ds, exc, test, index.train)
    self_of = dict(zip(listed, listed_self.tolist(), strict=True))
    train_names = dict(zip(listed, ds.decode(index.train[torch.tensor(listed, dtype=torch.long)]) if listed else [],
                           strict=True))
    out = TestReport(bundle, test, top_k, out_dir)
    for i, te in enumerate(ds.decode(test)):
        entry: dict = {"test_triple": te, "self_influence": float(test_self[i]), "n_candidates": len(index.train),
                       "n_positive": int(top.n_positive[i]), "n_negative": int(top.n_negative[i])}
        for key, idx, val in (("proponents", top.pro_idx, top.pro_val), ("opponents", top.opp_idx, top.opp_val)):
            entry[key] = [{"train_triple": train_names[int(j)], "influence": float(v),
                           "train_self_influence": self_of[int(j)], "train_index": int(j)}
                          for j, v in zip(idx[i].tolist(), val[i].tolist(), strict=True) if j >= 0]
        out.add(entry)
    settings = {"mode": "test", "estimator": estimator, "approximate": True, "top_k": top_k, "lr_weight": lr_weight,
                "checkpoints": [{"name": c.name, "epoch": getattr(c, "epoch", None), "lr": getattr(c, "lr", None),
                                 "weight": w} for c, w in zip(index.ckpts, index.weights(weights), strict=True)],
                "layers": list(index.settings.layers), "loss": loss, "projection_dim": int(proj_dim),
                "projection": GradientProjector.projection, "seed": int(seed),
                "damping": float(damping) if estimator == "trak" else None, "precision": "fp32",
                "requested_precision": None, "method": None, "filter": None, "warnings": []}
    settings["configuration"] = run_configuration(bundle, index, estimator, loss, proj_dim, seed, damping)
    if settings["configuration"]["matches_evaluated"] is False:
        settings["warnings"].append(_differs_warning(settings["configuration"]))
    return {**settings, **out.finish(), "notes": [], "n_candidates": len(index.train),
            "seconds": time.perf_counter() - t0}, out.rows
