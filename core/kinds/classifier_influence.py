"""``POST /tracin/classifier``: TracIn-CP on a classifier trained by the service: the training examples that
pushed a test prediction's loss down (proponents) or up (opponents), or the training examples ranked by
self-influence (suspected mislabels). No torch here.

The model is an ``exported_classifier`` with the checkpoints ``POST /train/classifier`` kept (``meta.checkpoints``);
the training data is the ``tensor_classification`` dataset it was trained on (``meta.dataset``) unless
``dataset`` names another of the same shape. Test examples (mode ``test``) are ``inputs`` (values, and the class
whose loss is traced: ``target``, by default the predicted class) or ``test_indices`` of a split of that dataset
(their own labels). The estimator is exact TracIn-CP over every parameter (``models.export.influence``):
Σ_checkpoints lr · ⟨∇ℓ(test), ∇ℓ(train)⟩, with ℓ the training loss (cross-entropy).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from core import limits
from core.contract.checks import require_model
from core.contract.errors import FieldError
from core.contract.fields import ADVANCED, JobRequest
from core.contract.kind import JobKind, register
from core.contract.results.base import Artifact, ResultModel
from core.kinds.attributions import TensorIn, _check_target, class_names, model_spec, values_problem
from core.kinds.train_classifier import DATASET_KIND, MODEL_KIND, ClassifierCheckpoint, dataset_counts
from core.memory import gib
from core.settings import Settings

MAX_TESTS = 64
MAX_TOP_K = 1000
BYTES_PER_GRADIENT_VALUE = 12  # a chunk's per-example gradients (fp32), the test side's, and the products


class ClassifierInfluenceRequest(JobRequest):
    model: str = Field(..., min_length=1, max_length=limits.MAX_NAME_LENGTH, title="Classifier",
        description="An exported classifier trained by the service (POST /train/classifier keeps its checkpoints)")
    dataset: str | None = Field(None, min_length=1, max_length=limits.MAX_PATH_LENGTH, title="Training data",
        description="The tensors dataset whose training examples are ranked; by default the one the model was "
                    "trained on")
    mode: Literal["test", "self"] = Field("test", title="What to compute",
        description="test: each test example's proponents and opponents; self: the training examples ranked by "
                    "self-influence (suspected mislabels first)")
    inputs: list[TensorIn] | None = Field(None, max_length=MAX_TESTS, title="Test inputs",
        description="Mode test: inputs in the model's per-example shape; target is the class whose loss is "
                    "traced (by default the predicted class)")
    test_indices: list[int] | None = Field(None, min_length=1, max_length=MAX_TESTS, title="Test examples",
        description="Mode test, instead of inputs: positions in the dataset's test_split, with their own labels")
    test_split: Literal["train", "valid", "test"] = Field("test", title="Split of test_indices",
        json_schema_extra=ADVANCED, description="The dataset split test_indices point into")
    top_k: int = Field(10, ge=1, le=MAX_TOP_K, title="Examples listed",
        description="Proponents and opponents per test example, or training examples in the self ranking (the full "
                    "self ranking is the artifact self_influence.csv)")
    checkpoints: Literal["all", "last"] = Field("all", title="Checkpoints", json_schema_extra=ADVANCED,
        description="Sum over every kept checkpoint (TracIn-CP), or the last one only")
    batch_size: int = Field(256, ge=1, le=4096, title="Examples per chunk", json_schema_extra=ADVANCED,
        description="Training examples whose gradients are held at once")


class InfluenceExample(ResultModel):
    """A training example: its position in the split, its label, its influence (or self-influence)."""

    index: int
    label: str
    score: float
    self_influence: float | None = None


class TestInfluence(ResultModel):
    """One test example: the class traced, the predicted class, its own self-influence, its strongest proponents and
    opponents, and how many training examples had a positive or negative influence."""

    id: str
    target: str
    predicted: str
    label: str | None = None
    self_influence: float
    n_positive: int
    n_negative: int
    proponents: list[InfluenceExample]
    opponents: list[InfluenceExample]


class ClassifierInfluenceResult(ResultModel):
    """``POST /tracin/classifier``: per test example (mode ``test``) or the top of the self-influence ranking
    (mode ``self``), with the checkpoints summed and the training examples ranked."""

    model: str
    dataset: str
    mode: Literal["test", "self"]
    estimator: Literal["tracin"] = "tracin"
    loss: Literal["cross_entropy"] = "cross_entropy"
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


def training_dataset(req: ClassifierInfluenceRequest, entry: dict[str, Any]) -> str:
    """The dataset whose training examples are ranked: the request's, or the one the model was trained on."""
    if req.dataset is not None:
        return req.dataset
    trained_on = (entry.get("meta") or {}).get("dataset")
    if not isinstance(trained_on, str):
        raise FieldError(("body", "dataset"), f"model {req.model!r} does not record its training data; name the "
                         "dataset", value=None)
    return trained_on


def validate(req: ClassifierInfluenceRequest, settings: Settings, owner: str = "system") -> None:
    entry = require_model(settings, req.model, MODEL_KIND, kind_label="an exported classifier")
    if not (entry.get("meta") or {}).get("checkpoints"):
        raise FieldError(("body", "model"), f"model {req.model!r} has no training checkpoints; TracIn needs the "
                         "checkpoints POST /train/classifier keeps", value=req.model)
    name = training_dataset(req, entry)
    counts = dataset_counts(settings, name, owner)
    spec = model_spec(entry)
    shape = list(spec["input"]["shape"][1:]) if spec is not None else None
    if shape is not None and counts.get("input_shape") not in (None, shape):
        raise FieldError(("body", "dataset"), f"the dataset's inputs are {counts['input_shape']} per example; model "
                         f"{req.model!r} takes {shape}", value=name)
    if req.mode == "self":
        for field in ("inputs", "test_indices"):
            if getattr(req, field) is not None:
                raise FieldError(("body", field), "mode self ranks the training examples; it takes no test "
                                 "examples", value=None)
    else:
        if (req.inputs is None) == (req.test_indices is None):
            raise FieldError(("body", "inputs"), "mode test needs test examples: inputs, or test_indices of the "
                             "dataset", value=None)
        labels = class_names(settings, entry)
        for i, t in enumerate(req.inputs or []):
            if shape is not None:
                problem = values_problem(t.values, shape)
                if problem is not None:
                    at, why = problem
                    raise FieldError(("body", "inputs", i, "values", *at),
                                     f"values{''.join(f'[{j}]' for j in at)} {why}", value=None)
            _check_target(("body", "inputs", i, "target"), t.target, labels, req.model)
        if req.inputs is not None and len({t.id for t in req.inputs}) != len(req.inputs):
            raise FieldError(("body", "inputs"), "input ids must be unique", value=None)
        size = counts.get(req.test_split)
        for i, k in enumerate(req.test_indices or []):
            if size is None:
                raise FieldError(("body", "test_split"), f"the dataset has no {req.test_split} split",
                                 value=req.test_split)
            if not 0 <= k < int(size):
                raise FieldError(("body", "test_indices", i), f"{k} is not a position in the {req.test_split} "
                                 f"split ({size} examples)", value=k)
    need = int(entry.get("parameters") or 0) * (req.batch_size + MAX_TESTS) * BYTES_PER_GRADIENT_VALUE
    budget = settings.worker_memory_bytes
    if budget and need > budget:
        raise FieldError(("body", "batch_size"), f"{req.batch_size} examples' gradients of model {req.model!r} "
                         f"would need about {gib(need)} of worker memory, more than the {gib(budget)} a worker "
                         "offers: lower batch_size", value=req.batch_size)


register(JobKind(
    name="classifier_influence",
    route="/tracin/classifier",
    request=ClassifierInfluenceRequest,
    queue="explain",
    func="workers.jobs.classifier_influence:run",
    timeout_s=3 * 3600,
    summary=("TracIn-CP on a classifier trained by the service: each test example's proponents and opponents "
             "among the training examples, or the training examples ranked by self-influence"),
    title="Training-data influence (classifier)",
    result=ClassifierInfluenceResult,
    pickers={"model": ("models", MODEL_KIND), "dataset": ("datasets", DATASET_KIND)},
    validate=validate,
))
