"""Small classifiers exported with ``torch.export`` for the tests, and crafted archives built from them.

Every archive is written by the test itself (nothing is downloaded): a CNN over 8x8 one-channel images (conv,
batch norm in eval, max pool, a reshape by the batch size, linear), a CNN over 3-channel 12x12 images with
adaptive pooling, and an MLP over 6 tabular features with layer norm, GELU, dropout (eval) and a self-attention
over its features (``scaled_dot_product_attention``). :func:`rewrite` copies an archive changing its members, for
the crafted files.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

IMAGE_LABELS = [str(i) for i in range(10)]
TABULAR_FEATURES = ["age", "income", "score", "visits", "tenure", "debt"]
TABULAR_LABELS = ["stay", "leave", "upgrade"]


class DigitCNN(torch.nn.Module):
    def __init__(self, channels: int = 1, classes: int = 10):
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 4 * 4, classes)
        self.register_buffer("shift", torch.full((1,), 0.25))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x - self.shift))), 2)
        return self.fc(h.reshape(x.shape[0], -1))


class ColourCNN(torch.nn.Module):
    def __init__(self, classes: int = 4):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 6, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(6, 8, 3, stride=2)
        self.head = torch.nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.silu(self.conv1(x))
        h = torch.tanh(self.conv2(h))
        return self.head(torch.nn.functional.adaptive_avg_pool2d(h, 1).flatten(1))


class TabularNet(torch.nn.Module):
    def __init__(self, features: int = 6, classes: int = 3, width: int = 8):
        super().__init__()
        self.embed = torch.nn.Linear(1, width)
        self.norm = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.drop = torch.nn.Dropout(0.1)
        self.out = torch.nn.Linear(features * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.embed(x.unsqueeze(-1)))                     # [B, F, W]
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        h = h + torch.nn.functional.scaled_dot_product_attention(q, k, v)
        h = self.drop(torch.nn.functional.gelu(h))
        return self.out(h.flatten(1))


def _init(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.4)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.normal_(std=0.3)
            m.running_var.uniform_(0.5, 2.0)
    return model.eval()


def export(model: torch.nn.Module, example: torch.Tensor, path: Path, dynamic: bool = True) -> Path:
    """``torch.export`` ``model`` on ``example`` (a dynamic batch) and save it at ``path``."""
    shapes = ({0: torch.export.Dim("batch", min=1, max=4096)},) if dynamic else None
    program = torch.export.export(model, (example,), dynamic_shapes=shapes)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))
    return path


def digit_cnn(seed: int = 0) -> torch.nn.Module:
    return _init(DigitCNN(), seed)


def colour_cnn(seed: int = 0) -> torch.nn.Module:
    return _init(ColourCNN(), seed)


def tabular_net(seed: int = 0) -> torch.nn.Module:
    return _init(TabularNet(), seed)


IMAGE_SPEC = {"input": {"kind": "image", "mean": [0.3]}, "labels": IMAGE_LABELS}
COLOUR_SPEC = {"input": {"kind": "image", "mean": [0.5, 0.4, 0.3]}, "labels": ["a", "b", "c", "d"]}
TABULAR_SPEC = {"input": {"kind": "tabular", "features": TABULAR_FEATURES, "mean": [0.1] * 6},
                "labels": TABULAR_LABELS}


def save_model_dir(directory: Path, kind: str = "image", seed: int = 0, spec: dict[str, Any] | None = None
                   ) -> tuple[Path, torch.nn.Module]:
    """A model directory (``model.pt2`` and ``spec.json``) of the ``image``, ``colour`` or ``tabular`` model."""
    model, example, default = {
        "image": (digit_cnn(seed), torch.randn(2, 1, 8, 8), IMAGE_SPEC),
        "colour": (colour_cnn(seed), torch.randn(2, 3, 12, 12), COLOUR_SPEC),
        "tabular": (tabular_net(seed), torch.randn(2, 6), TABULAR_SPEC),
    }[kind]
    directory.mkdir(parents=True, exist_ok=True)
    export(model, example, directory / "model.pt2")
    (directory / "spec.json").write_text(json.dumps(spec if spec is not None else default))
    return directory, model


# ------------------------------------------------------------------------------------------- crafted archives
def members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist() if not i.is_dir()}


def rewrite(src: Path, dst: Path, change: Callable[[dict[str, bytes]], dict[str, bytes]]) -> Path:
    """Copy the archive ``src`` to ``dst`` with its members (name -> bytes) changed by ``change``."""
    new = change(members(src))
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zf:
        for name, data in new.items():
            zf.writestr(name, data)
    return dst


def model_json_name(files: dict[str, bytes]) -> str:
    return next(n for n in files if "/models/" in n and n.endswith(".json"))


def edit_program(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, bytes]], dict[str, bytes]]:
    """A member change that edits the program's JSON in place."""
    def apply(files: dict[str, bytes]) -> dict[str, bytes]:
        name = model_json_name(files)
        program = json.loads(files[name])
        change(program)
        return {**files, name: json.dumps(program).encode()}
    return apply


class _Opens:
    """Unpickling this opens (creates) ``path``: what a hostile pickle could do instead."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def hostile_pickle(marker: Path) -> bytes:
    """A ``torch.save`` archive that, when loaded with ``weights_only=False``, creates ``marker``."""
    buf = io.BytesIO()
    torch.save(_Opens(str(marker)), buf)
    return buf.getvalue()
