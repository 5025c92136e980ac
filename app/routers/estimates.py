"""``POST /kinds/{name}/estimate``: what a training run would cost, before it is submitted (core/estimates.py)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Body, Depends, HTTPException, Path, Request
from pydantic import ValidationError

from app.deps import caller
from core import estimates
from core.contract.kind import JobKind

# The caller's recent succeeded runs of the kind looked at for a measured rate (the newest usable one is taken).
RECENT_RUNS = 5


def _rate(request: Request, kind: JobKind, owner: str) -> estimates.MeasuredRate | None:
    """The examples per second of the caller's newest succeeded run of ``kind`` whose size is known (a resumed
    run, which trained only part of its epochs, is skipped)."""
    store, settings = request.app.state.store, request.app.state.settings
    runs, _ = store.list(owner, kind=kind.name, status="succeeded", limit=RECENT_RUNS, scan_limit=200)
    for view in runs:
        payload = store.request_of(view["id"])
        if not isinstance(payload, dict) or payload.get("resume_from") or payload.get("resume"):
            continue
        try:
            earlier = kind.request.model_validate(payload)
        except ValidationError:
            continue
        rate = estimates.measured_rate(view["id"], view, kind.estimate(earlier, settings, owner))
        if rate is not None:
            return rate
    return None


def build_router(kinds: dict[str, JobKind]) -> APIRouter:
    router = APIRouter(tags=["kinds"])
    estimated = {k.name: k for k in kinds.values() if k.estimate is not None and not k.internal}
    # the kind whose runs measure each estimated kind's rate (an evaluation's: train_conve's, the training it does)
    rate_kinds = {name: kinds.get(k.estimate_rate_from or name) for name, k in estimated.items()}

    @router.post(
        "/kinds/{name}/estimate",
        summary="Estimate a training run or an evaluation: its trainings, examples, steps, time (and an "
        "evaluation's disk)",
        description="The body is the request you would submit (validated as it would be, 422 naming the field). "
        "The answer is an estimate. A training kind: `examples = epochs x training examples per epoch`, `steps = "
        "epochs x ceil(per epoch / batch size)`, and `seconds = examples / rate`, the rate (examples per second) "
        "measured on your latest succeeded run of this kind (`rate`, null without one). An evaluation "
        "(`evaluate_attribution`, `evaluate_mislabel`): `trainings` and `models` (the ConvE models it trains, "
        "at most: stored ones are reused), their `examples` and `steps`, `seconds = k x examples x parameters` "
        "(`basis` `measured`: k from your latest succeeded train_conve run; `model`: a constant measured on the "
        "reference machine; the training only, not the estimators) and `disk_bytes` by `disk`. The classifier "
        "evaluations (`evaluate_classifier_attribution`, `evaluate_classifier_mislabel`) answer the same way for "
        "the classifiers they train, k from your latest succeeded run of the same kind. Counts are null "
        "when the dataset's size is not registered.",
        responses={404: {}, 422: {}},
    )
    def estimate(request: Request, name: str = Path(..., max_length=64),
                 body: dict[str, Any] = Body(..., max_length=512),
                 owner: str = Depends(caller)) -> dict[str, Any]:
        kind = estimated.get(name)
        if kind is None:
            raise HTTPException(status_code=404, detail={
                "code": "not_found", "loc": ["path", "name"],
                "message": f"no estimate for {name!r}; kinds with one: {', '.join(sorted(estimated))}"})
        try:
            req = kind.request.model_validate(body)
        except ValidationError as exc:
            raise HTTPException(status_code=422, detail=[
                {"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]}
                for e in json.loads(exc.json(include_url=False, include_input=False))]) from None
        size = kind.estimate(req, request.app.state.settings, owner)
        rate_kind = rate_kinds[name]
        rate = _rate(request, rate_kind, owner) if size is not None and rate_kind is not None else None
        if isinstance(size, estimates.EvaluationSize):
            return estimates.evaluation_estimate(size, rate, rate_kind.name if rate_kind is not None else name)
        return estimates.estimate(size, rate)

    return router
