"""An exported classifier's attribution pages in a real browser (the system's Chromium through Playwright): an image
drawn as its heatmap grid (each cell's value in its title and the strongest cells' values as text in a table) and a
tabular row as signed bars with every feature's value and attribution as text; both at 1280 and 390 px, with no
sideways scrolling. The results are real (the export fixtures' CNN and MLP, through the job's report builder)."""

from __future__ import annotations

import re

import pytest

from app.ui.views import signed
from tests.analysis_pages import job_page, tensor_result
from tests.browser import BROWSER_MARKS, expect
from tests.test_ui_browser_analysis import _no_sideways_scroll
from tests.test_ui_browser_analysis import show as show  # noqa: PLC0414 - the page fixture, used by name

pytestmark = BROWSER_MARKS


@pytest.mark.parametrize("width", [1280, 390])
def test_an_image_attribution_is_a_heatmap_with_its_values_readable(show, tmp_path, width) -> None:
    result = tensor_result("image", tmp_path)
    pg = show(job_page(result), width)
    first = pg.locator("article.sample").first
    rec = result["samples"][0]
    cells = first.locator(".tgrid .tcell")
    assert cells.count() == 64
    # every cell names its value (title), in the record's order (row by row)
    assert cells.nth(9).get_attribute("title") == f"r1c1: {signed(rec['word_attributions'][9], 5)}"
    strongest = max(range(64), key=lambda k: abs(rec["word_attributions"][k]))
    style = cells.nth(strongest).get_attribute("style")
    r, _, b = (int(v) for v in re.search(r"background:rgb\((\d+), (\d+), (\d+)\)", style).groups())
    assert (r > b) == (rec["word_attributions"][strongest] > 0)  # orange for, blue against
    rows = first.locator(".tensor-image table tbody tr")
    assert rows.count() == 24
    expect(rows.first).to_be_visible()  # in the heatmap view too, not only the table view
    assert rows.first.locator("td.num").last.inner_text() == signed(rec["word_attributions"][strongest], 5)
    assert "explains class" in first.inner_text() and rec["target"]["label"] in first.inner_text()
    box = first.locator(".tgrid").bounding_box()
    assert box["width"] <= width and box["height"] > 100
    if width == 390:
        _no_sideways_scroll(pg)


@pytest.mark.parametrize("width", [1280, 390])
def test_a_tabular_attribution_is_signed_bars_with_values_as_text(show, tmp_path, width) -> None:
    result = tensor_result("tabular", tmp_path)
    pg = show(job_page(result), width)
    first = pg.locator("article.sample").first
    rec = result["samples"][0]
    rows = first.locator(".tensor-bars tbody tr")
    assert rows.count() == 6
    expect(rows.first).to_be_visible()
    for i in range(6):
        row = rows.nth(i)
        assert row.locator("th").inner_text() == rec["words"][i]
        assert row.locator("td.num").nth(1).inner_text() == signed(rec["word_attributions"][i], 5)
        cls = row.locator(".sbar").get_attribute("class")
        assert ("pos" in cls) == (rec["word_attributions"][i] > 0)
    if width == 390:
        _no_sideways_scroll(pg)
