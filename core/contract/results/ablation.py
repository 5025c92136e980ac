"""The ``ablation`` renderer's result: the LoRA weight-space ablation's table."""

from __future__ import annotations

from pydantic import Field

from core.contract.results.base import Artifact, OpenRecord, ResultModel
from core.contract.results.provenance import PROVENANCE_DESCRIPTION, Provenance


class MeanStd(OpenRecord):
    """A metric over a cell's probe runs: the mean and the sample standard deviation (0 for one run)."""

    mean: float | None
    std: float | None


class AblationCell(OpenRecord):
    """One (layer set, representation) cell: each metric's mean and spread over the probe runs, the summed
    confusion matrices and the feature size (every run is in ``results.json``)."""

    train_acc: MeanStd
    val_acc: MeanStd
    test_acc: MeanStd
    val_f1: MeanStd
    test_f1: MeanStd
    val_precision: MeanStd
    test_precision: MeanStd
    val_recall: MeanStd
    test_recall: MeanStd
    best_epoch: MeanStd
    time_s: MeanStd
    val_confusion_sum: list[list[int]]
    test_confusion_sum: list[list[int]]
    feature_dim: int


class MeanCI(OpenRecord):
    """The paired all − visual differences over runs: mean, sample std and the confidence interval of the mean
    (Nadeau–Bengio corrected, ``ci_method``; ``ci_naive`` is the uncorrected one). One run has no spread."""

    mean: float | None
    std: float | None
    n: int
    ci: list[float | None] | None
    ci_level: float
    ci_naive: list[float | None] | None = None
    ci_method: str | None = None
    test_train_ratio: float | None = None


class Drop(OpenRecord):
    """A representation's all → visual drop of ``metric``'s mean: absolute, relative to all (None when all is 0)
    and paired over runs (None when the layer sets ran different numbers of runs)."""

    metric: str
    all: float | None
    visual: float | None
    absolute: float | None
    relative: float | None
    paired: MeanCI | None


class DuplicateSet(ResultModel):
    """Identical adapters found before splitting: the one kept, those removed and their labels."""

    kept: str
    removed: list[str]
    labels: list[str]


class SplitSizes(ResultModel):
    """Adapters in each part of the first split, and how many distinct splits the runs used."""

    train: int
    val: int
    test: int
    n_splits: int


class AblationSettings(OpenRecord):
    """The experiment's settings as it ran (``models.lora.experiment.AblationConfig``) and ``runs`` per cell."""

    representations: list[str]
    layer_sets: list[str]
    num_runs: int
    n_splits: int | None
    quick: bool
    sample_layers: float
    cache_features: bool
    batch_size: int
    max_epochs: int
    patience: int
    hidden_dim: int
    dropout: float
    weight_decay: float
    precision: str
    seed: int
    runs: int


class AblationTiming(OpenRecord):
    """Seconds spent, which (layer set, representation) features were computed or read from the cache, and how
    many cells an earlier attempt had finished."""

    total_s: float
    features_s: float
    training_s: float
    features_computed: list[list[str]]
    features_cached: list[list[str]]
    resumed_cells: int


class AblationResult(ResultModel):
    """The LoRA weight-space ablation (``POST /ablations``): per layer set and representation, the probes'
    accuracy (mean and spread over runs), the paired all → visual drops, and the table as text."""

    dataset: str
    synthetic: bool
    format: str = Field(description="'safetensors_dir' or 'hf_disk'")
    num_items: int = Field(description="adapters used (after removing duplicates)")
    num_listed: int = Field(description="adapters the dataset lists")
    duplicates: list[DuplicateSet] = Field(default_factory=list)
    grouped: bool = Field(description="the splits kept each group's adapters together")
    warnings: list[str] = Field(default_factory=list)
    num_classes: int
    classes: list[str]
    num_layers: dict[str, int] = Field(description="the dataset's layers per layer set")
    layers_used: dict[str, int] = Field(description="the layers each layer set used (after sample_layers)")
    splits: SplitSizes
    config: AblationSettings
    device: str
    results: dict[str, dict[str, AblationCell]] = Field(description="layer set -> representation -> cell")
    drop: dict[str, Drop] = Field(default_factory=dict, description="per representation (with 'all' and 'visual')")
    timing: AblationTiming
    table: str
    artifacts: list[Artifact] = Field(default_factory=list)
    provenance: Provenance | None = Field(None, description=PROVENANCE_DESCRIPTION)

