"""The faithfulness curves and table on an attribution job's page, in headless Chromium (Playwright).

A real service with an untrained news model (the page needs a result, not a good model); one attribution job with
``faithfulness`` on, submitted over HTTP; the page must draw both curves with one line per ranking, show the
table with the result's numbers, and log no console error.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import httpx
import pytest

from app.ui.views import num
from core import registry
from tests.http_server import HttpServer

CHROMIUM = next((p for p in (os.environ.get("EXPLAINQ_CHROMIUM"), shutil.which("chromium"),
                             shutil.which("chromium-browser"), "/usr/bin/chromium") if p and Path(p).is_file()), None)
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - the skip below says why
    sync_playwright = None

pytestmark = [
    pytest.mark.slow,  # a service, a browser and a job: about 10 s on a free machine
    pytest.mark.skipif(sync_playwright is None, reason="playwright is not installed (pip install playwright)"),
    pytest.mark.skipif(CHROMIUM is None, reason="no system Chromium found (apt-get install chromium, or set "
                       "EXPLAINQ_CHROMIUM to its path); the browser tests need it"),
]

KEY = "faith:ui-key-faith-0123456789"
TOKEN = "ui-key-faith-0123456789"
HISTORY = ["Lakers beat Celtics in overtime thriller", "Yankees rally to win the league title"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import torch

    from models.news import checkpoint
    from models.news.demo import DEMOS, build, make_datasets
    from tests.service import Service

    root = tmp_path_factory.mktemp("faith-ui-model")
    make_datasets(root / "data", n_news=60, n_users=20)
    torch.manual_seed(0)
    spec = {s.name: s for s in DEMOS}["nrms-word-demo"]
    checkpoint.save(build(spec, root / "data"), root / "model", meta={})
    home = tmp_path_factory.mktemp("faith-ui-home")
    svc = Service(home, queues=("explain",), api_keys=KEY, heartbeat_ttl_s=30, start=False,
                  env={"OMP_NUM_THREADS": "1"})
    shutil.copytree(root / "model", home / "models" / "tiny")
    registry.register_model(svc.settings, "tiny", kind="news", loader="models.news.checkpoint:load",
                            path=home / "models" / "tiny", parameters=1)
    svc.start()
    try:
        with HttpServer(svc.settings) as http:
            yield http.url
    finally:
        svc.stop()


def test_faithfulness_curves_render(server, tmp_path) -> None:
    from playwright.sync_api import expect

    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as api:
        r = api.post("/attributions", json={
            "model": "tiny", "n_steps": 8, "precision": "fp32", "faithfulness": True, "samples": [
                {"id": "a", "history": HISTORY, "candidate": "Dodgers sign star quarterback to record deal"},
                {"id": "b", "history": HISTORY, "candidate": "Senate passes the budget bill after long debate"}]})
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        context = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=server)
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
        page.goto("/ui/login")
        page.fill("#api_key", TOKEN)
        page.click("button[type=submit]")
        expect(page).to_have_url(re.compile(r"/ui/jobs$"))
        page.goto(f"/ui/jobs/{job_id}")
        expect(page.locator("#job-status .badge")).to_have_text("succeeded", timeout=180_000)
        section = page.locator("#faithfulness")
        expect(section).to_be_visible(timeout=30_000)
        charts = section.locator("figure.faith-chart")
        expect(charts).to_have_count(2)
        for curve in ("deletion", "insertion"):
            fig = section.locator(f"figure.faith-chart[data-curve={curve}]")
            expect(fig.locator("canvas")).to_have_count(1)
            expect(fig).to_have_attribute("data-points", "21")
            # one legend entry per ranking, after uPlot's x series
            legend = fig.locator(".u-legend .u-series .u-label").all_inner_texts()
            assert legend[1:] == ["IG", "random order", "occlusion"], legend
        result = page.request.get(f"/jobs/{job_id}/result").json()["faithfulness"]
        row = section.locator("table.faith-table tr[data-order=ig] td").all_inner_texts()
        want = [*result["orders"]["ig"]["comprehensiveness"], *result["orders"]["ig"]["sufficiency"],
                result["orders"]["ig"]["deletion_auc"], result["orders"]["ig"]["insertion_auc"]]
        assert row == [num(v, 3) for v in want]
        section.scroll_into_view_if_needed()
        page.screenshot(path=str(tmp_path / "dashboard-faithfulness.png"))
        if os.environ.get("EXPLAINQ_UI_SCREENSHOTS"):
            target = Path(os.environ["EXPLAINQ_UI_SCREENSHOTS"])
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(tmp_path / "dashboard-faithfulness.png", target / "dashboard-faithfulness.png")
        context.close()
        browser.close()
    assert errors == [], errors
