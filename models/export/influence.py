"""TracIn-CP for exported classifiers: which training examples pushed a prediction up or down, and which are
suspect (self-influence), from the checkpoints ``POST /train/classifier`` kept.

The program becomes an ``nn.Module`` whose parameters are the program's (:class:`ProgramModule`), so the generic
engine (:class:`models.explain.tracin.TracIn` over :class:`models.explain.tracin.FuncGradients`: per-example
gradients by ``torch.func``) runs on it unchanged. An example is one row ``[input values..., label]``
(:func:`rows`); its loss is the cross-entropy of the program's logits for that label (the training loss, so a
proponent is a training example whose gradient step lowered the test example's loss). Checkpoints are the archives
listed in ``checkpoints.json``, each weighted by the learning rate stored with it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from models.explain.gradients import classification_margin
from models.explain.tracin import MemoryCheckpoint
from models.export.program import SPEC_FILE, ExportedClassifier, build

CHECKPOINTS_FILE = "checkpoints.json"


def _safe(fqn: str) -> str:
    return fqn.replace(".", "__")


class ProgramModule(nn.Module):
    """An exported classifier as a module: its program's parameters are this module's parameters (named by their
    fully qualified names, dots as ``__``), its buffers and constants stay the program's."""

    def __init__(self, clf: ExportedClassifier):
        super().__init__()
        self.program = clf.program
        self.shape = tuple(clf.spec.shape)
        self._slots: dict[str, str] = {}
        for name, (kind, fqn) in clf.info.state.items():
            if kind == "parameter":
                self.register_parameter(_safe(fqn), nn.Parameter(clf.program.state_tensor(name).detach().clone()))
                self._slots[_safe(fqn)] = self.program._slot[name]
        for p in self.program.parameters():
            p.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.program, {slot: getattr(self, safe) for safe, slot in self._slots.items()}, (x,))

    def state_of(self, clf: ExportedClassifier) -> dict[str, torch.Tensor]:
        """``clf``'s parameters under this module's names (a checkpoint of the same program)."""
        return {_safe(fqn): clf.program.state_tensor(name).detach().clone()
                for name, (kind, fqn) in clf.info.state.items() if kind == "parameter"}


def rows(inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Examples as the engine takes them: ``[N, D + 1]``, the flattened input and the class index last."""
    return torch.cat([inputs.reshape(len(inputs), -1).float(), labels.reshape(-1, 1).float()], 1)


def loss_of(shape: tuple[int, ...]) -> Callable[[Callable[..., Any], torch.Tensor], torch.Tensor]:
    """The per-example loss (:data:`models.explain.gradients.LossFn`): the cross-entropy of one row's logits."""

    def loss(forward: Callable[..., Any], example: torch.Tensor) -> torch.Tensor:
        logits = forward(example[:-1].reshape(1, *shape))
        return nn.functional.cross_entropy(logits.float(), example[-1:].long())

    return loss


def margin_of(shape: tuple[int, ...]) -> Callable[[Callable[..., Any], torch.Tensor], torch.Tensor]:
    """The per-example output TRAK differentiates (``classification_margin``), for a row of :func:`rows`."""

    def output(forward: Callable[..., Any], example: torch.Tensor) -> torch.Tensor:
        return classification_margin(forward(example[:-1].reshape(1, *shape)).float(), example[-1:].long())

    return output


@dataclass
class Checkpoints:
    """The checkpoints of a trained classifier: their listing (file, epoch, lr) and their weights."""

    listed: list[dict[str, Any]]
    states: list[MemoryCheckpoint]


def read_checkpoints(directory: Path, module: ProgramModule, which: str = "all",
                     device: torch.device | str = "cpu") -> Checkpoints:
    """The checkpoints listed in ``directory``'s ``checkpoints.json`` (``which``: ``all`` or ``last``), each read
    with the service's archive loader; ValueError when the model has none (it was not trained by the service)."""
    path = Path(directory) / CHECKPOINTS_FILE
    listed = json.loads(path.read_text()) if path.is_file() else []
    if not listed:
        raise ValueError("the model has no training checkpoints (train it with POST /train/classifier, which keeps "
                         "them)")
    if which == "last":
        listed = listed[-1:]
    spec = json.loads((Path(directory) / SPEC_FILE).read_text())
    states = []
    for c in listed:
        ckpt = build(Path(directory) / c["file"], spec, device)
        states.append(MemoryCheckpoint(module.state_of(ckpt), float(c["lr"]), f"epoch-{c['epoch']}"))
    return Checkpoints(listed, states)


def preview(x: torch.Tensor, cells: int = 28) -> list[list[float]]:
    """An image input ``[C, H, W]`` as the page draws it: the channels' mean, average-pooled to at most ``cells``
    a side, rounded to 4 decimals (row by row)."""
    grey = x.float().mean(0, keepdim=True)
    h, w = grey.shape[-2:]
    if h > cells or w > cells:
        grey = nn.functional.adaptive_avg_pool2d(grey, (min(h, cells), min(w, cells)))
    return [[round(float(v), 4) for v in row] for row in grey[0]]
