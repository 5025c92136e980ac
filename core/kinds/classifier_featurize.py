"""``POST /featurize/classifier``: store each training example's projected gradient features of a classifier
trained by the service (an exported program or a Hugging Face model), per checkpoint, so that later TRAK and
projected-TracIn queries (``POST /tracin/classifier`` with ``stored: true``) are one tiled pass over them. No torch
here.

The features (``models.explain.features``, the classifiers' side in ``models.explain.classifier_features``) are
kept in the file store under ``features/``, content-addressed by the checkpoint's weights, the architecture and
the settings; a repeated request computes nothing, and appended training examples or a new checkpoint compute only
what is new. ``loss`` ``margin`` stores TRAK's features (each checkpoint with its own projection, and each training
example's Q = 1 - p of its label at every checkpoint, so that a query runs no forward pass over the training set);
``train`` stores projected TracIn's. The features are
removed with the model version they belong to (``core.retention``). Only the model's owner may featurize it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from core import limits, registry
from core.contract.checks import require_model
from core.contract.errors import FieldConflict, FieldError
from core.contract.fields import ADVANCED, RequestModel
from core.contract.kind import JobKind, register
from core.contract.results.base import Artifact, ResultModel
from core.contract.results.provenance import PROVENANCE_DESCRIPTION, Provenance
from core.kinds.classifier_influence import MAX_PROJ_DIM
from core.kinds.featurize import FeaturizedCheckpoint
from core.kinds.train_classifier import (
    DATASET_KIND,
    HF_KIND,
    MODEL_KIND,
    TEXT_DATASET_KIND,
    dataset_counts,
)
from core.ownership import owns
from core.settings import Settings

SERVES = {"margin": ["trak"], "train": ["tracin_projected"]}


class ClassifierFeaturizeRequest(RequestModel):
    model: str = Field(..., min_length=1, max_length=limits.MAX_NAME_LENGTH, title="Classifier",
        description="An exported or Hugging Face classifier of yours trained by POST /train/classifier")
    dataset: str | None = Field(None, min_length=1, max_length=limits.MAX_PATH_LENGTH, title="Training data",
        description="The dataset whose training examples are featurized; by default the one the model was "
                    "trained on")
    loss: Literal["margin", "train"] = Field("margin", title="Gradient of",
        description="margin: the classification margin (TRAK's features, with each example's 1 - p); train: the "
                    "cross-entropy (projected TracIn's)")
    proj_dim: int = Field(2048, ge=16, le=MAX_PROJ_DIM, title="Projection size",
        description="Dimensions each gradient is projected to; queries must name the same")
    seed: int = Field(0, ge=0, le=limits.MAX_SEED, title="Projection seed", json_schema_extra=ADVANCED,
        description="Seed of the random projection; queries must name the same one")
    checkpoints: Literal["all", "last"] = Field("all", title="Checkpoints featurized", json_schema_extra=ADVANCED,
        description="Every kept checkpoint, or the last one only; queries must name the same")
    max_length: int = Field(128, ge=2, le=4096, title="Tokens per text", json_schema_extra=ADVANCED,
        description="Hugging Face classifiers: each text is cut to this many tokens, as fine-tuning cut it")
    batch_size: int | None = Field(None, ge=1, le=4096, title="Examples per pass", json_schema_extra=ADVANCED,
        description="Training examples whose gradients are held at once; by default as many as fit 256 MiB")


class ClassifierFeaturizeResult(ResultModel):
    """What a classifier featurize job stored, and the estimators that now answer ``POST /tracin/classifier`` with
    ``stored: true`` from it (the same checkpoints, proj_dim and seed)."""

    model: str
    dataset: str
    format: str
    layers: list[str] = Field(description="the parameters whose gradients are projected (every one)")
    loss: str
    proj_dim: int
    seed: int
    n_train: int
    checkpoints: list[FeaturizedCheckpoint]
    rows_computed: int
    serves: list[str] = Field(description="the estimators a query can score against these features")
    seconds: float
    examples_per_second: float | None = Field(None, description="training examples featurized per second (all "
                                              "checkpoints), None when nothing was computed")
    artifacts: list[Artifact] = Field(default_factory=list)
    provenance: Provenance | None = Field(None, description=PROVENANCE_DESCRIPTION)


def validate(req: ClassifierFeaturizeRequest, settings: Settings, owner: str = "system") -> None:
    from core.kinds.classifier_influence import training_dataset

    entry = require_model(settings, req.model, MODEL_KIND, kind_label="an exported classifier", also=(HF_KIND,))
    if not (owns(entry, owner) or owns(entry, registry.SYSTEM)):
        raise FieldConflict(("body", "model"), f"model {req.model!r} belongs to another owner; only its owner may "
                            "featurize it", value=req.model)
    if not (entry.get("meta") or {}).get("checkpoints"):
        raise FieldError(("body", "model"), f"model {req.model!r} has no training checkpoints; the features are "
                         "stored per checkpoint POST /train/classifier keeps", value=req.model)
    name = training_dataset(req, entry)  # type: ignore[arg-type]
    dataset_counts(settings, name, owner, entry["kind"])


register(JobKind(
    name="classifier_featurize",
    route="/featurize/classifier",
    request=ClassifierFeaturizeRequest,
    queue="bulk",
    func="workers.jobs.classifier_featurize:run",
    timeout_s=4 * 3600,
    result_ttl_s=7 * 24 * 3600,
    summary="Store the projected gradient features of a classifier's training examples",
    title="Gradient features (classifier)",
    pickers={"model": ("models", (MODEL_KIND, HF_KIND)), "dataset": ("datasets", (DATASET_KIND, TEXT_DATASET_KIND))},
    result=ClassifierFeaturizeResult,
    validate=validate,
))
