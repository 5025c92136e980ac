"""``POST /train/news``: train an NRMS or NAML news recommender on MIND-format data, register it by name.

API side only (no torch): the request schema and the checks that need the registry or the data roots.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from core import dataset_refs, limits
from core.kinds.base import FieldError, JobKind, JobRequest, register, require_new_name
from core.settings import Settings
from core.userfiles import PathError, UserFileError, UserFiles, check_tree, resolve_data_path
from models.news.data import has_split

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
SPLITS = ("train", "valid", "test")


class TrainNewsRequest(JobRequest):
    name: str = Field(..., max_length=limits.MAX_NAME_LENGTH, pattern=NAME_PATTERN,
                      description="name to register the trained model under")
    architecture: Literal["nrms", "naml"] = "nrms"
    encoder: Literal["minilm", "pretrained", "word"] = Field(
        "minilm", description="'minilm' (shipped), 'pretrained' (a BERT-family directory under the data roots: "
        "BERT, RoBERTa, DeBERTa), or 'word' embeddings (from scratch or from glove_path). NAML uses 'word'.")
    pretrained_path: str | None = Field(None, min_length=1, max_length=limits.MAX_PATH_LENGTH,
                                        description="encoder 'pretrained': its directory")
    fine_tune_layers: int = Field(0, ge=0, le=limits.MAX_FINE_TUNE_LAYERS,
                                  description="train the last k transformer layers (0: frozen)")
    glove_path: str | None = Field(None, min_length=1, max_length=limits.MAX_PATH_LENGTH, description="encoder "
                                   "'word': a GloVe-format text file under the data roots whose dimension is "
                                   "embedding_dim")
    embedding_dim: int = Field(128, ge=4, le=limits.MAX_NEWS_EMBEDDING_DIM,
                               description="word-embedding size (encoder 'word')")
    heads: int = Field(16, ge=1, le=limits.MAX_NEWS_HEADS, description="NRMS attention heads")
    head_dim: int = Field(16, ge=1, le=limits.MAX_NEWS_HEAD_DIM, description="NRMS size per head")
    query_dim: int = Field(200, ge=1, le=limits.MAX_NEWS_EMBEDDING_DIM, description="additive-attention query size")
    filters: int = Field(256, ge=1, le=limits.MAX_NEWS_FILTERS, description="NAML CNN filters")
    window: int = Field(3, ge=1, le=limits.MAX_NEWS_WINDOW, description="NAML CNN window")
    dropout: float = Field(0.2, ge=0, lt=1)
    dataset: str = Field(..., min_length=1, max_length=limits.MAX_PATH_LENGTH, description="a registered news dataset, a "
                         "directory under the data roots holding {train,valid}/ MIND splits or pairs_{split}.csv, "
                         "or one pairwise CSV file (training only: set valid_split to null)")
    train_split: Literal[SPLITS] = "train"  # type: ignore[valid-type]
    valid_split: Literal[SPLITS] | None = Field("valid", description="metrics per epoch; null: none")  # type: ignore[valid-type]
    npratio: int = Field(4, ge=1, le=limits.MAX_NPRATIO, description="non-clicked candidates per click, drawn without "
                         "replacement from its impression (with replacement only when it has fewer)")
    max_title_len: int = Field(30, ge=1, le=limits.MAX_TITLE_TOKENS)
    max_body_len: int = Field(60, ge=1, le=limits.MAX_BODY_TOKENS, description="NAML body tokens")
    max_history: int = Field(50, ge=1, le=limits.MAX_HISTORY)
    epochs: int = Field(3, ge=1, le=limits.MAX_EPOCHS)
    lr: float = Field(1e-3, gt=0, le=1)
    batch_size: int = Field(32, ge=1, le=limits.MAX_NEWS_BATCH_SIZE)
    seed: int = Field(0, ge=0, le=limits.MAX_SEED)
    precision: Literal["auto", "fp32", "fp16", "bf16"] = "auto"
    resume: bool = Field(False, description="continue your latest checkpointed run of this name: the model fields "
                         "must equal the checkpoint's (else the job fails with resume_mismatch); epochs, lr, "
                         "batch_size, npratio, max_history, seed, precision and the dataset and splits may change "
                         "(listed in the result's resume.changed)")
    overwrite: bool = Field(False, description="replace your existing model of the same name")


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

register(JobKind(
    name="train_news",
    route="/train/news",
    request=TrainNewsRequest,
    queue="train",
    func="workers.jobs.train_news:run",
    timeout_s=24 * 3600,
    summary="Train an NRMS or NAML news recommender (MIND metrics per epoch, checkpoints, resume); registers it",
    title="Train a news recommender",
    validate=validate,
))
