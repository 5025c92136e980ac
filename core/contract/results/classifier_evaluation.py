"""The results of the classifier evaluations: :class:`ClassifierLdsResult` (``POST /evaluate/classifier/
attribution``) and :class:`ClassifierMislabelResult` (``POST /evaluate/classifier/mislabel``), every field typed
(the maths that fills them: ``models/export/evaluation.py``, ``lds_report`` and ``mislabel_report``, over
``models/kg/evaluation.py``'s statistics). An LDS evaluation has one shape whether it ran whole (every model
stored) or fanned out: only ``trainings``, ``ground_truth.trainings``/``reused``, the estimators' ``seconds`` and
``shards`` differ.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from core import estimators as registry
from core.contract.results.base import Artifact, ResultModel, Shards
from core.contract.results.evaluation import (
    EstimatorTiming,
    GroundTruth,
    Interval,
    MeanInterval,
    NoiseCeiling,
    RatioInterval,
    RecallCurve,
)
from core.contract.results.provenance import PROVENANCE_DESCRIPTION, Provenance

ClassifierEstimatorName = registry.choices(classifier_evaluated=True)


class ClassifierRecipeEcho(ResultModel):
    """The recipe every model was trained with (the request's)."""

    epochs: int
    batch_size: int
    optimizer: Literal["sgd", "adam", "adamw"]
    lr: float
    momentum: float
    weight_decay: float
    checkpoint_every: int
    max_length: int
    seed: int


class ClassifierCheckpointRef(ResultModel):
    epoch: int
    lr: float


class ClassifierModelRef(ResultModel):
    """A stored model: its store address (``cache/evaluation/models/<key>/``), training seed, accuracy per split
    and checkpoints."""

    key: str
    seed: int
    accuracy: dict[str, float | None]
    checkpoints: list[ClassifierCheckpointRef]


class ClassifierEvaluationResult(ResultModel):
    metric: Literal["lds", "mislabel"]
    model: str
    model_version: str = Field(description="a digest of the program and its spec the models start from")
    dataset: str
    data_version: str = Field(description="a digest of the dataset's splits")
    recipe: ClassifierRecipeEcho
    seed: int
    n_train: int
    trainings: int = Field(description="the models this job (and its shards) trained; 0 when all were stored")
    artifacts: list[Artifact] = Field(default_factory=list)
    provenance: Provenance | None = Field(None, description=PROVENANCE_DESCRIPTION)


class ClassifierLdsEstimator(EstimatorTiming):
    """One estimator's LDS: per test example (Spearman over the subset models; None where undefined), its mean
    with a percentile bootstrap interval, its ratio to TracIn's (paired bootstrap; None for TracIn itself or when
    TracIn is not measured), the test-side output it traced."""

    lds: MeanInterval
    per_test: list[float | None]
    n_undefined: int
    ratio_to_tracin: RatioInterval | None = None
    output: Literal["margin", "loss"] | None = None


class ClassifierEnsemble(ResultModel):
    members: int
    seeds: list[int]
    models: list[str]


class ClassifierLdsResult(ClassifierEvaluationResult):
    """``m`` subset models on seeded ``alpha``-subsets, their margins ``log p / (1 - p)`` of the true class on
    ``n_test`` test examples (``test_index``: positions in the test split), and each estimator's LDS on them."""

    metric: Literal["lds"]
    m: int
    alpha: float
    design: int
    seeds: list[int]
    train_seeds: list[int]
    replicate_seeds: list[int] | None = None
    subset_size: int
    n_test: int
    test_index: list[int]
    output: str
    ground_truth: GroundTruth
    noise_ceiling: NoiseCeiling | None
    ensemble: ClassifierEnsemble
    full_model: ClassifierModelRef
    estimators: dict[ClassifierEstimatorName, ClassifierLdsEstimator]  # type: ignore[valid-type]
    shards: Shards | None = None
    warnings: list[str] = Field(default_factory=list, description="an 'underpowered' warning per estimator whose "
                                "ratio to TracIn has an interval wider than 1")


class AucInterval(Interval):
    """The ROC AUC of a self-influence ranking with a stratified percentile bootstrap over the training examples
    (``positives``: the flipped ones)."""

    auc: float
    positives: int
    n_resamples: int | None = None


class ClassifierMislabelEstimator(EstimatorTiming):
    auc_interval: AucInterval
    found_at_10: float
    found_at_20: float
    recall_curve: RecallCurve


class ClassifierMislabelResult(ClassifierEvaluationResult):
    """A ``fraction`` of the training labels flipped (``flipped``: their indices), the recipe trained on them, each
    estimator's self-influence ranking scored by ROC AUC."""

    metric: Literal["mislabel"]
    fraction: float
    n_flipped: int
    flipped: list[int]
    mislabel_model: ClassifierModelRef
    estimators: dict[ClassifierEstimatorName, ClassifierMislabelEstimator]  # type: ignore[valid-type]
