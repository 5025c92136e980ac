"""MLP probe: metrics against scikit-learn, best-epoch restore, standardisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, precision_score, recall_score
from torch import nn

from models.lora.probe import ProbeConfig, ProbeMLP, classification_metrics, predict, standardize, train_probe


def test_metrics_match_sklearn() -> None:
    rng = np.random.default_rng(0)
    for _ in range(5):
        y = rng.integers(0, 4, 40)
        p = np.where(rng.random(40) < 0.6, y, rng.integers(0, 3, 40))  # class 3 never predicted
        m = classification_metrics(y, p, 5)  # class 4 absent everywhere
        assert m["acc"] == pytest.approx(accuracy_score(y, p))
        assert m["f1"] == pytest.approx(f1_score(y, p, average="macro", zero_division=0))
        assert m["precision"] == pytest.approx(precision_score(y, p, average="macro", zero_division=0))
        assert m["recall"] == pytest.approx(recall_score(y, p, average="macro", zero_division=0))
        assert np.array_equal(np.array(m["confusion"]), confusion_matrix(y, p, labels=range(5)))


def test_mlp_architecture() -> None:
    m = ProbeMLP(7, 3, hidden_dim=16, dropout=0.5)
    kinds = [type(x) for x in m.network]
    assert kinds == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Dropout] * 3 + [nn.Linear]
    assert m.network[0].out_features == 16 and m.network[-1].out_features == 3


def test_standardize_uses_train_stats_and_keeps_constant_columns_finite() -> None:
    train = torch.tensor([[1.0, 0.1], [3.0, 0.1], [5.0, 0.1]])
    val = torch.tensor([[3.0, 0.1], [7.0, 0.2]])
    t, v = standardize(train, val)
    assert torch.allclose(t[:, 0], torch.tensor([-1.0, 0.0, 1.0]))
    assert torch.allclose(v[:, 0], torch.tensor([0.0, 2.0]))
    assert torch.all(t[:, 1].abs() < 1e-6) and torch.isclose(v[1, 1], torch.tensor(0.1))


def test_restores_best_epoch_when_val_accuracy_peaks_early() -> None:
    """Validation labels are the opposite of the training labels: as the model learns the training set its
    validation accuracy falls, so the best epoch is an early one and the last is much worse."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = (x[:, 0] > 0).long()
    x_val = x[:32]
    y_val = 1 - y[:32]
    cfg = ProbeConfig(hidden_dim=32, dropout=0.0, max_epochs=40, patience=40, batch_size=16, lr=1e-2)
    res = train_probe(x, y, x_val, y_val, 2, cfg, seed=0, device=torch.device("cpu"))
    hist = res.val_acc_history
    assert res.epochs == 40 and len(hist) == 40
    assert res.best_epoch == int(np.argmax(hist)) + 1 and res.best_val_acc == max(hist)
    assert res.best_epoch < 10 and hist[-1] < max(hist) - 0.2
    restored = float((predict(res.model, x_val, 64, torch.device("cpu"), "fp32") == y_val).float().mean())
    # trained and validated in "auto" precision (bf16 on CPUs with native bf16), re-predicted here in fp32:
    # logits within bf16 rounding of a tie may flip, so allow one of the 32 validation items to differ
    assert restored == pytest.approx(max(hist), abs=1 / 32 + 1e-9)
    assert restored > hist[-1] + 0.1


def test_early_stopping_stops_after_patience() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 4, generator=g)
    y = torch.randint(0, 2, (40,), generator=g)
    cfg = ProbeConfig(hidden_dim=8, max_epochs=200, patience=5, batch_size=16)
    res = train_probe(x, y, x[:10], y[:10], 2, cfg, seed=0, device=torch.device("cpu"))
    assert res.epochs == res.best_epoch + 5
