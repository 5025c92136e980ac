"""Worker side of ``POST /featurize/classifier``: the projected gradient features of a classifier's training
examples, per checkpoint, into the file store (only the rows not stored yet are computed; see
:mod:`models.explain.features` and :mod:`models.explain.classifier_features`), recorded with the model version so
that retention removes them with it."""

from __future__ import annotations

import time

from core import dataset_refs, registry
from core.filestore import get_store
from core.kinds.classifier_featurize import SERVES, ClassifierFeaturizeRequest, ClassifierFeaturizeResult
from core.kinds.classifier_influence import ClassifierInfluenceRequest, chunk_size, training_dataset
from core.kinds.train_classifier import DATASET_KINDS, HF_KIND
from workers.context import JobContext, JobError, json_safe
from workers.jobs.classifier_influence import Prepared, _exported, _huggingface
from workers.jobs.featurize import record_model


def prepare(ctx: JobContext, model: str, dataset: str | None, checkpoints: str, max_length: int) -> tuple[
        Prepared, str, dict]:
    """The classifier and its training rows, as ``POST /tracin/classifier`` builds them (the same rows, so the
    same segment digests)."""
    entry = registry.get_model(ctx.settings, model)
    if entry is None or entry.get("kind") not in DATASET_KINDS:
        raise JobError("unknown_model", f"model {model!r} is not a registered exported or Hugging Face classifier")
    like = ClassifierInfluenceRequest(model=model, dataset=dataset, mode="self", checkpoints=checkpoints,
                                      max_length=max_length)
    name = training_dataset(like, entry)
    ref = dataset_refs.resolve(ctx.settings, name, ctx.owner, DATASET_KINDS[entry["kind"]])
    directory = registry.absolute_path(ctx.settings, ref.entry) if ref.entry is not None else ref.path
    source = registry.local_path(ctx.settings, entry)
    p = (_huggingface if entry["kind"] == HF_KIND else _exported)(like, ctx, source, directory, name)
    return p, name, entry


def run(request: ClassifierFeaturizeRequest, ctx: JobContext) -> ClassifierFeaturizeResult:
    from models.explain.classifier_features import ClassifierFeatures, store_weights
    from models.explain.features import featurize

    t0 = time.perf_counter()
    r = request
    p, name, entry = prepare(ctx, r.model, r.dataset, r.checkpoints, r.max_length)
    parameters = sum(t.numel() for t in p.module.parameters())
    store = get_store(ctx.settings)
    source = ClassifierFeatures(p.clf, p.train_rows)

    def progress(done: int, total: int, message: str) -> None:
        ctx.progress(done, total, "rows", message=message)

    try:
        stored = featurize(store, source, "all", loss=r.loss, proj_dim=r.proj_dim, seed=r.seed, device=ctx.device,
                           batch_size=chunk_size(r, parameters), progress=progress)  # type: ignore[arg-type]
    except (KeyError, ValueError) as exc:
        raise JobError("invalid_request", str(exc.args[0] if exc.args else exc)) from None
    keys = [c["key"] for c in stored["checkpoints"]]
    if r.loss == "margin":
        store_weights(store, source, stored, ctx.device)
    record_model(store, keys, entry.get("location"))
    ctx.use_shared(f"features/{k}" for k in keys)
    seconds = time.perf_counter() - t0
    result = ClassifierFeaturizeResult.model_validate({
        "model": r.model, "dataset": name, **json_safe(stored), "serves": SERVES[r.loss],
        "examples_per_second": round(stored["rows_computed"] / stored["seconds"], 3)
        if stored["rows_computed"] and stored["seconds"] else None, "seconds": seconds})
    ctx.artifact_path("result.json").write_text(result.model_dump_json(exclude={"artifacts"}))
    result.artifacts = ctx.artifacts()
    return result
