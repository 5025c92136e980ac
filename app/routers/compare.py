"""``GET /compare?a=&b=``: two succeeded jobs of one kind side by side (``core/compare.py``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from app.deps import caller
from app.routers.jobs import _owned, _view
from core import compare
from core.artifacts import artifacts_key
from core.contract.kind import KINDS
from core.contract.results.compare import ComparisonResult
from core.filestore import StoreError, clean_key, get_store

router = APIRouter(tags=["jobs"])


def _refused(field: str, message: str, value: str) -> HTTPException:
    return HTTPException(status_code=422, detail=[{"loc": ["query", field], "msg": message, "type": "value_error",
                                                   "input": value[:64]}])


def _artifact_reader(request: Request, job_id: str) -> Any:
    store = get_store(request.app.state.settings)

    def lines(name: str) -> Any:
        try:
            key = clean_key(artifacts_key(job_id), name)
        except StoreError:
            return iter(())
        if not key.startswith(artifacts_key(job_id) + "/") or not store.exists(key):
            return iter(())
        return compare.read_lines(store, key)

    return lines


@router.get(
    "/compare", response_model=ComparisonResult,
    summary="Two succeeded jobs of one kind side by side (attributions, TracIn, training)",
    description="Deltas are b − a. Both jobs must be yours (another owner's job answers 404, as an unknown one), "
    "have succeeded (409 `not_succeeded`) and be of one kind that can be compared (422 naming `a` or `b`).",
    responses={404: {"description": "no such job of yours"}, 409: {"description": "a job has not succeeded"},
               422: {"description": "different kinds or modes, or a kind without comparisons"}},
)
async def compare_jobs(
    request: Request,
    a: str = Query(..., min_length=1, max_length=64, description="the first job's id (or a unique prefix)"),
    b: str = Query(..., min_length=1, max_length=64, description="the second job's id (or a unique prefix)"),
    owner: str = Depends(caller),
) -> Any:
    views = []
    for name, job_id in (("a", a), ("b", b)):
        try:
            full_id, raw, position, meta = await _owned(request, job_id, owner)
        except HTTPException as exc:
            if exc.status_code == 404:
                raise HTTPException(status_code=404, detail={"code": "not_found", "message": f"{name}: no job "
                                                             f"{job_id!r}", "loc": ["query", name]}) from None
            raise
        view = await _view(request, full_id, raw, position, meta)
        views.append((name, view))
    for name, view in views:
        if view["status"] != "succeeded":
            raise HTTPException(status_code=409, detail={
                "code": "not_succeeded", "loc": ["query", name], "status": view["status"],
                "message": f"{name}: job {view['id'][:8]} is {view['status']}; only succeeded jobs can be "
                "compared"})
    (_, view_a), (_, view_b) = views
    store = request.app.state.store
    result_a, _ = await run_in_threadpool(store.result, view_a["id"])
    result_b, _ = await run_in_threadpool(store.result, view_b["id"])
    if not isinstance(result_a, dict) or not isinstance(result_b, dict):
        raise _refused("a" if not isinstance(result_a, dict) else "b", "the job's result is not a JSON object "
                       "and cannot be compared", view_a["id"])
    kind_a, kind_b = view_a.get("kind") or "", view_b.get("kind") or ""
    renderer = getattr(KINDS.get(kind_a), "renderer", None)
    try:
        renderer = compare.check_comparable(renderer, kind_a, kind_b, result_a, result_b)
    except compare.CompareRefused as exc:
        raise _refused(exc.field, str(exc), a if exc.field == "a" else b) from None
    requests: list[dict[str, Any] | None] = [None, None]
    if renderer == "training":
        requests = [await run_in_threadpool(store.request_of, v["id"]) for v in (view_a, view_b)]
    answer = await run_in_threadpool(
        compare.build, kind_a, renderer, view_a, view_b, result_a, result_b,
        _artifact_reader(request, view_a["id"]), _artifact_reader(request, view_b["id"]), *requests)
    return JSONResponse(answer.model_dump(mode="json"))  # validated as built; served without a second pass
