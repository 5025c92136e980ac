"""Training runs and phone widths in a real browser (headless system Chromium through Playwright, as
tests/test_ui_browser.py): the per-step curve shows live before the first epoch ends, train and validation are drawn
in the colours the SDK uses, several runs overlay on one chart, and no page reachable from the navigation (plus one
job page of every kind) scrolls sideways at 390 px. Screenshots also go to ``$EXPLAINQ_UI_SCREENSHOTS``."""

from __future__ import annotations

import re
import shutil

import httpx
import pytest

from core import registry
from tests.browser import BROWSER_MARKS, expect
from tests.test_ui_browser import _shot

pytestmark = [
    pytest.mark.slow,  # about 75 s: one finished job of every kind, then a browser over them
    *BROWSER_MARKS,
]

KEYS = "alice:runs-ui-key-alice-0123456789"
ALICE = "runs-ui-key-alice-0123456789"
NEWS = "nrms-word-runs"
CONVE = {"dataset": "nations", "epochs": 2, "batch_size": 256, "embedding_dim": 20, "embedding_height": 4,
         "num_filters": 4, "checkpoint_every": 1, "seed": 0}
TINY_BDH = {"n_layer": 1, "n_embd": 16, "n_head": 2, "mlp_multiplier": 2, "dropout": 0.0}
PHONE = 390


def _api(base: str) -> httpx.Client:
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ALICE}"}, timeout=30)


def _submit(api: httpx.Client, route: str, body: dict) -> str:
    r = api.post(route, json=body)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def _wait(api: httpx.Client, job_id: str, timeout_s: float = 240.0) -> dict:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = api.get(f"/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "canceled"):
            return job
        time.sleep(0.2)
    raise TimeoutError(job_id)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real service with a tiny news model, the nations triples and a LoRA set; one finished job of every
    kind (two ConvE runs), served over HTTP."""
    from models.kg.triples import nations_dir
    from models.lora.synthetic import generate_dataset
    from models.news.demo import build_small
    from tests.http_server import HttpServer
    from tests.service import Service

    root = tmp_path_factory.getbasetemp() / "news-runs-ui"
    paths = build_small(root, ("nrms-word-demo",), n_news=120, n_users=30, epochs={"nrms-word-demo": 1})
    home = tmp_path_factory.mktemp("runs-ui-home")
    generate_dataset(home / "data" / "lora-tiny", signal=("visual",), seed=1, num_classes=3, per_class=10,
                     width_divisor=32, max_blocks=2, strength=0.8)
    svc = Service(home, queues=("explain,bulk", "train"), api_keys=KEYS, heartbeat_ttl_s=30, start=False,
                  env={"OMP_NUM_THREADS": "1"})
    shutil.copytree(paths["nrms-word-demo"], home / "models" / NEWS)
    shutil.copytree(paths["nrms-word-demo"], home / "data" / "import-me")
    registry.register_model(svc.settings, NEWS, kind="news", loader="models.news.checkpoint:load",
                            path=home / "models" / NEWS, parameters=1)
    shutil.copytree(root / "data" / "news-synthetic", home / "data" / "news-runs")
    registry.register_dataset(svc.settings, "news-runs", kind="news", path=home / "data" / "news-runs")
    registry.register_dataset(svc.settings, "nations", kind="triples", path=nations_dir(), upload=True)
    svc.start()
    title = (root / "data" / "news-synthetic" / "train" / "news.tsv").read_text(encoding="utf-8") \
        .splitlines()[0].split("\t")[3]
    try:
        with HttpServer(svc.settings) as http, _api(http.url) as api:
            jobs = {
                "train_conve": _submit(api, "/train/conve", {**CONVE, "name": "conve-runs-ui", "lr": 0.01}),
                "train_conve_2": _submit(api, "/train/conve", {**CONVE, "name": "conve-runs-ui-2", "lr": 0.003,
                                                               "embedding_dim": 32, "embedding_height": 4}),
                "train_bdh": _submit(api, "/train/bdh", {"dataset": "digits", "epochs": 2, "batch_size": 32,
                                                         "warmup_steps": 2, "model": TINY_BDH,
                                                         "max_train_samples": 64, "precision": "fp32"}),
                "train_news": _submit(api, "/train/news", {"name": "news-runs-trained", "dataset": "news-runs",
                                                           "encoder": "word", "epochs": 1, "embedding_dim": 16,
                                                           "heads": 2, "head_dim": 8, "query_dim": 16}),
                "attributions": _submit(api, "/attributions", {"model": NEWS, "n_steps": 4, "precision": "fp32",
                                                               "samples": [{"id": "s1", "history": [title],
                                                                            "candidate": title}]}),
                "ablations": _submit(api, "/ablations", {
                    "dataset": "lora-tiny", "representations": ["simple_stats"], "layer_sets": ["all", "visual"],
                    "quick": True, "max_epochs": 4, "hidden_dim": 16, "batch_size": 64}),
                "import_model": _submit(api, "/models/import", {"name": "news-imported", "kind": "nrms",
                                                                "path": "import-me"}),
            }
            assert _wait(api, jobs["train_conve"])["status"] == "succeeded", svc.worker_logs()
            jobs["tracin"] = _submit(api, "/tracin", {"model": "conve-runs-ui", "test_triples": [
                ["usa", "embassy", "uk"]], "top_k": 3})
            jobs["tracin_self"] = _submit(api, "/tracin", {"model": "conve-runs-ui", "mode": "self", "top_k": 5})
            for kind, job_id in jobs.items():
                job = _wait(api, job_id)
                assert job["status"] in ("succeeded", "failed"), (kind, job)
            yield svc, http.url, jobs
    finally:
        svc.stop()


@pytest.fixture()
def page(browser, server):
    context = browser.new_context(viewport={"width": 1280, "height": 800}, base_url=server[1])
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    pg.goto("/ui/login?next=/ui/jobs")
    pg.fill("#api_key", ALICE)
    pg.click("button[type=submit]")
    expect(pg).to_have_url(re.compile(r"/ui/jobs$"))
    yield pg
    context.close()
    assert errors == [], errors


def _marker_colours(pg, figure: str) -> dict[str, str]:
    """A uPlot chart's series labels and their legend colours (as the browser computes them)."""
    return pg.locator(f"{figure} .u-legend tr.u-series").evaluate_all(
        "rows => Object.fromEntries(rows.slice(1).map(r => [r.querySelector('.u-label').textContent,"
        " getComputedStyle(r.querySelector('.u-marker')).borderLeftColor]))")


def _rgb(hex_colour: str) -> str:
    h = hex_colour.lstrip("#")
    return "rgb({}, {}, {})".format(*(int(h[i:i + 2], 16) for i in (0, 2, 4)))


def test_train_and_validation_in_the_sdk_colours_and_runs_overlay(page, server, tmp_path) -> None:
    from explainq_client import render

    _, _, jobs = server
    page.goto(f"/ui/jobs/{jobs['train_bdh']}")
    loss = "figure.chart:has(figcaption:text-is('Loss'))"
    expect(page.locator(f"{loss} canvas")).to_have_count(1)
    colours = _marker_colours(page, loss)
    assert colours == {"train loss": _rgb(render.TRAIN_COLOUR), "validation loss": _rgb(render.VALIDATION_COLOUR)}
    steps = "figure.chart:has(figcaption:text-is('Running loss by step'))"
    assert int(page.locator(steps).get_attribute("data-points")) >= 2

    page.click("text=Compare with other train_bdh runs…")
    expect(page).to_have_url(re.compile(r"/ui/runs\?kind=train_bdh"))
    page.goto("/ui/runs")  # pick the kind, then two runs, as a user would
    page.select_option("select[name=kind]", "train_conve")
    page.click("text=Show runs")
    for key in ("train_conve", "train_conve_2"):
        page.check(f"input[name=ids][value='{jobs[key]}']")
    page.click("text=Compare the chosen runs")
    expect(page).to_have_url(re.compile(r"/ui/runs\?kind=train_conve&ids=[0-9a-f]{32}&ids=[0-9a-f]{32}$"))
    figures = page.locator("figure.overlay")
    expect(figures).to_have_count(3)
    expect(page.locator("figure.overlay canvas")).to_have_count(3)
    mrr = "figure.overlay:has(figcaption:text-is('Validation MRR / Hits@k'))"
    labels = list(_marker_colours(page, mrr))
    assert len(labels) == 6 and {label[:8] for label in labels} == {jobs["train_conve"][:8],
                                                                   jobs["train_conve_2"][:8]}
    differs = page.locator("table.params tr.differs th").all_inner_texts()
    assert {"lr", "embedding_dim", "name"} <= set(differs) and "epochs" not in differs
    _shot(page, tmp_path, "dashboard-runs-overlay.png", full_page=True)


def test_running_step_curve_shows_before_the_first_epoch_ends(page, server, tmp_path) -> None:
    with _api(server[1]) as api:
        # one sample per step over the whole digits training split: an epoch of 1,617 steps, long enough to
        # watch the step curve advance before it ends
        job_id = _submit(api, "/train/bdh", {"dataset": "digits", "epochs": 2, "batch_size": 1, "warmup_steps": 2,
                                             "model": {**TINY_BDH, "n_layer": 2, "n_embd": 64, "mlp_multiplier": 4},
                                             "precision": "fp32", "seed": 2, "augment": False})
    page.set_viewport_size({"width": PHONE, "height": 844})
    page.goto(f"/ui/jobs/{job_id}")
    steps = "figure.chart:has(figcaption:text-is('Running loss by step'))"
    loss = "figure.chart:has(figcaption:text-is('Loss'))"
    page.wait_for_function("() => +document.querySelector('figure.chart').dataset.points >= 2", timeout=120_000)
    assert page.locator(loss).get_attribute("data-points") == "0", "no step point showed before the first epoch ended"
    first = float(page.locator(steps).get_attribute("data-last-x"))
    assert 0 < first < 1  # fractional epochs of the first epoch
    page.wait_for_function(f"() => +document.querySelector('figure.chart').dataset.lastX > {first}",
                           timeout=90_000)  # the curve advances live
    # and, while it is still within the first epoch, the per-epoch chart stays empty (on a fast machine the
    # first epoch may have ended by the time the page sees the curve move again)
    points = page.locator(loss).get_attribute("data-points")  # read first: the step curve read after is later
    if float(page.locator(steps).get_attribute("data-last-x")) < 1:
        assert points == "0"
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE
    _shot(page, tmp_path, "dashboard-phone-training.png")
    page.click("text=Cancel job")
    expect(page.locator("#job-status .badge")).to_have_text("canceled", timeout=60_000)


def _crawl_targets(pg, jobs: dict[str, str]) -> list[str]:
    """Every dashboard page the navigation reaches (and the pages those link to within the dashboard: each
    kind's form), one job page per kind, the runs overlay and a delete confirmation."""
    pg.goto("/ui/jobs")
    nav = [h for h in pg.locator("header nav a").evaluate_all("as => as.map(a => a.getAttribute('href'))")
           if h.startswith("/ui")]
    pages = list(nav)
    for start in nav:
        pg.goto(start)
        for href in pg.locator("main a[href^='/ui/new/']").evaluate_all("as => as.map(a => a.getAttribute('href'))"):
            pages.append(href)
    pages += [f"/ui/jobs/{job_id}" for job_id in jobs.values()]
    pages += ["/ui/runs", f"/ui/runs?kind=train_conve&ids={jobs['train_conve']},{jobs['train_conve_2']}",
              "/ui/models/conve-runs-ui-2/delete"]
    return list(dict.fromkeys(pages))


def test_no_page_scrolls_sideways_at_phone_width(page, server, tmp_path) -> None:
    _, _, jobs = server
    targets = _crawl_targets(page, jobs)
    assert len(targets) >= 20, targets
    page.set_viewport_size({"width": PHONE, "height": 844})
    wide = {}
    for href in targets:
        response = page.goto(href)
        assert response is not None and response.ok, (href, response and response.status)
        page.wait_for_load_state("networkidle")
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > PHONE:
            kind = next((k for k, v in jobs.items() if href.endswith(v)), None)
            widest = page.evaluate(
                "() => { let w = null; for (const e of document.querySelectorAll('main *')) {"
                " const r = e.getBoundingClientRect(); if (r.right > innerWidth + 1 && (!w || r.right > w[1]))"
                " w = [e.tagName.toLowerCase() + '.' + [...e.classList].join('.'), Math.round(r.right)]; } return w; }")
            wide[f"{href} ({kind})" if kind else href] = (width, widest)
    assert wide == {}, f"pages wider than {PHONE} px: {wide}"
    page.goto("/ui/models")
    _shot(page, tmp_path, "dashboard-phone-models.png", full_page=True)
