"""Test-only job kinds for the service lifecycle tests (the product registers none of these)."""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field

from core.contract.kind import JobKind, register
from core.contract.results.training import TrainingResult


class SleepRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps: int = Field(5, ge=1, le=10_000)
    step_s: float = Field(0.1, ge=0, le=60)
    fail_at: int | None = None
    model: str | None = None


def sleep_job(request: SleepRequest, ctx) -> dict:
    """Sleeps in steps, reporting progress; optionally fails; optionally touches a registered model."""
    loads = None
    if request.model:
        ctx.model(request.model)
        loads = ctx._models.load_counts.get(request.model)
    for i in range(request.steps):
        if request.fail_at is not None and i == request.fail_at:
            from workers.context import JobError

            raise JobError("bad_step", f"step {i} failed on purpose")
        time.sleep(request.step_s)
        ctx.progress(i + 1, request.steps, "steps", message=f"step {i + 1}")
    path = ctx.artifact_path("out.txt")
    path.write_text("done")
    return {"steps": request.steps, "model_loads": loads, "artifacts": ctx.artifacts()}


def described_job(request: SleepRequest, ctx) -> TrainingResult:
    """``sleep_job`` for a kind that says its result draws as a training run: a training result (no epochs)."""
    sleep_job(request, ctx)
    return TrainingResult(artifacts=ctx.artifacts())


class NonFiniteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")


def nonfinite_job(request: NonFiniteRequest, ctx) -> dict:
    """Reports NaN and infinities everywhere a job can: progress, metrics, meta and its result."""
    nan, inf = float("nan"), float("inf")
    ctx.progress(1, 2, "steps", metrics={"loss": nan, "grad_norm": inf, "history": [1.0, -inf]})
    ctx.set_meta("summary", {"best": nan, "ok": 0.5})
    ctx.progress(2, 2, "steps", metrics={"loss": -inf})
    return {"score": nan, "scores": [0.25, inf, -inf], "nested": {"x": (nan, 1)}}


def threads_job(request: NonFiniteRequest, ctx) -> dict:
    """What CPU budget the worker process runs under."""
    import os

    import torch

    return {"torch_threads": torch.get_num_threads(), "nice": os.nice(0),
            "omp": os.environ.get("OMP_NUM_THREADS"), "mkl": os.environ.get("MKL_NUM_THREADS")}


def load_counter_model(path, device):
    """A registered 'model' whose loading is observable: it appends to a file each time it loads."""
    with open(path / "loads.txt", "a") as fh:
        fh.write("load\n")
    return {"path": str(path), "device": str(device)}


def register_test_kinds() -> None:
    register(JobKind(name="test_sleep", route="/test/sleep", request=SleepRequest, queue="explain",
                     func="tests.jobkinds:sleep_job", timeout_s=600, summary="test only"))
    register(JobKind(name="test_nonfinite", route="/test/nonfinite", request=NonFiniteRequest, queue="explain",
                     func="tests.jobkinds:nonfinite_job", timeout_s=60, summary="test only"))
    register(JobKind(name="test_threads", route="/test/threads", request=NonFiniteRequest, queue="train",
                     func="tests.jobkinds:threads_job", timeout_s=60, summary="test only"))
    register(JobKind(name="test_train_sleep", route="/test/train-sleep", request=SleepRequest, queue="train",
                     func="tests.jobkinds:sleep_job", timeout_s=600, summary="test only"))
    # a kind no client knows by name, described as drawn like a training run: clients must follow the description
    register(JobKind(name="test_described", route="/test/described-route", request=SleepRequest, queue="explain",
                     func="tests.jobkinds:described_job", timeout_s=600, summary="test only", title="Described",
                     renderer="training", sdk_method="described"))
