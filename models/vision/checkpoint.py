"""Vision-BDH checkpoints: ``model.safetensors`` plus ``config.json``; the trainer adds ``trainer_state.pt``.

A model directory is loadable by the service registry as ``loader="models.vision.checkpoint:load"``.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from models.vision.bdh import VisionBDH
from models.vision.config import Optimizations, VisionBDHConfig

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
STATE_FILE = "trainer_state.pt"


@dataclass
class VisionBDHBundle:
    """A loaded classifier with what is needed to feed it: class names and input normalisation."""

    model: VisionBDH
    config: VisionBDHConfig
    classes: list[str]
    mean: list[float]
    std: list[float]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def save_model_dir(
    directory: Path, model: torch.nn.Module, config: VisionBDHConfig, meta: dict[str, Any] | None = None
) -> None:
    """Write weights and config into ``directory`` (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(directory / MODEL_FILE))
    (directory / CONFIG_FILE).write_text(json.dumps({"model": config.to_dict(), **(meta or {})}, indent=2))


def replace_dir(tmp: Path, final: Path) -> None:
    """Move a fully written ``tmp`` directory to ``final``, so readers never see a half-written checkpoint."""
    old = final.with_name(final.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    if old.exists():
        shutil.rmtree(old)


def read_config(directory: Path) -> dict[str, Any]:
    return json.loads((directory / CONFIG_FILE).read_text())


def load_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(str(directory / MODEL_FILE))


def load(path: Path | str, device: torch.device | str = "cpu") -> VisionBDHBundle:
    """Registry loader: a model directory (or a training run's directory, whose best checkpoint is used)."""
    directory = Path(path)
    if not (directory / MODEL_FILE).is_file() and (directory / "checkpoints" / "best" / MODEL_FILE).is_file():
        directory = directory / "checkpoints" / "best"
    meta = read_config(directory)
    config = VisionBDHConfig.from_dict(meta["model"])
    model = VisionBDH(config, Optimizations())
    model.load_state_dict(load_state_dict(directory))
    model.to(device).eval()
    return VisionBDHBundle(
        model=model,
        config=config,
        classes=list(meta.get("classes", [str(i) for i in range(config.num_classes)])),
        mean=list(meta.get("mean", [0.0] * config.in_channels)),
        std=list(meta.get("std", [1.0] * config.in_channels)),
        meta={k: v for k, v in meta.items() if k not in ("model", "classes", "mean", "std")},
    )
