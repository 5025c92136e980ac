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

import copy
import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from models.explain.classifier import Classifier
from models.explain.gradients import classification_margin
from models.explain.tracin import CheckpointLike, MemoryCheckpoint
from models.export.kfac import WHY_NONE, Layer, program_layers
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
        self.info = clf.info
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

    def layers(self) -> list[Layer]:
        """The program's calls EK-FAC covers (:func:`models.export.kfac.program_layers`)."""
        return program_layers(self.info)

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


class LayeredProgram(nn.Module):
    """A :class:`ProgramModule` whose ``aten.linear`` / ``aten.conv2d`` calls of :func:`program_layers` run through
    real ``nn.Linear`` / ``nn.Conv2d`` modules (``layers``, named after their weights' owners, dots as ``__``)
    holding those parameters, so that Kronfluence (and the factorised TracIn) can hook them; the program's other
    parameters stay parameters (``rest``, under the module's names). The same computation as the module at its
    current weights (tested), on its device."""

    def __init__(self, module: ProgramModule, layers: Sequence[Layer] | None = None) -> None:
        super().__init__()
        layers = module.layers() if layers is None else list(layers)
        if not layers:
            raise ValueError(WHY_NONE)
        self.program = copy.deepcopy(module.program)
        slot_of = {fqn: module.program._slot[name] for name, (_, fqn) in module.info.state.items()}
        self.layers = nn.ModuleDict()
        self._by_node: dict[str, str] = {}
        held = set()
        for layer in layers:
            w = getattr(module, _safe(layer.weight)).detach()
            b = getattr(module, _safe(layer.bias)).detach() if layer.bias is not None else None
            if layer.kind == "linear":
                m: nn.Module = nn.Linear(w.shape[1], w.shape[0], bias=b is not None)
            else:
                c = layer.conv
                m = nn.Conv2d(w.shape[1] * c["groups"], w.shape[0], tuple(w.shape[2:]), stride=tuple(c["stride"]),
                              padding=tuple(c["padding"]), dilation=tuple(c["dilation"]), groups=c["groups"],
                              bias=b is not None)
            m = m.to(device=w.device, dtype=w.dtype)
            with torch.no_grad():
                m.weight.copy_(w)
                if b is not None:
                    m.bias.copy_(b)
            key = _safe(layer.name)
            self.layers[key] = m
            self._by_node[layer.node] = key
            held.update(_safe(f) for f in (layer.weight, layer.bias) if f is not None)
            # the program's own copies of these weights are never read (their call runs the module): share them
            setattr(self.program, slot_of[layer.weight], m.weight.detach())
            if b is not None:
                setattr(self.program, slot_of[layer.bias], m.bias.detach())
        self.rest = nn.ParameterDict({safe: nn.Parameter(getattr(module, safe).detach().clone())
                                      for safe in module._slots if safe not in held})
        self._rest_slots = {safe: module._slots[safe] for safe in self.rest}

    def _call(self, key: str) -> Callable[..., torch.Tensor]:
        def call(*args: Any, **kwargs: Any) -> torch.Tensor:
            return self.layers[key](args[0] if args else kwargs["input"])

        return call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the layer calls are bound for this call only (to this module's current ``layers``, which Kronfluence
        # replaces by its tracked wrappers), so copies of this module never call another's layers
        calls = {node: self._call(key) for node, key in self._by_node.items()}
        nodes = self.program._nodes
        self.program._nodes = [dataclasses.replace(n, op=calls[n.name]) if n.name in calls else n for n in nodes]
        try:
            return functional_call(self.program, {slot: self.rest[safe] for safe, slot in self._rest_slots.items()},
                                   (x,))
        finally:
            self.program._nodes = nodes


def classifier(module: ProgramModule, checkpoints: Sequence[CheckpointLike], name: str = "classifier"
               ) -> Classifier:
    """The exported classifier as the estimators take it (:class:`models.explain.classifier.Classifier`): rows
    of :func:`rows`, its checkpoints, and EK-FAC through :class:`LayeredProgram` (or the reason it cannot)."""
    shape = module.shape
    layers = module.layers()
    return Classifier(
        module=module, checkpoints=list(checkpoints), loss=loss_of(shape), margin=margin_of(shape),
        inputs=lambda r: (r[:, :-1].reshape(len(r), *shape),), labels=lambda r: r[:, -1].long(),
        layered=(lambda m: LayeredProgram(m, layers)) if layers else None,
        kfac_problem=None if layers else WHY_NONE, name=name, config=program_identity(module))


def program_identity(module: ProgramModule) -> dict[str, Any]:
    """What identifies the program besides its weights: a digest of its graph and its input shape."""
    import hashlib

    graph = json.dumps(module.info.program.get("graph_module", {}).get("graph", {}), sort_keys=True)
    return {"format": "exported", "graph": hashlib.sha256(graph.encode()).hexdigest(), "shape": list(module.shape)}
