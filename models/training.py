"""What every classifier trainer of ``POST /train/classifier`` shares: its options, its record (the history per
epoch and the checkpoints kept), and the optimizer the options name (``models.export.train`` trains exported
programs, ``models.hf.train`` Hugging Face classifiers)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class TrainOptions:
    epochs: int = 5
    batch_size: int = 64
    lr: float = 0.05
    optimizer: str = "sgd"          # sgd (with momentum), adam or adamw (decoupled weight decay)
    momentum: float = 0.9
    weight_decay: float = 0.0
    seed: int = 0
    checkpoint_every: int = 1
    max_length: int = 128           # text models: tokens per text (longer texts are truncated)


@dataclass
class Trained:
    """The history (per epoch: loss, train and valid accuracy, lr), and the checkpoints' epochs and weights (an
    exported program's, kept in memory) or files (a Hugging Face model's, written as they are made)."""

    history: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[tuple[int, float, Any]] = field(default_factory=list)


def optimizer(params: Iterable[torch.Tensor], opts: TrainOptions) -> torch.optim.Optimizer:
    params = list(params)
    if opts.optimizer == "adam":
        return torch.optim.Adam(params, lr=opts.lr, weight_decay=opts.weight_decay)
    if opts.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=opts.lr, weight_decay=opts.weight_decay)
    return torch.optim.SGD(params, lr=opts.lr, momentum=opts.momentum, weight_decay=opts.weight_decay)


def checkpoint_due(epoch: int, opts: TrainOptions) -> bool:
    return epoch % opts.checkpoint_every == 0 or epoch == opts.epochs


def run_epochs(opts: TrainOptions, n: int, loss_of: Callable[[torch.Tensor], torch.Tensor],
               optim: torch.optim.Optimizer, scores: Callable[[], dict[str, float]],
               progress: Callable[[int, int, dict[str, float]], None] | None = None,
               on_checkpoint: Callable[[int, float], Any] | None = None,
               on_epoch_start: Callable[[int], None] | None = None) -> Trained:
    """The loop every classifier trainer runs: ``opts.epochs`` passes over ``n`` examples in a seeded order
    (``torch.randperm`` from ``opts.seed``), one optimizer step per batch on ``loss_of(batch indices)``; after each
    epoch a history row (mean loss, ``lr`` and ``scores()``, e.g. train and valid accuracy), and when a checkpoint is
    due (:func:`checkpoint_due`) ``on_checkpoint(epoch, lr)``, whose value the record keeps. A loss that is not
    finite stops training (ValueError: lower lr)."""
    gen = torch.Generator().manual_seed(opts.seed)
    steps_per_epoch = math.ceil(n / opts.batch_size)
    out = Trained()
    for epoch in range(1, opts.epochs + 1):
        order = torch.randperm(n, generator=gen)
        if on_epoch_start is not None:
            on_epoch_start(epoch)
        total, seen = 0.0, 0
        for k in range(steps_per_epoch):
            idx = order[k * opts.batch_size:(k + 1) * opts.batch_size]
            loss = loss_of(idx)
            value = float(loss.detach())
            if not math.isfinite(value):
                raise ValueError(f"the loss became {value} at epoch {epoch}, step {k + 1}: lower lr")
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            total += value * len(idx)
            seen += len(idx)
            if progress is not None:
                progress((epoch - 1) * steps_per_epoch + k + 1, opts.epochs * steps_per_epoch,
                         {"loss": value, "epoch": epoch})
        out.history.append({"epoch": epoch, "loss": total / max(seen, 1), "lr": opts.lr, **scores()})
        if checkpoint_due(epoch, opts):
            out.checkpoints.append((epoch, opts.lr, on_checkpoint(epoch, opts.lr) if on_checkpoint else None))
    return out
