"""One ``POST /<kind>`` route per registered job kind, generated from the kind registry."""

# No ``from __future__ import annotations``: FastAPI must see the request model class itself.
import json
from typing import Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from app.deps import caller
from core import budgets, placement, registry
from core.contract.errors import FieldError
from core.contract.kind import JobKind
from core.jobstore import IdempotencyConflict, IdempotencyInProgress, QuotaExceeded

# Seconds a client should wait before retrying a 409 idempotency_in_progress / a 429.
IN_PROGRESS_RETRY_S = 1
QUOTA_RETRY_S = 30


def _admit(kind: JobKind, body: Any, settings: Any, owner: str) -> placement.Placement:
    """The kind's checks (its memory estimates compare with the workers that could take the request), then the
    request's queue (``core.placement.place``: a FieldError when no worker class can run it)."""
    requirements = getattr(body, "requirements", None)
    with placement.admitting(settings, kind.queue, requirements) as admission:
        if kind.validate is not None:
            kind.validate(body, settings, owner)
    placed = placement.place(settings, kind.queue, requirements, admission.memory_bytes)
    if settings.tenant_store_bytes or settings.tenant_compute_s:
        budgets.check(settings, registry.connection(settings), owner, kind.name)
    return placed


def _route_for(kind: JobKind):
    request_model = kind.request

    async def submit(
        request: Request,
        body: request_model,  # type: ignore[valid-type]
        owner: str = Depends(caller),
        idempotency_key: str | None = Header(
            None, alias="Idempotency-Key", max_length=255,
            description="a retry with the same key and body returns the same job",
        ),
    ) -> JSONResponse:
        settings = request.app.state.settings
        # registry and store lookups, blocking: in a thread; then the worker class the job may go to
        try:
            placed = await run_in_threadpool(_admit, kind, body, settings, owner)
        except budgets.BudgetExceeded as exc:
            headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else {}
            return JSONResponse(status_code=exc.status, headers=headers, content={"detail": exc.detail()})
        payload: dict[str, Any] = json.loads(body.model_dump_json())
        store = request.app.state.store
        try:
            # One Redis round trip on the async client: idempotency, quota admission, enqueue, the job's view.
            job_id, replayed, view = await store.asubmit_with_view(kind, payload, owner, idempotency_key, placed)
        except IdempotencyConflict as exc:
            raise FieldError(("header", "Idempotency-Key"), str(exc), value=idempotency_key) from None
        except IdempotencyInProgress as exc:
            return JSONResponse(status_code=409, headers={"Retry-After": str(IN_PROGRESS_RETRY_S)}, content={
                "detail": {"code": "idempotency_in_progress", "message": str(exc)}})
        except QuotaExceeded as exc:
            return JSONResponse(status_code=429, headers={"Retry-After": str(QUOTA_RETRY_S)}, content={
                "detail": {"code": "quota_exceeded", "limit": exc.limit, "value": exc.value,
                           "message": exc.message}})
        headers = {"Location": f"/jobs/{job_id}"}
        if replayed:
            headers["Idempotent-Replayed"] = "true"
        return JSONResponse(status_code=202, content=view, headers=headers)

    submit.__name__ = f"submit_{kind.name}"
    return submit


def build_router(kinds: dict[str, JobKind]) -> APIRouter:
    router = APIRouter(tags=["submit"])
    for kind in kinds.values():
        if kind.internal:
            continue
        router.add_api_route(
            kind.route,
            _route_for(kind),
            methods=["POST"],
            status_code=202,
            summary=kind.summary or f"Submit a {kind.name} job",
            description=f"Queue: `{kind.queue}`. Returns 202 with `Location: /jobs/<id>` and the job (a retry with "
            "the same Idempotency-Key and body returns the same job: submission is one atomic step); 429 "
            "`quota_exceeded` (with Retry-After) over `EXPLAINQ_MAX_ACTIVE_JOBS` or `EXPLAINQ_MAX_QUEUE_LENGTH`, or "
            "`compute_budget_exceeded` over `EXPLAINQ_TENANT_COMPUTE_S`; 413 `store_budget_exceeded` at "
            "`EXPLAINQ_TENANT_STORE_BYTES`.",
            name=f"submit_{kind.name}",
            openapi_extra={"x-explainq-kind": kind.describe()},
        )
    return router


def kinds_router(kinds: dict[str, JobKind]) -> APIRouter:
    """``GET /kinds``: every public kind as it describes itself (route, queue, title, result renderer, SDK method,
    form hints), so clients present a kind without knowing its name."""
    router = APIRouter(tags=["health"])
    described = [k.describe() for k in sorted(kinds.values(), key=lambda k: k.name) if not k.internal]

    @router.get("/kinds", summary="The job kinds this service runs, as they describe themselves")
    async def list_kinds(_owner: str = Depends(caller)) -> dict[str, Any]:
        return {"kinds": described}

    return router
