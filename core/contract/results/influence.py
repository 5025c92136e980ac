"""The ``influence`` renderer's result: TracIn and TRAK over a knowledge-graph model."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from core.contract.results.base import Artifact, Listed, ResultModel, Shards, Triple
from core.contract.results.provenance import PROVENANCE_DESCRIPTION, Provenance


class Prediction(ResultModel):
    """The model's own prediction of a test triple: the tail's logit, its filtered rank among ``n_entities``, and
    the dataset's splits that hold the triple."""

    score: float | None
    rank: float | None
    n_entities: int
    splits: list[str]


class ScoreBreakdown(ResultModel):
    """Where a listed influence comes from (exact TracIn, ``top_k`` set): ``checkpoints``, each checkpoint's term
    η_c ⟨∇ℓ_c(z), ∇ℓ_c(z')⟩ in the order of the result's ``checkpoints``; ``layers``, per layer group (entity
    table, relation table, convolution and batch norm, fully connected, entity bias: those the request's
    ``layers`` hold) the gradient dot product over its parameters, summed over the checkpoints. Each adds up to
    ``influence`` (to float rounding)."""

    checkpoints: list[float]
    layers: dict[str, float]


class InfluencePair(ResultModel):
    """A training triple's influence on one test triple (and its own self-influence under the same estimator).
    ``is_test_triple``: the training triple is the test triple itself (an exact duplicate of it in the training
    data); ``is_reverse``: it is the test triple's reverse (tail, relation, head), which a model that learnt the
    relation's symmetry draws on; either explains a high score without saying much about other facts."""

    train_triple: Triple
    influence: float | None
    train_self_influence: float | None = None
    is_test_triple: bool = False
    is_reverse: bool = False
    breakdown: ScoreBreakdown | None = None


class TestEntry(ResultModel):
    """One test triple: its candidates' counts, its strongest proponents and opponents (mode ``test``) or every
    given pair (mode ``single``), and the model's own prediction."""

    test_triple: Triple
    self_influence: float | None
    n_candidates: int
    n_positive: int | None = None
    n_negative: int | None = None
    proponents: list[InfluencePair] | None = None
    opponents: list[InfluencePair] | None = None
    pairs: list[InfluencePair] | None = None
    truncated: bool = False  # a list holds top_k of more candidates of its sign
    prediction: Prediction | None = None
    in_train: bool | None = None


class TopPair(ResultModel):
    """One of the strongest (test, training) pairs over every test triple."""

    test_triple: Triple
    train_triple: Triple
    influence: float | None
    train_self_influence: float | None = None


class SelfInfluence(ResultModel):
    train_triple: Triple
    self_influence: float | None


class CheckpointWeight(ResultModel):
    """A checkpoint summed over and its weight (TracIn: the learning rate, by ``lr_weight``; TRAK: equal)."""

    name: str
    epoch: int | None = None
    lr: float | None = None
    weight: float


class CandidateFilter(ResultModel):
    n_hops: int
    min_degree: int
    preserve_test_entities: bool


class ScoresMatrix(ResultModel):
    """Every score, in a ``.npy`` artifact (``top_k: null``): ``rows`` and ``columns`` say what indexes it."""

    artifact: str
    shape: list[int]
    rows: str
    columns: str


class Unscored(ResultModel):
    """What failed shards left unscored: their indices, how many candidates, the first 1,000 of them."""

    shards: list[int] = Field(default_factory=list)
    candidates: int = 0
    triples: list[Triple] = Field(default_factory=list)


class RunConfiguration(ResultModel):
    """What a stored-feature estimator ran (``ran``: checkpoints, layers, loss, projection_dim, damping, seed,
    projection) and, for ``trak``, the configuration ``models.kg.trak_config.trak_configuration`` says the
    evaluations measure (``evaluated``) and whether the two are equal (``matches_evaluated``). A featurize result
    uses it for the features it stored: the same fields without the damping, which a query applies
    (``models.kg.trak_config.stored_configuration``)."""

    ran: dict[str, Any]
    evaluated: dict[str, Any] | None
    matches_evaluated: bool | None


class InfluenceResult(ResultModel):
    """TracIn-CP or TRAK influence of training triples on a ConvE model's predictions (``POST /tracin``).

    Mode ``test``: per test triple its strongest proponents and opponents (``results``) and the strongest pairs
    over all (``top_proponents``, ``top_opponents``); mode ``self``: every candidate's self-influence, ranked
    (``ranking``); mode ``single``: every given (test, training) pair (``results[].pairs``).
    """

    model: str
    mode: Literal["test", "self", "single"]
    estimator: str = Field(description="the estimator's name in the one registry (core.estimators)")
    approximate: bool = Field(description="scores come from projected gradients (an estimate of exact TracIn)")
    top_k: int | None
    checkpoints: list[CheckpointWeight]
    lr_weight: str | None = None
    layers: list[str]
    loss: str
    projection_dim: int | None = None
    projection: str | None = Field(None, description="the random projection of the stored features: 'kronecker' "
                                   "(models.explain.trak) or 'dense'; None without one")
    configuration: RunConfiguration | None = Field(
        None, description="the stored-feature estimators' configuration as run, and for 'trak' the one the "
        "attribution-quality evaluations measured and whether they match (None for the other estimators)")
    seed: int | None = None
    damping: float | None = None
    precision: str | None = None
    requested_precision: str | None = None
    method: str | None = None
    filter: CandidateFilter | None = None
    warnings: list[str] = Field(default_factory=list)
    n_test: int = Field(description="test triples explained (0 in mode self)")
    n_candidates: int = Field(description="candidate training triples scored")
    results: list[TestEntry] = Field(default_factory=list)
    ranking: list[SelfInfluence] = Field(default_factory=list)
    top_proponents: list[TopPair] = Field(default_factory=list)
    top_opponents: list[TopPair] = Field(default_factory=list)
    listed: dict[str, Listed] = Field(default_factory=dict)
    scores: ScoresMatrix | None = None
    notes: list[str] = Field(default_factory=list, description="what the result leaves out, and where it is")
    failed: Unscored | None = None
    shards: Shards | None = None
    seconds: float
    artifacts: list[Artifact] = Field(default_factory=list)
    provenance: Provenance | None = Field(None, description=PROVENANCE_DESCRIPTION)
