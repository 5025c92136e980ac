"""ConvE model directories: safetensors checkpoints with their epoch and learning rate, and the loader.

Layout of a model directory::

    config.json                 model config, training settings, the checkpoint list [{file, epoch, lr}]
    model.safetensors           final weights (state dict, BN running statistics included)
    checkpoints/epoch_0005.safetensors   one per saved epoch; metadata {"epoch", "lr"}
    data/                       the triples (names, fixed id dictionaries, labels), so the model is self-contained
    metrics.json                filtered MRR / Hits@k on valid and test
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, safe_open, save_file

from models.kg.conve import ConvE, ConvEConfig
from models.kg.triples import TriplesDataset, load_triples_dir, write_dataset_dir

FORMAT = "explainq-conve-v1"


@dataclass
class CheckpointInfo:
    """One saved checkpoint: TracIn weights its gradient dot products by ``lr``."""

    path: Path
    epoch: int
    lr: float

    @property
    def name(self) -> str:
        return self.path.stem

    def state_dict(self, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        return load_file(str(self.path), device=str(device))


def save_checkpoint(model: ConvE, path: Path, epoch: int, lr: float) -> CheckpointInfo:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(path), metadata={"epoch": str(epoch), "lr": repr(float(lr)), "format": FORMAT})
    return CheckpointInfo(path, epoch, float(lr))


def read_checkpoint_info(path: Path) -> CheckpointInfo:
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
    if "epoch" not in meta or "lr" not in meta:
        raise ValueError(f"{path} has no epoch/lr metadata")
    return CheckpointInfo(path, int(meta["epoch"]), float(meta["lr"]))


@dataclass
class KGBundle:
    """What the worker's model cache holds for a ConvE model."""

    model: ConvE
    dataset: TriplesDataset
    checkpoints: list[CheckpointInfo]
    path: Path
    training: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def checkpoint(self, name: str) -> CheckpointInfo:
        for c in self.checkpoints:
            if name in (c.name, c.path.name, str(c.epoch)):
                return c
        raise KeyError(f"unknown checkpoint {name!r}")


def write_model_dir(path: Path, model: ConvE, dataset: TriplesDataset, checkpoints: list[CheckpointInfo],
                    training: dict, metrics: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(path / "model.safetensors"), metadata={"format": FORMAT})
    write_dataset_dir(dataset, path / "data")
    cfg = {
        "format": FORMAT,
        "model": model.config.to_dict(),
        "dataset": dataset.name,
        "training": training,
        "checkpoints": [{"file": str(c.path.relative_to(path)), "epoch": c.epoch, "lr": c.lr} for c in checkpoints],
    }
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    (path / "metrics.json").write_text(json.dumps(metrics, indent=2))


def load(path: Path | str, device: torch.device | str = "cpu") -> KGBundle:
    """Registry loader (``models.kg.checkpoint:load``): the final model in eval mode, data and checkpoints."""
    path = Path(path)
    cfg = json.loads((path / "config.json").read_text())
    if cfg.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} model directory")
    model = ConvE(ConvEConfig(**cfg["model"]))
    model.load_state_dict(load_file(str(path / "model.safetensors"), device="cpu"))
    model.to(device).eval()
    dataset = load_triples_dir(path / "data", cfg.get("dataset"))
    checkpoints = [CheckpointInfo(path / c["file"], int(c["epoch"]), float(c["lr"])) for c in cfg["checkpoints"]]
    metrics = json.loads((path / "metrics.json").read_text()) if (path / "metrics.json").is_file() else {}
    return KGBundle(model, dataset, checkpoints, path, cfg.get("training", {}), metrics)
