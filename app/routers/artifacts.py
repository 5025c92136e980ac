"""A job's files in the store: list them, stream one. Owner-checked like the job itself."""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.concurrency import iterate_in_threadpool, run_in_threadpool
from fastapi.responses import StreamingResponse

from app.artifacts import artifacts_key, list_files, owner_record
from app.deps import caller
from app.jobstore import JOB_PREFIX, owner_of
from app.store import StoreError, clean_key, get_store, media_type

router = APIRouter(tags=["artifacts"])

JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


def _not_found(message: str) -> HTTPException:
    return HTTPException(status_code=404, detail={"code": "not_found", "message": message})


async def _check_owner(request: Request, job_id: str, owner: str) -> None:
    """The job is the caller's: its Redis record says so, or (after the record expired, before gc) the
    artifact owner record does. Anything else is 404, exactly like an unknown job."""
    if not JOB_ID.match(job_id):
        raise _not_found(f"no job {job_id!r}")
    meta = await request.app.state.aredis.hget(JOB_PREFIX + job_id, "meta")
    if meta is not None:
        if owner_of({b"meta": meta}) == owner:
            return
        raise _not_found(f"no job {job_id!r}")
    record = await run_in_threadpool(owner_record, request.app.state.settings, job_id)
    if record is None or record.get("owner") != owner:
        raise _not_found(f"no job {job_id!r}")


@router.get("/jobs/{job_id}/artifacts", summary="A job's files: name, size, media type and download URL",
            responses={404: {}})
async def list_artifacts(job_id: str, request: Request, owner: str = Depends(caller)) -> dict[str, Any]:
    await _check_owner(request, job_id, owner)
    files = await run_in_threadpool(list_files, request.app.state.settings, job_id)
    return {"items": [{**f, "url": f"/jobs/{job_id}/artifacts/{f['name']}"} for f in files]}


@router.get("/jobs/{job_id}/artifacts/{name:path}", summary="Download one of a job's files",
            response_class=StreamingResponse, responses={200: {"content": {"application/octet-stream": {}}},
                                                         404: {}})
async def get_artifact(job_id: str, name: str, request: Request, owner: str = Depends(caller)) -> StreamingResponse:
    await _check_owner(request, job_id, owner)
    store = get_store(request.app.state.settings)
    try:
        key = clean_key(artifacts_key(job_id), name)
    except StoreError:
        raise _not_found(f"no artifact {name!r}") from None
    if not key.startswith(artifacts_key(job_id) + "/"):
        raise _not_found(f"no artifact {name!r}")
    try:
        size = await run_in_threadpool(store.size, key)
        is_dir = await run_in_threadpool(store.isdir, key)
    except (FileNotFoundError, StoreError):
        raise _not_found(f"no artifact {name!r} for job {job_id!r}") from None
    if is_dir:
        raise _not_found(f"{name!r} is a directory; list the job's artifacts for its files")
    filename = name.rsplit("/", 1)[-1].replace('"', "")
    return StreamingResponse(
        iterate_in_threadpool(store.iter_bytes(key)),
        media_type=media_type(name),
        headers={"Content-Length": str(size), "Content-Disposition": f'attachment; filename="{filename}"'},
    )
