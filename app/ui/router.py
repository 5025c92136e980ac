"""The dashboard at ``/ui``: server-rendered pages (Jinja2 + htmx) over the public API.

Every page gets its data from the service's own public endpoints, called in-process with the signed-in user's
key (``app.ui.api.Api``); nothing here reads Redis or the registry.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse, StreamingResponse
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.datastructures import FormData

from app.ui import analysis, forms, session, views
from app.ui.api import Api, ApiError
from app.ui.session import Session

HERE = Path(__file__).resolve().parent
STATIC_URL = "/ui/static"
JOBS_PER_PAGE = 20
SAMPLES_PER_PAGE = 10
LIVE_POLL_S = 1.0
MAX_LIVE_IDS = 100

templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.filters.update(
    num=views.num, signed=views.signed, fmt_time=views.fmt_time, duration=views.duration, size=views.size,
    pct=views.percent, progress_text=views.progress_text, eta=views.eta, tojson_compact=lambda v: json.dumps(v),
)
templates.env.globals.update(STATIC=STATIC_URL, TERMINAL=views.TERMINAL, STATUSES=views.STATUSES,
                             between=views.between, quote=quote)


def static_files() -> StaticFiles:
    """The vendored scripts, styles and licences (mounted at ``/ui/static``)."""
    return StaticFiles(directory=str(HERE / "static"))


class LoginRequired(Exception):
    pass


class FormRejected(Exception):
    """A dashboard form post without a valid CSRF token, or from another origin."""


class UIRoute(APIRoute):
    """Renders the public API's errors as pages, sends the sign-in page when needed, and sets a new cookie."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def ui_handler(request: Request) -> Response:
            try:
                response = await handler(request)
            except LoginRequired:
                response = _to_login(request)
            except FormRejected as exc:
                response = _page(request, "error.html", {"status": 403, "code": "forbidden", "message": str(exc)},
                                 status=403)
            except ApiError as exc:
                if exc.status == 401:
                    response = _to_login(request)
                else:
                    response = _page(request, "error.html", {"status": exc.status, "code": exc.code,
                                                             "message": exc.message}, status=exc.status)
                    response.headers.update(exc.headers)
            cookie = getattr(request.state, "ui_cookie", None)
            if cookie is not None:
                _set_cookie(request, response, cookie)
            return response

        return ui_handler


router = APIRouter(prefix="/ui", route_class=UIRoute, include_in_schema=False)


# ------------------------------------------------------------------------------------------------ sessions
def _set_cookie(request: Request, response: Response, value: str) -> None:
    response.set_cookie(session.COOKIE, value, max_age=session.MAX_AGE_S, path="/", httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")


def _auth_on(request: Request) -> bool:
    return bool(request.app.state.settings.api_keys)


async def current(request: Request) -> Session:
    """The signed-in user; with auth off, an anonymous session is issued on first visit (for CSRF tokens)."""
    sessions = session.sessions(request)
    found = await sessions.read(request)
    if found is None:
        if _auth_on(request):
            raise LoginRequired
        value, found = await sessions.issue(None)
        request.state.ui_cookie = value
    request.state.ui_user = found  # for the pages this request renders (error pages included)
    return found


def _same_origin(request: Request) -> bool:
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin or origin == "null":
        return origin is None
    # The host only: behind a TLS-terminating proxy the app may see http while the browser says https.
    return urlsplit(origin).netloc == urlsplit(str(request.base_url)).netloc


async def posted(request: Request, user: Session = Depends(current)) -> tuple[Session, FormData]:
    """A form post from the dashboard itself: same origin and the session's CSRF token."""
    form = await request.form()
    token = form.get(session.CSRF_FIELD) or request.headers.get(session.CSRF_HEADER)
    if not _same_origin(request):
        raise FormRejected("the form was posted from another site")
    if not session.csrf_ok(user, str(token) if token else None):
        raise FormRejected("the form's security token is missing or stale; reload the page and try again")
    return user, form


def _safe_next(value: str | None, default: str = "/ui/jobs") -> str:
    if value and value.startswith("/ui") and not value.startswith("//") and "\\" not in value:
        return value
    return default


def _to_login(request: Request) -> Response:
    target = "/ui/login?" + urlencode({"next": _safe_next(request.url.path + (
        "?" + request.url.query if request.url.query else ""))})
    if request.headers.get("hx-request"):
        return Response(status_code=401, headers={"HX-Redirect": target})
    if request.headers.get("accept", "").startswith("text/event-stream"):
        return Response(status_code=401)
    return RedirectResponse(target, status_code=303)


def _page(request: Request, template: str, context: dict[str, Any], status: int = 200,
          user: Session | None = None) -> HTMLResponse:
    if user is None:
        user = getattr(request.state, "ui_user", None)
    ctx = {"user": user, "auth_on": _auth_on(request), "csrf_field": session.CSRF_FIELD,
           "path": request.url.path, **context}
    return templates.TemplateResponse(request, template, ctx, status_code=status)


# --------------------------------------------------------------------------------------------- sign in/out
@router.get("", response_class=HTMLResponse)
async def home() -> RedirectResponse:
    return RedirectResponse("/ui/jobs", status_code=303)


@router.get("/login", response_class=HTMLResponse)
async def login_page(request: Request, next: str | None = None) -> Response:
    if not _auth_on(request):
        return RedirectResponse(_safe_next(next), status_code=303)
    return _page(request, "login.html", {"next": _safe_next(next), "error": None})


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    form = await request.form()
    nxt = _safe_next(str(form.get("next") or ""))
    if not _auth_on(request):
        return RedirectResponse(nxt, status_code=303)
    if not _same_origin(request):
        raise FormRejected("the sign-in form was posted from another site")
    sessions = session.sessions(request)
    key = sessions.key_for(str(form.get("api_key") or "").strip())
    if key is None:
        return _page(request, "login.html", {"next": nxt, "error": "unknown API key"}, status=401)
    await sessions.end(sessions.session_id(request))  # a session id is never carried over a sign-in
    value, _ = await sessions.issue(key)
    request.state.ui_cookie = value
    return RedirectResponse(nxt, status_code=303)


@router.post("/logout")
async def logout(request: Request, sent: tuple[Session, FormData] = Depends(posted)) -> Response:
    await session.sessions(request).end(sent[0].id)  # the record goes now: a copy of the cookie is refused
    response = RedirectResponse("/ui/login" if _auth_on(request) else "/ui/jobs", status_code=303)
    response.delete_cookie(session.COOKIE, path="/")
    return response


# --------------------------------------------------------------------------------------------------- jobs
async def _kinds(api: Api) -> dict[str, dict[str, Any]]:
    return forms.submit_routes(await api.openapi())


async def _described(api: Api, kind: str | None) -> dict[str, Any]:
    """How a kind describes itself (``GET /kinds``: renderer, charts...); ``{}`` for one the server no longer runs."""
    kinds = (await api.get("/kinds")).get("kinds") or []
    return next((k for k in kinds if k.get("name") == kind), {})


@router.get("/jobs", response_class=HTMLResponse)
async def jobs_page(
    request: Request,
    kind: str | None = None,
    status: str | None = None,
    cursor: str | None = None,
    back: str | None = Query(None, description="the cursors of the earlier pages, comma separated"),
    user: Session = Depends(current),
) -> Response:
    async with Api(request, user) as api:
        page = await api.jobs(kind=kind, status=status, cursor=cursor, limit=JOBS_PER_PAGE)
        kinds = await _kinds(api)
    trail = [c for c in (back or "").split(",") if c] if cursor else []
    filters = {k: v for k, v in (("kind", kind), ("status", status)) if v}

    def link(cur: str | None, history: list[str]) -> str:
        q = dict(filters)
        if cur:
            q["cursor"] = cur
            if history:
                q["back"] = ",".join(history)
        return "/ui/jobs" + ("?" + urlencode(q) if q else "")

    newer = None
    if cursor:
        newer = link(trail[-1] if trail and trail[-1] != "-" else None, trail[:-1])
    older = link(page["next_cursor"], trail + [cursor or "-"]) if page.get("next_cursor") else None
    live = [j["id"] for j in page["items"] if j["status"] not in views.TERMINAL]
    return _page(request, "jobs.html", {
        "jobs": page["items"], "kinds": list(kinds), "kind": kind, "status": status, "newer": newer,
        "older": older, "live_url": "/ui/jobs/live?" + urlencode({"ids": ",".join(live)}) if live else None,
        "here": request.url.path + ("?" + request.url.query if request.url.query else ""),
    }, user=user)


def _row(request: Request, job: dict[str, Any], user: Session) -> str:
    return templates.get_template("_job_row.html").render(
        job=job, user=user, csrf_field=session.CSRF_FIELD, here="/ui/jobs", **templates.env.globals)


@router.get("/jobs/live")
async def jobs_live(request: Request, ids: str = Query(..., max_length=MAX_LIVE_IDS * 64),
                    user: Session = Depends(current)) -> StreamingResponse:
    """Server-sent events for the jobs list: ``job-<id>`` carries the job's rendered row when it changes;
    ``done`` when every listed job has ended."""
    wanted = [i for i in dict.fromkeys(ids.split(",")) if i][:MAX_LIVE_IDS]

    async def stream():
        last: dict[str, Any] = {}
        async with Api(request, user) as api:
            while wanted:
                if await request.is_disconnected():
                    return
                for job_id in list(wanted):
                    try:
                        job = await api.job(job_id)
                    except ApiError as exc:
                        if exc.status == 404:
                            wanted.remove(job_id)
                            continue
                        raise
                    if job != last.get(job_id):
                        last[job_id] = job
                        data = "".join(f"data: {line}\n" for line in _row(request, job, user).splitlines())
                        yield f"event: job-{job_id}\n{data}\n"
                    if job["status"] in views.TERMINAL:
                        wanted.remove(job_id)
                if wanted:
                    await asyncio.sleep(LIVE_POLL_S)
        yield "event: done\ndata: {}\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.post("/jobs/{job_id}/cancel", response_class=HTMLResponse)
async def cancel(request: Request, job_id: str, sent: tuple[Session, FormData] = Depends(posted)) -> Response:
    user, form = sent
    async with Api(request, user) as api:
        try:
            job = await api.cancel(job_id)
        except ApiError as exc:
            if exc.status != 409:
                raise
            job = await api.job(job_id)  # it ended meanwhile: show how
    if request.headers.get("hx-request"):
        return HTMLResponse(_row(request, job, user))
    return RedirectResponse(_safe_next(str(form.get("next") or ""), f"/ui/jobs/{quote(job_id)}"), status_code=303)


async def _job_context(api: Api, job_id: str, page: int, options: dict[str, str] | None = None) -> dict[str, Any]:
    job = await api.job(job_id)
    r = await api.call("GET", f"/jobs/{quote(job_id, safe='')}/request", ok=(200, 404))
    if r.status_code == 200:
        job["request"] = r.json()
    result = await api.result(job_id) if job["status"] == "succeeded" else None
    artifacts, downloadable = await api.artifacts(job_id, result) if job["status"] in views.TERMINAL else ([], False)
    ctx: dict[str, Any] = {"job": job, "result": result, "artifacts": artifacts, "downloadable": downloadable,
                           "page": page}
    described = await _described(api, job.get("kind"))
    renderer = described.get("renderer")
    ctx["renderer"] = renderer
    ctx["resume_field"] = described.get("resume_field")
    if renderer == "attributions" and isinstance(result, dict):
        ctx.update(_attribution_context(result, page, options or {}))
    elif renderer == "influence" and isinstance(result, dict):
        ctx["tracin"] = analysis.tracin_context(result, await _tracin_entries(api, job_id, result))
    elif renderer == "ablation" and isinstance(result, dict):
        ctx["ablation"] = views.ablation_view(result)
    elif renderer == "training":
        ctx["curves"] = _curves(described, job, result)
    return ctx


def _attribution_context(result: dict[str, Any], page: int, options: dict[str, str]) -> dict[str, Any]:
    """The attribution page (``app.ui.analysis``) with its reading options: ``scale`` (global or sample),
    ``values`` (1: numbers under the words) and ``view`` (heatmap or table); pager links keep them."""
    scale = options.get("scale") if options.get("scale") in analysis.SCALES else "global"
    show_values = options.get("values") == "1"
    view = options.get("view") if options.get("view") in analysis.VIEWS else "heatmap"
    ctx = analysis.attribution_context(result, page, SAMPLES_PER_PAGE, scale, show_values, view)
    kept = {k: v for k, v in (("values", "1" if show_values else None), ("view", view if view != "heatmap" else None),
                              ("scale", scale if scale != "global" else None)) if v}
    ctx["page_query"] = lambda n: urlencode({"page": n, **kept})
    return ctx


TRACIN_SHOWN_TEST_TRIPLES = 200  # a fanned-out result's test triples read back from results.jsonl for the page


async def _tracin_entries(api: Api, job_id: str, result: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A fanned-out TracIn result lists its test triples in ``results.jsonl`` (``results: {"artifact"}``): the
    first ``TRACIN_SHOWN_TEST_TRIPLES`` are read back for the page; a single job's are in the result."""
    listed = result.get("results")
    if not isinstance(listed, dict) or listed.get("artifact") != "results.jsonl":
        return None
    r = await api.call("GET", f"/jobs/{quote(job_id, safe='')}/artifacts/results.jsonl", ok=(200, 404))
    if r.status_code != 200:
        return []
    out = []
    for line in r.text.splitlines()[:TRACIN_SHOWN_TEST_TRIPLES]:
        try:
            entry = json.loads(line)
        except ValueError:
            break
        if isinstance(entry, dict):
            out.append(entry)
    return out


def _curves(described: dict[str, Any], job: dict[str, Any], result: Any) -> dict[str, Any]:
    """The kind's chart specs and their rows: the result's history when finished, the live metrics otherwise
    (the whole history so far, or the latest metrics as one row, as the kind says)."""
    metrics = job.get("metrics") or {}
    live = described.get("live_rows", "latest")
    if isinstance(result, dict) and result.get("history") is not None:
        rows = result["history"]
    elif live == "history":
        rows = metrics.get("history") or []
    else:
        rows = [metrics] if metrics.get("epoch") is not None else []
    return {"source": live, "rows": [views.flat_row(r) for r in rows], "charts": described.get("charts") or []}


def _view_options(request: Request) -> dict[str, str]:
    """The attribution page's reading options from the query (unknown values fall back to the defaults)."""
    return {k: request.query_params.get(k, "")[:16] for k in ("scale", "values", "view")}


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
async def job_page(request: Request, job_id: str, page: int = Query(1, ge=1, le=1_000_000),
                   user: Session = Depends(current)) -> Response:
    async with Api(request, user) as api:
        ctx = await _job_context(api, job_id, page, _view_options(request))
    return _page(request, "job.html", ctx, user=user)


@router.get("/jobs/{job_id}/body", response_class=HTMLResponse)
async def job_body(request: Request, job_id: str, page: int = Query(1, ge=1, le=1_000_000),
                   user: Session = Depends(current)) -> Response:
    """The part of a job's page that changes when it ends (fetched by htmx on the stream's ``end``)."""
    async with Api(request, user) as api:
        ctx = await _job_context(api, job_id, page, _view_options(request))
    return _page(request, "_job_body.html", ctx, user=user)


@router.get("/jobs/{job_id}/influence.csv")
async def tracin_csv(request: Request, job_id: str, user: Session = Depends(current)) -> Response:
    """The TracIn card's CSV: the job's own ``influence.csv`` artifact, byte for byte (one CSV, whichever link)."""
    async with Api(request, user) as api:
        r = await api.call("GET", f"/jobs/{quote(job_id, safe='')}/artifacts/influence.csv")
    return Response(r.content, media_type="text/csv", headers={
        "Content-Disposition": f'attachment; filename="tracin-{quote(job_id, safe="")}.csv"'})


# ----------------------------------------------------------------------------------------- models, new job
@router.get("/models", response_class=HTMLResponse)
async def models_page(request: Request, user: Session = Depends(current)) -> Response:
    async with Api(request, user) as api:
        data = await api.models()
    return _page(request, "models.html", {"models": data.get("models", []), "datasets": data.get("datasets", [])},
                 user=user)


@router.get("/new", response_class=HTMLResponse)
async def new_index(request: Request, user: Session = Depends(current)) -> Response:
    async with Api(request, user) as api:
        kinds = await _kinds(api)
    return _page(request, "new_index.html", {"kinds": kinds}, user=user)


async def _form(api: Api, kind: str) -> tuple[dict[str, Any], list[forms.FormField]]:
    openapi = await api.openapi()
    kinds = forms.submit_routes(openapi)
    if kind not in kinds:
        raise ApiError(404, "not_found", f"no job kind {kind!r}; known: {', '.join(kinds)}")
    spec = kinds[kind]
    described = spec.get("kind") or {}
    fields = forms.fields_for(described.get("widgets") or {}, spec["schema"],
                              openapi.get("components", {}).get("schemas", {}))
    forms.apply_pickers(described.get("pickers") or {}, fields, await api.models())
    return spec, fields


def _form_page(request: Request, user: Session, kind: str, spec: dict[str, Any], fields: list[forms.FormField],
               values: dict[str, Any], errors: dict[str, str], general: list[str], status: int = 200,
               notes: list[str] | None = None) -> Response:
    return _page(request, "new_job.html", {
        "kind": kind, "spec": spec, "fields": fields, "values": values, "errors": errors, "general": general,
        "notes": notes or [],
        "idempotency_key": uuid.uuid4().hex, "posted": bool(values.get("__posted")),
    }, status=status, user=user)


def _flatten(obj: Any, prefix: str = "") -> dict[str, str]:
    """A request body as the form's dotted field values."""
    out: dict[str, str] = {}
    for k, v in (obj or {}).items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        elif isinstance(v, bool):
            out[prefix + k] = "true" if v else ""
        elif v is not None:
            out[prefix + k] = v if isinstance(v, str) else json.dumps(v)
    return out


async def _resume_values(api: Api, job_id: str) -> tuple[dict[str, str], list[str]]:
    """Form values to continue a BDH job: its request when the API shows it, and the architecture saved with
    its last checkpoint (a public artifact) so that the resumed model matches."""
    values: dict[str, str] = {}
    notes: list[str] = []
    try:
        view = await api.job(job_id)
    except ApiError:
        return values, notes
    values.update(_flatten(view.get("request") if isinstance(view.get("request"), dict) else None))
    r = await api.call("GET", f"/jobs/{quote(job_id, safe='')}/artifacts/checkpoints/last/config.json",
                       ok=(200, 404, 405))
    if r.status_code == 200:
        saved = r.json()
        values.update(_flatten({"model": saved.get("model") or {}}))
        if saved.get("dataset"):
            values.setdefault("dataset", str(saved["dataset"]))
        if isinstance(saved.get("epoch"), int):
            notes.append(f"The checkpoint has {saved['epoch']} epochs; ask for more than that.")
    elif not view.get("request"):
        notes.append("Set the same architecture as the job being resumed.")
    return values, notes


@router.get("/new/{kind}", response_class=HTMLResponse)
async def new_job(request: Request, kind: str, user: Session = Depends(current)) -> Response:
    notes: list[str] = []
    async with Api(request, user) as api:
        spec, fields = await _form(api, kind)
        values: dict[str, Any] = {}
        resume = request.query_params.get("resume_from")
        if resume and spec.get("kind", {}).get("resume_field") == "resume_from":
            values, notes = await _resume_values(api, resume)
    known = forms.field_names(fields)
    values.update({k: v for k, v in request.query_params.items() if k in known})
    values = {k: v for k, v in values.items() if k in known}
    return _form_page(request, user, kind, spec, fields, values, {}, [], notes=notes)


@router.post("/new/{kind}", response_class=HTMLResponse)
async def submit(request: Request, kind: str, sent: tuple[Session, FormData] = Depends(posted)) -> Response:
    user, form = sent
    async with Api(request, user) as api:
        spec, fields = await _form(api, kind)
        body = forms.body_from_form(fields, form)
        r = await api.submit(spec["route"], body, str(form.get("idempotency_key") or "") or None)
    if r.status_code == 202:
        return RedirectResponse(f"/ui/jobs/{quote(r.json()['id'])}", status_code=303)
    error = ApiError.from_response(r)
    if r.status_code != 422:
        raise error
    by_field, general = forms.errors_by_field(error.detail, fields)
    values: dict[str, Any] = {k: form.getlist(k) if len(form.getlist(k)) > 1 else form.get(k) for k in form}
    values["__posted"] = True
    return _form_page(request, user, kind, spec, fields, values, by_field, general, status=422)
