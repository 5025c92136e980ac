"""``POST /train/conve``: train ConvE on a triples dataset with checkpoints, register it by name (no torch here)."""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

from pydantic import Field

from core import dataset_refs, limits, memory, registry
from core.bounded import run_bounded
from core.contract.charts import STEPS_CHART
from core.contract.checks import refuse_reserved, require_new_name
from core.contract.errors import FieldError
from core.contract.fields import ADVANCED, JobRequest
from core.contract.kind import JobKind, register
from core.contract.results.training import TrainConvEResult
from core.estimates import TrainingSize
from core.settings import Settings
from core.userfiles import display
from models.kg.shapes import check_image

NATIONS = "nations"
# The graphs shipped in models/kg/data (models.kg.shipped); tests/test_kg_datasets.py checks these sizes.
SHIPPED_COUNTS = {"nations": {"entities": 14, "relations": 55}, "umls": {"entities": 135, "relations": 46},
                  "kinships": {"entities": 104, "relations": 25}}
# the shipped graphs' train and test triples (tests/test_kg_datasets.py checks them against the files)
SHIPPED_SPLITS = {"nations": {"train_triples": 1592, "test_triples": 201},
                  "umls": {"train_triples": 5216, "test_triples": 661},
                  "kinships": {"train_triples": 8544, "test_triples": 1074}}
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class TrainConvERequest(JobRequest):
    name: str = Field(..., max_length=limits.MAX_NAME_LENGTH, pattern=NAME_PATTERN, title="Model name",
        description="Name to register the trained model under")
    dataset: str = Field(NATIONS, min_length=1, max_length=limits.MAX_PATH_LENGTH, title="Triples dataset",
        description=("'nations', 'umls' or 'kinships' (shipped), a registered triples dataset, or a directory under "
                     "the data roots holding train.txt (and valid.txt, test.txt)"))
    epochs: int = Field(20, ge=1, le=limits.MAX_EPOCHS, title="Training epochs",
        description="Passes over the training triples")
    batch_size: int = Field(
        128, ge=2, le=limits.MAX_TRAIN_BATCH_SIZE, title="Triples per batch", json_schema_extra=ADVANCED,
        description="Training triples per optimizer step")
    lr: float = Field(0.003, gt=0, le=10, title="Learning rate", description="Adam's learning rate")
    lr_decay: float = Field(
        1.0, gt=0, le=1, title="Learning-rate decay", json_schema_extra=ADVANCED,
        description="Multiplier of the learning rate after each epoch (1: constant)")
    weight_decay: float = Field(0.0, ge=0, title="L2 weight decay", json_schema_extra=ADVANCED,
        description="Adam's L2 penalty on the weights")
    label_smoothing: float = Field(
        0.1, ge=0, lt=1, title="Label-smoothing share", json_schema_extra=ADVANCED,
        description="Share of the target mass spread over every entity")
    embedding_dim: int = Field(200, ge=6, le=limits.MAX_EMBEDDING_DIM, title="Embedding size",
        description="Size of the entity and relation embeddings")
    embedding_height: int | None = Field(
        None, ge=1, le=limits.MAX_EMBEDDING_DIM, title="Embedding image height", json_schema_extra=ADVANCED,
        description="Height of the 2-D image an embedding is reshaped to; by default 10 for size 200 (10 x 20)")
    num_filters: int = Field(
        32, ge=1, le=limits.MAX_CONVE_FILTERS, title="Convolution filters", json_schema_extra=ADVANCED,
        description="Filters of ConvE's convolution")
    input_dropout: float = Field(
        0.2, ge=0, lt=1, title="Input dropout rate", json_schema_extra=ADVANCED,
        description="Share of the embedding image dropped while training")
    feature_dropout: float = Field(
        0.2, ge=0, lt=1, title="Feature-map dropout rate", json_schema_extra=ADVANCED,
        description="Share of the convolution's feature maps dropped while training")
    hidden_dropout: float = Field(
        0.3, ge=0, lt=1, title="Hidden-layer dropout rate", json_schema_extra=ADVANCED,
        description="Share of the hidden layer dropped while training")
    reciprocal: bool = Field(True, title="Add reciprocal relations", json_schema_extra=ADVANCED,
        description="Also train on each triple reversed, with an inverse relation (as ConvE's authors do)")
    checkpoint_every: int = Field(
        5, ge=1, le=limits.MAX_EPOCHS, title="Checkpoint interval", json_schema_extra=ADVANCED,
        description="Save a checkpoint for TracIn every this many epochs")
    seed: int = Field(0, ge=0, le=limits.MAX_SEED, title="Random seed", json_schema_extra=ADVANCED,
        description="Seed of the initialisation and the data order")
    overwrite: bool = Field(False, title="Replace my model",
        description="Replace your existing model of the same name")


def resolve_dataset(settings: Settings, name: str, owner: str) -> Path | None:
    """A shipped graph's name (``nations``, ``umls``, ``kinships``) not registered yet -> None (the packaged copy);
    otherwise the directory of the ``triples`` dataset ``name`` names for ``owner`` (:mod:`core.dataset_refs`).
    FieldError on ``dataset`` otherwise."""
    if name in SHIPPED_COUNTS and registry.get_dataset(settings, name) is None:
        return None
    ref = dataset_refs.resolve(settings, name, owner, "triples")
    path = dataset_refs.local_dir(settings, ref, name)
    if not (path / "train.txt").exists():
        raise FieldError(("body", "dataset"), f"dataset {name!r} has no train.txt", value=name)
    return path


def dataset_counts(settings: Settings, name: str, owner: str = registry.SYSTEM,
                   field: str = "dataset") -> dict[str, int]:
    """Entities and relations of the dataset ``name`` names for ``owner``: a shipped graph's; a registered
    dataset's counts (from ``POST /datasets`` and demo preparation; zeros when it has none); a directory's, counted
    as ``POST /datasets`` counts them (:func:`directory_counts`), so that ``./bigkg`` is admitted exactly as
    ``bigkg`` registered."""
    counts = _counts(settings, name, owner, field)
    return {k: int(counts.get(k) or 0) for k in ("entities", "relations")}


def split_counts(settings: Settings, name: str, owner: str = registry.SYSTEM,
                 field: str = "dataset") -> dict[str, int | None]:
    """:func:`dataset_counts` with the triples of the train and test splits (None: not recorded, a dataset
    registered without counts)."""
    counts = _counts(settings, name, owner, field)
    out: dict[str, int | None] = {k: int(counts.get(k) or 0) for k in ("entities", "relations")}
    for k in ("train_triples", "test_triples"):
        out[k] = counts[k] if isinstance(counts.get(k), int) else None
    return out


def _counts(settings: Settings, name: str, owner: str, field: str) -> dict[str, Any]:
    if name in SHIPPED_COUNTS and registry.get_dataset(settings, name) is None:
        return {**SHIPPED_COUNTS[name], **SHIPPED_SPLITS[name]}
    ref = dataset_refs.resolve(settings, name, owner, "triples", field)
    if ref.entry is not None:
        return ref.entry.get("meta", {}).get("counts") or {}
    return directory_counts(settings, ref.path, name, field)


_DIRECTORY_COUNTS: OrderedDict[tuple, dict[str, Any]] = OrderedDict()


def directory_counts(settings: Settings, path: Path, value: str, field: str = "dataset") -> dict[str, Any]:
    """The counts of the triples directory ``path`` as ``POST /datasets`` records them (``detect`` in the bounded
    parser, through the user-file opener: the tree checked, size caps, bounded reads); kept for the directory as
    long as its files' sizes and times stay. FieldError on ``field`` when it is not a readable triples directory."""
    try:
        stamp = (str(path), *((f, st.st_size, st.st_mtime_ns) for f in TRIPLES_FILES
                              if (st := _stat(path / f)) is not None))
    except OSError as exc:
        raise FieldError(("body", *field.split(".")), f"{value!r} cannot be read ({exc.strerror or 'I/O error'})",
                         value=value) from None
    counts = _DIRECTORY_COUNTS.get(stamp)
    if counts is None:
        answer = run_bounded(settings, "dataset.detect", {"path": str(path)}, loc=("body", *field.split(".")),
                             value=value, shown=display(settings, path))
        if "format_error" in answer or "os_error" in answer:
            message = answer.get("format_error") or f"{value!r} cannot be read ({answer['os_error']})"
            raise FieldError(("body", *field.split(".")), message, value=value)
        found = answer["found"]
        if found["format"] != "triples":
            raise FieldError(("body", *field.split(".")), f"{value!r} is not a triples directory", value=value)
        counts = _DIRECTORY_COUNTS[stamp] = found["counts"]
        while len(_DIRECTORY_COUNTS) > 64:
            _DIRECTORY_COUNTS.popitem(last=False)
    return counts


TRIPLES_FILES = ("train.txt", "valid.txt", "test.txt", "entities.dict", "relations.dict")


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except FileNotFoundError:
        return None


def check_memory(req: TrainConvERequest, settings: Settings, owner: str = registry.SYSTEM) -> None:
    """The model and one step's activations at ``batch_size`` fit ``EXPLAINQ_WORKER_MEMORY_BYTES``."""
    counts = dataset_counts(settings, req.dataset, owner)
    est = memory.conve_training(counts["entities"], counts["relations"], req.embedding_dim, req.embedding_height,
                                req.num_filters, req.batch_size, req.reciprocal)
    sizes = [("embedding_dim", req.embedding_dim), ("num_filters", req.num_filters)]
    fields = sizes + [("batch_size", req.batch_size)]
    if est.activation_bytes > est.parameter_bytes:
        fields = [("batch_size", req.batch_size), *sizes]
    what = (f"ConvE with embedding_dim {req.embedding_dim}, num_filters {req.num_filters} and batch_size "
            f"{req.batch_size} on {req.dataset!r} ({counts['entities']} entities, {counts['relations']} relations)")
    memory.check_budget(settings, est, fields, what)


def validate(req: TrainConvERequest, settings: Settings, owner: str = "system") -> None:
    refuse_reserved(req.name, owner, "name")
    resolve_dataset(settings, req.dataset, owner)
    problem = check_image(req.embedding_dim, req.embedding_height)
    if problem:
        loc = "embedding_height" if req.embedding_height is not None else "embedding_dim"
        raise FieldError(("body", loc), problem, value=getattr(req, loc))
    check_memory(req, settings, owner)
    require_new_name(settings, req.name, owner, "conve", req.overwrite)

NATIONS_TRAIN_TRIPLES = 1592  # models/kg/data/nations/train.txt


def training_size(req: TrainConvERequest, settings: Settings, owner: str = "system") -> TrainingSize | None:
    """Triples per epoch: the dataset's training triples (its registered counts, or the shipped nations), twice
    with reciprocal relations; None when the count is not known without reading the files."""
    entry = registry.get_dataset(settings, req.dataset)
    counts = (entry or {}).get("meta", {}).get("counts") or {}
    triples = counts.get("train_triples")
    if not isinstance(triples, int) and req.dataset == NATIONS and entry is None:
        triples, counts = NATIONS_TRAIN_TRIPLES, SHIPPED_COUNTS[NATIONS]
    if not isinstance(triples, int):
        return None
    entities, relations = counts.get("entities"), counts.get("relations")
    params = (memory.conve_training(entities, relations, req.embedding_dim, req.embedding_height, req.num_filters,
                                    req.batch_size, req.reciprocal).parameters
              if isinstance(entities, int) and isinstance(relations, int) and entities > 0 else None)
    return TrainingSize("triples", triples * (2 if req.reciprocal else 1), req.epochs, req.batch_size, params)


register(JobKind(
    name="train_conve",
    route="/train/conve",
    request=TrainConvERequest,
    queue="train",
    func="workers.jobs.train_conve:run",
    timeout_s=12 * 3600,
    summary="Train ConvE on knowledge-graph triples with TracIn checkpoints; registers the model",
    title="Train ConvE",
    estimate=training_size,
    renderer="training",
    result=TrainConvEResult,
    pickers={"dataset": ("datasets", "triples")},
    live_rows="history",
    charts=(
        STEPS_CHART,
        {"id": "loss", "title": "Loss", "series": [["loss", "train loss"]]},
        {"id": "mrr", "title": "Validation MRR / Hits@k", "series": [["valid_mrr", "MRR"], ["valid_hits@1", "Hits@1"],
                                                                   ["valid_hits@10", "Hits@10"]]},
    ),
    validate=validate,
    recheck=True,
))
