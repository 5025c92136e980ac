"""The exported-classifier demo's data and model: scikit-learn's digits (the UCI optical-digits images, 8x8, 16
grey levels, shipped inside the scikit-learn wheel) as a ``tensors`` dataset, and a small CNN for them exported with
``torch.export`` (the program the service then trains and explains like any archive a user brings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

DIGITS_LABELS = [str(i) for i in range(10)]
SPLIT_SIZES = {"valid": 300, "test": 297}  # the rest (1,200 of 1,797) is train


class DigitsCNN(torch.nn.Module):
    """Two 3x3 convolutions (8 and 16 channels, ReLU, 2x2 max pool after the second) and a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv1(x))
        h = torch.nn.functional.max_pool2d(torch.relu(self.conv2(h)), 2)
        return self.fc(h.flatten(1))


class DigitsMLP(torch.nn.Module):
    """A multi-layer perceptron for the digits: the 64 pixels, one hidden layer (``hidden`` units, ReLU), 10 logits
    (only ``nn.Linear`` layers, so that every EK-FAC implementation covers all of its parameters)."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(64, hidden)
        self.fc2 = torch.nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


ARCHITECTURES = {"cnn": DigitsCNN, "mlp": DigitsMLP}


def digits_arrays(seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{split: (inputs [N, 1, 8, 8] in [0, 1], labels [N])}``, a seeded split of the 1,797 digits."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0)[:, None]
    y = d.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test, n_valid = SPLIT_SIZES["test"], SPLIT_SIZES["valid"]
    parts = {"test": order[:n_test], "valid": order[n_test:n_test + n_valid], "train": order[n_test + n_valid:]}
    return {s: (x[i], y[i]) for s, i in parts.items()}


def write_digits(root: Path, seed: int = 0) -> dict[str, Any]:
    """The digits as ``root/{train,valid,test}.safetensors``; returns the counts ``POST /datasets`` records."""
    from safetensors.numpy import save_file

    root.mkdir(parents=True, exist_ok=True)
    counts: dict[str, Any] = {}
    for split, (x, y) in digits_arrays(seed).items():
        save_file({"inputs": np.ascontiguousarray(x), "labels": y}, str(root / f"{split}.safetensors"))
        counts[split] = int(len(y))
    counts["input_shape"] = [1, 8, 8]
    return counts


def training_mean(seed: int = 0) -> float:
    """The train split's mean intensity (the ``mean`` baseline of the demo's spec)."""
    return float(digits_arrays(seed)["train"][0].mean())


def digits_program(directory: Path, seed: int = 0, architecture: str = "cnn") -> Path:
    """An untrained :class:`DigitsCNN` (or ``architecture="mlp"``: :class:`DigitsMLP`), seeded, exported with a
    dynamic batch into ``directory/model.pt2``."""
    torch.manual_seed(seed)
    model = ARCHITECTURES[architecture]().eval()
    program = torch.export.export(model, (torch.zeros(2, 1, 8, 8),),
                                  dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=1 << 20)},))
    directory.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(directory / "model.pt2"))
    return directory
