"""Worker side of ``POST /train/bdh``: run the Vision-BDH trainer with progress, metrics and cancellation."""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path
from typing import Any

from core import registry
from core.artifacts import artifacts_key
from core.contract.errors import FieldError
from core.contract.results.training import TrainBDHResult
from core.filestore import StoreError, get_store
from core.kinds.train_bdh import CIFAR_DIRS, TrainBDHRequest, checkpoint_key, cifar_dir, cifar_marker
from core.ownership import owns, owns_files
from core.settings import Settings
from workers.context import JobContext, JobError

LOADER = "models.vision.checkpoint:load"
METRICS_INTERVAL_S = 2.0


def train_config(request: TrainBDHRequest, data_dir: Path | None, device_type: str) -> Any:
    """The library's TrainConfig from the request: every field the two share, the resolved data directory, the
    model's configuration, and the data-loading processes (by default 4 on a GPU, 0 on CPU)."""
    from models.vision.config import VisionBDHConfig
    from models.vision.train import TrainConfig

    shared = {f.name for f in dataclasses.fields(TrainConfig)} - {"data_dir", "model", "num_workers"}
    workers = request.num_workers
    if workers is None:
        workers = 4 if device_type == "cuda" else 0  # on CPU the cores are better spent on the matmuls
    return TrainConfig(**request.model_dump(include=shared), data_dir=str(data_dir) if data_dir else None,
                       model=VisionBDHConfig.from_dict(request.model.model_dump()), num_workers=workers)


def _data_dir(settings: Settings, request: TrainBDHRequest, owner: str) -> Path | None:
    if request.dataset == "digits":
        return None
    try:
        return cifar_dir(settings, request.dataset, request.data_dir, owner)
    except FieldError as exc:
        raise JobError("dataset_not_found", exc.message) from None


def default_model_name(ctx: JobContext, request: TrainBDHRequest) -> str:
    """``bdh-<label or dataset>-<first 8 characters of the job id>``: readable in lists and pickers. The label is
    reduced to the registry's name characters (at most 40 of them), without a leading ``bdh-`` of its own (a
    label ``bdh-tiny`` names ``bdh-tiny-<id>``, not ``bdh-bdh-tiny-<id>``). When that name is another owner's (or, for
    this owner, another job's model), the job id's full 32 characters make it unique."""
    label = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.label or "").strip("-.")
    label = re.sub(r"^(bdh[-_.]+)+", "", label, flags=re.IGNORECASE)[:40].strip("-.")  # no bdh-bdh-...
    stem = f"bdh-{label or request.dataset}"
    name = f"{stem}-{ctx.job_id[:8]}"
    entry = registry.get_model(ctx.settings, name)
    if entry is not None and (not owns(entry, ctx.owner) or (entry.get("meta") or {}).get("job_id")
                              not in (None, ctx.job_id)):
        name = f"{stem}-{ctx.job_id}"
    return name


def run(request: TrainBDHRequest, ctx: JobContext) -> TrainBDHResult:
    """Train; progress in batches, latest metrics in ``job.meta["metrics"]``; returns history and artifacts.

    If this job restarts (worker shutdown puts it back on its queue) and already wrote a checkpoint, it
    continues from its own checkpoint, so a restart costs at most one epoch.
    """
    from models.vision.data import DatasetNotFoundError
    from models.vision.train import (
        BatchEvent,
        ResumeError,
        ResumeMismatch,
        TrainingDiverged,
        find_checkpoint,
        train,
    )

    data_dir = _data_dir(ctx.settings, request, ctx.owner)
    config = train_config(request, data_dir, ctx.device.type)
    out_dir = ctx.artifacts_dir
    store = get_store(ctx.settings)
    resume_from: Path | None = None
    own = checkpoint_key(ctx.job_id)
    if store.exists(f"{own}/trainer_state.pt"):  # this job restarted (on this host or another)
        resume_from = store.local_dir(own)
        try:  # its best beside it (the trainer rebuilds best from last when it is missing)
            store.local_dir(artifacts_key(ctx.job_id, "checkpoints", "best"))
        except StoreError:
            pass
    elif request.resume_from:
        if not owns_files(ctx.settings, request.resume_from, ctx.owner):
            raise JobError("bad_resume_from", f"no job {request.resume_from!r} of yours to resume from")
        try:
            resume_from = store.local_dir(checkpoint_key(request.resume_from))
        except StoreError:
            raise JobError("bad_resume_from", f"job {request.resume_from!r} has no checkpoint") from None
    if resume_from is not None:
        try:
            find_checkpoint(resume_from)
        except ResumeError:
            raise JobError("bad_resume_from", "the checkpoint to resume from is incomplete (no trainer state)") \
                from None

    last_metrics = {"t": 0.0, "epochs": -1}

    def on_batch_end(event: BatchEvent) -> None:
        now = time.monotonic()
        metrics = None
        if len(event.history) != last_metrics["epochs"] and event.history:
            # an epoch ended and its checkpoint is on disk: put it in the store, so a restart of this job on
            # any host (or a later resume_from) continues from it
            ctx.publish_artifacts("checkpoints/last")
            if (out_dir / "checkpoints" / "best").is_dir():
                ctx.publish_artifacts("checkpoints/best")
        if len(event.history) != last_metrics["epochs"] or now - last_metrics["t"] >= METRICS_INTERVAL_S:
            last_metrics.update(t=now, epochs=len(event.history))
            metrics = {
                "epoch": event.epoch, "batch": event.batch, "running_train_loss": event.loss, "lr": event.lr,
                "history": event.history, "steps": event.steps.rows() if event.steps is not None else [],
            }
        ctx.progress(
            event.done_batches, event.total_batches, "batches",
            message=f"epoch {event.epoch}/{event.epochs}, batch {event.batch}/{event.batches_per_epoch}",
            metrics=metrics,
        )  # raises JobCanceled at the end of this batch when the job was canceled

    try:
        # run_id: the checkpoint saved under this job id is its own wherever it is read from (a restart after
        # the last epoch then evaluates and registers instead of refusing a finished checkpoint)
        result = train(config, out_dir, device=ctx.device, resume_from=resume_from, on_batch_end=on_batch_end,
                       run_id=ctx.job_id)
    except DatasetNotFoundError as exc:
        raise JobError("dataset_not_found", str(exc)) from None
    except ResumeMismatch as exc:
        raise JobError("resume_mismatch", str(exc)) from None
    except TrainingDiverged as exc:
        raise JobError("diverged", str(exc)) from None
    except ResumeError as exc:
        raise JobError("bad_resume_from", str(exc)) from None

    ctx.progress(result.epochs_completed, request.epochs, "epochs", message="done",
                 metrics={"history": result.history, "steps": result.steps})
    name = request.register_as or default_model_name(ctx, request)
    ctx.register_model(
        name, kind="vision_bdh", loader=LOADER, path=out_dir / "checkpoints" / "best",  # copied into the store
        parameters=result.parameters,
        meta={"dataset": request.dataset, "best_val_accuracy": result.best_val_accuracy,
              "test_accuracy": result.test_accuracy, "job_id": ctx.job_id},
    )
    return TrainBDHResult.model_validate({
        "history": result.history,
        "steps": result.steps,
        "best_epoch": result.best_epoch,
        "best_val_accuracy": result.best_val_accuracy,
        "test_accuracy": result.test_accuracy,
        "parameters": result.parameters,
        "expected_parameters": result.expected_parameters,
        "epochs_completed": result.epochs_completed,
        "resumed_from": request.resume_from,
        "model_name": name,
        "model_config": result.model_config,
        "device": result.device,
        "precision": result.precision,
        "optimizer": result.optimizer,
        "samples": {"train": result.n_train, "val": result.n_val, "test": result.n_test},
        "warnings": result.warnings,
        "changed_on_resume": result.changed_on_resume,
        "artifacts": ctx.artifacts(),
    })


def demo_steps() -> list[Any]:
    from workers.demo import DemoStep

    return [DemoStep("vision-datasets", prepare_demo, datasets=("digits",), kinds=("train_bdh",), cost_s=2.0)]


def prepare_demo(settings: Settings, progress: bool = True) -> None:
    """Register the datasets ``POST /train/bdh`` can use here: digits (bundled) and CIFAR when extracted.

    Idempotent and quick: digits needs only scikit-learn's bundled file; CIFAR directories are only detected
    under the data roots, never downloaded.
    """
    from tqdm import tqdm

    from core import registry

    steps = [("digits", None), *((name, CIFAR_DIRS[name][0]) for name in CIFAR_DIRS)]
    for name, dirname in tqdm(steps, desc="vision datasets", disable=not progress):
        if dirname is None:
            if registry.system_entry(settings, "datasets", "digits") is None:
                import sklearn.datasets

                path = Path(sklearn.datasets.__file__).parent / "data" / "digits.csv.gz"
                if not path.is_file():
                    raise FileNotFoundError(f"scikit-learn's bundled digits file is missing: {path}")
                registry.register_dataset(settings, "digits", kind="image_classification",
                                          meta={"images": 1797, "classes": 10, "source": "scikit-learn (packaged)"})
            continue
        found = None
        for root in settings.data_roots:
            found = cifar_marker(name, root / dirname)
            if found is not None:
                break
        if found is not None and registry.system_entry(settings, "datasets", name) is None:
            registry.register_dataset(settings, name, kind="image_classification", path=found,
                                      meta={"classes": 10 if name == "cifar10" else 100, "format": "python-pickle"})
