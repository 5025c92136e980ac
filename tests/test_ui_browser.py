"""The dashboard in a real browser: headless Chromium from the system's package manager, driven by Playwright.

A real service (private Redis, real workers) is served by uvicorn on a free port. The tests sign in with an
API key, submit an attribution job through the form and watch it succeed live, check every word of the
headline with its sign, watch a BDH training curve grow, and use the jobs list at a narrow width. Every page
must log no console errors. Screenshots go to the test's directory, and also to ``$EXPLAINQ_UI_SCREENSHOTS``
when set (``docs/`` keeps the current ones).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
from pathlib import Path

import httpx
import pytest

from app.ui.views import signed
from core import registry
from models.news.text import WordTokenizer
from tests.browser import BROWSER_MARKS, expect
from tests.http_server import HttpServer

pytestmark = BROWSER_MARKS

KEYS = "alice:ui-key-alice-0123456789,bob:ui-key-bob-0123456789"
ALICE = "ui-key-alice-0123456789"
MODEL = "nrms-word-ui"
TWIN = "nrms-word-ui-twin"  # the same weights under a second name, for compare_with
TINY_BDH = {"n_layer": 1, "n_embd": 16, "n_head": 2, "mlp_multiplier": 2, "dropout": 0.0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real service with a tiny news model, served over HTTP by uvicorn in a thread."""

    from models.news.demo import build_small
    from tests.service import Service

    # The dashboard only needs a working model, not a good one: one epoch on a small synthetic set.
    root = tmp_path_factory.getbasetemp() / "news-ui"
    paths = build_small(root, ("nrms-word-demo",), n_news=120, n_users=30, epochs={"nrms-word-demo": 1})
    home = tmp_path_factory.mktemp("ui-home")
    svc = Service(home, queues=("explain", "train"), api_keys=KEYS, heartbeat_ttl_s=30, start=False,
                  env={"OMP_NUM_THREADS": "1"})
    shutil.copytree(paths["nrms-word-demo"], home / "models" / MODEL)
    for name in (MODEL, TWIN):
        registry.register_model(svc.settings, name, kind="news", loader="models.news.checkpoint:load",
                                path=home / "models" / MODEL, parameters=1)
    shutil.copytree(root / "data" / "news-synthetic", home / "data" / "news-ui")
    registry.register_dataset(svc.settings, "news-ui", kind="news", path=home / "data" / "news-ui")
    svc.start()
    # Headlines from the model's own training news, so that every word is in its vocabulary (not [UNK]).
    vocab = set(json.loads((home / "models" / MODEL / "vocab.json").read_text()))
    titles = [line.split("\t")[3] for line in (root / "data" / "news-synthetic" / "train" / "news.tsv")
              .read_text(encoding="utf-8").splitlines()]
    known = [t for t in titles if all(w in vocab for w in WordTokenizer.words(t))]
    assert len(known) >= 3, "the small demo vocabulary covers too few headlines"
    try:
        with HttpServer(svc.settings) as http:
            yield svc, http.url, known[0], known[1:3]
    finally:
        svc.stop()


@pytest.fixture()
def page(browser, server, tmp_path):
    """A signed-in page at 1280x800 that records console errors (asserted empty after the test)."""
    base = server[1]
    context = browser.new_context(viewport={"width": 1280, "height": 800}, base_url=base)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    pg.goto("/ui/jobs")
    expect(pg).to_have_url(re.compile(r"/ui/login\?next="))
    pg.fill("#api_key", ALICE)
    pg.click("button[type=submit]")
    expect(pg).to_have_url(re.compile(r"/ui/jobs$"))
    yield pg
    context.close()
    assert errors == [], errors


def _shot(pg, tmp_path: Path, name: str, full_page: bool = False) -> None:
    pg.screenshot(path=str(tmp_path / name), full_page=full_page)
    target = os.environ.get("EXPLAINQ_UI_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / name, Path(target) / name)


def _api(base: str) -> httpx.Client:
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ALICE}"}, timeout=30)


def test_session_cookie_is_httponly_strict_and_holds_no_key(page) -> None:
    (cookie,) = [c for c in page.context.cookies() if c["name"] == "explainq_session"]
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert ALICE not in cookie["value"]
    assert page.locator(".who").inner_text() == "alice"


def test_attribution_submitted_through_the_form_succeeds_live_with_every_word(page, server, tmp_path) -> None:
    _, _, headline, history = server
    page.goto("/ui/new/attributions")
    page.select_option("#f-model", MODEL)
    page.fill("#f-sample-candidate", headline)
    page.fill("#f-sample-history", "\n".join(history))
    page.fill("#f-n_steps", "16")
    page.click("details#advanced > summary")  # precision is an expert setting
    page.select_option("#f-precision", "fp32")
    page.click("form.job-form button[type=submit]")
    expect(page).to_have_url(re.compile(r"/ui/jobs/[0-9a-f]{32}$"))
    job_id = page.url.rsplit("/", 1)[1]
    page.evaluate("window.__samePage = true")
    expect(page.locator("#job-status .badge")).to_have_text("succeeded", timeout=180_000)
    words = page.locator(".heat .w")
    expect(words.first).to_be_visible(timeout=30_000)
    assert page.evaluate("window.__samePage") is True, "the page was reloaded instead of updated live"

    # The same words and signs the public result has, each with its value on hover.
    result = page.request.get(f"/jobs/{job_id}/result")  # the session cookie authenticates GETs
    assert result.ok, result.text()
    sample = result.json()["samples"][0]
    shown = words.evaluate_all("els => els.map(e => [e.dataset.word, e.dataset.sign, e.title])")
    assert [w for w, _, _ in shown] == sample["words"]
    for (word, sign, title), value in zip(shown, sample["word_attributions"], strict=True):
        assert sign == ("+" if value > 0 else "−" if value < 0 else "0"), (word, value)
        assert title == f"{word}: {signed(value, 5)}", title
    assert [w for w, _, _ in shown] == WordTokenizer.words(headline)  # every word of the headline, in order
    assert page.locator(".sample dl.metrics").inner_text().count("completeness delta") == 1
    _shot(page, tmp_path, "dashboard-attributions.png")


def test_running_bdh_job_curve_grows_and_cancel_works(page, server, tmp_path) -> None:
    base = server[1]
    with _api(base) as api:
        r = api.post("/train/bdh", json={"dataset": "digits", "epochs": 300, "batch_size": 32, "lr": 3e-3,
                                         "warmup_steps": 2, "model": TINY_BDH, "max_train_samples": 64,
                                         "precision": "fp32", "seed": 1})
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
    page.goto(f"/ui/jobs/{job_id}")
    chart = page.locator("figure.chart").nth(1)  # the per-epoch loss (the first chart is the step curve)
    expect(chart.locator("canvas")).to_have_count(1)
    epochs = "document.querySelectorAll('figure.chart')[1].dataset.points"
    page.wait_for_function(f"() => +{epochs} >= 1", timeout=120_000)
    first = int(chart.get_attribute("data-points"))
    page.wait_for_function(f"() => +{epochs} >= {first + 2}", timeout=60_000)
    expect(page.locator("#job-status .badge")).to_have_text("running")
    assert "ETA" in page.locator("#job-progress").inner_text()
    _shot(page, tmp_path, "dashboard-bdh-training.png")
    page.click("text=Cancel job")
    expect(page.locator("#job-status .badge")).to_have_text("canceled", timeout=60_000)
    expect(page.locator("text=Resume from this job's checkpoint")).to_be_visible(timeout=30_000)


def test_jobs_list_live_at_a_narrow_width_and_keyboard_reachable(page, server, tmp_path) -> None:
    base = server[1]
    page.set_viewport_size({"width": 390, "height": 844})
    with _api(base) as api:
        r = api.post("/test/sleep", json={"steps": 30, "step_s": 0.1})
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
    page.goto("/ui/jobs")
    row = page.locator(f"#row-{job_id}")
    expect(row).to_be_visible()
    page.evaluate("window.__samePage = true")
    expect(row.locator(".badge")).to_have_text("succeeded", timeout=60_000)
    assert page.evaluate("window.__samePage") is True
    assert page.evaluate("document.documentElement.scrollWidth") <= 390 + 1, "the page scrolls sideways"
    _shot(page, tmp_path, "dashboard-jobs-narrow.png")
    page.set_viewport_size({"width": 1280, "height": 800})
    _shot(page, tmp_path, "dashboard-jobs.png")
    # Keyboard: Tab from the top reaches the first job's link.
    page.locator("body").focus()
    for _ in range(30):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.closest('table.jobs') !== null"):
            break
    else:
        pytest.fail("the jobs table cannot be reached with the keyboard")


def test_dataset_run_pages_through_samples_and_shows_the_comparison(page, server) -> None:
    base = server[1]
    with _api(base) as api:
        r = api.post("/attributions", json={"model": MODEL, "compare_with": TWIN, "n_steps": 4, "precision": "fp32",
                                            "dataset": {"name": "news-ui", "split": "test", "n_samples": 12,
                                                        "balanced": True, "seed": 1}})
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
    page.goto(f"/ui/jobs/{job_id}")
    expect(page.locator("#job-status .badge")).to_have_text("succeeded", timeout=180_000)
    samples = page.locator("article.sample")
    expect(samples).to_have_count(10, timeout=30_000)
    first_ids = samples.evaluate_all("els => els.map(e => e.dataset.sampleId)")
    expect(page.locator("h2", has_text=f"Comparison: {MODEL} vs {TWIN}")).to_be_visible()
    expect(page.locator("text=No word's mean attribution changed by more than the threshold.")).to_be_visible()
    labels = page.locator(".wstat figcaption").all_inner_texts()
    assert sorted(t.split(":")[0] for t in labels) == ["fake", "real"]
    page.click("text=Next samples →")
    expect(page).to_have_url(re.compile(r"\?page=2$"))
    expect(samples).to_have_count(2)
    assert not set(samples.evaluate_all("els => els.map(e => e.dataset.sampleId)")) & set(first_ids)
    expect(page.locator("text=page 2 of 2")).to_be_visible()


def test_a_job_page_opens_by_the_short_id_the_dashboard_shows(page, server) -> None:
    """The 8-character ids the pages show are enough: /ui/jobs/<prefix> opens the job, which then follows itself
    live by its full id."""
    base = server[1]
    with _api(base) as api:
        r = api.post("/test/sleep", json={"steps": 10, "step_s": 0.1})
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
    page.goto(f"/ui/jobs/{job_id[:8]}")
    expect(page.locator("h1")).to_contain_text(job_id[:8])
    expect(page.locator(".badge").first).to_have_text("succeeded", timeout=60_000)
    assert job_id in page.content()  # the page knows the whole id (its links and its event stream use it)
