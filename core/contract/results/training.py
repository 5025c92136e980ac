"""The ``training`` renderer's result: the per-epoch history and the per-step curve every training kind has, and
each training kind's own result (:class:`TrainConvEResult`, :class:`TrainBDHResult`, :class:`TrainNewsResult`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from core.contract.results.base import BY_ALIAS, Artifact, OpenRecord, RankMetrics, ResultModel
from core.contract.results.provenance import PROVENANCE_DESCRIPTION, Provenance


class StepPoint(OpenRecord):
    """A point of the per-step running-loss curve (``models.curves``): the mean loss over a range of steps."""

    step: int
    epoch: float
    loss: float | None


class TrainingResult(ResultModel):
    """What every training kind's result has: the per-epoch ``history`` rows (the kind's charts draw them) and
    the per-step running-loss curve ``steps``; a kind's own model adds its fields."""

    history: list[dict[str, Any]] = Field(default_factory=list)
    steps: list[StepPoint] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    artifacts: list[Artifact] = Field(default_factory=list)
    provenance: Provenance | None = Field(None, description=PROVENANCE_DESCRIPTION)


# --------------------------------------------------------------------------------------------------- train_conve
class ConvECheckpoint(ResultModel):
    """A TracIn checkpoint of a ConvE model: its file in the model directory, the epoch and the learning rate then."""

    file: str
    epoch: int
    lr: float


class TrainConvEResult(TrainingResult):
    """``POST /train/conve``: the registered model, its filtered metrics per split (``valid``, ``test``: those the
    dataset has), the checkpoints TracIn sums over, and the history (``epoch``, ``loss``, ``lr``, and ``valid``'s
    metrics at checkpoint epochs)."""

    model: str = Field(description="the name the model is registered under")
    metrics: dict[str, RankMetrics] = Field(description="per split (valid, test): the final model's metrics")
    parameters: int
    checkpoints: list[ConvECheckpoint]
    seconds: float = Field(description="training and evaluation time")


# ----------------------------------------------------------------------------------------------------- train_bdh
class BDHModelConfig(OpenRecord):
    """The trained Vision-BDH's configuration (``models.vision.config.VisionBDHConfig``), sized from the data."""

    n_layer: int
    n_embd: int
    n_head: int
    mlp_multiplier: int
    dropout: float
    softmax_attention: bool
    cls_token: bool
    img_size: int
    patch_size: int
    in_channels: int
    num_classes: int


class SampleCounts(ResultModel):
    """Images in each split the run used."""

    train: int
    val: int
    test: int


class ResumeChangeBDH(ResultModel):
    """A setting that differs from the checkpoint resumed: its value there and the one requested."""

    checkpoint: Any = None
    requested: Any = None


class TrainBDHResult(TrainingResult):
    """``POST /train/bdh``: the history (``train_loss``, ``val_loss``, ``train_accuracy``, ``val_accuracy``...
    per epoch), the best epoch and its validation accuracy, the test accuracy of the best weights, the registered
    model (``model_name``) and what ran (device, precision, optimizer, the model's configuration)."""

    model_config = ConfigDict(extra="forbid", **BY_ALIAS)

    best_epoch: int | None
    best_val_accuracy: float | None
    test_accuracy: float | None = Field(description="of the best epoch's weights; None without a best epoch")
    parameters: int
    expected_parameters: int
    epochs_completed: int
    resumed_from: str | None = Field(description="the job whose checkpoint this run continued (resume_from)")
    model_name: str = Field(description="the name the best model is registered under")
    bdh_config: BDHModelConfig = Field(alias="model_config")
    device: str
    precision: str
    optimizer: str
    samples: SampleCounts
    changed_on_resume: dict[str, ResumeChangeBDH] = Field(
        default_factory=dict, description="settings that differ from the resumed checkpoint's (nested as model.x)")


# ---------------------------------------------------------------------------------------------------- train_news
class NewsMetrics(OpenRecord):
    """MIND's metrics averaged over impressions (``models.news.train.evaluate``); None where no impression had
    both a click and a non-click."""

    model_config = ConfigDict(extra="allow", **BY_ALIAS)

    auc: float | None
    mrr: float | None
    ndcg_5: float | None = Field(alias="ndcg@5")
    ndcg_10: float | None = Field(alias="ndcg@10")
    pooled_auc: float | None
    impressions: int
    mean_score_fake: float | None = None
    mean_score_real: float | None = None


class NewsEpoch(OpenRecord):
    """One epoch: the mean training loss, the validation metrics (with a validation split) and the store key of
    its checkpoint (``runs/train_news/<owner>/<name>/<run>/epoch_NNNN``)."""

    epoch: int
    loss: float | None
    valid: NewsMetrics | None = None
    checkpoint: str


class ResumeChangeNews(ResultModel):
    """A training setting that differs from the checkpoint resumed: its value there and in this request."""

    checkpoint: Any = None
    request: Any = None


class NewsResume(ResultModel):
    """Where a resumed run started: the epoch and checkpoint key, and the training settings that changed (None when
    the checkpoint did not record them)."""

    from_epoch: int
    checkpoint: str
    changed: dict[str, ResumeChangeNews] | None


class TrainNewsResult(TrainingResult):
    """``POST /train/news``: the registered model, per epoch the loss and validation metrics (``epochs``, with
    their checkpoints; ``history``: the same rows without them), the last validation metrics and the untrained
    model's (``initial_valid``, the floor to beat), and how a resumed run started."""

    model: str = Field(description="the name the model is registered under")
    architecture: Literal["nrms", "naml"]
    encoder: Literal["minilm", "pretrained", "word"]
    parameters: int
    train_examples: int
    precision: str
    resumed_from_epoch: int | None
    resume: NewsResume | None
    initial_valid: NewsMetrics | None = Field(description="the untrained model's validation metrics (new runs)")
    epochs: list[NewsEpoch]
    valid: NewsMetrics | None = Field(description="the last epoch's validation metrics")
    train_seconds: float
    run: str = Field(description="the run's id in the store (its checkpoints' directory)")
