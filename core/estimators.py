"""The data-attribution estimators, by name: one registry, one meaning per name (torch-free).

Every request that names an estimator takes its choices from here: ``POST /tracin`` (``estimator``: those that
answer a query), ``POST /featurize`` (its result lists the estimators its stored features serve) and the
evaluation kinds (``estimators``: those an evaluation can measure). A model family implements the names it
supports beside its model (ConvE: ``models.kg.estimators``, tested to cover exactly the names here marked
``evaluated``).

- ``tracin``: TracIn-CP (Pruthi et al. 2020), Σ_checkpoints η_c ⟨∇ℓ(z), ∇ℓ(z')⟩ with exact gradient dot products,
  computed from the checkpoints (every layer unless the request says otherwise).
- ``tracin_last``: the same over the output layers only (ConvE: fc and the entity table's output role).
- ``tracin_adam``: TracIn with Adam's update direction (LESS, Xia et al. 2024), Σ_c η_c ⟨∇f(z), Γ_c(∇ℓ(z'))⟩ with
  Γ_c(g) = m̂/(√v̂ + ε) the step Adam would take on g alone from its state at checkpoint c (evaluations only; it
  needs the Adam state saved with each checkpoint, which the evaluations' models keep).
- ``tracin_projected``: TracIn-CP with each gradient projected to k dimensions (a seeded Kronecker-structured
  Gaussian projection): unbiased, approximate; a query scores against the features ``POST /featurize`` stored.
- ``trak``: TRAK (Park et al. 2023): projected gradients, a damped Gauss–Newton inverse per checkpoint, averaged
  over the checkpoints; a query scores against stored features, an evaluation computes it with its own settings
  (the margin output function, k=4096).
- ``trak_ensemble``: TRAK averaged over the full-data model and further models of the same recipe trained with
  other seeds (TRAK's model ensemble): an evaluation of the LDS trains them.
- ``graddot`` / ``gradcos``: baselines (evaluations only): ⟨∇(z), ∇ℓ(z')⟩ at the last checkpoint alone,
  unweighted, and the same divided by the two gradients' norms (cosine).
- ``random``: seeded Gaussian noise, the floor any estimator must beat (evaluations only).
- ``ekfac``: influence functions, ∇f(z)ᵀ(G + λI)⁻¹∇ℓ(z') with G the EK-FAC approximation of the Gauss–Newton
  Hessian at the trained weights, computed by Kronfluence (Grosse et al. 2023) over the model's ``nn.Linear`` and
  ``nn.Conv2d`` layers (classifiers only; an exported program's linear and convolution calls run as such layers).

The capabilities above (``query``, ``evaluated``, ``stored``) are those of knowledge-graph models (``POST /tracin``,
``POST /featurize``, ``POST /evaluate/*``). Classifiers (``POST /tracin/classifier``, their evaluations) have
their own: ``classifier_query`` (``POST /tracin/classifier`` answers with it) and ``classifier_evaluated`` (the
classifier evaluations can measure it), implemented in ``models.explain.classifier_estimators`` (tested to cover
exactly the names marked ``classifier_evaluated``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Estimator:
    name: str
    summary: str
    approximate: bool = False  # scores come from projected gradients
    stored: bool = False       # a query scores against the features POST /featurize stored
    query: bool = False        # POST /tracin answers with it
    evaluated: bool = True     # the evaluation kinds can measure it
    ensemble: bool = False     # averages over independently trained models of one recipe (LDS only)
    classifier_query: bool = False      # POST /tracin/classifier answers with it
    classifier_evaluated: bool = False  # the classifier evaluations can measure it
    default: bool = True       # among the evaluations' default estimators (when evaluated)


ESTIMATORS: dict[str, Estimator] = {e.name: e for e in (
    Estimator("tracin", "TracIn-CP from the checkpoints, exact gradient dot products", query=True,
              classifier_query=True, classifier_evaluated=True),
    Estimator("tracin_last", "TracIn-CP over the output layers only"),
    Estimator("tracin_adam", "TracIn with Adam's update direction on the training side, from the optimizer "
              "state saved with each checkpoint (evaluations only; 30-50x TracIn's time, so not among the "
              "evaluations' defaults)", default=False),
    Estimator("tracin_projected", "TracIn-CP with projected gradients (approximate), scored against the stored "
              "features", approximate=True, stored=True, query=True, evaluated=False, classifier_query=True,
              classifier_evaluated=True),
    Estimator("trak", "TRAK: projected gradients with a damped Gauss-Newton inverse per checkpoint, averaged "
              "over the checkpoints", approximate=True, stored=True, query=True, classifier_query=True,
              classifier_evaluated=True),
    Estimator("trak_ensemble", "TRAK averaged over independently trained models of the same recipe (LDS only)",
              approximate=True, ensemble=True, classifier_query=True, classifier_evaluated=True),
    Estimator("graddot", "GradDot: the gradient dot product at the last checkpoint alone (evaluations only)",
              classifier_evaluated=True),
    Estimator("gradcos", "GradCos: the gradients' cosine at the last checkpoint alone (evaluations only; its "
              "self-influence is 1 for every example)", classifier_evaluated=True),
    Estimator("random", "seeded Gaussian noise: the floor any estimator must beat", classifier_evaluated=True),
    Estimator("ekfac", "influence functions with EK-FAC curvature through Kronfluence, over the nn.Linear and "
              "nn.Conv2d layers at the trained weights (classifiers)", query=False,
              evaluated=False, classifier_query=True, classifier_evaluated=True),
)}

# An earlier name of ``tracin`` in POST /tracin, still read from stored requests and accepted from clients.
ALIASES = {"exact": "tracin"}


def names(*, query: bool | None = None, evaluated: bool | None = None, stored: bool | None = None,
          ensemble: bool | None = None, classifier_query: bool | None = None,
          classifier_evaluated: bool | None = None, default: bool | None = None) -> tuple[str, ...]:
    """The names of the estimators with the given capabilities (None: either), in registry order."""
    want = {"query": query, "evaluated": evaluated, "stored": stored, "ensemble": ensemble,
            "classifier_query": classifier_query, "classifier_evaluated": classifier_evaluated,
            "default": default}
    return tuple(n for n, e in ESTIMATORS.items()
                 if all(v is None or getattr(e, k) == v for k, v in want.items()))


def choices(**capabilities: bool | None) -> type:
    """A ``Literal`` of :func:`names` for a request field (the OpenAPI schema lists the choices)."""
    return Literal.__getitem__(names(**capabilities))  # type: ignore[attr-defined,return-value]


def canonical(value: object) -> object:
    """``value`` with an earlier name replaced by its registry name (a field validator's ``mode="before"``)."""
    return ALIASES.get(value, value) if isinstance(value, str) else value


def get(name: str) -> Estimator:
    try:
        return ESTIMATORS[canonical(name)]  # type: ignore[index]
    except KeyError:
        raise KeyError(f"unknown estimator {name!r}; choose from {list(ESTIMATORS)}") from None
