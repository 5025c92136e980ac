"""The jobs list and the new-job forms in a real browser (the system's Chromium, driven by Playwright): a job
submitted from another client appears live, the Advanced fold, rows of samples and of triples with the model's
vocabulary, clone-and-edit from a job page, the cost estimate of a training run, and no sideways scrolling at
390 px. The app runs without workers (tests/formserver.py): jobs stay queued. Every page must log no console
errors."""

from __future__ import annotations

import re

import pytest

from tests.browser import BROWSER_MARKS, expect
from tests.formserver import ALICE, CONVE, ENTITIES, NEWS, api, serve
from tests.test_ui_browser import _shot

pytestmark = BROWSER_MARKS


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("browser-forms")) as (_, url):
        yield url


@pytest.fixture(scope="module")
def signed_in(browser, server):
    """The cookies of one sign-in through the form, for every test's fresh context."""
    context = browser.new_context(base_url=server)
    pg = context.new_page()
    pg.goto("/ui/login?next=/ui/jobs")
    pg.fill("#api_key", ALICE)
    pg.click("button[type=submit]")
    expect(pg).to_have_url(re.compile(r"/ui/jobs$"))
    state = context.storage_state()
    context.close()
    return state


@pytest.fixture()
def page(browser, server, signed_in):
    context = browser.new_context(viewport={"width": 1280, "height": 800}, base_url=server,
                                  storage_state=signed_in)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    yield pg
    context.close()
    assert errors == [], errors


def _no_sideways_scroll(pg) -> None:
    width = pg.evaluate("document.documentElement.scrollWidth")
    assert width <= 390 + 1, f"{pg.url} is {width} px wide at 390 px"


def test_a_job_submitted_elsewhere_appears_live_without_reload(page, server, monkeypatch) -> None:
    from app.ui import router

    monkeypatch.setattr(router, "NEW_JOBS_POLL_S", 0.2)  # the server runs in this process
    monkeypatch.setattr(router, "LIVE_POLL_S", 0.2)
    page.goto("/ui/jobs")
    page.evaluate("window.__notReloaded = true")
    with api(server) as a:
        job = a.post("/test/sleep", json={"steps": 1, "label": "appears by itself", "tags": ["live"]}).json()
    row = page.locator(f"#row-{job['id']}")
    expect(row).to_be_visible(timeout=10_000)
    expect(row).to_contain_text("appears by itself")
    expect(row.locator(".tag")).to_have_text("live")
    expect(page.locator("#job-rows > tr").first).to_have_id(f"row-{job['id']}")  # on top
    assert page.evaluate("window.__notReloaded") is True
    # a filtered list takes only the jobs its filter keeps
    page.goto("/ui/jobs?tag=wanted")
    with api(server) as a:
        skipped = a.post("/test/sleep", json={"steps": 1, "tags": ["other"]}).json()
        kept = a.post("/test/sleep", json={"steps": 1, "tags": ["wanted"]}).json()
    expect(page.locator(f"#row-{kept['id']}")).to_be_visible(timeout=10_000)
    expect(page.locator(f"#row-{skipped['id']}")).to_have_count(0)


def test_the_advanced_fold_is_closed_and_holds_the_expert_fields(page) -> None:
    page.goto("/ui/new/attributions")
    fold = page.locator("details#advanced")
    assert fold.get_attribute("open") is None
    for name in ("shard_size", "alpha_batch_size", "max_failed_fraction"):
        expect(page.locator(f"#f-{name}")).to_be_hidden()
        assert fold.locator(f"#f-{name}").count() == 1
    expect(page.locator("#f-model")).to_be_visible()
    expect(page.locator("label[for=f-n_steps]")).to_have_text("Integration steps")
    page.click("details#advanced > summary")
    expect(page.locator("#f-shard_size")).to_be_visible()
    expect(page.locator("label[for=f-alpha_batch_size]")).to_have_text("Path points per pass")


def test_several_samples_are_added_removed_and_submitted(page, server) -> None:
    page.goto("/ui/new/attributions")
    page.select_option("#f-model", NEWS)
    page.fill("#f-label", "three then two")
    page.fill("#f-sample-candidate", "Lakers win the title")
    page.fill("#f-sample-history", "first\nsecond")
    for _ in range(2):
        page.click("text=Add a sample")
    rows = page.locator("[data-rows] > .sample-row")
    expect(rows).to_have_count(3)
    expect(rows.nth(2).locator("legend")).to_have_text("Sample 3")
    rows.nth(1).locator("input[name='sample.candidate']").fill("Markets fall")
    rows.nth(1).locator("textarea[name='sample.history']").fill("third")
    rows.nth(2).locator("input[name='sample.candidate']").fill("to be removed")
    rows.nth(2).locator("[data-remove-row]").click()
    expect(rows).to_have_count(2)
    page.click("form.job-form button[type=submit]")
    expect(page).to_have_url(re.compile(r"/ui/jobs/[0-9a-f]{32}$"))
    job_id = page.url.rsplit("/", 1)[1]
    with api(server) as a:
        body = a.get(f"/jobs/{job_id}/request").json()
    assert [(s["candidate"], s["history"]) for s in body["samples"]] == [
        ("Lakers win the title", ["first", "second"]), ("Markets fall", ["third"])]
    expect(page.locator("h1")).to_contain_text("three then two")


def test_triple_rows_complete_from_the_models_vocabulary_and_submit(page, server, tmp_path) -> None:
    page.goto("/ui/new/tracin")
    page.select_option("#f-model", CONVE)
    expect(page.locator("#vocab-entities option")).to_have_count(len(ENTITIES))
    expect(page.locator("#vocab-note")).to_contain_text(f"{len(ENTITIES)} of {len(ENTITIES)} entities")
    head = page.locator("#f-test_triples-head")
    assert head.get_attribute("list") == "vocab-entities"
    assert page.locator("#f-test_triples-relation").get_attribute("list") == "vocab-relations"
    head.fill("usa")
    page.fill("#f-test_triples-relation", "embassy")
    page.fill("#f-test_triples-tail", "uk")
    page.locator("#f-test_triples").locator("text=Add a triple").click()
    second = page.locator("#f-test_triples [data-rows] > .triple-row").nth(1)
    second.locator("input[name='test_triples.head']").fill("uk")
    second.locator("input[name='test_triples.relation']").fill("treaties")
    second.locator("input[name='test_triples.tail']").fill("burma")
    _shot(page, tmp_path, "dashboard-new-tracin.png", full_page=True)
    page.click("form.job-form button[type=submit]")
    expect(page).to_have_url(re.compile(r"/ui/jobs/[0-9a-f]{32}$"))
    with api(server) as a:
        body = a.get(f"/jobs/{page.url.rsplit('/', 1)[1]}/request").json()
    assert body["test_triples"] == [["usa", "embassy", "uk"], ["uk", "treaties", "burma"]]


def test_clone_and_edit_from_a_job_page(page, server) -> None:
    with api(server) as a:
        job = a.post("/tracin", json={"model": CONVE, "test_triples": [["usa", "embassy", "uk"]], "top_k": 3,
                                      "label": "to be cloned"}).json()
    page.goto(f"/ui/jobs/{job['id']}")
    page.click("#clone")
    expect(page).to_have_url(re.compile(rf"/ui/new/tracin\?clone={job['id']}$"))
    expect(page.locator("#f-test_triples-head")).to_have_value("usa")
    expect(page.locator("#f-top_k")).to_have_value("3")
    page.fill("#f-label", "the clone")
    page.fill("#f-test_triples-tail", "burma")
    page.click("form.job-form button[type=submit]")
    expect(page).to_have_url(re.compile(r"/ui/jobs/[0-9a-f]{32}$"))
    assert job["id"] not in page.url
    with api(server) as a:
        body = a.get(f"/jobs/{page.url.rsplit('/', 1)[1]}/request").json()
    assert body["test_triples"] == [["usa", "embassy", "burma"]] and body["top_k"] == 3
    assert body["label"] == "the clone"


def test_no_sideways_scrolling_at_390px_on_the_jobs_list_and_the_forms(page, server, tmp_path) -> None:
    with api(server) as a:
        a.post("/attributions", json={"model": NEWS, "label": "a rather long label " * 5, "tags": ["narrow"],
                                      "samples": [{"id": "n", "candidate": "word " * 40, "history": ["h"]}]})
    page.goto("/ui/jobs")
    _shot(page, tmp_path, "dashboard-jobs-labels.png")
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto("/ui/jobs")
    _no_sideways_scroll(page)
    _shot(page, tmp_path, "dashboard-jobs-labels-narrow.png")
    for kind in ("attributions", "tracin", "train_bdh", "train_conve", "train_news", "import_model", "ablations"):
        page.goto(f"/ui/new/{kind}")
        if page.locator("details#advanced").count():
            page.click("details#advanced > summary")
        for _ in range(page.locator("text=/^Add a (sample|triple)$/").count()):
            page.locator("text=/^Add a (sample|triple)$/").first.click()
        _no_sideways_scroll(page)


def test_an_evaluation_form_shows_its_trainings_time_and_disk_as_it_changes(page) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto("/ui/new/evaluate_attribution")
    box = page.locator("#estimate")
    # the defaults: 64 subset models, the full-data model and trak_ensemble's 4 members
    expect(box).to_contain_text("at most 69 ConvE trainings (64 subset models of 1,592 triples × 10 epochs")
    expect(box).to_contain_text("by the stated model")
    page.fill("#f-m", "8")
    expect(box).to_contain_text("at most 13 ConvE trainings (8 subset models")
    expect(box.locator("#estimate-disk")).to_have_text(re.compile(r"^[0-9.]+ MiB$"))
    _no_sideways_scroll(page)


def test_a_training_form_shows_its_cost_estimate_as_it_changes(page) -> None:
    page.goto("/ui/new/train_bdh")
    box = page.locator("#estimate")
    expect(box).to_contain_text("Estimate: 10 epochs × 1,294 training images")
    expect(box).to_contain_text("An estimate")
    page.fill("#f-epochs", "20")
    expect(box).to_contain_text("Estimate: 20 epochs")
