"""``POST /train/bdh``: train a Vision-BDH image classifier on the ``train`` queue (no torch here)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from core import dataset_refs, limits, memory
from core.artifacts import artifacts_key, owner_record
from core.contract.charts import STEPS_CHART
from core.contract.checks import refuse_reserved, require_name_free
from core.contract.errors import FieldError, FieldNotFound
from core.contract.fields import ADVANCED, JobRequest, RequestModel
from core.contract.kind import JobKind, register
from core.contract.results.training import TrainBDHResult
from core.estimates import TrainingSize
from core.filestore import get_store
from core.keys import valid_job_id
from core.ownership import owns
from core.settings import Settings
from core.userfiles import PathError, UserFileError, check_tree, display, resolve_data_path

# Directory names of the official python-pickle archives, and the file that marks a complete one.
CIFAR_DIRS = {"cifar10": ("cifar-10-batches-py", "data_batch_1"), "cifar100": ("cifar-100-python", "train")}
NUM_CLASSES = {"digits": 10, "cifar10": 10, "cifar100": 100}


class BDHModelSpec(RequestModel):
    """Vision-BDH architecture: N = mlp_multiplier · n_embd / n_head neurons per head."""

    n_layer: int = Field(6, ge=1, le=limits.MAX_BDH_LAYERS, title="Layer applications",
        description="How many times the shared BDH layer is applied (the depth)")
    n_embd: int = Field(192, ge=4, le=limits.MAX_EMBEDDING_DIM, title="Embedding width",
        description="Width of the embeddings; a multiple of the attention heads")
    n_head: int = Field(6, ge=1, le=limits.MAX_BDH_HEADS, title="Attention heads",
        description="Heads of the attention; they divide the embedding width")
    mlp_multiplier: int = Field(32, ge=1, le=limits.MAX_BDH_MLP_MULTIPLIER, title="MLP width multiplier",
        description="Width of the neuron layer as a multiple of the embedding width")
    softmax_attention: bool = Field(False, title="Use softmax attention",
        description="Softmax attention (SDPA) instead of BDH's linear attention")
    dropout: float = Field(0.1, ge=0.0, lt=1.0, title="Dropout rate",
        description="Share of activations dropped while training")
    cls_token: bool = Field(False, title="Classify from a CLS token",
        description="Classify from a CLS token instead of averaging the patches")

    @field_validator("n_head")
    @classmethod
    def _heads_divide_width(cls, n_head: int, info) -> int:  # noqa: ANN001 - pydantic ValidationInfo
        n_embd = info.data.get("n_embd")
        if n_embd is not None and n_embd % n_head:
            raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        return n_head

    @field_validator("mlp_multiplier")
    @classmethod
    def _even_neurons(cls, mult: int, info) -> int:  # noqa: ANN001
        n_embd, n_head = info.data.get("n_embd"), info.data.get("n_head")
        if n_embd and n_head and (mult * n_embd) % (2 * n_head):
            raise ValueError("mlp_multiplier · n_embd / n_head must be an even integer (RoPE rotates pairs)")
        return mult


class TrainBDHRequest(JobRequest):
    dataset: Literal["digits", "cifar10", "cifar100"] = Field("digits", title="Image dataset",
        description="Digits (shipped, small), or CIFAR-10 / CIFAR-100 from the data roots")
    data_dir: str | None = Field(
        None, max_length=limits.MAX_PATH_LENGTH, title="CIFAR directory", json_schema_extra=ADVANCED,
        description=("CIFAR: the python-pickle batch directory (or its parent) under the data roots, or a registered "
                     "CIFAR dataset; by default cifar-10-batches-py / cifar-100-python in the first data root. Not "
                     "used for digits"))
    epochs: int = Field(10, ge=1, le=limits.MAX_EPOCHS, title="Training epochs",
        description="Passes over the training images (a resumed run continues up to this)")
    batch_size: int = Field(
        64, ge=1, le=limits.MAX_BDH_BATCH_SIZE, title="Images per batch", json_schema_extra=ADVANCED,
        description="Images per optimizer step (before gradient accumulation)")
    grad_accum_steps: int = Field(
        1, ge=1, le=limits.MAX_GRAD_ACCUM_STEPS, title="Gradient accumulation", json_schema_extra=ADVANCED,
        description="Batches whose gradients are summed before each optimizer step")
    lr: float = Field(1e-3, gt=0.0, le=10.0, title="Learning rate",
        description="Peak learning rate of AdamW, reached after the warm-up, then decayed along a cosine")
    weight_decay: float = Field(
        0.05, ge=0.0, le=10.0, title="AdamW weight decay", json_schema_extra=ADVANCED,
        description="Decoupled weight decay of the optimizer")
    warmup_steps: int = Field(
        50, ge=0, le=limits.MAX_WARMUP_STEPS, title="Learning-rate warm-up steps", json_schema_extra=ADVANCED,
        description="Optimizer steps over which the learning rate rises to its peak")
    model: BDHModelSpec = Field(default_factory=BDHModelSpec, title="Architecture",
        description="The size of the BDH network")
    compile: Literal["off", "default", "max-autotune"] = Field(
        "off", title="Compilation", json_schema_extra=ADVANCED,
        description="torch.compile mode: faster steps after a slower start; 'off' runs eagerly")
    precision: Literal["auto", "fp32", "fp16", "bf16"] = Field(
        "auto", title="Numeric precision", json_schema_extra=ADVANCED,
        description="Floating-point format of training; 'auto' picks what suits the device")
    deterministic: bool = Field(False, title="Deterministic kernels", json_schema_extra=ADVANCED,
        description="Bit-for-bit repeatable runs (slower on GPUs)")
    seed: int = Field(0, ge=0, le=limits.MAX_SEED, title="Random seed", json_schema_extra=ADVANCED,
        description="Seed of the initialisation, the data order and the augmentation")
    resume_from: str | None = Field(
        None, max_length=limits.MAX_JOB_ID_LENGTH, title="Continue from job", json_schema_extra=ADVANCED,
        description=("Id of an earlier BDH training job whose checkpoint to continue (same settings; only the epochs "
                     "may grow)"))
    keep_checkpoints: Literal["last_best", "all"] = Field(
        "last_best", title="Checkpoints kept", json_schema_extra=ADVANCED,
        description=("'last_best': the resumable last checkpoint and the best weights; 'all': the weights of every "
                     "epoch too"))
    val_fraction: float = Field(
        0.1, gt=0.0, lt=1.0, title="Validation share", json_schema_extra=ADVANCED,
        description="Share of the training images held out to pick the best epoch")
    max_train_samples: int | None = Field(
        None, ge=1, le=limits.MAX_TRAIN_SAMPLES, title="Training images cap", json_schema_extra=ADVANCED,
        description="Train on at most this many images (for a quick trial); empty: all")
    augment: bool = Field(True, title="Augment images", json_schema_extra=ADVANCED,
        description="Random resized crops (0.8-1.0) and, except for digits, horizontal flips")
    num_workers: int | None = Field(
        None, ge=0, le=limits.MAX_DATA_WORKERS, title="Data-loading processes", json_schema_extra=ADVANCED,
        description="DataLoader workers; by default 4 on a GPU, 0 on CPU")
    register_as: str | None = Field(
        None, max_length=limits.MAX_NAME_LENGTH, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$", title="Register model as",
        description="Name of the best model in the registry; by default bdh-<label or dataset>-<first 8 characters of the job id>")


def cifar_marker(dataset: str, directory: Path) -> Path | None:
    """The directory holding the batches (``directory`` or its official sub-directory), or None."""
    name, marker = CIFAR_DIRS[dataset]
    for cand in (directory, directory / name):
        if (cand / marker).is_file():
            return cand
    return None


def checkpoint_key(job_id: str) -> str:
    """The store key of a train/bdh job's resumable checkpoint (published at every epoch)."""
    return artifacts_key(job_id, "checkpoints", "last")


def cifar_dir(settings: Settings, dataset: str, data_dir: str | None, owner: str) -> Path:
    """The directory holding ``dataset``'s python batches: ``data_dir`` as :mod:`core.dataset_refs` resolves it for
    ``owner`` (a registered ``image_classification`` dataset or a directory under the data roots), else the official
    directory name under the data roots. Every entry must be a regular file inside the roots. FieldError on
    ``data_dir`` otherwise; messages name directories relative to the data roots."""
    name, marker = CIFAR_DIRS[dataset]
    loc = ("body", "data_dir")
    if data_dir:
        ref = dataset_refs.resolve(settings, data_dir, owner, "image_classification", field="data_dir")
        directory = dataset_refs.local_dir(settings, ref, data_dir, field="data_dir")
    else:
        try:
            directory = resolve_data_path(settings, name, must_exist=False)
        except PathError as exc:
            raise FieldError(loc, str(exc), value=data_dir) from None
    found = cifar_marker(dataset, directory)
    if found is None:
        raise FieldError(loc, f"{dataset} not found in {display(settings, directory)!r}: extract the official python "
                         f"version ({name}.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html) into a data root "
                         f"so that {name}/{marker} exists there, or pass data_dir", value=data_dir)
    try:
        check_tree(settings, found)
    except UserFileError as exc:
        raise FieldError(loc, str(exc), value=data_dir) from None
    return found


def check_memory(req: TrainBDHRequest, settings: Settings) -> None:
    """The model and one step's activations at ``batch_size`` fit ``EXPLAINQ_WORKER_MEMORY_BYTES``."""
    m = req.model
    est = memory.bdh_training(m.n_layer, m.n_embd, m.n_head, m.mlp_multiplier, m.cls_token,
                              NUM_CLASSES[req.dataset], req.batch_size)
    sizes = [("model.n_embd", m.n_embd), ("model.mlp_multiplier", m.mlp_multiplier)]
    acts = [("batch_size", req.batch_size), ("model.n_layer", m.n_layer)]
    fields = sizes + acts if est.parameter_bytes > est.activation_bytes else acts + sizes
    what = (f"Vision-BDH with n_layer {m.n_layer}, n_embd {m.n_embd}, n_head {m.n_head} and mlp_multiplier "
            f"{m.mlp_multiplier} at batch_size {req.batch_size}")
    memory.check_budget(settings, est, fields, what)


def validate(req: TrainBDHRequest, settings: Settings, owner: str = "system") -> None:
    """Data directory inside the data roots and complete; resume_from names a job with a checkpoint; the model
    fits a worker."""
    if req.register_as is not None:
        refuse_reserved(req.register_as, owner, "register_as")
    check_memory(req, settings)
    if req.dataset == "digits":
        if req.data_dir is not None:
            raise FieldError(("body", "data_dir"), "digits is bundled with scikit-learn; omit data_dir",
                             value=req.data_dir)
    else:
        cifar_dir(settings, req.dataset, req.data_dir, owner)
    if req.register_as is not None:
        require_name_free(settings, req.register_as, owner, "register_as")
    if req.resume_from is not None:
        check_resume_from(settings, req.resume_from, owner)


def check_resume_from(settings: Settings, job_id: str, owner: str) -> None:
    """``resume_from`` names one of the caller's own train/bdh jobs that has a checkpoint in the store.
    Another owner's job answers 404, exactly as an unknown one (its existence is private)."""
    loc = ("body", "resume_from")
    if not valid_job_id(job_id):
        raise FieldError(loc, "not a job id", value=job_id)
    record = owner_record(settings, job_id)
    if not owns(record, owner):
        raise FieldNotFound(loc, f"no job {job_id!r} of yours with files to resume from", value=job_id)
    if record.get("kind") not in (None, "train_bdh"):
        raise FieldError(loc, f"job {job_id!r} is a {record['kind']} job, not train_bdh", value=job_id)
    if not get_store(settings).exists(f"{checkpoint_key(job_id)}/trainer_state.pt"):
        raise FieldError(loc, f"job {job_id!r} has no checkpoint to resume from (it stopped before its first "
                         "epoch ended)", value=job_id)


# Training images before the validation split: digits keeps a fixed 20% of its 1,797 images for testing
# (models/vision/data.py), CIFAR-10 and CIFAR-100 have 50,000 training images.
TRAIN_IMAGES = {"digits": 1797 - round(0.2 * 1797), "cifar10": 50_000, "cifar100": 50_000}


def training_size(req: TrainBDHRequest, settings: Settings, owner: str = "system") -> TrainingSize:
    """Images per epoch: the training images less the validation share (as models/vision/data.py splits them),
    at most ``max_train_samples``."""
    total = TRAIN_IMAGES[req.dataset]
    per_epoch = total - max(1, round(req.val_fraction * total))
    if req.max_train_samples is not None:
        per_epoch = min(per_epoch, req.max_train_samples)
    return TrainingSize("images", per_epoch, req.epochs, req.batch_size * req.grad_accum_steps)


register(JobKind(
    name="train_bdh",
    route="/train/bdh",
    request=TrainBDHRequest,
    queue="train",
    func="workers.jobs.train_bdh:run",
    timeout_s=48 * 3600,
    result_ttl_s=30 * 24 * 3600,
    summary="Train a Vision-BDH image classifier (digits, CIFAR-10/100) with checkpoints and resume",
    title="Train Vision-BDH",
    estimate=training_size,
    renderer="training",
    result=TrainBDHResult,
    live_rows="history",
    charts=(
        STEPS_CHART,
        {"id": "loss", "title": "Loss", "series": [["train_loss", "train loss"], ["val_loss", "validation loss"]]},
        {"id": "acc", "title": "Accuracy", "series": [["train_accuracy", "train accuracy"],
                                                     ["val_accuracy", "validation accuracy"]]},
    ),
    validate=validate,
    recheck=True,
    tags=("training", "vision"),
))
