"""Worker side of ``POST /train/classifier``, and the digits demo: a small CNN on scikit-learn's digits, exported
with ``torch.export``, trained by the service and registered as ``digits-cnn-demo``.

The model's registered version (its archive and spec) is built by the interpreter, its parameters trained on the
dataset's ``train.safetensors`` (``models.export.train``); the trained archive, its spec and its checkpoints are
registered under the request's name. The per-epoch history and the per-step running loss are live in the job's
metrics.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from core import dataset_refs, registry
from core.kinds.train_classifier import (
    DATASET_KIND,
    MODEL_KIND,
    TrainClassifierRequest,
    TrainClassifierResult,
)
from core.userfiles import files_for
from models.curves import StepCurve
from workers.context import JobContext, JobError
from workers.live import LiveMetrics

DEMO_MODEL = "digits-cnn-demo"
DEMO_DATASET = "digits-tensors"  # "digits" is the Vision-BDH demo's image_classification dataset


def _dataset_dir(ctx: JobContext, request: TrainClassifierRequest) -> Path:
    ref = dataset_refs.resolve(ctx.settings, request.dataset, ctx.owner, DATASET_KIND)
    return registry.absolute_path(ctx.settings, ref.entry) if ref.entry is not None else ref.path


def _splits(directory: Path, files: Any) -> dict[str, Any]:
    from models.export.train import read_split

    return {s: read_split(directory / f"{s}.safetensors", files)
            for s in ("train", "valid", "test") if (directory / f"{s}.safetensors").is_file()}


def train_and_save(clf: Any, splits: dict[str, Any], opts: Any, out: Path,
                   progress: Any = None) -> tuple[Any, list[dict[str, Any]], dict[str, float | None]]:
    """Train ``clf`` on ``splits`` (``train``, optional ``valid`` and ``test``) and write the model directory."""
    from models.export.train import accuracy, save_model, train

    trained = train(clf, splits["train"], opts, splits.get("valid"), progress)
    checkpoints = save_model(out, clf, trained)
    scores = {s: accuracy(clf, d) for s, d in splits.items()}
    return trained, checkpoints, scores


def run(request: TrainClassifierRequest, ctx: JobContext) -> TrainClassifierResult:
    from models.export.program import load
    from models.export.train import TrainOptions

    t0 = time.perf_counter()
    entry = registry.get_model(ctx.settings, request.model)
    if entry is None or entry.get("kind") != MODEL_KIND:
        raise JobError("unknown_model", f"model {request.model!r} is not a registered exported classifier")
    source = registry.local_path(ctx.settings, entry)
    directory = _dataset_dir(ctx, request)
    try:
        splits = _splits(directory, files_for(ctx.settings, directory))
    except (ValueError, OSError) as exc:
        raise JobError("bad_dataset", f"dataset {request.dataset!r}: {exc}") from None
    try:  # a fresh copy: training changes its weights, the cached one serves explanations
        clf = load(source, ctx.device)
    except ValueError as exc:
        raise JobError("invalid_model", str(exc)) from None
    shape = list(clf.spec.shape)
    if list(splits["train"].inputs.shape[1:]) != shape:
        raise JobError("invalid_request", f"dataset {request.dataset!r} has inputs of shape "
                       f"{list(splits['train'].inputs.shape[1:])}; model {request.model!r} takes {shape}")
    opts = TrainOptions(epochs=request.epochs, batch_size=request.batch_size, lr=request.lr,
                        optimizer=request.optimizer, momentum=request.momentum, weight_decay=request.weight_decay,
                        seed=request.seed, checkpoint_every=request.checkpoint_every)
    live = LiveMetrics(ctx)
    steps_per_epoch = -(-splits["train"].labels.shape[0] // request.batch_size)
    curve = StepCurve(steps_per_epoch)
    history: list[dict[str, Any]] = []

    def progress(step: int, total: int, metrics: dict[str, float]) -> None:
        end = step % steps_per_epoch == 0
        curve.add(step, metrics["loss"], 1.0, force=end)
        sent = live.metrics(history, curve, force=end, epoch=metrics["epoch"])
        ctx.progress(step, total, "steps", message=f"epoch {metrics['epoch']}, loss {metrics['loss']:.4f}",
                     metrics=sent)

    out = ctx.settings.work_dir / f"train-classifier-{ctx.job_id}"
    try:
        try:
            trained, checkpoints, scores = train_and_save(clf, splits, opts, out, progress)
        except ValueError as exc:
            raise JobError("invalid_request", str(exc)) from None
        history[:] = trained.history
        ctx.register_model(request.name, kind=MODEL_KIND, loader="models.export.program:load", path=out,
                           parameters=clf.parameters,
                           meta={"labels": clf.labels, "spec": clf.spec.to_json(), "trained_from": request.model,
                                 "dataset": request.dataset, "accuracy": scores, "checkpoints": checkpoints})
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return TrainClassifierResult.model_validate({
        "model": request.name, "started_from": request.model, "parameters": clf.parameters,
        "examples": {s: int(d.labels.shape[0]) for s, d in splits.items()}, "accuracy": scores,
        "checkpoints": checkpoints, "history": trained.history, "steps": curve.rows(),
        "seconds": time.perf_counter() - t0})


# ---------------------------------------------------------------------------------------------------- demo
def demo_steps() -> list[Any]:
    from workers.demo import DemoStep

    return [DemoStep(DEMO_MODEL, prepare_demo, models=(DEMO_MODEL,), datasets=(DEMO_DATASET,),
                     kinds=("train_classifier",), cost_s=20.0)]


def prepare_demo(settings: Any, progress: bool = True) -> None:
    """scikit-learn's digits as a ``tensors`` dataset, and a small CNN exported with ``torch.export``, trained on
    it by :func:`train_and_save` and registered (idempotent: what is registered is kept)."""
    from models.export.demo import DIGITS_LABELS, digits_program, training_mean, write_digits
    from models.export.program import build
    from models.export.train import TrainOptions

    data_root = settings.work_dir / "demo-data" / DEMO_DATASET
    existing = registry.system_entry(settings, "datasets", DEMO_DATASET)
    if existing is not None and existing.get("kind") != DATASET_KIND:
        raise ValueError(f"dataset {DEMO_DATASET!r} is registered with kind {existing.get('kind')!r}, not "
                         f"{DATASET_KIND!r}: the digits demo needs its name")
    if existing is None:
        counts = write_digits(data_root)
        registry.register_dataset(settings, DEMO_DATASET, kind=DATASET_KIND, path=data_root, upload=True,
                                  meta={"format": "tensors", "counts": counts,
                                        "source": "scikit-learn's load_digits (UCI optical digits, 8x8)"})
    entry = registry.system_entry(settings, "models", DEMO_MODEL)
    store = registry.store(settings)
    if entry is not None and entry.get("location") and store.exists(f"{entry['location']}/model.pt2"):
        return
    work = settings.work_dir / "demo-models" / DEMO_MODEL
    shutil.rmtree(work, ignore_errors=True)
    initial = digits_program(work / "initial")
    clf = build(initial / "model.pt2", {"input": {"kind": "image", "mean": [round(training_mean(), 6)]},
                                        "labels": DIGITS_LABELS})
    if not data_root.is_dir():
        data_root = registry.absolute_path(settings, registry.get_dataset(settings, DEMO_DATASET))
    splits = _splits(data_root, files_for(settings, data_root))
    _, checkpoints, scores = train_and_save(clf, splits, TrainOptions(epochs=8, batch_size=64, lr=0.05, seed=0,
                                                                      checkpoint_every=2), work / "trained")
    if progress:
        print(f"{DEMO_MODEL}: test accuracy {scores.get('test', float('nan')):.3f}", flush=True)
    registry.register_model(settings, DEMO_MODEL, kind=MODEL_KIND, loader="models.export.program:load",
                            path=work / "trained", parameters=clf.parameters, preload=True,
                            meta={"labels": DIGITS_LABELS, "spec": clf.spec.to_json(), "dataset": DEMO_DATASET,
                                  "accuracy": scores, "checkpoints": checkpoints, "demo": True})
    shutil.rmtree(work, ignore_errors=True)
