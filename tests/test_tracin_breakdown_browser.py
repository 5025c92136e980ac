"""TracIn's breakdown and flags in a real browser (the system's Chromium; the page is the dashboard's own job page
over a crafted result, as tests/test_ui_browser_analysis.py): the breakdown opens from the keyboard, its numbers
are text, the reverse of the test triple is flagged, and nothing scrolls sideways at 390 px."""

from __future__ import annotations

import pytest

from tests.analysis_pages import job_page
from tests.browser import BROWSER_MARKS, expect
from tests.test_tracin_breakdown import _with_breakdown
from tests.test_ui_browser_analysis import show  # noqa: F401 (the page fixture)

pytestmark = BROWSER_MARKS


@pytest.mark.parametrize("width", [1280, 390])
def test_the_breakdown_opens_from_the_keyboard_and_fits(show, width) -> None:  # noqa: F811
    pg = show(job_page(_with_breakdown(), kind="tracin"), width=width)
    first = pg.locator("article.test-triple").first
    expect(first.get_by_text("the test triple reversed")).to_be_visible()
    details = first.locator("details.breakdown")
    table = details.locator("table.breakdown")
    expect(table).to_be_hidden()
    details.locator("summary").focus()
    pg.keyboard.press("Enter")
    expect(table).to_be_visible()
    row = table.locator("tbody tr").first
    expect(row).to_contain_text("proponent 1")
    expect(row).to_contain_text("+0.0111")  # checkpoint e1: 0.75 × 0.0148
    assert pg.evaluate("document.documentElement.scrollWidth") <= width + 1, "the page scrolls sideways"
    expect(pg.locator("article.test-triple").nth(1).locator("details.breakdown")).to_have_count(0)
