"""The worker side of ``digits_mlp``: train, report progress (the dashboard follows it live), honour a cancel,
write the test predictions as an artifact, return the result model."""

from __future__ import annotations

import csv

import torch
from sklearn.datasets import load_digits

from explainq_digits.kind import DigitsMLPRequest, DigitsMLPResult
from models.curves import StepCurve

HELD_OUT = 0.2


def _data(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(12345))  # a fixed split, not the seed's
    n_test = int(HELD_OUT * len(x))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def run(request: DigitsMLPRequest, ctx) -> DigitsMLPResult:
    torch.manual_seed(request.seed)
    x_train, y_train, x_test, y_test = _data(request.seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, request.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(request.hidden, 10)).to(ctx.device)
    opt = torch.optim.Adam(model.parameters(), lr=request.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    per_epoch = -(-len(x_train) // request.batch_size)
    curve = StepCurve(per_epoch)
    history: list[dict[str, float]] = []
    order_gen = torch.Generator().manual_seed(request.seed)
    step = 0
    for epoch in range(1, request.epochs + 1):
        model.train()
        total = 0.0
        for idx in torch.randperm(len(x_train), generator=order_gen).split(request.batch_size):
            xb, yb = x_train[idx].to(ctx.device), y_train[idx].to(ctx.device)
            loss = loss_fn(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            total += float(loss) * len(idx)
            curve.add(step, float(loss) * len(idx), float(len(idx)), force=step % per_epoch == 0)
        model.eval()
        with torch.no_grad():
            logits = model(x_test.to(ctx.device)).cpu()
        history.append({"epoch": epoch, "train_loss": total / len(x_train),
                        "val_loss": float(loss_fn(logits, y_test)),
                        "val_accuracy": float((logits.argmax(1) == y_test).float().mean())})
        # progress: the live curves, and a cancel is honoured here (JobCanceled)
        ctx.progress(epoch, request.epochs, "epochs", message=f"epoch {epoch}/{request.epochs}",
                     metrics={"history": history, "steps": curve.rows()})
    predicted = logits.argmax(1)
    confusion = [[0] * 10 for _ in range(10)]
    for t, p in zip(y_test.tolist(), predicted.tolist(), strict=True):
        confusion[t][p] += 1
    with open(ctx.artifact_path("test_predictions.csv"), "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["index", "true", "predicted"])
        writer.writerows(zip(range(len(y_test)), y_test.tolist(), predicted.tolist(), strict=True))
    return DigitsMLPResult(history=history, steps=curve.rows(), parameters=sum(p.numel() for p in model.parameters()),
                           test_accuracy=history[-1]["val_accuracy"], confusion=confusion, artifacts=ctx.artifacts())
