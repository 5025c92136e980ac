"""The dashboard at ``/ui``: server-rendered pages (Jinja2 + htmx) over the public API.

Every page gets its data from the service's own public endpoints, called in-process with the signed-in user's
key (``app.ui.api.Api``); nothing here reads Redis or the registry.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi import Path as FastPath
from fastapi.responses import HTMLResponse, RedirectResponse, StreamingResponse
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.datastructures import FormData

from app.ui import analysis, forms, session, views
from app.ui.api import UNVALIDATED, Api, ApiError
from app.ui.evaluation import classifier_evaluation_view, evaluation_view
from app.ui.session import Session
from core import ratelimit
from core.ownership import owns

HERE = Path(__file__).resolve().parent
STATIC_URL = "/ui/static"
JOBS_PER_PAGE = 20
SAMPLES_PER_PAGE = 10
LIVE_POLL_S = 1.0
NEW_JOBS_POLL_S = 2.0  # how often a watching jobs list looks for new jobs
VOCABULARY_NAMES = 1000  # names per autocomplete list (the API's bound)
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
    limit = request.app.state.settings.login_rate_limit
    if limit.enabled:  # attempts per client address (behind a proxy: the proxy's address)
        address = request.client.host if request.client else "unknown"
        taken = await ratelimit.atake(request.app.state.aredis, limit, address)
        if not taken.allowed:
            response = _page(request, "login.html", {"next": nxt, "error": "too many sign-in attempts from your "
                             f"address; try again in {taken.retry_after_header} s"}, status=429)
            response.headers["Retry-After"] = taken.retry_after_header
            return response
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


def _job_filters(kind: str | None, status: str | None, q: str | None, tag: str | None,
                 model_digest: str | None = None) -> dict[str, str]:
    """The jobs list's filters as query parameters (unset ones left out)."""
    return {k: v for k, v in (("kind", kind), ("status", status), ("q", (q or "").strip()), ("tag", tag),
                              ("model_digest", model_digest)) if v}


@router.get("/jobs", response_class=HTMLResponse)
async def jobs_page(
    request: Request,
    kind: str | None = None,
    status: str | None = None,
    q: str | None = None,
    tag: str | None = None,
    model_digest: str | None = Query(None, max_length=64),
    cursor: str | None = None,
    back: str | None = Query(None, description="the cursors of the earlier pages, comma separated"),
    user: Session = Depends(current),
) -> Response:
    filters = _job_filters(kind, status, q, tag, model_digest)
    async with Api(request, user) as api:
        page = await api.jobs(**filters, cursor=cursor, limit=JOBS_PER_PAGE)
        kinds = await _kinds(api)
    trail = [c for c in (back or "").split(",") if c] if cursor else []

    def link(cur: str | None, history: list[str]) -> str:
        query = dict(filters)
        if cur:
            query["cursor"] = cur
            if history:
                query["back"] = ",".join(history)
        return "/ui/jobs" + ("?" + urlencode(query) if query else "")

    newer = None
    if cursor:
        newer = link(trail[-1] if trail and trail[-1] != "-" else None, trail[:-1])
    older = link(page["next_cursor"], trail + [cursor or "-"]) if page.get("next_cursor") else None
    live = [j["id"] for j in page["items"] if j["status"] not in views.TERMINAL]
    live_url = None
    if not cursor:  # the first page: rows update live, and jobs submitted from anywhere appear on top
        watch = {**filters, "watch": "1"}
        if page["items"]:
            watch["newest"] = page["items"][0]["created_at"]
        live_url = "/ui/jobs/live?" + urlencode({"ids": ",".join(live), **watch})
    elif live:
        live_url = "/ui/jobs/live?" + urlencode({"ids": ",".join(live)})
    return _page(request, "jobs.html", {
        "jobs": page["items"], "kinds": kinds, "kind": kind, "status": status, "q": filters.get("q", ""),
        "tag": tag or "", "model_digest": model_digest or "", "filtered": bool(filters), "newer": newer, "older": older, "live_url": live_url,
        "watching": not cursor, "here": request.url.path + ("?" + request.url.query if request.url.query else ""),
    }, user=user)


def _row(request: Request, job: dict[str, Any], user: Session, template: str = "_job_row.html") -> str:
    return templates.get_template(template).render(
        job=job, user=user, csrf_field=session.CSRF_FIELD, here="/ui/jobs", **templates.env.globals)


def _sse(event: str, html: str) -> str:
    data = "".join(f"data: {line}\n" for line in html.splitlines())
    return f"event: {event}\n{data}\n"


@router.get("/jobs/live")
async def jobs_live(
    request: Request,
    ids: str = Query("", max_length=MAX_LIVE_IDS * 64),
    watch: bool = Query(False, description="also send jobs created after `newest` that match the filters"),
    newest: str | None = Query(None, max_length=40, description="the created_at of the newest job shown"),
    kind: str | None = Query(None, max_length=64),
    status: str | None = Query(None, max_length=16),
    q: str | None = Query(None, max_length=200),
    tag: str | None = Query(None, max_length=32),
    model_digest: str | None = Query(None, max_length=64),
    user: Session = Depends(current),
) -> StreamingResponse:
    """Server-sent events for the jobs list: ``job-<id>`` carries the job's rendered row when it changes;
    ``done`` when every listed job has ended. With ``watch``, ``new`` carries the whole row (``<tr>``) of each job
    created since ``newest`` that matches the list's filters (checked every ``NEW_JOBS_POLL_S``), whose changes
    then follow as ``job-<id>``; the stream then lasts as long as the page."""
    wanted = [i for i in dict.fromkeys(ids.split(",")) if i][:MAX_LIVE_IDS]
    filters = _job_filters(kind, status, q, tag, model_digest)
    if newest is not None and views.parse_time(newest) is None:
        raise ApiError(422, "validation_error", "newest: not an ISO 8601 time")
    if watch:  # the filters are the API's to judge: a bad one is its 422 now, not an error mid-stream
        async with Api(request, user) as api:
            await api.jobs(**filters, created_after=newest, limit=1)

    async def new_jobs(api: Api, since: str | None, seen: set[str]) -> list[dict[str, Any]]:
        page = await api.jobs(**filters, created_after=since, limit=JOBS_PER_PAGE)
        fresh = [j for j in page["items"] if j["id"] not in seen and (since is None or
                                                                      (j.get("created_at") or "") > since)]
        return fresh[::-1]  # oldest first: each is put on top of the list in turn

    async def stream():
        last: dict[str, Any] = {}
        seen: set[str] = set(wanted)
        since = newest
        next_look = 0.0
        loop = asyncio.get_running_loop()
        async with Api(request, user) as api:
            while wanted or watch:
                if await request.is_disconnected():
                    return
                if watch and loop.time() >= next_look:
                    next_look = loop.time() + NEW_JOBS_POLL_S
                    for job in await new_jobs(api, since, seen):
                        seen.add(job["id"])
                        since = max(since or "", job.get("created_at") or "")
                        last[job["id"]] = job
                        yield _sse("new", _row(request, job, user, "_job_tr.html"))
                        if job["status"] not in views.TERMINAL and len(wanted) < MAX_LIVE_IDS:
                            wanted.append(job["id"])
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
                        yield _sse(f"job-{job_id}", _row(request, job, user))
                    if job["status"] in views.TERMINAL:
                        wanted.remove(job_id)
                if wanted or watch:
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


@router.post("/jobs/{job_id}/keep", response_class=HTMLResponse)
async def keep(request: Request, job_id: str, sent: tuple[Session, FormData] = Depends(posted)) -> Response:
    """Keep a finished job (``keep=1``) or undo it (``keep=0``): htmx swaps the control, a plain form goes back to
    the job's page."""
    user, form = sent
    async with Api(request, user) as api:
        job = await api.keep(job_id, str(form.get("keep") or "1") == "1")
    if request.headers.get("hx-request"):
        html = templates.get_template("_keep.html").render(job=job, user=user, csrf_field=session.CSRF_FIELD,
                                                           **templates.env.globals)
        return HTMLResponse(html)
    return RedirectResponse(f"/ui/jobs/{quote(job['id'])}", status_code=303)


async def _job_context(api: Api, job_id: str, page: int, options: dict[str, str] | None = None) -> dict[str, Any]:
    job = await api.job(job_id)
    r = await api.call("GET", f"/jobs/{quote(job_id, safe='')}/request", ok=(200, 404))
    if r.status_code == 200:
        job["request"] = r.json()
    result, schema = await api.result_and_schema(job_id) if job["status"] == "succeeded" else (None, None)
    artifacts, downloadable = await api.artifacts(job_id, result) if job["status"] in views.TERMINAL else ([], False)
    described = await _described(api, job.get("kind"))
    return page_context(PageInput(job, result, schema, described, artifacts, downloadable, page, options or {}))


@dataclass(frozen=True)
class PageInput:
    """What a job's page is drawn from: the job's view (with its request), its result and the result's schema
    header (None before it succeeded), how its kind describes itself (``GET /kinds``), its artifacts, the page of
    samples and the reading options."""

    job: dict[str, Any]
    result: Any
    schema: str | None
    described: dict[str, Any]
    artifacts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    downloadable: bool = False
    page: int = 1
    options: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class Renderer:
    """How the job page draws a renderer's results: the template of its card, and the function that builds the
    card's context from the page's input (``live``: it draws before the job has a result, a training run's curves
    as it runs)."""

    template: str
    context: Callable[[PageInput], dict[str, Any]]
    live: bool = False


def _attributions_card(p: PageInput) -> dict[str, Any]:
    return _attribution_context(p.result, p.page, p.options)


def _influence_card(p: PageInput) -> dict[str, Any]:
    return {"tracin": analysis.tracin_context(p.result)}


def _classifier_influence_card(p: PageInput) -> dict[str, Any]:
    return {"influence": views.classifier_influence_view(p.result)}


def _ablation_card(p: PageInput) -> dict[str, Any]:
    return {"ablation": views.ablation_view(p.result)}


def _evaluation_card(p: PageInput) -> dict[str, Any]:
    return {"evaluation": evaluation_view(p.result)}


def _classifier_evaluation_card(p: PageInput) -> dict[str, Any]:
    return {"evaluation": classifier_evaluation_view(p.result)}


# A training kind's own summary under its curves, chosen by the result model its kind declares (``GET /kinds``
# ``result``); any other training result (a plugin's, say) gets the table of its top-level values.
TRAINING_SUMMARIES: dict[str, str] = {
    "TrainBDHResult": "_summary_bdh.html",
    "TrainConvEResult": "_summary_conve.html",
    "TrainNewsResult": "_summary_news.html",
}
SUMMARY_SKIPPED = ("history", "steps", "warnings", "artifacts")  # drawn elsewhere on the page


def scalar_fields(result: dict[str, Any]) -> list[tuple[str, Any]]:
    """A result's top-level values that print in a cell (numbers, strings, booleans), in the result's order."""
    return [(k, v) for k, v in result.items()
            if k not in SUMMARY_SKIPPED and isinstance(v, str | int | float | bool)]


def _training_card(p: PageInput) -> dict[str, Any]:
    result = p.result if isinstance(p.result, dict) else None
    ctx: dict[str, Any] = {"curves": _curves(p.described, p.job, result)}
    if result is not None:
        ctx["summary_template"] = TRAINING_SUMMARIES.get(p.described.get("result") or "")
        ctx["scalars"] = scalar_fields(result)
    return ctx


# Renderer name (a kind's ``renderer`` in ``GET /kinds``) -> how its results are drawn: a new renderer is one entry.
RENDERERS: dict[str, Renderer] = {
    "attributions": Renderer("_attributions.html", _attributions_card),
    "influence": Renderer("_tracin.html", _influence_card),
    "ablation": Renderer("_ablations.html", _ablation_card),
    "evaluation": Renderer("_evaluation.html", _evaluation_card),
    "classifier_influence": Renderer("_class_influence.html", _classifier_influence_card),
    "classifier_evaluation": Renderer("_classifier_evaluation.html", _classifier_evaluation_card),
    "training": Renderer("_curves.html", _training_card, live=True),
}


def page_context(p: PageInput) -> dict[str, Any]:
    """The job page's context (no I/O): the job, its result and artifacts, and the card of its kind's renderer. A
    result whose schema header says ``unvalidated`` (an earlier version's, matching no renderer's model) is shown
    as JSON, not drawn."""
    renderer = p.described.get("renderer")
    ctx: dict[str, Any] = {
        "job": p.job, "result": p.result, "artifacts": p.artifacts, "downloadable": p.downloadable,
        "page": p.page, "renderer": renderer, "kind_title": p.described.get("title") or p.job.get("kind"),
        "resume_field": p.described.get("resume_field"),
        "clonable": bool(p.described.get("route")),  # a kind with a form (not a fan-out's shard or reduce step)
        "unvalidated": p.schema == UNVALIDATED, "card": None,
    }
    drawn = RENDERERS.get(renderer or "")
    if drawn is None or ctx["unvalidated"]:
        return ctx
    if isinstance(p.result, dict) or (drawn.live and p.result is None):
        ctx.update(drawn.context(p))
        ctx["card"] = drawn.template
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


def _curves(described: dict[str, Any], job: dict[str, Any], result: dict[str, Any] | None) -> dict[str, Any]:
    """The kind's chart specs and their rows: the result's history and per-step curve when finished (every
    training result has both), the live metrics otherwise (the whole history so far, or the latest metrics as one
    row, as the kind says)."""
    metrics = job.get("metrics") or {}
    live = described.get("live_rows", "latest")
    if result is not None:
        rows, steps = result.get("history") or [], result.get("steps") or []
    else:
        if live == "history":
            rows = metrics.get("history") or []
        else:
            rows = [metrics] if metrics.get("epoch") is not None else []
        steps = metrics.get("steps") or []
    return {"source": live, "rows": [views.flat_row(r) for r in rows if isinstance(r, dict)],
            "steps": [r for r in steps if isinstance(r, dict)], "charts": described.get("charts") or []}


RUN_PICK_LIMIT = 50  # the caller's newest jobs of the kind offered to pick from


async def _run_view(api: Api, job_id: str, kind: str) -> dict[str, Any]:
    """One run to overlay: the caller's own job (another owner's answers 404 from the API, as an unknown one)."""
    job = await api.job(job_id)
    if job.get("kind") != kind:
        raise ApiError(422, "invalid", f"ids: job {job['id'][:8]} is a {job.get('kind')} job, not {kind}")
    r = await api.call("GET", f"/jobs/{quote(job['id'], safe='')}/request", ok=(200, 404))
    request = r.json() if r.status_code == 200 else None
    result = await api.result(job["id"]) if job["status"] == "succeeded" else None
    source = result if isinstance(result, dict) and result.get("history") is not None else (job.get("metrics") or {})
    rows = [views.flat_row(x) for x in source.get("history") or [] if isinstance(x, dict)]
    steps = [x for x in source.get("steps") or [] if isinstance(x, dict)]
    return {"id": job["id"], "status": job["status"], "label": job.get("label"), "rows": rows, "steps": steps,
            "request": request, "last": rows[-1] if rows else {}}


@router.get("/runs", response_class=HTMLResponse)
async def runs_page(request: Request, kind: str | None = Query(None, max_length=64),
                    user: Session = Depends(current)) -> Response:
    """Several training runs of one kind on the same charts, with their hyper-parameters side by side.
    ``ids``: the runs (job ids or unique prefixes of the caller's own jobs), repeated or comma separated."""
    raw = request.query_params.getlist("ids")
    if len(raw) > views.MAX_RUNS or sum(len(v) for v in raw) > views.MAX_RUNS * 80:
        raise ApiError(422, "invalid", f"ids: at most {views.MAX_RUNS} runs at once")
    async with Api(request, user) as api:
        kinds = [k for k in (await api.get("/kinds")).get("kinds") or [] if k.get("renderer") == "training"]
        by_name = {k["name"]: k for k in kinds}
        chosen = [i.strip() for i in dict.fromkeys(",".join(raw).split(",")) if i.strip()]
        if len(chosen) > views.MAX_RUNS:
            raise ApiError(422, "invalid", f"ids: at most {views.MAX_RUNS} runs at once, got {len(chosen)}")
        if kind is None and chosen:
            kind = (await api.job(chosen[0])).get("kind")
        if kind is not None and kind not in by_name:
            raise ApiError(422, "invalid", f"kind: not a training kind; one of {', '.join(by_name)}")
        runs = [await _run_view(api, i, kind) for i in chosen] if kind else []
        candidates = (await api.jobs(kind=kind, limit=RUN_PICK_LIMIT))["items"] if kind else []
    for n, run in enumerate(runs):
        run["colour"] = views.RUN_COLOURS[n % len(views.RUN_COLOURS)]
    described = by_name.get(kind or "", {})
    charts = views.overlay(runs, described.get("charts") or []) if runs else []
    params = views.params_table([r["request"] for r in runs])
    last_keys = list(dict.fromkeys(k for r in runs for k, v in r["last"].items()
                                   if isinstance(v, int | float) and not isinstance(v, bool)))
    return _page(request, "runs.html", {
        "kinds": kinds, "kind": kind, "runs": runs, "charts": charts, "params": params, "last_keys": last_keys,
        "candidates": candidates, "chosen": {r["id"] for r in runs}, "title": described.get("title") or kind,
    }, user=user)


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
def explain_actions(kinds: list[dict[str, Any]], model_kind: str | None) -> list[dict[str, str]]:
    """The job kinds that take a model of ``model_kind`` (their form's model picker, from ``GET /kinds``):
    ``{"kind", "title", "field"}`` for each, to open that form with the model chosen."""
    out = []
    for k in kinds:
        for field, picker in (k.get("pickers") or {}).items():
            if picker[0] == "models" and model_kind in forms.registry_kinds(picker) and k.get("route"):
                out.append({"kind": k["name"], "title": k.get("title") or k["name"], "field": field})
                break
    return out


@router.get("/models", response_class=HTMLResponse)
async def models_page(request: Request, deleted: str | None = Query(None, max_length=128),
                      user: Session = Depends(current)) -> Response:
    async with Api(request, user) as api:
        data = await api.models()
        kinds = (await api.get("/kinds")).get("kinds") or []
    listed = data.get("models", [])
    models = [{**m, "actions": explain_actions(kinds, m.get("kind")),
               "job_id": (m.get("meta") or {}).get("job_id") if isinstance(m.get("meta"), dict) else None,
               "mine": owns(m, user.owner)}
              for m in listed if m.get("status", "ready") == "ready"]
    names = {m["name"] for m in models}
    return _page(request, "models.html", {"models": models, "datasets": data.get("datasets", []),
                                          "preparing": [m for m in listed if m.get("status") == "preparing"],
                                          "deleted": deleted if deleted and deleted not in names else None},
                 user=user)


# ------------------------------------------------------------------------------------------ system status
@router.get("/status", response_class=HTMLResponse)
async def status_strip(request: Request, user: Session = Depends(current)) -> Response:
    """The status strip every page loads (``_status_strip.html``), from ``GET /status``."""
    async with Api(request, user) as api:
        st = await api.status()
    return _page(request, "_status_strip.html", {"st": st}, user=user)


@router.get("/workers", response_class=HTMLResponse)
async def workers_page(request: Request, user: Session = Depends(current)) -> Response:
    async with Api(request, user) as api:
        st = await api.status()
    return _page(request, "workers.html", {"st": st}, user=user)


MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


@router.get("/models/{name}/delete", response_class=HTMLResponse)
async def model_delete_page(request: Request, name: str = FastPath(..., pattern=MODEL_NAME),
                            user: Session = Depends(current)) -> Response:
    """Asks before deleting one of the caller's models (another owner's is 409, an unknown one 404)."""
    async with Api(request, user) as api:
        data = await api.models()
    model = next((m for m in data.get("models", []) if m.get("name") == name), None)
    if model is None:
        raise ApiError(404, "not_found", f"no model {name!r}")
    if not owns(model, user.owner):
        raise ApiError(409, "owned_by_other", f"model {name!r} belongs to another owner; only they can delete it")
    return _page(request, "model_delete.html", {"model": model}, user=user)


@router.post("/models/{name}/delete", response_class=HTMLResponse)
async def model_delete(request: Request, name: str = FastPath(..., pattern=MODEL_NAME),
                       sent: tuple[Session, FormData] = Depends(posted)) -> Response:
    user, _ = sent
    async with Api(request, user) as api:
        await api.call("DELETE", f"/models/{quote(name, safe='')}")
    return RedirectResponse("/ui/models?" + urlencode({"deleted": name}), status_code=303)


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
    forms.apply_pickers(described.get("pickers") or {}, fields, await api.models(), kind)
    return spec, fields


def _form_page(request: Request, user: Session, kind: str, spec: dict[str, Any], fields: list[forms.FormField],
               values: dict[str, Any], errors: dict[str, str], general: list[str], status: int = 200,
               notes: list[str] | None = None, rows: dict[str, list[dict[str, Any]]] | None = None) -> Response:
    advanced = [f for f in fields if f.advanced]
    return _page(request, "new_job.html", {
        "kind": kind, "spec": spec, "fields": [f for f in fields if not f.advanced], "advanced": advanced,
        "advanced_open": any(n == f.name or n.startswith(f.name + ".") for n in errors for f in advanced),
        "values": values, "errors": errors, "general": general, "notes": notes or [], "rows": rows or {},
        "vocabulary": any(f.widget == "triples" for f in fields),
        "idempotency_key": uuid.uuid4().hex, "posted": bool(values.get("__posted")),
    }, status=status, user=user)


def _known(fields: list[forms.FormField]) -> set[str]:
    names = forms.field_names(fields)
    return names | {n + forms.TOGGLE for n in names}


async def _clone_values(api: Api, job_id: str, kind: str, fields: list[forms.FormField]
                        ) -> tuple[dict[str, str], dict[str, list[dict[str, Any]]], str]:
    """The form values and rows of one of the caller's jobs' request (``GET /jobs/{id}/request``: another
    owner's job is a 404 there, as a missing one), and its full id. A job of another kind is a 404 here."""
    job = await api.job(job_id)
    if job.get("kind") != kind:
        raise ApiError(404, "not_found", f"job {job_id!r} is not a {kind} job")
    body = (await api.call("GET", f"/jobs/{quote(job['id'], safe='')}/request")).json()
    return forms.values_of(body, fields), forms.rows_of(fields, body), job["id"]


async def _resume_values(api: Api, job_id: str, kind: str, fields: list[forms.FormField]
                         ) -> tuple[dict[str, Any], list[str]]:
    """Form values to continue a job: its request when it is one of the caller's jobs of this kind, and the
    architecture saved with its last checkpoint (a public artifact) so that the resumed model matches."""
    values: dict[str, Any] = {}
    notes: list[str] = []
    try:
        job = await api.job(job_id)
    except ApiError:
        job = {}
    if job.get("kind") == kind:
        r = await api.call("GET", f"/jobs/{quote(job['id'], safe='')}/request", ok=(200, 404))
        if r.status_code == 200:
            values.update(forms.values_of({k: v for k, v in r.json().items() if k != "resume_from"}, fields))
    r = await api.call("GET", f"/jobs/{quote(job_id, safe='')}/artifacts/checkpoints/last/config.json",
                       ok=(200, 404, 405))
    if r.status_code == 200:
        saved = r.json()
        values.update(forms.values_of({"model": saved.get("model") or {}}, fields))
        if saved.get("dataset"):
            values.setdefault("dataset", str(saved["dataset"]))
        if isinstance(saved.get("epoch"), int):
            notes.append(f"The checkpoint has {saved['epoch']} epochs; ask for more than that.")
    else:
        notes.append("Set the same architecture as the job being resumed.")
    values["resume_from"] = job_id
    return values, notes


@router.get("/new/{kind}", response_class=HTMLResponse)
async def new_job(request: Request, kind: str, user: Session = Depends(current)) -> Response:
    notes: list[str] = []
    rows: dict[str, list[dict[str, Any]]] = {}
    async with Api(request, user) as api:
        spec, fields = await _form(api, kind)
        values: dict[str, Any] = {}
        resume = request.query_params.get("resume_from")
        clone = request.query_params.get("clone")
        if clone:
            values, rows, full_id = await _clone_values(api, clone, kind, fields)
            notes.append(f"A copy of job {full_id[:8]}'s request: change what you like and submit it as a new job.")
        elif resume and spec.get("kind", {}).get("resume_field") == "resume_from":
            values, notes = await _resume_values(api, resume, kind, fields)
    known = _known(fields)
    values.update({k: v for k, v in request.query_params.items() if k in known})
    values = {k: v for k, v in values.items() if k in known}
    return _form_page(request, user, kind, spec, fields, values, {}, [], notes=notes, rows=rows)


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
    return _form_page(request, user, kind, spec, fields, values, by_field, general, status=422,
                      rows=forms.posted_rows(fields, form))


@router.get("/vocabulary", response_class=HTMLResponse)
async def vocabulary(request: Request, model: str = Query("", max_length=128),
                     user: Session = Depends(current)) -> Response:
    """The entity and relation names of ``model`` as the ``<datalist>``s the triple rows complete from (from
    ``GET /models/{name}/vocabulary``, at most its bound of names each); empty lists for an unknown model."""
    lists: dict[str, dict[str, Any]] = {}
    async with Api(request, user) as api:
        for field in ("entities", "relations"):
            r = await api.call("GET", f"/models/{quote(model, safe='')}/vocabulary", ok=(200, 404, 422),
                               params={"field": field, "limit": VOCABULARY_NAMES}) if model else None
            lists[field] = r.json() if r is not None and r.status_code == 200 else {"names": [], "total": 0}
    return _page(request, "_vocabulary.html", {"lists": lists, "model": model}, user=user)


@router.post("/new/{kind}/estimate", response_class=HTMLResponse)
async def estimate(request: Request, kind: str, sent: tuple[Session, FormData] = Depends(posted)) -> Response:
    """The cost estimate of the form as filled in (``POST /kinds/{kind}/estimate``), redrawn as it changes."""
    user, form = sent
    async with Api(request, user) as api:
        _, fields = await _form(api, kind)
        body = forms.body_from_form(fields, form)
        r = await api.call("POST", f"/kinds/{quote(kind, safe='')}/estimate", ok=(200, 404, 422), json=body)
    answer = r.json() if r.status_code == 200 else None
    return _page(request, "_estimate.html", {"e": answer, "invalid": r.status_code == 422}, user=user)
