"""Shared FastAPI dependencies: settings, Redis clients, the job store and the caller's identity."""

from __future__ import annotations

from fastapi import HTTPException, Request

from app.ui import session
from core import ratelimit
from core.jobstore import JobStore

ANONYMOUS = "anonymous"


def get_store(request: Request) -> JobStore:
    return request.app.state.store


async def caller(request: Request) -> str:
    """The owner name of the API key in ``Authorization: Bearer <key>``; ``anonymous`` when auth is off.

    Without an Authorization header, the dashboard's signed session cookie is accepted too: for GET and HEAD
    (a browser's EventSource cannot send headers), and for other methods only with the session's CSRF token
    in ``X-CSRF-Token``. Each authenticated request takes a token from its key's bucket (429 when empty)."""
    keys: dict[str, str] = request.app.state.settings.api_keys
    if not keys:
        return ANONYMOUS
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header and session.COOKIE in request.cookies:
        found = await session.sessions(request).read(request)
        if found is not None and (request.method in ("GET", "HEAD")
                                  or session.csrf_ok(found, request.headers.get(session.CSRF_HEADER))):
            await _rate_limited(request, found.owner)
            return found.owner
    if scheme.lower() != "bearer" or not token:
        raise HTTPException(
            status_code=401,
            detail={"code": "unauthorized", "message": "send an API key as 'Authorization: Bearer <key>'"},
            headers={"WWW-Authenticate": "Bearer"},
        )
    key = request.app.state.settings.api_key_for(token.strip())
    if key is not None:
        await _rate_limited(request, keys[key])
        return keys[key]
    raise HTTPException(
        status_code=401,
        detail={"code": "unauthorized", "message": "unknown API key"},
        headers={"WWW-Authenticate": "Bearer"},
    )


async def _rate_limited(request: Request, owner: str) -> None:
    """429 with ``Retry-After`` when ``owner``'s token bucket is empty (``core.ratelimit``; the dashboard's
    requests count against the signed-in key too)."""
    limit = request.app.state.settings.key_rate_limit
    if not limit.enabled:
        return
    taken = await ratelimit.atake(request.app.state.aredis, limit, owner)
    if not taken.allowed:
        raise HTTPException(status_code=429, detail=ratelimit.refusal(limit, taken, "this API key"),
                            headers={"Retry-After": taken.retry_after_header})
