"""The comparison in a real browser (headless system Chromium through Playwright): from the jobs list, tick two
jobs with the keyboard and compare them; the compare pages of attributions, TracIn and training at 1280 and
390 px, values as text, nothing scrolling sideways, no console errors. Screenshots go to
``$EXPLAINQ_UI_SCREENSHOTS`` when set. The app runs without workers; the jobs are crafted
(tests/compare_fixtures.py)."""

from __future__ import annotations

import re

import pytest

from tests.browser import BROWSER_MARKS, expect
from tests.compare_fixtures import ALICE, serve
from tests.test_ui_browser import _shot

pytestmark = BROWSER_MARKS


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("compare-browser")) as s:
        yield s


@pytest.fixture(scope="module")
def signed_in(browser, served):
    context = browser.new_context(base_url=served[1])
    pg = context.new_page()
    pg.goto("/ui/login?next=/ui/jobs")
    pg.fill("#api_key", ALICE)
    pg.click("button[type=submit]")
    expect(pg).to_have_url(re.compile(r"/ui/jobs$"))
    state = context.storage_state()
    context.close()
    return state


def _page(browser, served, signed_in, width: int):
    context = browser.new_context(viewport={"width": width, "height": 900}, base_url=served[1],
                                  storage_state=signed_in)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    return context, pg, errors


def _fits(pg, width: int) -> None:
    scroll = pg.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width + 1, f"{pg.url} is {scroll} px wide at {width} px"


@pytest.mark.parametrize("width", [1280, 390])
def test_two_jobs_ticked_with_the_keyboard_open_their_comparison(browser, served, signed_in, width,
                                                                 tmp_path) -> None:
    _, _, jobs = served
    context, pg, errors = _page(browser, served, signed_in, width)
    try:
        pg.goto("/ui/jobs")
        _fits(pg, width)
        for name in ("tracin_a", "tracin_b"):
            box = pg.locator(f'input.pick[value="{jobs[name]}"]')
            box.focus()
            pg.keyboard.press("Space")
            expect(box).to_be_checked()
        pg.get_by_role("button", name="Compare selected").focus()
        pg.keyboard.press("Enter")
        expect(pg).to_have_url(re.compile(r"/ui/compare\?"))
        expect(pg.locator("h1")).to_contain_text("Compare two")
        props = pg.locator("table.list-compare caption").first
        expect(props).to_contain_text("Proponents: overlap 2 of 3")
        expect(pg.locator("table.list-compare").first).to_contain_text("india · embassy · uk")
        expect(pg.locator("tr.change-entered").first).to_contain_text("entered")
        _fits(pg, width)
        _shot(pg, tmp_path, f"compare-tracin-{width}.png", full_page=True)
    finally:
        context.close()
    assert errors == [], errors


@pytest.mark.parametrize("width", [1280, 390])
def test_the_attribution_and_training_comparisons_fit_and_read_as_text(browser, served, signed_in, width,
                                                                       tmp_path) -> None:
    _, _, jobs = served
    context, pg, errors = _page(browser, served, signed_in, width)
    try:
        pg.goto(f"/ui/compare?a={jobs['att_a']}&b={jobs['att_b']}")
        row = pg.locator("#sample-deltas tbody tr").first
        expect(row).to_contain_text("s1")
        expect(row).to_contain_text("+14.56")
        expect(pg.locator("#word-deltas tbody tr").first).to_contain_text("shocking")
        summary = pg.locator("details.sample-details summary").first
        summary.focus()
        pg.keyboard.press("Enter")  # a sample's words open from the keyboard
        expect(pg.locator("details.sample-details").first).to_have_attribute("open", "")
        _fits(pg, width)
        _shot(pg, tmp_path, f"compare-attributions-{width}.png", full_page=True)
        pg.goto(f"/ui/compare?a={jobs['train_a']}&b={jobs['train_b']}")
        expect(pg.locator("#metric-deltas")).to_contain_text("valid_mrr")
        expect(pg.locator("#field-deltas")).to_contain_text("steps")
        expect(pg.locator("#overlay figure").first).to_be_visible()
        _fits(pg, width)
        _shot(pg, tmp_path, f"compare-training-{width}.png", full_page=True)
    finally:
        context.close()
    assert errors == [], errors
