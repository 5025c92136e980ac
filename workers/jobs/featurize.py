"""Worker side of ``POST /featurize``: the projected gradient features of the model's training triples, per
checkpoint, into the file store (only the rows not stored yet are computed; see :mod:`models.explain.features`,
and :mod:`models.kg.stored` for ConvE's side of it)."""

from __future__ import annotations

import json
from typing import Any

from core import registry
from core.filestore import get_store
from core.kinds.featurize import FeaturizeRequest, FeaturizeResult
from workers.context import JobContext, JobError, json_safe
from workers.jobs.tracin import _bundle

MODELS_FILE = "models.json"  # features/<key>/models.json: the model versions (store keys) these features belong to


def record_model(store: Any, feature_keys: list[str], location: str | None) -> None:
    """Note under each feature key the model version it was computed from, so retention removes the features
    once no registered model holds that version (``core.retention``)."""
    if not location:
        return
    for key in feature_keys:
        path = f"features/{key}/{MODELS_FILE}"
        held = set(json.loads(store.read_bytes(path))) if store.exists(path) else set()
        if location not in held:
            store.put_bytes(json.dumps(sorted(held | {location})).encode(), path)


def run(request: FeaturizeRequest, ctx: JobContext) -> FeaturizeResult:
    from models.kg.stored import featurize

    bundle = _bundle(ctx, request.model)

    def progress(done: int, total: int, message: str) -> None:
        ctx.progress(done, total, "rows", message=message)

    try:
        stored = featurize(get_store(ctx.settings), bundle, request.checkpoints, layers=request.layers,
                           loss=request.loss, proj_dim=request.proj_dim, seed=request.seed, device=ctx.device,
                           batch_size=request.batch_size, progress=progress)
    except (KeyError, ValueError) as exc:  # the API validated names; this catches a model re-trained in between
        raise JobError("invalid_request", str(exc.args[0] if exc.args else exc)) from None
    keys = [c["key"] for c in stored["checkpoints"]]
    record_model(get_store(ctx.settings), keys, (registry.get_model(ctx.settings, request.model) or {}).get("location"))
    ctx.use_shared(f"features/{k}" for k in keys)
    result = FeaturizeResult.model_validate({"model": request.model, **json_safe(stored)})
    ctx.artifact_path("result.json").write_text(result.model_dump_json(exclude={"artifacts"}))
    result.artifacts = ctx.artifacts()
    return result
