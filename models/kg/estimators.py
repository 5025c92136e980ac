"""ConvE's implementations of the data-attribution estimators, by the names of the one registry.

What each name means, and which requests take it, is stated once in ``core.estimators`` (torch-free, read by the
API); this table implements the names that registry marks ``evaluated`` for knowledge-graph models, and agrees
with it on which average over an ensemble (``tests/test_evaluation.py`` holds the two equal). Each entry is two
functions, named by dotted path and imported when first used:

- ``scores(bundle, checkpoints, test, train) -> Tensor[m, n]``: the attribution of each of the ``n`` training
  triples (``train``, ids ``[n, 3]``) to each of the ``m`` test triples (``test``, ids ``[m, 3]``), computed on the
  full-data model ``bundle`` (a :class:`models.kg.checkpoint.KGBundle`) and its ``checkpoints``. A positive score
  says training on the triple raised the model's output on the test triple (lowered its loss).
- ``self_scores(bundle, checkpoints, train) -> Tensor[n]``: each training triple's attribution to itself (its
  self-influence), which mislabel detection ranks by.

An entry with ``ensemble=True`` averages over independently trained models of the same recipe (TRAK's model
ensemble): its ``scores`` also takes ``members``, a list of further full-data bundles trained with other seeds
(the LDS evaluation trains them, ``ensemble`` of them, once per recipe and data version). Any estimator of
``models.kg.evaluation.ENSEMBLE_BASES`` can be averaged over the same members (``ensemble_scores``: the benchmark's
compute-matched comparison); only ``trak_ensemble`` has a name here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Estimator:
    name: str
    scores: str        # "module:function", (bundle, checkpoints, test, train) -> Tensor[m, n]
    self_scores: str   # "module:function", (bundle, checkpoints, train) -> Tensor[n]
    ensemble: bool = False  # ``scores`` takes ``members=[KGBundle, ...]`` (further independently trained models)
    # the test-side outputs it computes: with two or more ``scores`` takes ``output=`` one of them (the first is
    # its evaluation default); with one it always uses that one; with none it has no output (noise)
    outputs: tuple[str, ...] = ()

    def load(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """The two functions (importing their module: torch)."""
        return _resolve(self.scores), _resolve(self.self_scores)


def _resolve(path: str) -> Callable[..., Any]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


ESTIMATORS: dict[str, Estimator] = {e.name: e for e in (
    Estimator("tracin", "models.kg.evaluation:tracin_scores", "models.kg.evaluation:tracin_self_scores",
              outputs=("margin", "loss")),
    Estimator("tracin_last", "models.kg.evaluation:tracin_last_scores",
              "models.kg.evaluation:tracin_last_self_scores", outputs=("margin", "loss")),
    # the training side replaced by Adam's update from the optimizer state saved with each checkpoint (LESS)
    Estimator("tracin_adam", "models.kg.evaluation:tracin_adam_scores",
              "models.kg.evaluation:tracin_adam_self_scores", outputs=("margin", "loss")),
    # the margin output function projected to k=4096 (less on graphs too large for that), damped Gauss-Newton
    Estimator("trak", "models.kg.evaluation:trak_scores", "models.kg.evaluation:trak_self_scores",
              outputs=("margin",)),
    Estimator("trak_ensemble", "models.kg.evaluation:trak_ensemble_scores",
              "models.kg.evaluation:trak_self_scores", ensemble=True, outputs=("margin",)),
    # baselines on the last checkpoint alone: the gradient dot product and its cosine
    Estimator("graddot", "models.kg.evaluation:graddot_scores", "models.kg.evaluation:graddot_self_scores",
              outputs=("margin", "loss")),
    Estimator("gradcos", "models.kg.evaluation:gradcos_scores", "models.kg.evaluation:gradcos_self_scores",
              outputs=("margin", "loss")),
    Estimator("random", "models.kg.evaluation:random_scores", "models.kg.evaluation:random_self_scores"),
)}


def names() -> tuple[str, ...]:
    return tuple(ESTIMATORS)


def ensembles() -> tuple[str, ...]:
    """The names of the estimators that average over independently trained models."""
    return tuple(n for n, e in ESTIMATORS.items() if e.ensemble)


def get(name: str) -> Estimator:
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise KeyError(f"unknown estimator {name!r}; choose from {list(ESTIMATORS)}") from None
