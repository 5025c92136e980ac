"""``POST /train/news``: train an NRMS or NAML news recommender on MIND-format data, register it by name.

API side only (no torch): the request schema and the checks that need the registry or the data roots.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from core import dataset_refs, limits, registry
from core.contract.charts import STEPS_CHART
from core.contract.checks import refuse_reserved, require_new_name
from core.contract.errors import FieldError
from core.contract.fields import ADVANCED, JobRequest
from core.contract.kind import JobKind, register
from core.contract.results.training import TrainNewsResult
from core.estimates import TrainingSize
from core.settings import Settings
from core.userfiles import PathError, UserFileError, UserFiles, check_tree, resolve_data_path
from models.news.data import has_split

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
SPLITS = ("train", "valid", "test")


class TrainNewsRequest(JobRequest):
    name: str = Field(..., max_length=limits.MAX_NAME_LENGTH, pattern=NAME_PATTERN, title="Model name",
        description="Name to register the trained model under")
    architecture: Literal["nrms", "naml"] = Field("nrms", title="Recommender architecture",
        description="NRMS (self-attention over titles) or NAML (CNNs over title and body)")
    encoder: Literal["minilm", "pretrained", "word"] = Field("minilm", title="Title encoder",
        description=("'minilm' (shipped), 'pretrained' (a BERT-family directory under the data roots: BERT, "
                     "RoBERTa, DeBERTa), or 'word' embeddings (from scratch or from a GloVe file). NAML uses 'word'"))
    pretrained_path: str | None = Field(
        None, min_length=1, max_length=limits.MAX_PATH_LENGTH, title="Pretrained encoder directory", json_schema_extra=ADVANCED,
        description="For the 'pretrained' encoder: its directory under the data roots")
    fine_tune_layers: int = Field(
        0, ge=0, le=limits.MAX_FINE_TUNE_LAYERS, title="Fine-tuned transformer layers", json_schema_extra=ADVANCED,
        description="Train the last this many transformer layers (0: frozen)")
    glove_path: str | None = Field(
        None, min_length=1, max_length=limits.MAX_PATH_LENGTH, title="GloVe vectors file", json_schema_extra=ADVANCED,
        description=("For the 'word' encoder: a GloVe text file under the data roots whose size is the word-embedding "
                     "size"))
    embedding_dim: int = Field(
        128, ge=4, le=limits.MAX_NEWS_EMBEDDING_DIM, title="Word-embedding size", json_schema_extra=ADVANCED,
        description="Size of the word embeddings (the 'word' encoder)")
    heads: int = Field(
        16, ge=1, le=limits.MAX_NEWS_HEADS, title="NRMS attention heads", json_schema_extra=ADVANCED,
        description="Attention heads of NRMS")
    head_dim: int = Field(
        16, ge=1, le=limits.MAX_NEWS_HEAD_DIM, title="NRMS size per head", json_schema_extra=ADVANCED,
        description="Size of each NRMS attention head")
    query_dim: int = Field(
        200, ge=1, le=limits.MAX_NEWS_EMBEDDING_DIM, title="Attention query size", json_schema_extra=ADVANCED,
        description="Size of the additive-attention query")
    filters: int = Field(
        256, ge=1, le=limits.MAX_NEWS_FILTERS, title="NAML CNN filters", json_schema_extra=ADVANCED,
        description="Filters of NAML's CNNs")
    window: int = Field(
        3, ge=1, le=limits.MAX_NEWS_WINDOW, title="NAML CNN window", json_schema_extra=ADVANCED,
        description="Window of NAML's CNNs, in words")
    dropout: float = Field(0.2, ge=0, lt=1, title="Dropout rate", json_schema_extra=ADVANCED,
        description="Share of activations dropped while training")
    dataset: str = Field(..., min_length=1, max_length=limits.MAX_PATH_LENGTH, title="News dataset",
        description=("A registered news dataset, a directory under the data roots holding {train,valid}/ MIND "
                     "splits or pairs_{split}.csv, or one pairwise CSV file (training only: leave the validation "
                     "split empty)"))
    train_split: Literal[SPLITS] = Field(
        "train", title="Training split", json_schema_extra=ADVANCED,
        description="The split trained on")  # type: ignore[valid-type]
    valid_split: Literal[SPLITS] | None = Field(
        "valid", title="Validation split", json_schema_extra=ADVANCED,
        description="The split scored after each epoch; empty: none")  # type: ignore[valid-type]
    npratio: int = Field(
        4, ge=1, le=limits.MAX_NPRATIO, title="Negatives per click", json_schema_extra=ADVANCED,
        description=("Non-clicked candidates per click, drawn without replacement from its impression (with "
                     "replacement only when it has fewer)"))
    max_title_len: int = Field(
        30, ge=1, le=limits.MAX_TITLE_TOKENS, title="Title tokens", json_schema_extra=ADVANCED,
        description="Tokens of each title the model reads")
    max_body_len: int = Field(
        60, ge=1, le=limits.MAX_BODY_TOKENS, title="Body tokens (NAML)", json_schema_extra=ADVANCED,
        description="Tokens of each body NAML reads")
    max_history: int = Field(
        50, ge=1, le=limits.MAX_HISTORY, title="History titles read", json_schema_extra=ADVANCED,
        description="How many of the most recent history titles the model reads")
    epochs: int = Field(3, ge=1, le=limits.MAX_EPOCHS, title="Training epochs",
        description="Passes over the training impressions")
    lr: float = Field(1e-3, gt=0, le=1, title="Learning rate", description="Adam's learning rate")
    batch_size: int = Field(
        32, ge=1, le=limits.MAX_NEWS_BATCH_SIZE, title="Clicks per batch", json_schema_extra=ADVANCED,
        description="Clicked impressions per optimizer step")
    seed: int = Field(0, ge=0, le=limits.MAX_SEED, title="Random seed", json_schema_extra=ADVANCED,
        description="Seed of the initialisation, the negatives and the data order")
    precision: Literal["auto", "fp32", "fp16", "bf16"] = Field(
        "auto", title="Numeric precision", json_schema_extra=ADVANCED,
        description="Floating-point format of training; 'auto' picks what suits the device")
    resume: bool = Field(False, title="Continue my last run", json_schema_extra=ADVANCED,
        description=("Continue your latest checkpointed run of this name: the architecture must equal the "
                     "checkpoint's (else the job fails with resume_mismatch); the epochs, learning rate, batch "
                     "size, negatives, history, seed, precision, dataset and splits may change"))
    overwrite: bool = Field(False, title="Replace my model",
        description="Replace your existing model of the same name")


def resolve_news_dataset(settings: Settings, name: str, owner: str, field: str = "dataset") -> Path:
    """The directory of the ``news`` dataset ``name`` names for ``owner`` (:mod:`core.dataset_refs`)."""
    ref = dataset_refs.resolve(settings, name, owner, "news", field=field)
    return dataset_refs.local_dir(settings, ref, name, field=field)


def data_file(settings: Settings, raw: str, field: str, fmt: str | None = None) -> Path:
    """A file (``fmt`` given: a regular file readable under that format's cap) or directory (``fmt`` None: checked
    whole, every entry inside the roots) that a request names under the data roots; FieldError on ``field``."""
    try:
        path = resolve_data_path(settings, raw)
        if fmt is None:
            check_tree(settings, path)
        else:
            UserFiles(settings).open(path, fmt).close()
    except (PathError, UserFileError) as exc:
        raise FieldError(("body", field), str(exc), value=raw) from None
    return path


def check_tokens(req: TrainNewsRequest) -> None:
    """The tokens one training step encodes stay within ``MAX_NEWS_TOKENS_PER_BATCH``."""
    per_title = req.max_title_len + (req.max_body_len if req.architecture == "naml" else 0)
    tokens = req.batch_size * (req.max_history + 1 + req.npratio) * per_title
    if tokens > limits.MAX_NEWS_TOKENS_PER_BATCH:
        related = [(("body", f), getattr(req, f)) for f in ("max_history", "npratio", "max_title_len")]
        if req.architecture == "naml":
            related.append((("body", "max_body_len"), req.max_body_len))
        raise FieldError(("body", "batch_size"), f"one step would encode {tokens:,} tokens (batch_size x "
                         "(max_history + 1 + npratio) x tokens per news), more than "
                         f"{limits.MAX_NEWS_TOKENS_PER_BATCH:,}; lower batch_size or the lengths",
                         value=req.batch_size, related=related)


def validate(req: TrainNewsRequest, settings: Settings, owner: str = "system") -> None:
    refuse_reserved(req.name, owner, "name")
    check_tokens(req)
    root = resolve_news_dataset(settings, req.dataset, owner)
    for field in ("train_split", "valid_split"):
        split = getattr(req, field)
        if split is not None and not has_split(root, split):
            raise FieldError(("body", field), f"dataset {req.dataset!r} has no {split}/behaviors.tsv nor "
                             f"pairs_{split}.csv", value=split)
    if req.architecture == "naml" and req.encoder != "word":
        raise FieldError(("body", "encoder"), "NAML reads word embeddings: use encoder 'word'", value=req.encoder)
    if req.encoder == "pretrained":
        if req.pretrained_path is None:
            raise FieldError(("body", "pretrained_path"), "encoder 'pretrained' needs pretrained_path", value=None)
        path = data_file(settings, req.pretrained_path, "pretrained_path")
        if not (path / "config.json").is_file() or not (path / "tokenizer.json").is_file():
            raise FieldError(("body", "pretrained_path"), f"{req.pretrained_path!r} needs config.json and a fast "
                             "tokenizer (tokenizer.json), as written by save_pretrained", value=req.pretrained_path)
    elif req.pretrained_path is not None:
        raise FieldError(("body", "pretrained_path"), "pretrained_path is for encoder 'pretrained'",
                         value=req.pretrained_path)
    if req.fine_tune_layers and req.encoder == "word":
        raise FieldError(("body", "fine_tune_layers"), "fine_tune_layers is for transformer encoders",
                         value=req.fine_tune_layers)
    if req.glove_path is not None:
        if req.encoder != "word":
            raise FieldError(("body", "glove_path"), "glove_path is for encoder 'word'", value=req.glove_path)
        data_file(settings, req.glove_path, "glove_path", "embeddings")
    require_new_name(settings, req.name, owner, "news", req.overwrite or req.resume)

def training_size(req: TrainNewsRequest, settings: Settings, owner: str = "system") -> TrainingSize | None:
    """Impressions per epoch: the training split's behaviour rows (or CSV rows) in the registered dataset's
    counts; None when the dataset is not registered with them."""
    entry = registry.get_dataset(settings, req.dataset)
    split = ((entry or {}).get("meta", {}).get("counts") or {}).get(req.train_split)
    rows = split.get("impressions", split.get("rows")) if isinstance(split, dict) else None
    if not isinstance(rows, int):
        return None
    return TrainingSize("impressions", rows, req.epochs, req.batch_size)


register(JobKind(
    name="train_news",
    route="/train/news",
    request=TrainNewsRequest,
    queue="train",
    func="workers.jobs.train_news:run",
    timeout_s=24 * 3600,
    summary="Train an NRMS or NAML news recommender (MIND metrics per epoch, checkpoints, resume); registers it",
    title="Train a news recommender",
    estimate=training_size,
    renderer="training",
    result=TrainNewsResult,
    live_rows="history",
    charts=(
        STEPS_CHART,
        {"id": "loss", "title": "Loss", "series": [["loss", "train loss"]]},
        {"id": "valid", "title": "Validation AUC / MRR / nDCG@10", "series": [
            ["valid_auc", "AUC"], ["valid_mrr", "MRR"], ["valid_ndcg@10", "nDCG@10"]]},
    ),
    validate=validate,
    recheck=True,
))
