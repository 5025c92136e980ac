"""The ``evaluation`` renderer's results: how good data-attribution estimators are.

:class:`EvaluationResult` is what both evaluations share; :class:`LdsResult` (``POST /evaluate/attribution``) and
:class:`MislabelResult` (``POST /evaluate/mislabel``) are the complete results, every field typed (the maths that
fills them: ``models/kg/evaluation.py``, ``lds_report`` and ``mislabel_report``). An LDS evaluation has one shape
whether it ran whole (its ground truth was stored) or fanned out (its reduce step computed it): only
``trainings``, ``ground_truth.trainings``/``reused``, the estimators' ``seconds``, ``shards`` and the size of
``result.json`` differ.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from core import estimators as registry
from core.contract.results.base import Artifact, RankMetrics, ResultModel, Shards, Triple
from core.contract.results.provenance import PROVENANCE_DESCRIPTION, Provenance

# the estimators an evaluation measures (core/estimators.py), the keys of ``estimators``
LdsEstimatorName = registry.choices(evaluated=True)
MislabelEstimatorName = registry.choices(evaluated=True, ensemble=False)


class EvaluationRecipe(ResultModel):
    """The training recipe every model of the evaluation was trained with, as the request gave it with its
    defaults (``core.kinds.evaluate.Recipe``; a test keeps the two field lists equal)."""

    epochs: int
    batch_size: int
    lr: float
    lr_decay: float
    weight_decay: float
    label_smoothing: float
    embedding_dim: int
    embedding_height: int | None
    num_filters: int
    input_dropout: float
    feature_dropout: float
    hidden_dropout: float
    reciprocal: bool
    checkpoint_every: int
    seed: int


class SplitMetrics(ResultModel):
    """A trained model's metrics on the dataset's validation and test splits (None: the split is empty)."""

    valid: RankMetrics | None = None
    test: RankMetrics | None = None


class EstimatorTiming(ResultModel):
    """What every estimator's entry has: the seconds it took (timing: differs from run to run)."""

    seconds: float


class EvaluationResult(ResultModel):
    """What both evaluations' results share: the data, the recipe, how many models this job trained and each
    estimator's numbers under ``estimators`` (their fields: :class:`LdsResult`, :class:`MislabelResult`)."""

    metric: Literal["lds", "mislabel"]
    dataset: str
    data_version: str  # a digest of the dataset's triples (models.kg.evaluation.data_version)
    recipe: EvaluationRecipe
    seed: int
    n_train: int
    trainings: int  # the models this job (and its shards) trained; 0 when everything was stored
    estimators: dict[str, EstimatorTiming]
    artifacts: list[Artifact] = Field(default_factory=list)
    provenance: Provenance | None = Field(None, description=PROVENANCE_DESCRIPTION)


# ------------------------------------------------------------------------------------------------ LDS
class Interval(ResultModel):
    """A seeded percentile bootstrap interval ``[low, high]`` over ``n`` test triples (None where none is
    defined)."""

    low: float | None
    high: float | None
    n: int
    confidence: float
    n_resamples: int
    seed: int


class MeanInterval(Interval):
    """A mean over test triples with its interval (``mean_interval``)."""

    mean: float | None


class RatioInterval(Interval):
    """mean(estimator's LDS) / mean(reference's LDS) over the test triples where both are defined, with a paired
    bootstrap interval (``ratio_interval``)."""

    ratio: float | None


class LdsEstimator(EstimatorTiming):
    """One estimator's LDS: per test triple (None: undefined, a constant prediction or output), its mean and
    interval, and, when TracIn was measured too, its ratio to TracIn's (None for TracIn itself, or without it)."""

    lds: MeanInterval
    per_test: list[float | None]
    n_undefined: int
    ratio_to_tracin: RatioInterval | None = None
    # the test-side output its scores used: "margin" (what the LDS measures) or "loss"; None for one without (random)
    output: Literal["margin", "loss"] | None = None


class GroundTruth(ResultModel):
    """The stored ground truth the LDS was measured on: its address (``cache/evaluation/lds/<key>/``), the
    full-data model's, and how many of the models it needs this job trained or found stored."""

    key: str
    full_model: str
    trainings: int
    reused: int


class NoiseCeiling(ResultModel):
    """How well each subset model and its replicate (same subset, another seed) agree: Spearman per test triple,
    its mean and interval, and the ceiling no estimator's LDS can be expected to pass."""

    agreement: MeanInterval
    ceiling: float | None
    per_test: list[float | None]


class Ensemble(ResultModel):
    """The further full-data models (the recipe with other seeds) the ensemble estimators averaged over (none
    when no ensemble estimator was asked for): their seeds and their addresses."""

    members: int
    seeds: list[int]
    models: list[str]


class CheckpointRef(ResultModel):
    name: str
    epoch: int
    lr: float


class FullModel(ResultModel):
    """The full-data model the estimators ran on: its training seed (``models.kg.evaluation.full_model_seed`` of
    the evaluation's seed and the recipe's), its metrics and the checkpoints they used."""

    seed: int
    metrics: SplitMetrics
    checkpoints: list[CheckpointRef]


class LdsResult(EvaluationResult):
    """The linear datamodeling score of each estimator (``POST /evaluate/attribution``), from ``m`` models
    trained on random ``alpha``-subsets of the training triples, on ``n_test`` test triples."""

    metric: Literal["lds"]
    m: int
    alpha: float
    design: int  # the version of how every seed is derived from ``seed`` (models.kg.evaluation.LDS_DESIGN)
    seeds: list[int]  # the subset models' mask seeds (subset i: seeds[i])
    train_seeds: list[int]  # the subset models' training seeds
    replicate_seeds: list[int] | None = None  # the training seeds of their replicates (with ``replicates``)
    subset_size: int
    n_test: int
    test_triples: list[Triple]
    output: str  # what a model's output on a test triple is (the quantity the LDS correlates)
    ground_truth: GroundTruth
    noise_ceiling: NoiseCeiling | None  # None unless the request asked for ``replicates``
    ensemble: Ensemble
    full_model: FullModel
    estimators: dict[LdsEstimatorName, LdsEstimator]  # type: ignore[valid-type]
    shards: Shards | None = None  # None: it ran whole (its ground truth was stored)
    underpowered_width: float | None = Field(
        None, description="the widest interval of an estimator's ratio to TracIn that is not underpowered "
        "(models.kg.evaluation.UNDERPOWERED_RATIO_WIDTH); None in results written before it existed")
    warnings: list[str] = Field(default_factory=list, description="an 'underpowered' warning per estimator whose "
                                "ratio interval to TracIn is wider than underpowered_width")


# ------------------------------------------------------------------------------------------------ mislabel
class RecallCurve(ResultModel):
    """The fraction of the corrupted triples ``found`` after inspecting the top ``inspected`` fraction of all
    training triples by self-influence."""

    inspected: list[float]
    found: list[float]


class Suspect(ResultModel):
    """A training triple of an estimator's self-influence ranking (highest first, ties in training order: the
    order its recall curve inspects them in): ``triple`` as the model was trained on it (a corrupted triple with
    its replaced tail), and, when it was one of the corrupted ones, the tail it had before."""

    rank: int  # 1: the highest self-influence
    train_index: int
    triple: Triple
    self_influence: float
    corrupted: bool
    original_tail: str | None = None  # None: not corrupted


class MislabelEstimator(EstimatorTiming):
    """One estimator's mislabel detection: ROC AUC of its self-influence ranking (``auc_interval``: a stratified
    percentile bootstrap over the training triples, ``n`` of them; None in results written before it existed),
    the corrupted triples found in the top 10 % and 20 %, the recall curve, and the top of its ranking
    (``suspects``: the first ``suspects_listed`` of the result; the whole ranking is ``suspects.csv``; empty in
    results written before it existed)."""

    auc: float
    auc_interval: Interval | None = None
    found_at_10: float
    found_at_20: float
    recall_curve: RecallCurve
    suspects: list[Suspect] = Field(default_factory=list)


class CorruptedTriple(ResultModel):
    train_index: int
    original: Triple
    corrupted: Triple


class ModelRef(ResultModel):
    key: str  # the model of the corrupted graph: cache/evaluation/models/<key>/


class MislabelResult(EvaluationResult):
    """Mislabel detection (``POST /evaluate/mislabel``): a ``fraction`` of the training triples' tails corrupted,
    one model trained, the training triples ranked by each estimator's self-influence. ``corrupted`` lists the
    first ``corrupted_listed`` of the ``n_corrupted`` triples (all of them: ``corrupted.tsv``); each estimator's
    ``suspects`` the top ``suspects_listed`` of its ranking (every training triple of every ranking:
    ``suspects.csv``)."""

    metric: Literal["mislabel"]
    fraction: float
    n_corrupted: int
    corrupted: list[CorruptedTriple]
    corrupted_listed: int
    model: ModelRef
    model_metrics: SplitMetrics
    suspects_listed: int | None = Field(None, description="how many training triples each estimator's suspects "
                                        "list (the top of its ranking); None in results written before it existed")
    estimators: dict[MislabelEstimatorName, MislabelEstimator]  # type: ignore[valid-type]
