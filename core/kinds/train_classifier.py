"""``POST /train/classifier``: train a classifier from its own weights and register the result with its checkpoints
(no torch here).

The model is a registered ``exported_classifier`` (its architecture and initial weights, trained on a
``tensor_classification`` dataset: ``train.safetensors`` with inputs of the model's per-example shape) or an
``hf_classifier`` (a Hugging Face checkpoint, fine-tuned on a ``text_classification`` dataset: ``train.csv`` or
``train.jsonl`` with text and label, each label one of the model's class names or indices). Either may be a
registered dataset or a directory under the data roots. The job trains every parameter
(``models.export.train``: through the service's interpreter; ``models.hf.train``: transformers' model), keeps a
checkpoint every ``checkpoint_every`` epochs with its learning rate, and registers the trained model under ``name``
as the kind it started from. ``optimizer`` and ``lr`` default by the model: SGD with momentum at 0.05 for an
exported program, AdamW at 5e-5 for a Hugging Face model (:func:`resolved`).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field

from core import dataset_refs, limits, registry
from core.bounded import run_bounded
from core.contract.charts import STEPS_CHART
from core.contract.checks import refuse_reserved, require_model, require_new_name
from core.contract.errors import FieldError
from core.contract.fields import ADVANCED, JobRequest
from core.contract.kind import JobKind, register
from core.contract.results.classifier_influence import ClassifierCheckpoint
from core.contract.results.training import TrainingResult
from core.memory import gib
from core.placement import memory_budget
from core.settings import Settings
from core.userfiles import display
from models.textdata import label_indices

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
MODEL_KIND = "exported_classifier"
DATASET_KIND = "tensor_classification"
HF_KIND = "hf_classifier"
TEXT_DATASET_KIND = "text_classification"
DATASET_KINDS = {MODEL_KIND: DATASET_KIND, HF_KIND: TEXT_DATASET_KIND}
BYTES_PER_VALUE = 8  # a split is read whole (its bytes, up to 4 per value) and kept as float32 (4 per value)
# optimizer and learning rate when the request leaves them out, by the model's kind
DEFAULT_OPTIMIZER = {MODEL_KIND: ("sgd", 0.05), HF_KIND: ("adamw", 5e-5)}
# fine-tuning memory: fp32 weights, gradients and two Adam moments per parameter; activations kept for the backward
# pass per token and layer, about 34 x hidden values plus 5 x heads x length attention values (Korthikanti et al.,
# "Reducing Activation Recomputation in Large Transformer Models", 2022), 4 bytes each
BYTES_PER_PARAMETER = 16
MAX_EXAMPLE_STEPS = 10**9  # examples x epochs one job may train on (a 2-core CPU does ~1e5 digit examples/s)


class TrainClassifierRequest(JobRequest):
    name: str = Field(..., max_length=limits.MAX_NAME_LENGTH, pattern=NAME_PATTERN, title="Model name",
        description="Name to register the trained model under")
    model: str = Field(..., min_length=1, max_length=limits.MAX_NAME_LENGTH, title="Model to train",
        description=("A registered exported classifier or Hugging Face classifier: its architecture and its weights "
                     "are where training starts"))
    dataset: str = Field(..., min_length=1, max_length=limits.MAX_PATH_LENGTH, title="Training data",
        description=("A registered dataset of the model's input: tensors (train.safetensors with inputs and labels) "
                     "for an exported classifier, texts (train.csv or train.jsonl with text and label) for a Hugging "
                     "Face one; its valid split is scored every epoch. Or such a directory under the data roots"))
    epochs: int = Field(5, ge=1, le=limits.MAX_EPOCHS, title="Training epochs",
        description="Passes over the training examples")
    batch_size: int = Field(64, ge=1, le=limits.MAX_TRAIN_BATCH_SIZE, title="Examples per batch",
        json_schema_extra=ADVANCED, description="Training examples per optimizer step")
    optimizer: Literal["sgd", "adam", "adamw"] | None = Field(None, title="Update rule",
        description=("SGD with momentum, Adam, or AdamW (decoupled weight decay); by default SGD for an exported "
                     "program, AdamW for a Hugging Face model"))
    lr: float | None = Field(None, gt=0, le=10, title="Learning rate",
        description="The optimizer's learning rate; by default 0.05 for an exported program, 5e-5 for a Hugging Face "
                    "model")
    momentum: float = Field(0.9, ge=0, lt=1, title="SGD momentum", json_schema_extra=ADVANCED,
        description="SGD's momentum (not used by Adam)")
    weight_decay: float = Field(0.0, ge=0, le=1, title="L2 weight decay", json_schema_extra=ADVANCED,
        description="The optimizer's weight decay (L2 penalty for SGD and Adam, decoupled for AdamW)")
    max_length: int = Field(128, ge=2, le=4096, title="Tokens per text", json_schema_extra=ADVANCED,
        description="Hugging Face models: each text is cut to this many tokens (the model's own limit applies too)")
    checkpoint_every: int = Field(1, ge=1, le=limits.MAX_EPOCHS, title="Checkpoint interval",
        json_schema_extra=ADVANCED, description="Keep a checkpoint (for data attribution) every this many epochs")
    seed: int = Field(0, ge=0, le=limits.MAX_SEED, title="Random seed", json_schema_extra=ADVANCED,
        description="Seed of the data order")
    overwrite: bool = Field(False, title="Replace my model",
        description="Replace your existing model of the same name")


class TrainClassifierResult(TrainingResult):
    """``POST /train/classifier``: the registered model, its accuracy per split, the checkpoints kept, and the
    history (``epoch``, ``loss``, ``lr``, ``train_accuracy``, ``valid_accuracy`` when the dataset has a valid
    split)."""

    model: str = Field(description="the name the model is registered under")
    started_from: str = Field(description="the model whose weights training started from")
    optimizer: str = Field(description="the update rule used (the model's default when the request had none)")
    lr: float = Field(description="the learning rate used")
    parameters: int
    examples: dict[str, int] = Field(description="examples per split of the dataset")
    accuracy: dict[str, float | None] = Field(description="the trained model's accuracy per split")
    checkpoints: list[ClassifierCheckpoint]
    seconds: float


def resolved(req: TrainClassifierRequest, model_kind: str) -> tuple[str, float]:
    """The optimizer and learning rate a job of ``req`` uses on a model of ``model_kind``: the request's, else the
    model kind's defaults (:data:`DEFAULT_OPTIMIZER`)."""
    optimizer, lr = DEFAULT_OPTIMIZER[model_kind]
    return req.optimizer or optimizer, req.lr if req.lr is not None else lr


def dataset_counts(settings: Settings, dataset: str, owner: str, model_kind: str = MODEL_KIND) -> dict[str, Any]:
    """The dataset's splits (and per-example shape, or labels), from the registry or, for a directory, its files."""
    dataset_kind = DATASET_KINDS[model_kind]
    label = "a tensors dataset" if dataset_kind == DATASET_KIND else "a text classification dataset"
    ref = dataset_refs.resolve(settings, dataset, owner, dataset_kind, kind_label=label)
    if ref.entry is not None:
        counts = (ref.entry.get("meta") or {}).get("counts")
        if isinstance(counts, dict) and "train" in counts:
            return counts
        path = registry.absolute_path(settings, ref.entry)
    else:
        path = ref.path
    answer = run_bounded(settings, "dataset.classifier_counts",
                         {"path": str(path), "tensors": dataset_kind == DATASET_KIND}, loc=("body", "dataset"),
                         value=dataset, shown=display(settings, path))
    if "error" in answer:
        raise FieldError(("body", "dataset"), answer["error"], value=dataset)
    counts = answer["counts"]
    if "train" not in counts:
        raise FieldError(("body", "dataset"), "the dataset has no train.safetensors", value=dataset)
    return counts


def _check_tensors(req: TrainClassifierRequest, settings: Settings, entry: dict[str, Any],
                   counts: dict[str, Any]) -> None:
    spec = (entry.get("meta") or {}).get("spec") or {}
    shape = (spec.get("input") or {}).get("shape")
    if isinstance(shape, list) and counts.get("input_shape") is not None and counts["input_shape"] != shape[1:]:
        raise FieldError(("body", "dataset"), f"the dataset's inputs are {counts['input_shape']} per example; model "
                         f"{req.model!r} takes {shape[1:]}", value=req.dataset)
    values = sum(int(counts.get(split) or 0) for split in ("train", "valid", "test")) \
        * math.prod(counts.get("input_shape") or [1])
    need = values * BYTES_PER_VALUE
    budget = memory_budget(settings, need)
    if budget and need > budget:
        raise FieldError(("body", "dataset"), f"the dataset's {values:,} input values would need about {gib(need)} of "
                         f"worker memory to train on, more than the {gib(budget)} a worker offers "
                         "(EXPLAINQ_WORKER_MEMORY_BYTES)", value=req.dataset)


def fine_tune_bytes(parameters: int, dims: dict[str, Any], batch_size: int, max_length: int) -> int:
    """Memory to fine-tune a transformer of ``parameters`` (``dims``: its ``hidden``, ``layers`` and ``heads``, as
    the import recorded them; without them, the weights' share only) on batches of ``batch_size`` texts of up to
    ``max_length`` tokens (:data:`BYTES_PER_PARAMETER`, and the activations kept for the backward pass)."""
    need = parameters * BYTES_PER_PARAMETER
    hidden, layers, heads = (int(dims.get(k) or 0) for k in ("hidden", "layers", "heads"))
    if hidden and layers:
        per_token_layer = 34 * hidden + 5 * max(heads, 1) * max_length
        need += 4 * batch_size * max_length * layers * per_token_layer
    return need


def _check_texts(req: TrainClassifierRequest, settings: Settings, entry: dict[str, Any],
                 counts: dict[str, Any]) -> None:
    meta = entry.get("meta") or {}
    classes = [str(c) for c in meta.get("labels") or []]
    labels = [str(v) for v in counts.get("labels") or []]
    if classes and labels:
        indices, bad = label_indices(labels, classes)
        if indices is None:
            raise FieldError(("body", "dataset"), f"the dataset's labels {bad} are neither class names of model "
                             f"{req.model!r} ({', '.join(classes[:8])}{', ...' if len(classes) > 8 else ''}) nor "
                             f"class indices 0..{len(classes) - 1}", value=req.dataset)
    need = fine_tune_bytes(int(entry.get("parameters") or 0), meta.get("dims") or {}, req.batch_size, req.max_length)
    budget = memory_budget(settings, need)
    if budget and need > budget:
        raise FieldError(("body", "batch_size"), f"fine-tuning model {req.model!r} ({int(entry.get('parameters') or 0):,} "
                         f"parameters) on batches of {req.batch_size} texts of up to {req.max_length} tokens would "
                         f"need about {gib(need)} of worker memory, more than the {gib(budget)} a worker offers "
                         "(EXPLAINQ_WORKER_MEMORY_BYTES): lower batch_size or max_length", value=req.batch_size)


def validate(req: TrainClassifierRequest, settings: Settings, owner: str = "system") -> None:
    refuse_reserved(req.name, owner, "name")
    entry = require_model(settings, req.model, MODEL_KIND, kind_label="an exported classifier",
                          also=(HF_KIND,))
    kind = entry["kind"]
    counts = dataset_counts(settings, req.dataset, owner, kind)
    if kind == MODEL_KIND:
        _check_tensors(req, settings, entry, counts)
    else:
        _check_texts(req, settings, entry, counts)
    if counts["train"] * req.epochs > MAX_EXAMPLE_STEPS:
        raise FieldError(("body", "epochs"), f"{counts['train']:,} examples x {req.epochs} epochs is more than "
                         f"{MAX_EXAMPLE_STEPS:,} example steps for one job", value=req.epochs)
    require_new_name(settings, req.name, owner, kind, req.overwrite)


register(JobKind(
    name="train_classifier",
    route="/train/classifier",
    request=TrainClassifierRequest,
    queue="train",
    func="workers.jobs.train_classifier:run",
    timeout_s=12 * 3600,
    result_ttl_s=30 * 24 * 3600,
    summary=("Train an exported classifier on a tensors dataset, or fine-tune a Hugging Face classifier on a text "
             "dataset, from its own weights (seeded, with checkpoints), and register it"),
    title="Train a classifier",
    renderer="training",
    charts=(STEPS_CHART,),
    pickers={"model": ("models", (MODEL_KIND, HF_KIND)), "dataset": ("datasets", (DATASET_KIND, TEXT_DATASET_KIND))},
    result=TrainClassifierResult,
    validate=validate,
    recheck=True,
))
