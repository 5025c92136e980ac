"""``POST /tracin/classifier``: training-data influence on a classifier trained by the service: the training examples that
pushed a test prediction's loss down (proponents) or up (opponents), or the training examples ranked by
self-influence (suspected mislabels). No torch here.

The model is an ``exported_classifier`` or an ``hf_classifier`` with the checkpoints ``POST /train/classifier``
kept (``meta.checkpoints``); the training data is the dataset it was trained on (``meta.dataset``: tensors or
texts) unless ``dataset`` names another of the same kind. Test examples (mode ``test``) are ``inputs`` (exported:
values) or ``texts`` (Hugging Face), each with the class whose loss is traced (``target``, by default the predicted
class), or ``test_indices`` of a split of that dataset (their own labels). The estimator is exact TracIn-CP over
every parameter (``models.export.influence``, ``models.hf.influence``): Σ_checkpoints lr · ⟨∇ℓ(test), ∇ℓ(train)⟩,
with ℓ the training loss (cross-entropy).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from core import estimators, limits, registry
from core.contract.checks import require_model
from core.contract.errors import FieldError
from core.contract.fields import ADVANCED, JobRequest
from core.contract.kind import JobKind, register
from core.contract.results.classifier_influence import ClassifierInfluenceResult
from core.kinds.attributions import TensorIn, TextIn, _check_target, class_names, model_spec, values_problem
from core.kinds.train_classifier import (
    DATASET_KIND,
    HF_KIND,
    MODEL_KIND,
    TEXT_DATASET_KIND,
    dataset_counts,
)

__all__ = ["ClassifierInfluenceRequest", "ClassifierInfluenceResult", "chunk_size", "training_dataset", "validate"]
from core.memory import gib
from core.placement import memory_budget
from core.settings import Settings
from models.textdata import label_indices

MAX_TESTS = 64
PROGRAM_FILE = "model.pt2"  # models.export.program.PROGRAM_FILE: an exported classifier's program
MAX_ENSEMBLE = 16
EstimatorName = estimators.choices(classifier_query=True)
OUTPUT_DEFAULTS = {"tracin": "loss", "tracin_projected": "loss", "trak": "margin", "trak_ensemble": "margin",
                   "ekfac": "margin"}
MAX_PROJ_DIM = 8192  # models.explain.trak.MAX_PROJ_DIM: the k x k matrix inverted per checkpoint
MAX_TOP_K = 1000
BYTES_PER_GRADIENT_VALUE = 4  # per-example gradients are fp32
GRADIENT_CHUNK_BYTES = 256 * 2**20  # batch_size "auto": training examples whose gradients fit this
MAX_AUTO_BATCH = 256
TEST_FACTOR_BYTES = 768 * 2**20  # what the engine keeps of a block of test examples (models.explain.tracin)


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
        description="Mode test, an exported classifier: inputs in the model's per-example shape; target is the "
                    "class whose loss is traced (by default the predicted class)")
    texts: list[TextIn] | None = Field(None, max_length=MAX_TESTS, title="Test texts",
        description="Mode test, a Hugging Face classifier: texts; target is the class whose loss is traced (by "
                    "default the predicted class)")
    test_indices: list[Annotated[int, Field(ge=0, le=limits.MAX_SEED)]] | None = Field(
        None, min_length=1, max_length=MAX_TESTS, title="Test examples",
        description="Mode test, instead of inputs: positions in the dataset's test_split, with their own labels")
    test_split: Literal["train", "valid", "test"] = Field("test", title="Split of the test examples",
        json_schema_extra=ADVANCED, description="The dataset split test_indices point into")
    top_k: int = Field(10, ge=1, le=MAX_TOP_K, title="Examples listed",
        description="Proponents and opponents per test example, or training examples in the self ranking (the full "
                    "self ranking is the artifact self_influence.csv)")
    estimator: EstimatorName = Field("tracin", title="Influence method",  # type: ignore[valid-type]
        description="tracin: exact TracIn-CP (Σ lr · gradient dot products); tracin_projected: the same with the "
                    "gradients projected to proj_dim; trak: TRAK (projected gradients of the classification margin, "
                    "an independent projection per checkpoint, the Gauss-Newton inverse, averaged over the "
                    "checkpoints, each training example weighted by 1 - p of its label averaged over the same "
                    "checkpoints); trak_ensemble: TRAK averaged over this model and the models of ensemble; "
                    "ekfac: influence functions with EK-FAC curvature through Kronfluence, at the trained model, "
                    "over its linear and convolution layers")
    output: Literal["loss", "margin"] | None = Field(None, title="Test output traced", json_schema_extra=ADVANCED,
        description="What the test side differentiates: loss (the cross-entropy of the target class) or margin "
                    "(the classification margin, negated, so a positive score helps the prediction either way). "
                    "Default: loss for tracin and tracin_projected, margin for ekfac; trak and trak_ensemble always "
                    "use the margin")
    method: Literal["ghost", "vmap"] = Field("ghost", title="TracIn gradients", json_schema_extra=ADVANCED,
        description="tracin: ghost factorises each linear layer's gradient dot products where that costs less "
                    "than materialising its gradients (exact, the same numbers); vmap materialises every gradient")
    ensemble: list[Annotated[str, Field(min_length=1, max_length=limits.MAX_NAME_LENGTH)]] | None = Field(
        None, min_length=1, max_length=MAX_ENSEMBLE, title="Ensemble members", json_schema_extra=ADVANCED,
        description="trak_ensemble: further classifiers of the same architecture, classes and training data "
                    "(trained with other seeds), each with its checkpoints")
    stored: bool = Field(False, title="From stored features", json_schema_extra=ADVANCED,
        description="trak, tracin_projected: score against the features POST /featurize/classifier stored (the "
                    "same checkpoints, proj_dim and seed; loss margin for trak, train for tracin_projected): one "
                    "tiled pass over the stored rows, no gradient of a training example computed")
    proj_dim: int = Field(2048, ge=16, le=MAX_PROJ_DIM, title="Projection size", json_schema_extra=ADVANCED,
        description="trak, trak_ensemble, tracin_projected: dimensions of the random projection of the gradients")
    projection: Literal["kronecker", "dense"] = Field(
        "kronecker", title="Random projection kind", json_schema_extra=ADVANCED,
        description="trak, trak_ensemble, tracin_projected: 'kronecker' (per layer, a Kronecker product of two "
                    "Gaussian factors: little memory, more variance) or 'dense' (one dense Gaussian matrix, as the "
                    "TRAK paper and dattri project: proj_dim x parameters numbers, at most 2^28)")
    damping: float = Field(0.01, gt=0, le=1e6, title="TRAK damping", json_schema_extra=ADVANCED,
        description="trak, trak_ensemble: the Gauss-Newton matrix's damping, relative to its mean eigenvalue")
    ekfac_damping: float | None = Field(None, ge=0, le=1e6, title="EK-FAC damping", json_schema_extra=ADVANCED,
        description="ekfac: the damping added to the EK-FAC eigenvalues (Kronfluence's damping_factor); by default "
                    "Kronfluence's heuristic, 0.1 x each layer's mean eigenvalue")
    seed: int = Field(0, ge=0, le=limits.MAX_SEED, title="Random seed", json_schema_extra=ADVANCED,
        description="trak, trak_ensemble, tracin_projected: seed of the random projection (trak, trak_ensemble: "
                    "each checkpoint's own projection is derived from it and the checkpoint's position); ekfac: "
                    "seed of the labels sampled for the Fisher")
    checkpoints: Literal["all", "last"] = Field("all", title="Checkpoints summed", json_schema_extra=ADVANCED,
        description="Sum over every kept checkpoint (TracIn-CP, TRAK), or the last one only; ekfac always runs at "
                    "the trained model (the last checkpoint)")
    max_length: int = Field(128, ge=2, le=4096, title="Tokens per text", json_schema_extra=ADVANCED,
        description="Hugging Face classifiers: each text is cut to this many tokens, as fine-tuning cut it")
    batch_size: int | None = Field(None, ge=1, le=4096, title="Examples per chunk", json_schema_extra=ADVANCED,
        description="Training examples whose gradients are held at once; by default as many as fit 256 MiB "
                    "(at most 256)")


def output_of(req: ClassifierInfluenceRequest) -> str:
    """The test side's output: the request's, or the estimator's default (:data:`OUTPUT_DEFAULTS`)."""
    return req.output or OUTPUT_DEFAULTS[req.estimator]


def kfac_problem(settings: Settings, entry: dict[str, Any]) -> str | None:
    """Why EK-FAC cannot run on the exported classifier ``entry`` (``models.export.kfac``), or None. Reads the
    program's graph (no torch) in the bounded parser, once per model version."""
    location = str(entry.get("location") or entry.get("path") or "")
    if location not in _KFAC_PROBLEMS:
        from core.bounded import run_bounded

        try:
            path = registry.local_path(settings, entry) / PROGRAM_FILE
        except OSError:
            return None
        answer = run_bounded(settings, "export.kfac_problem", {"path": str(path)}, loc=("body", "model"),
                             value=entry.get("name"), shown=PROGRAM_FILE)
        if "problem" not in answer:
            return None  # unreadable here: the worker decides (and says why)
        if len(_KFAC_PROBLEMS) > 256:
            _KFAC_PROBLEMS.clear()
        _KFAC_PROBLEMS[location] = answer["problem"]
    return _KFAC_PROBLEMS[location]


_KFAC_PROBLEMS: dict[str, str | None] = {}


def _check_estimator(req: ClassifierInfluenceRequest, settings: Settings, entry: dict[str, Any]) -> None:
    """The estimator's own fields: its output, its ensemble members, what EK-FAC needs of the model."""
    name = req.estimator
    if req.output == "loss" and name in ("trak", "trak_ensemble"):
        raise FieldError(("body", "output"), f"{name} differentiates the classification margin (TRAK's output "
                         "function); output 'loss' is for tracin, tracin_projected and ekfac", value=req.output)
    if (req.ensemble is not None) != (name == "trak_ensemble"):
        raise FieldError(("body", "ensemble"), "trak_ensemble needs ensemble: the other models of the ensemble"
                         if req.ensemble is None else "ensemble is for estimator trak_ensemble", value=None)
    for i, member in enumerate(req.ensemble or []):
        where = ("body", "ensemble", i)
        if member == req.model or member in req.ensemble[:i]:
            raise FieldError(where, f"{member!r} is already in the ensemble", value=member)
        other = registry.get_model(settings, member)
        if other is None or other.get("kind") != entry["kind"]:
            raise FieldError(where, f"{member!r} is not a registered classifier of the kind of {req.model!r}",
                             value=member)
        if not (other.get("meta") or {}).get("checkpoints"):
            raise FieldError(where, f"model {member!r} has no training checkpoints", value=member)
        if class_names(settings, other) != class_names(settings, entry):
            raise FieldError(where, f"model {member!r} has other classes than {req.model!r}", value=member)
        if entry["kind"] == MODEL_KIND and model_spec(other) != model_spec(entry):
            raise FieldError(where, f"model {member!r} takes other inputs than {req.model!r}", value=member)
        if int(other.get("parameters") or 0) != int(entry.get("parameters") or 0):
            raise FieldError(where, f"model {member!r} has {int(other.get('parameters') or 0):,} parameters, "
                             f"{req.model!r} {int(entry.get('parameters') or 0):,}: an ensemble is one architecture",
                             value=member)
    if name == "ekfac":
        if "checkpoints" in req.model_fields_set and req.checkpoints != "last":
            raise FieldError(("body", "checkpoints"), "ekfac runs at the trained model (the last checkpoint): "
                             "influence functions take the Hessian at the trained weights", value=req.checkpoints)
        if entry["kind"] == MODEL_KIND:
            problem = kfac_problem(settings, entry)
            if problem is not None:
                raise FieldError(("body", "estimator"), f"model {req.model!r}: {problem}", value=name)
    if req.mode == "self" and req.output is not None:
        raise FieldError(("body", "output"), "self-influence differentiates the training loss on both sides (trak: "
                         "the margin); output is for mode test", value=req.output)
    if req.projection != "kronecker":
        if name not in ("trak", "trak_ensemble", "tracin_projected"):
            raise FieldError(("body", "projection"), "projection is for trak, trak_ensemble and tracin_projected",
                             value=req.projection)
        if req.stored:
            raise FieldError(("body", "projection"), "stored features are Kronecker-projected; a dense projection "
                             "is computed directly (stored: false)", value=req.projection)
    if req.stored:
        if name not in ("trak", "tracin_projected"):
            raise FieldError(("body", "stored"), "stored features serve trak and tracin_projected", value=True)
        if name == "tracin_projected" and req.output == "margin":
            raise FieldError(("body", "output"), "stored projected TracIn features are of the loss: output 'loss'",
                             value=req.output)
    if req.method != "ghost" and name != "tracin":
        raise FieldError(("body", "method"), "method is for estimator tracin", value=req.method)


def training_dataset(req: ClassifierInfluenceRequest, entry: dict[str, Any]) -> str:
    """The dataset whose training examples are ranked: the request's, or the one the model was trained on."""
    if req.dataset is not None:
        return req.dataset
    trained_on = (entry.get("meta") or {}).get("dataset")
    if not isinstance(trained_on, str):
        raise FieldError(("body", "dataset"), f"model {req.model!r} does not record its training data; name the "
                         "dataset", value=None)
    return trained_on


def chunk_size(req: ClassifierInfluenceRequest, parameters: int) -> int:
    """Training examples per chunk: the request's, or as many as :data:`GRADIENT_CHUNK_BYTES` holds."""
    if req.batch_size is not None:
        return req.batch_size
    return max(1, min(MAX_AUTO_BATCH, GRADIENT_CHUNK_BYTES // max(1, parameters * BYTES_PER_GRADIENT_VALUE)))


def _test_items(req: ClassifierInfluenceRequest, kind: str) -> tuple[str, list[Any] | None]:
    """The field that holds the request's test items for a model of ``kind``, and its value; the other family's
    field must be absent."""
    own, other = ("texts", "inputs") if kind == HF_KIND else ("inputs", "texts")
    if getattr(req, other) is not None:
        what = "a Hugging Face classifier reads texts" if kind == HF_KIND else "an exported classifier reads inputs"
        raise FieldError(("body", other), f"{what}, not {other}", value=None)
    return own, getattr(req, own)


def validate(req: ClassifierInfluenceRequest, settings: Settings, owner: str = "system") -> None:
    entry = require_model(settings, req.model, MODEL_KIND, kind_label="an exported classifier", also=(HF_KIND,))
    kind = entry["kind"]
    if not (entry.get("meta") or {}).get("checkpoints"):
        raise FieldError(("body", "model"), f"model {req.model!r} has no training checkpoints; TracIn needs the "
                         "checkpoints POST /train/classifier keeps", value=req.model)
    name = training_dataset(req, entry)
    counts = dataset_counts(settings, name, owner, kind)
    labels = class_names(settings, entry)
    if kind == MODEL_KIND:
        spec = model_spec(entry)
        shape = list(spec["input"]["shape"][1:]) if spec is not None else None
        if shape is not None and counts.get("input_shape") not in (None, shape):
            raise FieldError(("body", "dataset"), f"the dataset's inputs are {counts['input_shape']} per example; "
                             f"model {req.model!r} takes {shape}", value=name)
    else:
        shape = None
        if labels and counts.get("labels"):
            indices, bad = label_indices([str(v) for v in counts["labels"]], labels)
            if indices is None:
                raise FieldError(("body", "dataset"), f"the dataset's labels {bad} are not classes of model "
                                 f"{req.model!r}", value=name)
    _check_estimator(req, settings, entry)
    field, items = _test_items(req, kind)
    if req.mode == "self":
        for f in (field, "test_indices"):
            if getattr(req, f) is not None:
                raise FieldError(("body", f), "mode self ranks the training examples; it takes no test examples",
                                 value=None)
    else:
        if (items is None) == (req.test_indices is None):
            raise FieldError(("body", field), f"mode test needs test examples: {field}, or test_indices of the "
                             "dataset", value=None)
        for i, t in enumerate(items or []):
            if shape is not None:
                problem = values_problem(t.values, shape)
                if problem is not None:
                    at, why = problem
                    raise FieldError(("body", field, i, "values", *at),
                                     f"values{''.join(f'[{j}]' for j in at)} {why}", value=None)
            _check_target(("body", field, i, "target"), t.target, labels, req.model)
        if items is not None and len({t.id for t in items}) != len(items):
            raise FieldError(("body", field), f"{field} ids must be unique", value=None)
        size = counts.get(req.test_split)
        for i, k in enumerate(req.test_indices or []):
            if size is None:
                raise FieldError(("body", "test_split"), f"the dataset has no {req.test_split} split",
                                 value=req.test_split)
            if not 0 <= k < int(size):
                raise FieldError(("body", "test_indices", i), f"{k} is not a position in the {req.test_split} "
                                 f"split ({size} examples)", value=k)
    parameters = int(entry.get("parameters") or 0)
    need = parameters * chunk_size(req, parameters) * BYTES_PER_GRADIENT_VALUE + TEST_FACTOR_BYTES
    budget = memory_budget(settings, need)
    if budget and need > budget:
        raise FieldError(("body", "batch_size"), f"{chunk_size(req, parameters)} examples' gradients of model "
                         f"{req.model!r} ({parameters:,} parameters) would need about {gib(need)} of worker memory, "
                         f"more than the {gib(budget)} a worker offers: lower batch_size", value=req.batch_size)


register(JobKind(
    name="classifier_influence",
    route="/tracin/classifier",
    request=ClassifierInfluenceRequest,
    queue="explain",
    func="workers.jobs.classifier_influence:run",
    timeout_s=3 * 3600,
    summary=("Training-data influence on a classifier trained by the service (TracIn-CP, projected TracIn, TRAK "
             "and its ensembles, EK-FAC influence functions through Kronfluence): each test example's proponents "
             "and opponents among the training examples, or the training examples ranked by self-influence"),
    title="Training-data influence (classifier)",
    renderer="classifier_influence",
    result=ClassifierInfluenceResult,
    pickers={"model": ("models", (MODEL_KIND, HF_KIND)), "dataset": ("datasets", (DATASET_KIND, TEXT_DATASET_KIND))},
    validate=validate,
))
