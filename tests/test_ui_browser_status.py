"""The status strip in a real browser (headless system Chromium, Playwright): with no worker it says so on every
page, at 1280 and 390 px, without horizontal overflow; a queued job's page says why it waits and stops saying so,
live, when a worker registers. The service here has Redis and the API only: no worker ever runs."""

from __future__ import annotations

import re

import httpx
import pytest

from core import demo_status, keys
from core.redis_server import EmbeddedRedis
from core.settings import Settings
from tests.browser import BROWSER_MARKS, expect
from tests.http_server import HttpServer

pytestmark = BROWSER_MARKS

OVERFLOW = "document.documentElement.scrollWidth - document.documentElement.clientWidth"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("status-ui")
    redis_server = EmbeddedRedis(home / "redis", appendonly=False).start()
    try:
        settings = Settings(EXPLAINQ_HOME=str(home), REDIS_URL=redis_server.url)
        with HttpServer(settings) as http:
            yield http.url, redis_server
    finally:
        redis_server.stop()


@pytest.fixture()
def errors():
    return []


def _page(browser, base: str, width: int, errors: list[str]):
    context = browser.new_context(viewport={"width": width, "height": 800}, base_url=base)
    pg = context.new_page()
    pg.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    return context, pg


@pytest.mark.parametrize("width", [1280, 390])
def test_the_strip_says_no_worker_runs_on_every_page_without_overflow(browser, server, width, errors,
                                                                      tmp_path) -> None:
    base, redis_server = server
    import redis

    r = redis.Redis.from_url(redis_server.url)
    steps = [{"name": "conve-nations-demo", "models": ["conve-nations-demo"], "datasets": ["nations"],
              "kinds": ["tracin", "train_conve"], "cost_s": 15},
             {"name": "nrms-minilm-poisoned-demo", "models": ["nrms-minilm-poisoned-demo"],
              "kinds": ["attributions"], "cost_s": 60}]
    context, pg = _page(browser, base, width, errors)
    try:
        for path in ("/ui/jobs", "/ui/new", "/ui/workers"):
            pg.goto(path)
            strip = pg.locator("#status-strip")
            expect(strip).to_contain_text("No worker is running")
            expect(strip.get_by_role("link", name="Workers and queues")).to_be_visible()
            assert pg.evaluate(OVERFLOW) <= 0, (path, width)
        with demo_status.DemoProgress(r, steps) as progress:
            progress.start("conve-nations-demo")
            pg.goto("/ui/models")
            strip = pg.locator("#status-strip")
            expect(strip).to_contain_text("0 of 2 ready")
            expect(strip).to_contain_text("preparing conve-nations-demo")
            expect(pg.locator("#preparing")).to_contain_text("nrms-minilm-poisoned-demo")
            assert pg.evaluate(OVERFLOW) <= 0, width
            if width == 1280:
                progress.end("conve-nations-demo", ok=True)
                expect(strip).to_contain_text("1 of 2 ready", timeout=10_000)  # refreshed live
            pg.goto("/ui/workers")
            expect(pg.locator("#demo-steps")).to_contain_text("nrms-minilm-poisoned-demo")
            assert pg.evaluate(OVERFLOW) <= 0, width
            _shot(pg, tmp_path, f"status-strip-{width}.png")
    finally:
        context.close()
        r.delete(keys.DEMO_PLAN, keys.DEMO_ALIVE)
    assert errors == [], errors


def _shot(pg, tmp_path, name: str) -> None:
    """A full-page screenshot in the test's directory, and in ``$EXPLAINQ_UI_SCREENSHOTS`` when set."""
    import os
    import shutil
    from pathlib import Path

    pg.screenshot(path=str(tmp_path / name), full_page=True)
    target = os.environ.get("EXPLAINQ_UI_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / name, Path(target) / name)


def test_a_queued_job_page_says_why_it_waits_until_a_worker_registers(browser, server, errors) -> None:
    base, redis_server = server
    import redis

    r = redis.Redis.from_url(redis_server.url)
    job_id = httpx.post(f"{base}/test/sleep", json={"steps": 1}).json()["id"]
    context, pg = _page(browser, base, 390, errors)
    try:
        pg.goto(f"/ui/jobs/{job_id}")
        waiting = pg.locator("#job-waiting")
        expect(waiting).to_be_visible()
        expect(waiting).to_contain_text(re.compile(r"no worker is listening on queue 'explain'"))
        assert pg.evaluate(OVERFLOW) <= 0
        r.hset("rq:worker:fake.1", mapping={"queues": "explain", "state": "idle"})
        r.sadd("rq:workers:explain", "rq:worker:fake.1")
        expect(waiting).to_be_hidden(timeout=10_000)  # the job's event stream carried the change
    finally:
        context.close()
        r.delete("rq:worker:fake.1", "rq:workers:explain")
        httpx.delete(f"{base}/jobs/{job_id}")
    assert errors == [], errors
