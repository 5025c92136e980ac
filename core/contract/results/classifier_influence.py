"""The ``classifier_influence`` renderer's result: TracIn-CP on a classifier the service trained
(``POST /tracin/classifier``): per test example its proponents and opponents, or the self-influence ranking."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from core import estimators
from core.contract.results.base import Artifact, ResultModel
from core.contract.results.provenance import PROVENANCE_DESCRIPTION, Provenance

TEXT_SHOWN = 500  # characters of a training text listed with its influence
PREVIEW_MAX = 28  # an image example's preview: at most this many cells a side


class ClassifierCheckpoint(ResultModel):
    """A checkpoint of a trained classifier: its file in the model directory, its epoch and learning rate."""

    file: str
    epoch: int
    lr: float


class InfluenceExample(ResultModel):
    """A training example: its position in the split, its label, its influence (or self-influence), and for a text
    dataset its text (the first 500 characters), for an image its preview (the channels' mean, at most 28x28 cells,
    row by row)."""

    index: int
    label: str
    score: float
    self_influence: float | None = None
    text: str | None = None
    preview: list[list[float]] | None = None


class TestInfluence(ResultModel):
    """One test example: the class traced, the predicted class, its own self-influence, its strongest proponents and
    opponents, and how many training examples had a positive or negative influence."""

    id: str
    target: str
    predicted: str
    label: str | None = None
    self_influence: float | None = Field(description="tracin: the test example's own TracIn score; trak: None")
    n_positive: int
    n_negative: int
    proponents: list[InfluenceExample]
    opponents: list[InfluenceExample]
    text: str | None = Field(None, description="a text's own words (the request's text or the dataset's)")
    preview: list[list[float]] | None = Field(None, description="an image's preview, as its examples'")


class ClassifierInfluenceResult(ResultModel):
    """``POST /tracin/classifier``: per test example (mode ``test``) or the top of the self-influence ranking
    (mode ``self``), with the checkpoints summed and the training examples ranked."""

    model: str
    dataset: str
    mode: Literal["test", "self"]
    estimator: estimators.choices(classifier_query=True) = "tracin"  # type: ignore[valid-type]
    output: Literal["cross_entropy", "margin"] = Field(
        "cross_entropy", description="what the test side differentiates: the training loss (cross-entropy) or the "
        "classification margin log(p / (1 - p)) of the example's class (negated for tracin and ekfac, so that a "
        "positive score helps the prediction); the training side is the loss, for trak the margin")
    proj_dim: int | None = Field(None, description="trak, trak_ensemble, tracin_projected: the projection's "
                                 "dimensions")
    projection: Literal["kronecker", "dense"] | None = Field(
        None, description="trak, trak_ensemble, tracin_projected computed directly: the random projection's kind")
    damping: float | None = Field(None, description="trak: the damping relative to the mean eigenvalue; ekfac: "
                                  "Kronfluence's damping_factor (None: its heuristic)")
    ensemble: list[str] | None = Field(None, description="trak_ensemble: the other models averaged with this one")
    layers: list[str] | None = Field(None, description="ekfac: the layers Kronfluence covered (their parameters "
                                     "are the ones the scores differentiate)")
    factorised: list[str] | None = Field(None, description="tracin with method ghost: the linear layers whose "
                                         "gradient dot products were factorised")
    stored: bool = Field(False, description="scored against the features POST /featurize/classifier stored")
    parameters: int = Field(description="the parameters differentiated (all of the program's)")
    train_examples: int
    checkpoints: list[ClassifierCheckpoint]
    tests: list[TestInfluence] | None = None
    self_influence: list[InfluenceExample] | None = Field(
        None, description="mode self: the top_k training examples by self-influence, highest first")
    labels: list[str]
    seconds: float
    warnings: list[str] = Field(default_factory=list)
    artifacts: list[Artifact] = Field(default_factory=list)
    provenance: Provenance | None = Field(None, description=PROVENANCE_DESCRIPTION)


