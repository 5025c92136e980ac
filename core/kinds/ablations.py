"""``POST /ablations``: the LoRA weight-space visual-only ablation (API side; no torch).

Validation reads only ``labels.csv`` and a safetensors JSON header (or a ``datasets`` directory's
``dataset_info.json``), so a bad dataset is a 422 naming the field before anything is queued.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator

from core import dataset_refs, limits
from core.bounded import run_bounded
from core.contract.errors import FieldError
from core.contract.fields import ADVANCED, JobRequest
from core.contract.kind import JobKind, register
from core.contract.results.ablation import AblationResult
from core.settings import Settings
from models.lora.keys import REPRESENTATION_NAMES

DATASET_KIND = "lora"


class AblationRequest(JobRequest):
    dataset: str = Field(..., min_length=1, max_length=limits.MAX_PATH_LENGTH, title="LoRA dataset",
        description="A registered LoRA dataset, or a directory under the data roots")
    representations: Annotated[list[Annotated[str, Field(max_length=limits.MAX_REPRESENTATION_NAME_LENGTH)]],
                               Field(max_length=len(REPRESENTATION_NAMES))] | Literal["all"] = Field(
        "all", title="Weight representations compared", json_schema_extra=ADVANCED,
        description=f"'all', or a list from: {', '.join(REPRESENTATION_NAMES)}")
    layer_sets: list[Literal["all", "visual", "text"]] = Field(
        ["all", "visual"], min_length=1, max_length=3, title="Layer groups compared",
        description="All layers, the visual ones (attn1 self-attention) and/or the text ones (attn2 cross-attention)")
    num_runs: int = Field(10, ge=1, le=limits.MAX_PROBE_RUNS, title="Probe runs per cell",
        description="Probes trained per representation and layer group, with seeds seed, seed + 1, ...")
    n_splits: int | None = Field(
        None, ge=1, le=limits.MAX_PROBE_RUNS, title="Distinct data splits", json_schema_extra=ADVANCED,
        description=("Seeded train/test splits shared by the runs (run r uses split r mod this); empty: a new split "
                     "per run"))
    quick: bool = Field(False, title="Quick run (3 probes)",
        description="Three probe runs per cell instead of the number set")
    sample_layers: float = Field(
        1.0, gt=0, le=1, title="Share of layers sampled", json_schema_extra=ADVANCED,
        description="Share of each layer group's layers used (a seeded draw)")
    cache_features: bool = Field(True, title="Cache feature matrices", json_schema_extra=ADVANCED,
        description="Keep the computed features for later runs")
    batch_size: int = Field(
        256, ge=2, le=limits.MAX_TRAIN_BATCH_SIZE, title="Probe batch size", json_schema_extra=ADVANCED,
        description="Samples per probe training step")
    max_epochs: int = Field(
        200, ge=1, le=limits.MAX_EPOCHS, title="Probe epoch limit", json_schema_extra=ADVANCED,
        description="Most epochs a probe trains")
    patience: int = Field(
        15, ge=1, le=limits.MAX_EPOCHS, title="Early-stopping patience", json_schema_extra=ADVANCED,
        description="Epochs without a better validation accuracy before a probe stops")
    hidden_dim: int = Field(
        512, ge=1, le=limits.MAX_PROBE_HIDDEN, title="Probe hidden width", json_schema_extra=ADVANCED,
        description="Width of the probe MLP's hidden layer")
    dropout: float = Field(0.5, ge=0, lt=1, title="Probe dropout rate", json_schema_extra=ADVANCED,
        description="Share of the probe's hidden units dropped while training")
    weight_decay: float = Field(
        1e-4, ge=0, le=1, title="Probe weight decay", json_schema_extra=ADVANCED,
        description="The probe optimizer's weight decay")
    precision: Literal["auto", "fp32", "fp16", "bf16"] = Field(
        "auto", title="Numeric precision", json_schema_extra=ADVANCED,
        description="Floating-point format of the probes; 'auto' picks what suits the device")
    seed: int = Field(42, ge=0, le=limits.MAX_SEED, title="Random seed", json_schema_extra=ADVANCED,
        description="Seed of the splits, the probes and the layer draw")

    @field_validator("representations")
    @classmethod
    def _known_representations(cls, v: list[str] | str) -> list[str] | str:
        if isinstance(v, list):
            if not v:
                raise ValueError("give at least one representation, or \"all\"")
            unknown = [r for r in v if r not in REPRESENTATION_NAMES]
            if unknown:
                raise ValueError(f"unknown representation(s) {unknown}; known: {list(REPRESENTATION_NAMES)}")
            if len(set(v)) != len(v):
                raise ValueError("representations are repeated")
        return v

    @field_validator("layer_sets")
    @classmethod
    def _unique_sets(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("layer_sets are repeated")
        return v


def resolve_dataset(settings: Settings, name: str, owner: str) -> Path:
    """The directory of the LoRA dataset ``name`` names for ``owner`` (:mod:`core.dataset_refs`).

    Raises ``FieldError`` on the ``dataset`` field."""
    ref = dataset_refs.resolve(settings, name, owner, DATASET_KIND, kind_label="a LoRA dataset")
    return dataset_refs.local_dir(settings, ref, name)


def validate(req: AblationRequest, settings: Settings, owner: str = "system") -> None:
    path = resolve_dataset(settings, req.dataset, owner)
    summary = run_bounded(settings, "dataset.lora_summary", {"path": str(path)}, loc=("body", "dataset"),
                          value=req.dataset, shown=req.dataset)
    if "format_error" in summary:
        raise FieldError(("body", "dataset"), summary["format_error"], req.dataset)
    if "os_error" in summary:
        raise FieldError(("body", "dataset"), f"cannot read the dataset: {summary['os_error']}", req.dataset)
    classes, num_layers = summary["classes"], summary["num_layers"]
    if classes and len(classes) < 2:
        raise FieldError(("body", "dataset"),
                         f"the dataset has {len(classes)} class(es); a probe needs at least 2", req.dataset)
    if not summary["layers"]:
        raise FieldError(("body", "dataset"), "no LoRA down/up factor pairs found in the dataset", req.dataset)
    for i, ls in enumerate(req.layer_sets):
        if num_layers.get(ls, 0) == 0:
            raise FieldError(("body", "layer_sets", i),
                             f"layer set {ls!r} matches no layer of the dataset (layers per set: {num_layers})",
                             ls)


register(JobKind(
    name="ablations",
    route="/ablations",
    request=AblationRequest,
    queue="train",
    func="workers.jobs.ablations:run",
    timeout_s=12 * 3600,
    result_ttl_s=30 * 24 * 3600,
    summary="LoRA weight-space ablation: can the concept be probed from all layers vs visual (attn1) layers only?",
    title="LoRA visual ablation",
    renderer="ablation",
    result=AblationResult,
    pickers={"dataset": ("datasets", "lora")},
    validate=validate,
    tags=("lora",),
))
