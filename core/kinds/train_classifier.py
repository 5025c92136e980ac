"""``POST /train/classifier``: train an exported classifier from its own weights on a ``tensors`` dataset and
register the result with its checkpoints (no torch here).

The model is a registered ``exported_classifier`` (its architecture and initial weights); the dataset a registered
``tensor_classification`` dataset (or a directory under the data roots holding ``train.safetensors``) whose inputs
have the model's per-example shape. The job trains the program's parameters through the service's interpreter
(``models.export.train``), keeps a checkpoint every ``checkpoint_every`` epochs with its learning rate, and
registers the trained program under ``name`` as an ``exported_classifier``.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field

from core import dataset_refs, limits, registry
from core.contract.charts import STEPS_CHART
from core.contract.checks import refuse_reserved, require_model, require_new_name
from core.contract.errors import FieldError
from core.contract.fields import ADVANCED, JobRequest
from core.contract.kind import JobKind, register
from core.contract.results.base import ResultModel
from core.contract.results.training import TrainingResult
from core.dataset_formats import FormatError, tensor_splits
from core.memory import gib
from core.settings import Settings
from core.userfiles import UserFiles

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
MODEL_KIND = "exported_classifier"
DATASET_KIND = "tensor_classification"
BYTES_PER_VALUE = 8  # a split is read whole (its bytes, up to 4 per value) and kept as float32 (4 per value)
MAX_EXAMPLE_STEPS = 10**9  # examples x epochs one job may train on (a 2-core CPU does ~1e5 digit examples/s)


class TrainClassifierRequest(JobRequest):
    name: str = Field(..., max_length=limits.MAX_NAME_LENGTH, pattern=NAME_PATTERN, title="Model name",
        description="Name to register the trained model under")
    model: str = Field(..., min_length=1, max_length=limits.MAX_NAME_LENGTH, title="Model to train",
        description="A registered exported classifier: its program and its weights are where training starts")
    dataset: str = Field(..., min_length=1, max_length=limits.MAX_PATH_LENGTH, title="Training data",
        description=("A registered tensors dataset (train.safetensors with inputs and labels; valid.safetensors "
                     "is scored every epoch), or such a directory under the data roots"))
    epochs: int = Field(5, ge=1, le=limits.MAX_EPOCHS, title="Training epochs",
        description="Passes over the training examples")
    batch_size: int = Field(64, ge=1, le=limits.MAX_TRAIN_BATCH_SIZE, title="Examples per batch",
        json_schema_extra=ADVANCED, description="Training examples per optimizer step")
    optimizer: Literal["sgd", "adam"] = Field("sgd", title="Update rule",
        description="SGD with momentum, or Adam")
    lr: float = Field(0.05, gt=0, le=10, title="Learning rate", description="The optimizer's learning rate")
    momentum: float = Field(0.9, ge=0, lt=1, title="SGD momentum", json_schema_extra=ADVANCED,
        description="SGD's momentum (not used by Adam)")
    weight_decay: float = Field(0.0, ge=0, le=1, title="L2 weight decay", json_schema_extra=ADVANCED,
        description="The optimizer's L2 penalty on the weights")
    checkpoint_every: int = Field(1, ge=1, le=limits.MAX_EPOCHS, title="Checkpoint interval",
        json_schema_extra=ADVANCED, description="Keep a checkpoint (for data attribution) every this many epochs")
    seed: int = Field(0, ge=0, le=limits.MAX_SEED, title="Random seed", json_schema_extra=ADVANCED,
        description="Seed of the data order")
    overwrite: bool = Field(False, title="Replace my model",
        description="Replace your existing model of the same name")


class ClassifierCheckpoint(ResultModel):
    """A checkpoint of the trained classifier: its archive in the model directory, its epoch and learning rate."""

    file: str
    epoch: int
    lr: float


class TrainClassifierResult(TrainingResult):
    """``POST /train/classifier``: the registered model, its accuracy per split, the checkpoints kept, and the
    history (``epoch``, ``loss``, ``lr``, ``train_accuracy``, ``valid_accuracy`` when the dataset has a valid
    split)."""

    model: str = Field(description="the name the model is registered under")
    started_from: str = Field(description="the model whose weights training started from")
    parameters: int
    examples: dict[str, int] = Field(description="examples per split of the dataset")
    accuracy: dict[str, float | None] = Field(description="the trained model's accuracy per split")
    checkpoints: list[ClassifierCheckpoint]
    seconds: float


def dataset_counts(settings: Settings, req: TrainClassifierRequest, owner: str) -> dict[str, Any]:
    """The dataset's splits and per-example shape, from the registry or (a directory) its headers."""
    ref = dataset_refs.resolve(settings, req.dataset, owner, DATASET_KIND, kind_label="a tensors dataset")
    if ref.entry is not None:
        counts = (ref.entry.get("meta") or {}).get("counts")
        if isinstance(counts, dict) and "train" in counts:
            return counts
        path = registry.absolute_path(settings, ref.entry)
    else:
        path = ref.path
    try:
        counts = tensor_splits(path, UserFiles(settings))
    except FormatError as exc:
        raise FieldError(("body", "dataset"), str(exc), value=req.dataset) from None
    if "train" not in counts:
        raise FieldError(("body", "dataset"), "the dataset has no train.safetensors", value=req.dataset)
    return counts


def validate(req: TrainClassifierRequest, settings: Settings, owner: str = "system") -> None:
    refuse_reserved(req.name, owner, "name")
    entry = require_model(settings, req.model, MODEL_KIND, kind_label="an exported classifier")
    counts = dataset_counts(settings, req, owner)
    spec = (entry.get("meta") or {}).get("spec") or {}
    shape = (spec.get("input") or {}).get("shape")
    if isinstance(shape, list) and counts.get("input_shape") is not None and counts["input_shape"] != shape[1:]:
        raise FieldError(("body", "dataset"), f"the dataset's inputs are {counts['input_shape']} per example; model "
                         f"{req.model!r} takes {shape[1:]}", value=req.dataset)
    values = sum(int(counts.get(split) or 0) for split in ("train", "valid", "test")) \
        * math.prod(counts.get("input_shape") or [1])
    need = values * BYTES_PER_VALUE
    budget = settings.worker_memory_bytes
    if budget and need > budget:
        raise FieldError(("body", "dataset"), f"the dataset's {values:,} input values would need about {gib(need)} of "
                         f"worker memory to train on, more than the {gib(budget)} a worker offers "
                         "(EXPLAINQ_WORKER_MEMORY_BYTES)", value=req.dataset)
    if counts["train"] * req.epochs > MAX_EXAMPLE_STEPS:
        raise FieldError(("body", "epochs"), f"{counts['train']:,} examples x {req.epochs} epochs is more than "
                         f"{MAX_EXAMPLE_STEPS:,} example steps for one job", value=req.epochs)
    require_new_name(settings, req.name, owner, MODEL_KIND, req.overwrite)


register(JobKind(
    name="train_classifier",
    route="/train/classifier",
    request=TrainClassifierRequest,
    queue="train",
    func="workers.jobs.train_classifier:run",
    timeout_s=12 * 3600,
    result_ttl_s=30 * 24 * 3600,
    summary=("Train an exported classifier from its own weights on a tensors dataset (SGD or Adam, seeded, with "
             "checkpoints) and register it"),
    title="Train a classifier",
    renderer="training",
    charts=(STEPS_CHART,),
    pickers={"model": ("models", MODEL_KIND), "dataset": ("datasets", DATASET_KIND)},
    result=TrainClassifierResult,
    validate=validate,
))
