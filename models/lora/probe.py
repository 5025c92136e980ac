"""MLP probe on LoRA features: training with early stopping on validation accuracy, and metrics.

The probe is three blocks of [Linear(hidden), BatchNorm, ReLU, Dropout] and a linear output, trained with Adam
(lr 1e-3, weight decay 1e-4) and cross-entropy, ``ReduceLROnPlateau`` (mode max, factor 0.5, patience 10) on
validation accuracy, and early stopping after ``patience`` epochs without a strictly better validation
accuracy. The weights of the best epoch are restored from a deep copy (the source kept ``state_dict()``, a
dict of references to the live tensors, and so "restored" the last epoch).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from models.common import autocast, resolve_precision, seed_everything


class ProbeMLP(nn.Module):
    def __init__(self, input_dim: int, num_classes: int, hidden_dim: int = 512, dropout: float = 0.5,
                 blocks: int = 3) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = input_dim
        for _ in range(blocks):
            layers += [nn.Linear(width, hidden_dim), nn.BatchNorm1d(hidden_dim), nn.ReLU(), nn.Dropout(dropout)]
            width = hidden_dim
        layers.append(nn.Linear(width, num_classes))
        self.network = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x)


@dataclass
class ProbeConfig:
    hidden_dim: int = 512
    dropout: float = 0.5
    lr: float = 1e-3
    weight_decay: float = 1e-4
    batch_size: int = 256
    max_epochs: int = 200
    patience: int = 15
    lr_patience: int = 10
    lr_factor: float = 0.5
    precision: str = "auto"


@dataclass
class TrainResult:
    model: nn.Module
    best_epoch: int  # 1-based
    best_val_acc: float
    epochs: int
    val_acc_history: list[float] = field(default_factory=list)
    train_loss_history: list[float] = field(default_factory=list)


def standardize(train: torch.Tensor, *others: torch.Tensor) -> list[torch.Tensor]:
    """z-score every split with the training mean and std (unbiased); a constant column is only centred, so
    rounding noise in its mean is not divided by ~0."""
    mean = train.mean(0, keepdim=True)
    std = train.std(0, keepdim=True, correction=1 if train.shape[0] > 1 else 0)
    scale_ref = train.abs().amax(0, keepdim=True)
    std = torch.where(std > 1e-6 * scale_ref.clamp_min(1e-30), std, torch.ones_like(std))
    return [(x - mean) / std for x in (train, *others)]


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor, batch_size: int, device: torch.device, precision: str) -> torch.Tensor:
    model.eval()
    preds = []
    for i in range(0, x.shape[0], batch_size):
        with autocast(device, precision):
            logits = model(x[i:i + batch_size])
        preds.append(logits.argmax(1))
    return torch.cat(preds) if preds else torch.empty(0, dtype=torch.long, device=x.device)


def train_probe(
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_val: torch.Tensor,
    y_val: torch.Tensor,
    num_classes: int,
    config: ProbeConfig,
    seed: int,
    device: torch.device,
    model: nn.Module | None = None,
    on_epoch: Callable[[int, float], None] | None = None,
) -> TrainResult:
    """Train ``model`` (default ``ProbeMLP``) on tensors already on ``device`` and restore its best epoch.

    Mini-batches come from a seeded permutation each epoch; a final batch of one item is dropped (BatchNorm
    cannot train on it). ``on_epoch(epoch, val_acc)`` is called after each epoch (cancellation hooks).
    """
    seed_everything(seed)
    precision = resolve_precision(config.precision, device, cuda_half="bf16", cpu_native_bf16=True)
    if model is None:
        model = ProbeMLP(x_train.shape[1], num_classes, config.hidden_dim, config.dropout)
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=config.lr_factor,
                                                       patience=config.lr_patience)
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator(device="cpu").manual_seed(seed)
    n = x_train.shape[0]
    if n < 2:
        raise ValueError("the probe needs at least 2 training items")
    best_acc, best_epoch, best_state = -1.0, 0, None
    since_best = 0
    val_hist: list[float] = []
    loss_hist: list[float] = []
    epoch = 0
    for epoch in range(1, config.max_epochs + 1):
        model.train()
        perm = torch.randperm(n, generator=gen).to(x_train.device)
        total, batches = 0.0, 0
        for i in range(0, n, config.batch_size):
            idx = perm[i:i + config.batch_size]
            if idx.numel() < 2:
                continue
            opt.zero_grad(set_to_none=True)
            with autocast(device, precision):
                loss = loss_fn(model(x_train[idx]).float(), y_train[idx])
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            total += float(loss.detach())
            batches += 1
        loss_hist.append(total / max(batches, 1))
        val_acc = float((predict(model, x_val, config.batch_size, device, precision) == y_val).float().mean())
        val_hist.append(val_acc)
        sched.step(val_acc)
        if on_epoch is not None:
            on_epoch(epoch, val_acc)
        if val_acc > best_acc:
            best_acc, best_epoch, since_best = val_acc, epoch, 0
            best_state = copy.deepcopy(model.state_dict())
        else:
            since_best += 1
            if since_best >= config.patience:
                break
    assert best_state is not None  # at least one epoch ran and -1 < any accuracy
    model.load_state_dict(best_state)
    return TrainResult(model, best_epoch, best_acc, epoch, val_hist, loss_hist)


def classification_metrics(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int) -> dict:
    """Accuracy, macro precision/recall/F1 and the confusion matrix (rows = true class).

    Macro averages run over the classes present in y_true or y_pred, a class with no predictions (or no
    items) scoring 0 for precision (recall) — scikit-learn's ``average="macro", zero_division=0``.
    """
    y_true = np.asarray(y_true, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    cm = np.bincount(y_true * num_classes + y_pred, minlength=num_classes * num_classes).reshape(num_classes,
                                                                                                 num_classes)
    tp = np.diag(cm).astype(np.float64)
    pred_count = cm.sum(0).astype(np.float64)
    true_count = cm.sum(1).astype(np.float64)
    present = (pred_count + true_count) > 0
    precision = np.divide(tp, pred_count, out=np.zeros_like(tp), where=pred_count > 0)
    recall = np.divide(tp, true_count, out=np.zeros_like(tp), where=true_count > 0)
    denom = precision + recall
    f1 = np.divide(2 * precision * recall, denom, out=np.zeros_like(tp), where=denom > 0)
    return {
        "acc": float(tp.sum() / max(len(y_true), 1)),
        "f1": float(f1[present].mean()) if present.any() else 0.0,
        "precision": float(precision[present].mean()) if present.any() else 0.0,
        "recall": float(recall[present].mean()) if present.any() else 0.0,
        "confusion": cm.tolist(),
    }


def run_probe(
    x: torch.Tensor,
    y: torch.Tensor,
    splits,
    num_classes: int,
    config: ProbeConfig,
    seed: int,
    device: torch.device,
    on_epoch: Callable[[int, float], None] | None = None,
) -> dict:
    """One run: standardise with train statistics on the device, train, and measure every split.

    ``x [N, D]`` and ``y [N]`` hold all items; ``splits`` has ``train``/``val``/``test`` index arrays.
    """
    t0 = time.perf_counter()
    x = x.to(device, torch.float32)
    y = y.to(device)
    idx = {k: torch.as_tensor(getattr(splits, k), device=device) for k in ("train", "val", "test")}
    xs = standardize(x[idx["train"]], x[idx["val"]], x[idx["test"]])
    ys = [y[idx[k]] for k in ("train", "val", "test")]
    res = train_probe(xs[0], ys[0], xs[1], ys[1], num_classes, config, seed, device, on_epoch=on_epoch)
    precision = resolve_precision(config.precision, device, cuda_half="bf16", cpu_native_bf16=True)
    out: dict = {"seed": seed, "best_epoch": res.best_epoch, "epochs": res.epochs, "feature_dim": int(x.shape[1])}
    for name, xi, yi in zip(("train", "val", "test"), xs, ys, strict=True):
        pred = predict(res.model, xi, config.batch_size, device, precision).cpu().numpy()
        m = classification_metrics(yi.cpu().numpy(), pred, num_classes)
        out[f"{name}_acc"] = m["acc"]
        if name != "train":
            for key in ("f1", "precision", "recall", "confusion"):
                out[f"{name}_{key}"] = m[key]
    out["time_s"] = time.perf_counter() - t0
    out["val_acc_history"] = res.val_acc_history
    return out
