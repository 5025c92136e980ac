"""The dashboard's comparison of two jobs (``/ui/compare``): the public ``GET /compare``, drawn as text tables
(and, for training runs, the runs overlay's charts). Reached from the jobs list (select two, compare)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import HTMLResponse

from app.ui import views
from app.ui.api import Api, ApiError
from app.ui.router import UIRoute, _page, current
from app.ui.session import Session

router = APIRouter(prefix="/ui", route_class=UIRoute, include_in_schema=False)

VOCABULARY_SHOWN = 50  # words of the vocabulary table (the API answer has more; the SDK gives them all)


def _charts(described: dict[str, Any], cmp: dict[str, Any]) -> list[dict[str, Any]]:
    """The training kind's charts with both runs (the runs page's overlay)."""
    section = cmp.get("training") or {}
    runs = [{"id": cmp[side]["id"], "rows": section.get(f"history_{side}") or [],
             "steps": section.get(f"steps_{side}") or []} for side in ("a", "b")]
    return views.overlay(runs, described.get("charts") or [])


@router.get("/compare", response_class=HTMLResponse)
async def compare_page(request: Request, a: str | None = Query(None, max_length=64),
                       b: str | None = Query(None, max_length=64), user: Session = Depends(current)) -> Response:
    """Two jobs side by side: ``a`` and ``b``, or ``ids`` twice (the jobs list's checkboxes)."""
    ids = [i.strip() for i in request.query_params.getlist("ids") if i.strip()][:3]
    if a is None and b is None:
        if len(ids) != 2:
            raise ApiError(422, "invalid", f"ids: choose two jobs to compare (got {len(ids)})")
        a, b = ids
    if not a or not b:
        raise ApiError(422, "invalid", f"{'a' if not a else 'b'}: choose two jobs to compare")
    async with Api(request, user) as api:
        cmp = await api.get("/compare", a=a, b=b)
        kinds = (await api.get("/kinds")).get("kinds") or []
    described = next((k for k in kinds if k.get("name") == cmp.get("kind")), {})
    charts = _charts(described, cmp) if cmp.get("renderer") == "training" else []
    for n, chart in enumerate(charts):
        chart["n"] = n
    return _page(request, "compare.html", {
        "cmp": cmp, "title": described.get("title") or cmp.get("kind"), "charts": charts,
        "colours": views.RUN_COLOURS[:2], "vocabulary_shown": VOCABULARY_SHOWN,
    }, user=user)
