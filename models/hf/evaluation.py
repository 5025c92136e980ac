"""The LDS and mislabel evaluations for Hugging Face classifiers: the pieces ``models.export.evaluation`` has for
exported programs, on text splits (the statistics and the reports are that module's and ``models.kg.evaluation``'s).

- :func:`train_recipe` fine-tunes a fresh copy of the model in ``source`` (the checkpoint as imported, so every
  model of one evaluation starts from the same weights) on the given texts with the recipe's options and a seed of
  its own (``models.hf.train.train``); with ``out``, the model directory (``save_model``: final weights, tokenizer,
  checkpoints) is written there.
- :func:`train_subset`: the recipe on a seeded ``alpha``-subset of the training texts
  (``models.kg.evaluation.subset_mask``), and that model's margins on the test texts: the LDS's ground truth.
- :func:`margins`: TRAK's classification margin of each text's label (as ``models.export.evaluation.margins``).
- :func:`read_classifier` and :func:`rows`: a trained directory and texts as the estimators take them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.explain.gradients import classification_margin
from models.hf.checkpoint import HFClassifier, load
from models.hf.train import Encoded, logits, save_model, train, write_checkpoint
from models.kg import evaluation as ev
from models.textdata import TextSplit
from models.training import TrainOptions


def margins(clf: HFClassifier, split: TextSplit, max_length: int) -> np.ndarray:
    """``float64[N]``: each text's classification margin of its label under ``clf``."""
    data = Encoded(clf, split, max_length, "test split")
    out = logits(clf, data).double()
    return np.array([float(classification_margin(out[i:i + 1], data.labels[i:i + 1])) for i in range(len(out))])


def train_recipe(source: Path, data: TextSplit, opts: TrainOptions, seed: int, out: Path | None = None,
                 device: Any = "cpu") -> HFClassifier:
    """The recipe from the checkpoint in ``source`` on ``data`` with training seed ``seed``."""
    clf = load(source, device, trainable=True)
    opts = dataclasses.replace(opts, seed=int(seed))
    encoded = Encoded(clf, data, opts.max_length, "train split")
    if out is None:
        train(clf, encoded, opts)
        return clf
    out.mkdir(parents=True, exist_ok=True)
    trained = train(clf, encoded, opts, on_checkpoint=lambda epoch, lr: write_checkpoint(clf, out, epoch))
    save_model(out, clf, trained)
    return clf


def subset(data: TextSplit, keep: np.ndarray) -> TextSplit:
    return TextSplit([data.texts[i] for i in keep.tolist()], [data.labels[i] for i in keep.tolist()])


def train_subset(source: Path, data: TextSplit, opts: TrainOptions, alpha: float, seed: int, train_seed: int,
                 test: TextSplit, device: Any = "cpu") -> dict[str, Any]:
    """The recipe on the ``alpha``-subset drawn with ``seed`` (trained with ``train_seed``): its mask ``bool[n]``
    and its margins on ``test`` ``float64[m]``."""
    mask = ev.subset_mask(len(data.labels), alpha, seed)
    clf = train_recipe(source, subset(data, np.flatnonzero(mask)), opts, train_seed, device=device)
    return {"mask": mask, "outputs": margins(clf, test, opts.max_length)}


def read_classifier(directory: Path, name: str = "classifier", device: Any = "cpu") -> tuple[Any, HFClassifier]:
    """A model directory :func:`train_recipe` wrote, as the estimators take it (every checkpoint), and the loaded
    classifier itself (its tokenizer makes the rows: :func:`rows`)."""
    from models.hf.influence import TextModule, classifier, read_checkpoints

    hf = load(Path(directory), device)
    module = TextModule(hf)
    return classifier(module, read_checkpoints(Path(directory), module)[1], name=name), hf


def labels_of(split: TextSplit, classes: list[str]) -> list[int]:
    """The class index of each label of ``split`` (ValueError naming those that are not classes)."""
    from models.textdata import label_indices

    idx, bad = label_indices(split.labels, classes)
    if idx is None:
        raise ValueError(f"the labels {bad} are not classes of the model")
    return idx


def rows(hf: HFClassifier, split: TextSplit, max_length: int) -> torch.Tensor:
    """The texts of ``split`` with their labels as rows (``models.hf.influence.rows``, as wide as the longest)."""
    from models.hf.influence import rows as text_rows
    from models.hf.influence import width

    return text_rows(hf, split.texts, labels_of(split, hf.labels), max_length, width(hf, split.texts, max_length))
