"""The dashboard's only way to data: the service's public HTTP API, called in-process with the user's key.

``httpx.ASGITransport`` runs the same app the browser talks to, so every request goes through the same routes,
auth and ownership checks as any other client's: whatever the dashboard shows, a user's own client can show.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx
from starlette.requests import Request

from app.routers.jobs import RESULT_SCHEMA_HEADER
from app.ui.session import Session

UNVALIDATED = "unvalidated"  # the schema header of a result that matches no renderer's model (an earlier version's)


class ApiError(Exception):
    """A non-2xx answer of the public API, with its status, error code and message."""

    def __init__(self, status: int, code: str, message: str, detail: Any = None,
                 headers: dict[str, str] | None = None):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail
        self.headers = headers or {}

    @classmethod
    def from_response(cls, r: httpx.Response) -> ApiError:
        try:
            body = r.json()
        except ValueError:
            body = {}
        detail = body.get("detail") if isinstance(body, dict) else None
        if isinstance(detail, dict):
            code, message = str(detail.get("code", r.status_code)), str(detail.get("message", ""))
        elif isinstance(detail, list):  # 422: FastAPI's field errors
            code = "validation_error"
            message = "; ".join(f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg')}"
                                for d in detail if isinstance(d, dict))
        else:
            code, message = str(r.status_code), r.reason_phrase
        keep = {k: v for k, v in r.headers.items() if k.lower() == "retry-after"}
        return cls(r.status_code, code, message, detail, keep)


class Api:
    """A thin async client of the public API for one signed-in user."""

    def __init__(self, request: Request, session: Session):
        headers = {"Authorization": f"Bearer {session.key}"} if session.key else {}
        self._client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=request.app), base_url="http://explainq.internal",
            headers=headers, timeout=30.0,
        )

    async def __aenter__(self) -> Api:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()

    async def call(self, method: str, path: str, ok: tuple[int, ...] = (200,), **kwargs: Any) -> httpx.Response:
        r = await self._client.request(method, path, **kwargs)
        if r.status_code not in ok:
            raise ApiError.from_response(r)
        return r

    async def get(self, path: str, **params: Any) -> Any:
        clean = {k: v for k, v in params.items() if v not in (None, "")}
        return (await self.call("GET", path, params=clean)).json()

    # ---- the resources the dashboard reads
    async def job(self, job_id: str) -> dict[str, Any]:
        return await self.get(f"/jobs/{quote(job_id, safe='')}")

    async def jobs(self, **params: Any) -> dict[str, Any]:
        return await self.get("/jobs", **params)

    async def result(self, job_id: str) -> Any:
        return await self.get(f"/jobs/{quote(job_id, safe='')}/result")

    async def result_and_schema(self, job_id: str) -> tuple[Any, str | None]:
        """A succeeded job's result and its ``X-Explainq-Result-Schema``: the name of the result model it
        validated against, ``unvalidated`` (written by an earlier version; drawn by no renderer) or ``none``."""
        r = await self.call("GET", f"/jobs/{quote(job_id, safe='')}/result")
        return r.json(), r.headers.get(RESULT_SCHEMA_HEADER)

    async def models(self) -> dict[str, Any]:
        return await self.get("/models")

    async def status(self) -> dict[str, Any]:
        return await self.get("/status")

    async def openapi(self) -> dict[str, Any]:
        return await self.get("/openapi.json")

    async def artifacts(self, job_id: str, result: Any) -> tuple[list[dict[str, Any]], bool]:
        """The job's artifacts and whether they can be downloaded (``GET /jobs/{id}/artifacts``); on a server
        without that route, the names and sizes the result lists, without download links."""
        r = await self._client.get(f"/jobs/{quote(job_id, safe='')}/artifacts")
        if r.status_code == 200:
            return list(r.json().get("items", [])), True
        if r.status_code not in (404, 405):
            raise ApiError.from_response(r)
        listed = result.get("artifacts") if isinstance(result, dict) else None
        items = [{"name": a.get("name"), "size": a.get("size", a.get("bytes")), "media_type": a.get("media_type")}
                 for a in (listed or []) if isinstance(a, dict) and a.get("name")]
        return items, False

    async def cancel(self, job_id: str) -> dict[str, Any]:
        return (await self.call("DELETE", f"/jobs/{quote(job_id, safe='')}", ok=(202,),
                                params={"cancel_only": "true"})).json()

    async def keep(self, job_id: str, keep: bool) -> dict[str, Any]:
        """``POST`` (or, to undo, ``DELETE``) ``/jobs/{id}/keep``: the job's view after it."""
        return (await self.call("POST" if keep else "DELETE", f"/jobs/{quote(job_id, safe='')}/keep")).json()

    async def submit(self, route: str, body: dict[str, Any], idempotency_key: str | None) -> httpx.Response:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return await self._client.post(route, json=body, headers=headers)
