"""The job resource: read, list, cancel, result, and progress as server-sent events."""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import UTC, datetime
from typing import Any, Union

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from redis.exceptions import RedisError

from app.deps import caller
from core import demo_status, fanout, limits, system_status
from core.contract.fields import TAG_PATTERN
from core.contract.kind import KINDS, JobKind
from core.jobstore import aresolve_prefix, decode_cursor, fanned_out, is_id_prefix, read_view, run_script
from core.jobview import (
    STATUSES,
    TERMINAL,
    VIEW_FIELDS,
    VIEW_SCRIPT,
    fields_to_raw,
    is_abandoned,
    parse_meta,
    view_script_args,
    view_script_result,
)
from core.keys import JOB_PREFIX, valid_job_id
from core.ownership import owns

router = APIRouter(tags=["jobs"])


def register_scripts(app: Any) -> None:
    """The job view script (fields and queue position in one round trip) on the app's async Redis client."""
    app.state.view_script = app.state.aredis.register_script(VIEW_SCRIPT)
    app.state.live_workers_script = app.state.aredis.register_script(system_status.LIVE_WORKERS_SCRIPT)

JOB_EXAMPLE = {
    "id": "3f0c...", "kind": "attributions", "label": "baseline run", "tags": ["nrms"], "model": "nrms-demo",
    "input": "1 sample: “Lakers win”", "status": "running", "queue": "explain", "position": None,
    "created_at": "2026-01-01T12:00:00.000000Z", "started_at": "2026-01-01T12:00:01.000000Z", "finished_at": None,
    "progress": {"done": 120, "total": 400, "unit": "samples", "message": "...", "eta_s": 31.5},
    "metrics": None, "error": None, "kept": False, "result_url": None, "waiting_reason": None,
    "links": {"self": "/jobs/3f0c...", "cancel": "/jobs/3f0c...", "events": "/jobs/3f0c.../events"},
}


def _not_found(job_id: str) -> HTTPException:
    return HTTPException(status_code=404, detail={"code": "not_found", "message": f"no job {job_id!r}"})


async def _fetch(request: Request, job_id: str) -> dict[bytes, bytes]:
    return fields_to_raw(await request.app.state.aredis.hmget(JOB_PREFIX + job_id, VIEW_FIELDS))


class SharedViews:
    """The views the event streams of one API process read, shared: a stream asking for a job's view gets the
    last one read if it is younger than the stream's own interval, else reads it once for every stream that asks
    meanwhile (one read in flight per job). So 16 streams on one job cost one view per interval, not 16."""

    MAX_ENTRIES = 1024  # views kept at most (an entry older than 10 s goes at the next insert past 256)

    def __init__(self) -> None:
        self._entries: dict[Any, tuple[float, asyncio.Future]] = {}

    async def get(self, key: Any, max_age_s: float, read: Any) -> Any:
        now = time.monotonic()
        entry = self._entries.get(key)
        future = entry[1] if entry is not None else None
        failed = future is not None and future.done() and (future.cancelled() or future.exception() is not None)
        if entry is None or now - entry[0] >= max_age_s or failed:
            if len(self._entries) >= 256:
                self._prune(now)
            entry = (now, asyncio.ensure_future(read()))
            self._entries[key] = entry
        return await asyncio.shield(entry[1])

    def _prune(self, now: float) -> None:
        for key, (at, future) in list(self._entries.items()):
            if future.done() and now - at > 10.0:
                del self._entries[key]
        while len(self._entries) >= self.MAX_ENTRIES:  # all young: drop the oldest
            del self._entries[next(iter(self._entries))]


def shared_views(app: Any) -> SharedViews:
    views = getattr(app.state, "shared_views", None)
    if views is None:
        views = app.state.shared_views = SharedViews()
    return views


async def _fetch_with_position(request: Request, job_id: str) -> tuple[dict[bytes, bytes], int | None]:
    keys, args = view_script_args(job_id)
    return view_script_result(await run_script(request.app.state.aredis, request.app.state.view_script, keys, args))


async def resolve_id(request: Request, job_id: str, owner: str) -> str:
    """The full id of the caller's only job whose id starts with ``job_id`` (core/jobstore.py:
    ``aresolve_prefix``); 404 as for an unknown job when none does, 409 ``ambiguous_id`` with the matching ids
    when several do."""
    matches = await aresolve_prefix(request.app.state.aredis, owner, job_id)
    if not matches:
        raise _not_found(job_id)
    if len(matches) > 1:
        raise HTTPException(status_code=409, detail={
            "code": "ambiguous_id", "message": f"{job_id!r} is the start of {len(matches)} of your jobs' ids; "
            "give more of the id", "matches": matches})
    return matches[0]


async def _owned(request: Request, job_id: str, owner: str
                 ) -> tuple[str, dict[bytes, bytes], int | None, dict[str, Any]]:
    """The job's full id, fields, queue position and parsed meta; 404 for a malformed id, a missing job or another
    owner's job. A full id costs one round trip; only an id that names no job of the caller's is then tried as a
    prefix of one (``resolve_id``)."""
    if not valid_job_id(job_id):
        raise _not_found(job_id)
    raw, position = await _fetch_with_position(request, job_id)
    meta = parse_meta(raw) if raw else {}
    if not raw or not owns(meta, owner):
        if not is_id_prefix(job_id):
            raise _not_found(job_id)
        full_id = await resolve_id(request, job_id, owner)
        raw, position = await _fetch_with_position(request, full_id)
        meta = parse_meta(raw) if raw else {}
        if not raw or not owns(meta, owner):
            raise _not_found(job_id)
        job_id = full_id
    if is_abandoned(raw, request.app.state.settings.heartbeat_ttl_s):
        reaped = await run_in_threadpool(request.app.state.store.reap_if_abandoned, raw, job_id)
        if reaped is not raw:
            raw, meta = reaped, parse_meta(reaped)
    return job_id, raw, position, meta


async def _owned_raw(request: Request, job_id: str, owner: str) -> tuple[str, dict[bytes, bytes]]:
    """The job's full id and fields (see ``_owned``)."""
    job_id, raw, _, _ = await _owned(request, job_id, owner)
    return job_id, raw


async def _view(request: Request, job_id: str, raw: dict[bytes, bytes], position: int | None = None,
                meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The job view (``core.jobstore.read_view``, the one job read): off the event loop only for a fanned-out
    parent, whose view reads its children; inline otherwise, at zero extra cost."""
    redis = request.app.state.redis
    if fanned_out(raw):
        view = await run_in_threadpool(read_view, redis, job_id, raw, "", position, meta)
    else:
        view = read_view(redis, job_id, raw, position=position, meta=meta)
    view["waiting_reason"] = await _waiting_reason(request, view) if view["status"] == "queued" else None
    return view


async def _waiting_reason(request: Request, view: dict[str, Any]) -> str | None:
    """Why a queued job does not start (core/system_status.py); None while a live worker listens on its queue.
    One extra round trip for a queued job (one script), two when no worker is there; none for any other job."""
    aredis = request.app.state.aredis
    queue = view.get("queue")
    if not queue:
        return None
    live = await run_script(aredis, request.app.state.live_workers_script,
                            system_status.live_workers_keys(queue), [])
    if live:
        return None
    return system_status.waiting_reason(queue, live, await demo_status.aread(aredis))


# The path parameter as FastAPI documents a ``job_id: str`` argument.
JOB_ID_PARAMETER = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string", "title": "Job Id"}}


@router.get(
    "/jobs/{job_id}",
    summary="A job's status, progress and error",
    responses={200: {"content": {"application/json": {"example": JOB_EXAMPLE}}}, 404: {}},
    openapi_extra={"parameters": [JOB_ID_PARAMETER]},
)
async def get_job(request: Request) -> JSONResponse:
    # The hottest endpoint. Auth is called inline rather than through Depends, and the id is read from the path
    # rather than declared as an argument (any string; an id that is not a job's is a 404 below): both cost more
    # per request in FastAPI's dependency solver than the Redis round trip itself.
    job_id: str = request.path_params["job_id"]
    job_id, raw, position, meta = await _owned(request, job_id, await caller(request))
    return JSONResponse(await _view(request, job_id, raw, position, meta))


@router.get(
    "/jobs",
    summary="List your jobs, newest first",
    description="Keyset paging: follow `next_cursor` until it is null. Jobs added, finished or expired meanwhile "
    "never shift a page. A page may hold fewer than `limit` items, with a cursor, when filters skip many jobs.",
)
def list_jobs(
    request: Request,
    kind: str | None = Query(None, description="only jobs of this kind"),
    status: str | None = Query(None, description="queued, running, succeeded, failed or canceled"),
    limit: int = Query(50, ge=1, le=500),
    cursor: str | None = Query(None, description="the next_cursor of the previous page"),
    parent: str | None = Query(None, description="list the shards (then the reduce step) of this fanned-out job"),
    q: str | None = Query(None, max_length=limits.MAX_LABEL_LENGTH,
                          description="only jobs whose label, model, input, kind or id holds this text (any case)"),
    tag: list[str] = Query([], max_length=limits.MAX_TAGS,
                           description="only jobs with this tag (repeat for jobs with every one of them)"),
    created_after: datetime | None = Query(None, description="only jobs created after this time (ISO 8601; "
                                           "the scan stops there)"),
    model_digest: str | None = Query(None, description="only jobs that read or registered a model version whose "
                                     "digest (its provenance's SHA-256) starts with these 8 to 64 hex digits"),
    owner: str = Depends(caller),
) -> dict[str, Any]:
    if parent is not None:
        return _list_children(request, parent, owner, limit, cursor)
    for i, t in enumerate(tag):
        if len(t) > limits.MAX_TAG_LENGTH or not re.fullmatch(TAG_PATTERN, t):
            raise HTTPException(status_code=422, detail=[{
                "loc": ["query", "tag", i], "msg": f"a tag is 1 to {limits.MAX_TAG_LENGTH} letters, digits, '-', "
                "'_' or '.', starting with a letter or digit", "type": "value_error", "input": t[:64]}])
    if model_digest is not None and not MODEL_DIGEST.fullmatch(model_digest):
        raise HTTPException(status_code=422, detail=[{
            "loc": ["query", "model_digest"], "msg": "a model digest is 8 to 64 hexadecimal digits (a prefix of the "
            "SHA-256 a result's provenance gives)", "type": "value_error", "input": model_digest[:80]}])
    if status is not None and status not in STATUSES:
        raise HTTPException(
            status_code=422,
            detail=[{"loc": ["query", "status"], "msg": f"status must be one of {', '.join(STATUSES)}",
                     "type": "value_error", "input": status}],
        )
    if cursor is not None:
        try:
            decode_cursor(cursor)
        except ValueError:
            raise HTTPException(
                status_code=422,
                detail=[{"loc": ["query", "cursor"], "msg": "malformed cursor", "type": "value_error",
                         "input": cursor}],
            ) from None
    items, next_cursor = request.app.state.store.list(owner, kind=kind, status=status, limit=limit, cursor=cursor,
                                                      q=q.strip() if q else None, tags=tuple(tag),
                                                      created_after=_aware(created_after),
                                                      model_digest=model_digest)
    return {"items": items, "next_cursor": next_cursor}


MODEL_DIGEST = re.compile(r"[0-9a-fA-F]{8,64}")


def _aware(when: datetime | None) -> datetime | None:
    """A time without a zone is UTC, as every time the API writes."""
    return when.replace(tzinfo=UTC) if when is not None and when.tzinfo is None else when


# A shard listing's cursor is the offset of its next page: ASCII digits, at most 12 of them. ``str.isdigit`` also
# accepts superscripts ('²', which ``int`` refuses) and other scripts' digits, and ``int`` refuses more than 4300.
CHILD_CURSOR = re.compile(r"[0-9]{1,12}")


def _list_children(request: Request, parent: str, owner: str, limit: int, cursor: str | None) -> dict[str, Any]:
    store = request.app.state.store
    raw = store.raw(parent) if valid_job_id(parent) else {}
    if not raw or not owns(parse_meta(raw), owner):
        raise HTTPException(status_code=404, detail={"code": "not_found", "message": f"no job {parent!r}",
                                                     "loc": ["query", "parent"]})
    if cursor is not None and not CHILD_CURSOR.fullmatch(cursor):
        raise HTTPException(status_code=422, detail=[{"loc": ["query", "cursor"], "msg": "malformed cursor",
                                                      "type": "value_error", "input": cursor}])
    start = int(cursor or 0)
    ids = fanout.children(request.app.state.redis, parent)
    page = ids[start:start + limit]
    with request.app.state.redis.pipeline(transaction=False) as pipe:
        for jid in page:
            pipe.hmget(JOB_PREFIX + jid, VIEW_FIELDS)
        raws = [fields_to_raw(v) for v in pipe.execute()]
    redis = request.app.state.redis
    items = [read_view(redis, jid, r) for jid, r in zip(page, raws, strict=True) if r]
    return {"items": items, "next_cursor": str(start + limit) if start + limit < len(ids) else None}


@router.delete(
    "/jobs/{job_id}",
    summary="Cancel a queued or running job (at once when queued, at its next step when running); delete a "
    "finished one with its result and files",
    responses={202: {"description": "canceled (the job's view)"},
               200: {"description": "a finished job deleted: its record, result and files"},
               409: {"description": "`already_finished` with `cancel_only`; `kept`: undo the keep first"}},
)
async def cancel_job(
    job_id: str, request: Request, owner: str = Depends(caller),
    cancel_only: bool = Query(False, description="only cancel: a finished job is answered 409 `already_finished` "
                              "and kept, never deleted (what a cancel that races the job's end wants)"),
) -> JSONResponse:
    job_id, raw = await _owned_raw(request, job_id, owner)
    view = await _view(request, job_id, raw)
    if view["status"] in TERMINAL:
        if cancel_only:
            return JSONResponse(status_code=409, content={"detail": {
                "code": "already_finished", "status": view["status"],
                "message": f"job is already {view['status']}"}, "job": view})
        return await _delete_finished(request, job_id, owner, view)
    await run_in_threadpool(request.app.state.store.cancel, job_id)
    raw = await _fetch(request, job_id)
    return JSONResponse(status_code=202, content=await _view(request, job_id, raw))


async def _delete_finished(request: Request, job_id: str, owner: str, view: dict[str, Any]) -> JSONResponse:
    store = request.app.state.store
    if await run_in_threadpool(store.is_kept, job_id):
        return JSONResponse(status_code=409, content={"detail": {
            "code": "kept", "status": view["status"],
            "message": f"job {job_id} is kept; undo that first (DELETE /jobs/{job_id}/keep), then delete it"},
            "job": view})
    try:
        removed = await run_in_threadpool(store.delete, job_id, owner)
    except RedisError:
        raise
    except Exception as exc:  # the store: nothing of the job's records was deleted, the call can be repeated
        return JSONResponse(status_code=503, headers={"Retry-After": "30"}, content={"detail": {
            "code": "store_unavailable", "message": f"the job's files could not be deleted from the store "
            f"({type(exc).__name__}); its record is kept, try again"}})
    return JSONResponse({"id": job_id, "deleted": True, "status": view["status"], "files_removed": removed})


def _not_finished(view: dict[str, Any]) -> JSONResponse:
    return JSONResponse(status_code=409, content={"detail": {
        "code": "not_finished", "status": view["status"],
        "message": f"job is {view['status']}; only a finished job can be kept"}, "job": view})


@router.post("/jobs/{job_id}/keep", summary="Keep a finished job: its record, result and files are exempt from "
             "retention until the keep is undone", responses={409: {"description": "the job has not finished"}})
async def keep_job(job_id: str, request: Request, owner: str = Depends(caller)) -> JSONResponse:
    job_id, raw = await _owned_raw(request, job_id, owner)
    view = await _view(request, job_id, raw)
    if view["status"] not in TERMINAL:
        return _not_finished(view)
    await run_in_threadpool(request.app.state.store.keep, job_id, owner)
    return JSONResponse(await _view(request, job_id, await _fetch(request, job_id)))


@router.delete("/jobs/{job_id}/keep", summary="Undo a keep: the job expires after its retention period again, "
               "counted from now")
async def unkeep_job(job_id: str, request: Request, owner: str = Depends(caller)) -> JSONResponse:
    job_id, raw = await _owned_raw(request, job_id, owner)
    view = await _view(request, job_id, raw)
    if view["status"] not in TERMINAL:
        return _not_finished(view)
    store = request.app.state.store
    if await run_in_threadpool(store.is_kept, job_id):  # a job that is not kept keeps its expiry as it is
        await run_in_threadpool(store.unkeep, job_id, KINDS.get(view.get("kind") or ""))
    return JSONResponse(await _view(request, job_id, await _fetch(request, job_id)))


# Set on a result that does not validate against its kind's result model (written by an earlier version): it is
# served as it was stored, and clients show it as JSON rather than draw it.
RESULT_SCHEMA_HEADER = "X-Explainq-Result-Schema"


def result_router(kinds: dict[str, JobKind]) -> APIRouter:
    """``GET /jobs/{id}/result``, declared with the union of the loaded kinds' result models as its
    ``response_model``, so the OpenAPI document describes every result. A result is served as stored: the worker
    validated it against its kind's model when it ran (``result_schema`` in its meta); one written by an earlier
    version is validated now, and served as it is, marked with ``X-Explainq-Result-Schema: unvalidated``, when it
    does not match."""
    models = list(dict.fromkeys(k.result for k in kinds.values() if k.result is not None))
    answer: Any = Union[tuple(models)] if models else dict[str, Any]  # noqa: UP007 (a runtime union of classes)
    router = APIRouter(tags=["jobs"])

    @router.get("/jobs/{job_id}/result", summary="The result of a succeeded job", response_model=answer,
                responses={409: {"description": "the job has not succeeded"}})
    async def get_result(job_id: str, request: Request, owner: str = Depends(caller)) -> Response:
        job_id, raw = await _owned_raw(request, job_id, owner)
        view = await _view(request, job_id, raw)
        if view["status"] != "succeeded":
            return JSONResponse(status_code=409, content={"detail": {
                "code": "not_ready" if view["status"] in ("queued", "running") else view["status"],
                "message": f"job is {view['status']}; a result exists only for succeeded jobs"}, "job": view})
        result, schema = await run_in_threadpool(request.app.state.store.result, job_id)
        model = getattr(KINDS.get(view.get("kind") or ""), "result", None)
        if model is None or schema == model.__name__:
            return JSONResponse(result, headers={RESULT_SCHEMA_HEADER: schema or "none"})
        if await run_in_threadpool(_validates, model, result):
            return JSONResponse(result, headers={RESULT_SCHEMA_HEADER: model.__name__})
        return JSONResponse(result, headers={RESULT_SCHEMA_HEADER: "unvalidated"})

    return router


def _validates(model: Any, result: Any) -> bool:
    try:
        model.model_validate(result)
    except ValidationError:
        return False
    return True


@router.get("/jobs/{job_id}/request", summary="The request a job was submitted with (as validated and stored)")
async def get_request(job_id: str, request: Request, owner: str = Depends(caller)) -> JSONResponse:
    job_id, _ = await _owned_raw(request, job_id, owner)
    body = await run_in_threadpool(request.app.state.store.request_of, job_id)
    if body is None:
        raise _not_found(job_id)
    return JSONResponse(body)


@router.get(
    "/jobs/{job_id}/events",
    summary="Progress as server-sent events until the job ends",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def job_events(
    job_id: str, request: Request, owner: str = Depends(caller),
    interval_s: float = Query(0.5, ge=0.05, le=10.0),
) -> StreamingResponse:
    job_id, _ = await _owned_raw(request, job_id, owner)

    async def read() -> dict[str, Any] | None:
        raw, position = await _fetch_with_position(request, job_id)
        if not raw:
            return None
        if is_abandoned(raw, request.app.state.settings.heartbeat_ttl_s):
            raw = await run_in_threadpool(request.app.state.store.reap_if_abandoned, raw, job_id)
        return await _view(request, job_id, raw, position)

    async def stream():
        last = None
        last_sent = time.monotonic()
        while True:
            if await request.is_disconnected():
                return
            # every stream on this job shares one read per interval: N streams cost one view, not N
            view = await shared_views(request.app).get((owner, job_id), interval_s, read)
            if view is None:
                yield "event: gone\ndata: {}\n\n"
                return
            if view != last:
                yield f"event: {view['status']}\ndata: {json.dumps(view)}\n\n"
                last, last_sent = view, time.monotonic()
            elif time.monotonic() - last_sent > 15:
                yield ": keep-alive\n\n"
                last_sent = time.monotonic()
            if view["status"] in TERMINAL:
                yield f"event: end\ndata: {json.dumps({'status': view['status']})}\n\n"
                return
            await asyncio.sleep(interval_s)

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
