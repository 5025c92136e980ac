"""Train an exported classifier from its own weights, through the service's interpreter, and write it back.

An exported program is a function of its weights: :func:`train` marks the program's *parameters* (the signature's
``parameter`` inputs; buffers such as batch-norm statistics stay as exported, the program being in eval mode) as
trainable and minimises the cross-entropy of its logits on a ``tensors`` dataset (:func:`read_split`) with SGD
(momentum) or Adam, in a seeded order, keeping a checkpoint every ``checkpoint_every`` epochs. :func:`write_program`
writes the trained weights into a copy of the archive (the program's JSON unchanged; each weight's bytes laid out
as its recorded sizes, strides and offset say), so the result is an archive like the one imported and loads the
same way. Training through the interpreter equals training the eager model the program was exported from
(``tests/test_export_train.py``: the weights after two epochs, element-wise).
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from models.export.files import LOCAL, FileAccess, Payload
from models.export.program import PROGRAM_FILE, SPEC_FILE, TORCH_DTYPES, ExportedClassifier
from models.training import Trained, TrainOptions, optimizer, run_epochs

__all__ = ["Split", "Trained", "TrainOptions", "accuracy", "read_split", "save_model", "train", "write_program"]

CHECKPOINTS_FILE = "checkpoints.json"
CHECKPOINT_DIR = "checkpoints"


@dataclass
class Split:
    inputs: torch.Tensor   # [N, *shape] float32
    labels: torch.Tensor   # [N] int64


def read_split(path: Path, files: FileAccess = LOCAL) -> Split:
    """``inputs`` and ``labels`` of a ``tensors`` dataset's split file (safetensors: no pickle)."""
    from safetensors.torch import load as load_safetensors

    with files.open(Path(path), "safetensors") as fh:
        tensors = load_safetensors(fh.read())
    x, y = tensors.get("inputs"), tensors.get("labels")
    if x is None or y is None or y.ndim != 1 or x.shape[0] != y.shape[0] or not x.is_floating_point():
        raise ValueError(f"{files.display(Path(path))} must hold floating-point inputs [N, ...] and integer labels [N]")
    return Split(x.float(), y.long())


def parameters(clf: ExportedClassifier) -> dict[str, torch.Tensor]:
    """The program's parameters: fqn -> the tensor the interpreter runs with."""
    return {fqn: clf.program.state_tensor(name) for name, (kind, fqn) in clf.info.state.items()
            if kind == "parameter"}


def trainable(clf: ExportedClassifier) -> dict[str, torch.Tensor]:
    """:func:`parameters`, made trainable."""
    params = parameters(clf)
    for t in params.values():
        t.requires_grad_(True)
    return params


def accuracy(clf: ExportedClassifier, split: Split, batch: int = 512) -> float:
    if split.labels.numel() == 0:
        return float("nan")
    pred = clf.logits(split.inputs, batch).argmax(1)
    return float((pred == split.labels).float().mean())


def train(clf: ExportedClassifier, data: Split, opts: TrainOptions, valid: Split | None = None,
          progress: Callable[[int, int, dict[str, float]], None] | None = None) -> Trained:
    """Train ``clf``'s parameters in place; the checkpoints hold detached copies of them."""
    n_classes = len(clf.labels)
    if int(data.labels.min()) < 0 or int(data.labels.max()) >= n_classes:
        raise ValueError(f"labels must be class indices 0..{n_classes - 1} of the model's {n_classes} classes")
    params = trainable(clf)
    if not params:
        raise ValueError("the program has no parameters to train")
    optim = optimizer(params.values(), opts)
    device = clf.device

    def loss_of(idx: torch.Tensor) -> torch.Tensor:
        x, y = data.inputs[idx].to(device), data.labels[idx].to(device)
        return torch.nn.functional.cross_entropy(clf.forward(x).float(), y)

    def scores() -> dict[str, float]:
        row = {"train_accuracy": accuracy(clf, data)}
        if valid is not None:
            row["valid_accuracy"] = accuracy(clf, valid)
        return row

    out = run_epochs(opts, data.labels.shape[0], loss_of, optim, scores, progress,
                     on_checkpoint=lambda epoch, lr: {k: v.detach().clone().cpu() for k, v in params.items()})
    for t in params.values():
        t.requires_grad_(False)
    return out


def _layout(p: Payload, tensor: torch.Tensor, storage: torch.Tensor) -> None:
    torch.as_strided(storage, p.sizes, p.strides, p.offset).copy_(tensor.to(storage.dtype))


def write_program(src: Path, dst: Path, info: Any, weights: dict[str, torch.Tensor]) -> Path:
    """A copy of the archive ``src`` (checked: ``info``) with the weights named in ``weights`` replaced."""
    by_path: dict[str, list[tuple[Payload, torch.Tensor]]] = {}
    for fqn, t in weights.items():
        p = info.weights[fqn]
        by_path.setdefault(p.path, []).append((p, t.detach().cpu()))
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename in by_path:
                first = by_path[item.filename][0][0]
                dtype = TORCH_DTYPES[first.dtype]
                storage = torch.frombuffer(bytearray(data), dtype=dtype).clone() if data else torch.empty(0, dtype=dtype)
                for p, t in by_path[item.filename]:
                    _layout(p, t, storage)
                data = storage.numpy().tobytes()
            zout.writestr(item, data)
    return dst


def save_model(out: Path, clf: ExportedClassifier, trained: Trained) -> list[dict[str, Any]]:
    """The model directory of a trained classifier: ``model.pt2`` (the final weights), ``spec.json``, and each
    checkpoint as ``checkpoints/epoch-<k>.pt2`` listed in ``checkpoints.json`` with its epoch and learning rate
    (the data-attribution estimators sum over them). Returns that list."""
    out.mkdir(parents=True, exist_ok=True)
    (out / CHECKPOINT_DIR).mkdir(exist_ok=True)
    write_program(clf.path, out / PROGRAM_FILE, clf.info, parameters(clf))
    (out / SPEC_FILE).write_text(json.dumps(clf.spec.to_json()))
    listed = []
    for epoch, lr, weights in trained.checkpoints:
        name = f"{CHECKPOINT_DIR}/epoch-{epoch}.pt2"
        write_program(clf.path, out / name, clf.info, weights)
        listed.append({"file": name, "epoch": epoch, "lr": lr})
    (out / CHECKPOINTS_FILE).write_text(json.dumps(listed))
    return listed
