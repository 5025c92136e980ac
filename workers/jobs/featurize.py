"""Worker side of ``POST /featurize``: the projected gradient features of the model's training triples, per
checkpoint, into the file store (only the rows not stored yet are computed; see :mod:`models.explain.features`)."""

from __future__ import annotations

import json
from typing import Any

from core.filestore import get_store
from workers.context import JobContext, JobError
from workers.context import json_safe as _clean
from workers.jobs.tracin import _bundle


def run(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    from models.explain.features import featurize

    bundle = _bundle(ctx, payload["model"])

    def progress(done: int, total: int, message: str) -> None:
        ctx.progress(done, total, "rows", message=message)

    try:
        result = featurize(get_store(ctx.settings), bundle, payload["checkpoints"], layers=payload["layers"],
                           loss=payload["loss"], proj_dim=payload["proj_dim"], seed=payload["seed"],
                           device=ctx.device, batch_size=payload["batch_size"], progress=progress)
    except (KeyError, ValueError) as exc:  # the API validated names; this catches a model re-trained in between
        raise JobError("invalid_request", str(exc.args[0] if exc.args else exc)) from None
    result = {"model": payload["model"], **_clean(result)}
    ctx.artifact_path("result.json").write_text(json.dumps(result))
    return {**result, "artifacts": ctx.artifacts()}
