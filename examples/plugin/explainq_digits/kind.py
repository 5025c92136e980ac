"""The ``digits_mlp`` kind: its request, its result and its registration (no torch: the API imports this).

The request model is the only place the defaults live; the worker's job function receives it validated. The
result derives from the ``training`` renderer's model, so the dashboard draws its curves and the SDK renders it
like any training run, without knowing this kind.
"""

from __future__ import annotations

from pydantic import Field

from core.contract.charts import STEPS_CHART
from core.contract.fields import ADVANCED, JobRequest
from core.contract.kind import JobKind
from core.contract.kind import register as register_kind
from core.contract.results.training import TrainingResult


class DigitsMLPRequest(JobRequest):
    """Train a one-hidden-layer MLP on scikit-learn's 8x8 digits (1,797 images; a fixed 20% held out)."""

    epochs: int = Field(10, ge=1, le=200, title="Training epochs", description="Passes over the training images")
    hidden: int = Field(64, ge=1, le=1024, title="Hidden units", description="Width of the hidden layer")
    lr: float = Field(0.01, gt=0, le=1, title="Learning rate", description="Adam's learning rate")
    batch_size: int = Field(64, ge=1, le=1437, title="Images per batch", json_schema_extra=ADVANCED,
                            description="Training images per optimizer step")
    seed: int = Field(0, ge=0, le=2**31 - 1, title="Random seed", json_schema_extra=ADVANCED,
                      description="Seed of the initial weights and of the batch order")


class DigitsMLPResult(TrainingResult):
    """The run's curves (``history``: one row per epoch; ``steps``: the running loss) and its test accuracy."""

    parameters: int
    test_accuracy: float
    confusion: list[list[int]] = Field(description="test confusion matrix: rows true digit, columns predicted")


KIND = JobKind(
    name="digits_mlp",
    route="/plugins/digits-mlp",
    request=DigitsMLPRequest,
    queue="train",
    func="explainq_digits.job:run",
    timeout_s=600,
    summary="Train a small MLP on scikit-learn's digits (an example plugin)",
    title="Digits MLP (example plugin)",
    renderer="training",
    result=DigitsMLPResult,
    charts=(STEPS_CHART,
            {"id": "loss", "title": "Loss", "series": [["train_loss", "train loss"], ["val_loss", "test loss"]]},
            {"id": "accuracy", "title": "Accuracy", "series": [["val_accuracy", "test accuracy"]]}),
    live_rows="history",
)


def register() -> None:
    """The ``EXPLAINQ_KIND_PLUGINS`` hook: ``explainq_digits.kind:register``."""
    register_kind(KIND)
