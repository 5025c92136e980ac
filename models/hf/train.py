"""Fine-tune a Hugging Face sequence classifier on a text dataset, and write it back as a checkpoint directory.

The model is the job's own copy (:func:`models.hf.checkpoint.load` with ``trainable=True``); every parameter is
trained. Texts are tokenized once (truncated to ``max_length`` tokens) and batched in a seeded order, each batch
padded to its longest text with the attention mask (the tokenizer's own ``pad``), so a padded batch computes what
its texts would alone (``tests/test_hf_train.py``: one step on a padded batch equals the mean of the texts'
unpadded gradients, element-wise). The loss is the cross-entropy of the logits; dropout draws from a seed per
epoch, so a run is reproducible whatever ran before it in the worker. A checkpoint is written every
``checkpoint_every`` epochs as ``checkpoints/epoch-<k>.safetensors`` (the model's tensors) and listed in
``checkpoints.json`` with its epoch and learning rate; the final model is saved with ``save_pretrained``
(safetensors) next to the tokenizer files it was loaded with, so the result is a checkpoint like any imported one.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from models.hf.checkpoint import HFClassifier
from models.textdata import TextSplit, label_indices
from models.training import Trained, TrainOptions, optimizer, run_epochs

CHECKPOINTS_FILE = "checkpoints.json"
CHECKPOINT_DIR = "checkpoints"
EVAL_BATCH = 64


class Encoded:
    """A split tokenized once: per text its encoding (``input_ids``, ``attention_mask``, and ``token_type_ids``
    where the tokenizer makes them), and the class index of each label."""

    def __init__(self, clf: HFClassifier, split: TextSplit, max_length: int, name: str = "split"):
        labels, bad = label_indices(split.labels, clf.labels)
        if labels is None:
            raise ValueError(f"{name}: the labels {bad} are neither class names of the model ({clf.labels[:8]}) nor "
                             f"class indices 0..{len(clf.labels) - 1}")
        enc = clf.tokenizer(split.texts, truncation=True, max_length=max_length)
        keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc]
        self.rows: list[dict[str, list[int]]] = [{k: enc[k][i] for k in keys} for i in range(len(split.texts))]
        self.labels = torch.tensor(labels, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, clf: HFClassifier, idx: list[int]) -> dict[str, torch.Tensor]:
        if len(idx) > 1 and clf.tokenizer.pad_token is None:
            raise ValueError("the tokenizer has no pad token, so texts cannot be batched: train with batch_size 1, "
                             "or save the tokenizer with a pad token (tokenizer.pad_token = tokenizer.eos_token)")
        padded = clf.tokenizer.pad([self.rows[i] for i in idx], return_tensors="pt")
        return {k: v.to(clf.device) for k, v in padded.items()}


def logits(clf: HFClassifier, data: Encoded, batch: int = EVAL_BATCH) -> torch.Tensor:
    was = clf.model.training
    clf.model.eval()
    out = []
    with torch.no_grad():
        for s in range(0, len(data), batch):
            out.append(clf.model(**data.batch(clf, list(range(s, min(s + batch, len(data)))))).logits.float().cpu())
    clf.model.train(was)
    return torch.cat(out) if out else torch.empty(0, len(clf.labels))


def accuracy(clf: HFClassifier, data: Encoded) -> float:
    if len(data) == 0:
        return float("nan")
    return float((logits(clf, data).argmax(1) == data.labels).float().mean())


def train(clf: HFClassifier, data: Encoded, opts: TrainOptions, valid: Encoded | None = None,
          progress: Callable[[int, int, dict[str, float]], None] | None = None,
          on_checkpoint: Callable[[int, float], Any] | None = None) -> Trained:
    """Fine-tune ``clf`` in place; ``on_checkpoint(epoch, lr)`` is called when a checkpoint is due (it writes it;
    its return value is kept in the record's checkpoints)."""
    params = [p for p in clf.model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters (load it with trainable=True)")
    optim = optimizer(params, opts)

    def start(epoch: int) -> None:
        torch.manual_seed(opts.seed * 1000 + epoch)  # dropout: reproducible whatever ran before in this process
        clf.model.train()

    def loss_of(idx: torch.Tensor) -> torch.Tensor:
        rows = idx.tolist()
        y = data.labels[idx].to(clf.device)
        return torch.nn.functional.cross_entropy(clf.model(**data.batch(clf, rows)).logits.float(), y)

    def scores() -> dict[str, float]:
        row = {"train_accuracy": accuracy(clf, data)}
        if valid is not None:
            row["valid_accuracy"] = accuracy(clf, valid)
        return row

    try:
        return run_epochs(opts, len(data), loss_of, optim, scores, progress, on_checkpoint, on_epoch_start=start)
    finally:
        clf.model.eval()


def write_checkpoint(clf: HFClassifier, out: Path, epoch: int) -> str:
    """The model's tensors now, as ``checkpoints/epoch-<epoch>.safetensors`` under ``out``; returns that name."""
    from safetensors.torch import save_model

    name = f"{CHECKPOINT_DIR}/epoch-{epoch}.safetensors"
    (out / CHECKPOINT_DIR).mkdir(parents=True, exist_ok=True)
    save_model(clf.model, str(out / name))
    return name


def save_model(out: Path, clf: HFClassifier, trained: Trained) -> list[dict[str, Any]]:
    """The model directory of a fine-tuned classifier: ``config.json`` and ``model.safetensors``
    (``save_pretrained``), the tokenizer files it was loaded with, and ``checkpoints.json`` listing the checkpoints
    (written during training by :func:`write_checkpoint`). Returns that list."""
    from models.hf.files import TOKENIZER, TOKENIZER_FILES

    out.mkdir(parents=True, exist_ok=True)
    clf.model.save_pretrained(out, safe_serialization=True)
    for name in (TOKENIZER, *TOKENIZER_FILES):
        if (clf.path / name).is_file():
            shutil.copyfile(clf.path / name, out / name)
    listed = [{"file": file, "epoch": epoch, "lr": lr} for epoch, lr, file in trained.checkpoints if file]
    (out / CHECKPOINTS_FILE).write_text(json.dumps(listed))
    return listed
