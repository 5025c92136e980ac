"""Worker side of ``POST /tracin``: TracIn-CP over the model's checkpoints, JSON result and a CSV artifact."""

from __future__ import annotations

import json

from workers.context import JobContext, JobError


def run(payload: dict, ctx: JobContext) -> dict:
    from models.common import NonFiniteError
    from models.kg.checkpoint import KGBundle
    from models.kg.influence import FilterSpec, tracin_report, write_csv

    bundle = ctx.model(payload["model"])
    if not isinstance(bundle, KGBundle):
        raise JobError("wrong_model", f"model {payload['model']!r} is not a ConvE model")
    filt = payload.get("filter")

    def progress(done: int, total: int, message: str) -> None:
        ctx.progress(done, total, "batches", message=message)

    try:
        result, rows = tracin_report(
            bundle, payload.get("test_triples"), mode=payload["mode"], top_k=payload["top_k"],
            checkpoints=payload["checkpoints"], layers=payload["layers"], loss=payload["loss"],
            projection_dim=payload.get("projection_dim"), precision=payload["precision"],
            batch_size=payload["batch_size"], filter=FilterSpec(**filt) if filt else None,
            train_triples=payload.get("train_triples"), method=payload.get("method", "ghost"),
            device=ctx.device, lr_weight=payload.get("lr_weight", "last"), progress=progress)
    except NonFiniteError as exc:
        raise JobError("non_finite_scores", str(exc)) from None
    except (KeyError, ValueError) as exc:
        # the API validates names, checkpoints and layers; this catches a model re-trained in between
        raise JobError("invalid_request", str(exc.args[0] if exc.args else exc)) from None
    write_csv(rows, ctx.artifact_path("influence.csv"))
    ctx.artifact_path("result.json").write_text(json.dumps(result))
    return {"model": payload["model"], **result, "artifacts": ctx.artifacts()}
