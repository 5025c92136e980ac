"""A job's files in the store: list them, stream one. Owner-checked like the job itself."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi.concurrency import iterate_in_threadpool, run_in_threadpool
from fastapi.responses import RedirectResponse, StreamingResponse

from app.deps import caller
from app.routers.jobs import resolve_id
from core.artifacts import artifacts_key, list_files
from core.filestore import StoreError, clean_key, get_store, media_type
from core.jobstore import is_id_prefix
from core.jobview import parse_meta
from core.keys import JOB_PREFIX, valid_job_id
from core.ownership import owns_files

router = APIRouter(tags=["artifacts"])



def _not_found(message: str) -> HTTPException:
    return HTTPException(status_code=404, detail={"code": "not_found", "message": message})


async def _check_owner(request: Request, job_id: str, owner: str) -> str:
    """The job's full id when the job is the caller's: its Redis record says so, or (after the record expired,
    before gc) the artifact owner record does; a unique prefix of one of the caller's job ids names that job
    (app/routers/jobs.py: ``resolve_id``). Anything else is 404, exactly like an unknown job."""
    if not valid_job_id(job_id):
        raise _not_found(f"no job {job_id!r}")
    if await _owns(request, job_id, owner):
        return job_id
    if is_id_prefix(job_id):
        full_id = await resolve_id(request, job_id, owner)
        if await _owns(request, full_id, owner):
            return full_id
    raise _not_found(f"no job {job_id!r}")


async def _owns(request: Request, job_id: str, owner: str) -> bool:
    raw_meta = await request.app.state.aredis.hget(JOB_PREFIX + job_id, "meta")
    meta = parse_meta({b"meta": raw_meta}) if raw_meta is not None else None
    return await run_in_threadpool(owns_files, request.app.state.settings, job_id, owner, meta)


@router.get("/jobs/{job_id}/artifacts", summary="A job's files: name, size, media type and download URL",
            responses={404: {}})
async def list_artifacts(job_id: str, request: Request, owner: str = Depends(caller)) -> dict[str, Any]:
    job_id = await _check_owner(request, job_id, owner)
    files = await run_in_threadpool(list_files, request.app.state.settings, job_id)
    return {"items": [{**f, "url": f"/jobs/{job_id}/artifacts/{f['name']}"} for f in files]}


@router.get("/jobs/{job_id}/artifacts/{name:path}", summary="Download one of a job's files",
            description="Where the store signs URLs (S3), a `307` redirect to a pre-signed URL of the file, valid "
            "`EXPLAINQ_PRESIGNED_URL_TTL_S` seconds, so the file comes straight from the store (send no "
            "`Authorization` header there: clients drop it on a redirect to another host); `redirect=false`, or "
            "a store that signs nothing, streams it through the API.",
            response_class=StreamingResponse, responses={200: {"content": {"application/octet-stream": {}}},
                                                         307: {"description": "the file's pre-signed URL"},
                                                         404: {}})
async def get_artifact(job_id: str, name: str, request: Request, owner: str = Depends(caller),
                       redirect: bool = Query(True, description="false: stream the file through the API even "
                                              "where the store offers a pre-signed URL")) -> Response:
    job_id = await _check_owner(request, job_id, owner)
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
    ttl = request.app.state.settings.presigned_url_ttl_s
    signed = await run_in_threadpool(store.sign, key, ttl, filename) if redirect else None
    if signed is not None:
        return RedirectResponse(signed, status_code=307, headers={"Cache-Control": "no-store"})
    return StreamingResponse(
        iterate_in_threadpool(store.iter_bytes(key)),
        media_type=media_type(name),
        headers={"Content-Length": str(size), "Content-Disposition": f'attachment; filename="{filename}"'},
    )
