"""The attribution, comparison and TracIn pages in a real browser (the system's Chromium through Playwright).

The pages are the dashboard's own: the router's context builders and templates render a crafted result (see
``tests/analysis_pages.py``), and the browser loads them with the real scripts and styles. What is checked is what a
reader gets without a mouse: the values as text (under the words, and in a table), one colour scale whose bar's
ends are the page's largest |attribution|, the text's casing, the completeness warning, the comparison's two
heatmaps one above the other with the top-N changes marked and correct counts, a sortable table, and TracIn's
prediction, in-training badge and bars from zero; and no horizontal scrolling at 390 px.
"""

from __future__ import annotations

import re

import pytest

from app.ui.views import signed
from tests.analysis_pages import (
    JOB_ID,
    MODEL_A,
    MODEL_B,
    STATIC,
    attribution_result,
    job_page,
    tracin_result,
)
from tests.browser import BROWSER_MARKS, expect

pytestmark = BROWSER_MARKS

BASE = "http://explainq.test"
TYPES = {".css": "text/css", ".js": "text/javascript"}


@pytest.fixture()
def show(browser):
    """``show(html, width)``: a page at ``width`` px that has loaded ``html`` as ``/ui/jobs/<id>`` with the
    dashboard's static files; console errors fail the test."""
    contexts, errors = [], []
    pages: dict[str, str] = {}

    def handle(route) -> None:
        url = route.request.url
        path = url[len(BASE):].split("?", 1)[0]
        if path.startswith("/ui/static/"):
            f = STATIC / path[len("/ui/static/"):]
            if f.is_file():
                return route.fulfill(body=f.read_bytes(), content_type=TYPES.get(f.suffix, "application/octet-stream"))
        if path.startswith("/ui/jobs/"):
            query = url.split("?", 1)[1] if "?" in url else ""
            return route.fulfill(body=pages.get(query, pages[""]), content_type="text/html")
        return route.fulfill(status=404, body="not found")

    def open_page(html: str | dict[str, str], width: int = 1280):
        pages.clear()
        pages.update(html if isinstance(html, dict) else {"": html})
        ctx = browser.new_context(viewport={"width": width, "height": 900})
        contexts.append(ctx)
        pg = ctx.new_page()
        pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.route(f"{BASE}/**", handle)
        pg.goto(f"{BASE}/ui/jobs/{JOB_ID}")
        return pg

    yield open_page
    for c in contexts:
        c.close()
    assert errors == [], errors


def _no_sideways_scroll(pg, width: int = 390) -> None:
    assert pg.evaluate("document.documentElement.scrollWidth") <= width + 1, "the page scrolls sideways"


def test_values_toggle_shows_every_number_under_its_word_without_hover(show) -> None:
    result = attribution_result()
    pg = show(job_page(result))
    first = pg.locator("article.sample").first
    values = first.locator(".heat .w .v")
    expect(values.first).to_be_hidden()
    pg.get_by_label("Show values under the words").check()
    expect(values.first).to_be_visible()
    sample = result["samples"][0]
    assert values.all_inner_texts() == [signed(v, 3) for v in sample["word_attributions"]]
    # each number sits under its word, inside the word's box
    word_box = first.locator(".heat .w").first.bounding_box()
    value_box = values.first.bounding_box()
    assert value_box["y"] >= word_box["y"] + 0.4 * word_box["height"] - 1
    assert "values=1" in pg.url  # the choice survives a reload and the pager
    assert "values=1" in pg.locator("a[rel=next]").get_attribute("href")


def test_table_view_lists_word_and_value_as_text(show) -> None:
    result = attribution_result()
    pg = show(job_page(result))
    table = pg.locator("article.sample").first.locator(".words-table table")
    expect(table).to_be_hidden()
    pg.get_by_label("Table").check()
    expect(table).to_be_visible()
    expect(pg.locator("article.sample").first.locator(".heat")).to_be_hidden()
    rows = table.locator("tbody tr")
    sample = result["samples"][0]
    got = [(r.locator("th").inner_text(), r.locator("td").nth(1).inner_text()) for r in rows.all()]
    assert got == [(d, signed(v, 5)) for d, v in zip(sample["display_words"], sample["word_attributions"],
                                                      strict=True)]


def test_one_scale_per_page_with_a_numeric_colour_bar_and_the_same_colour_for_the_same_value(show) -> None:
    result = attribution_result()
    pg = show(job_page(result))
    bar = pg.locator(".scale-line .colour-bar")
    assert float(bar.get_attribute("data-max")) == 2.6 == -float(bar.get_attribute("data-min"))
    assert bar.locator(".ticks span").all_inner_texts() == ["−2.6", "−1.3", "0", "+1.3", "+2.6"]
    # 1.4 in s2 is not drawn like its own sample's maximum: it is 1.4/2.6 of the page's end colour
    s1_top = pg.locator("[data-sample-id=s1] .heat .w").first.evaluate("e => getComputedStyle(e).backgroundColor")
    s2_top = pg.locator("[data-sample-id=s2] .heat .w").first.evaluate("e => getComputedStyle(e).backgroundColor")
    assert s1_top == "rgb(230, 97, 1)" and s2_top != s1_top
    # per-sample scale, as an option: s2's largest word now takes the end colour, with its own bar
    pg = show(job_page(result, options={"scale": "sample"}))
    s2 = pg.locator("[data-sample-id=s2]")
    assert s2.locator(".heat .w").first.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(230, 97, 1)"
    assert float(s2.locator(".colour-bar").get_attribute("data-max")) == 1.4


def test_casing_history_explanations_and_completeness_warning(show) -> None:
    pg = show(job_page(attribution_result()))
    s1 = pg.locator("[data-sample-id=s1]")
    assert s1.locator(".heat .w .t").first.inner_text().startswith("SHOCKING")
    assert s1.locator(".heat").inner_text().startswith("SHOCKING+:+ Fans")  # no space the headline lacks
    expect(pg.locator("details.explain")).to_contain_text("baseline score")
    s1.locator("details.sample-details summary").click()
    expect(s1.locator("ol.history li")).to_have_text(["Senate passes the Budget bill", "Lakers win"])
    warned = pg.locator("article.sample[data-warned]")
    expect(warned).to_have_count(1)
    assert warned.get_attribute("data-sample-id") == "s2"
    expect(warned.locator(".warn")).to_contain_text("0.42")
    expect(pg.locator(".warn-box")).to_contain_text("'s2'")


def test_comparison_heatmaps_one_above_the_other_with_top_n_marked_and_true_counts(show) -> None:
    result = attribution_result(compare=True)
    pg = show(job_page(result))
    expect(pg.locator("#attributions h2")).to_contain_text("12 samples")
    expect(pg.locator("#comparison h2")).to_contain_text("12 of 12 samples attributed by both")
    s1 = pg.locator("[data-sample-id=s1]")
    heats = s1.locator(".heat")
    expect(heats).to_have_count(2)
    assert heats.nth(0).get_attribute("aria-label") == MODEL_A and heats.nth(1).get_attribute("aria-label") == MODEL_B
    a, b = heats.nth(0).bounding_box(), heats.nth(1).bounding_box()
    assert b["y"] >= a["y"] + a["height"] - 1  # B below A
    top_n = result["comparison"]["top_n"]
    assert top_n == 2
    for sample in result["comparison"]["per_sample"][:10]:
        art = pg.locator(f"[data-sample-id={sample['id']}]")
        for k, key in ((0, "index_a"), (1, "index_b")):
            marked = art.locator(".heat").nth(k).locator(".w.changed")
            assert marked.count() == len(sample["changed"]) == top_n, sample["id"]
            positions = art.locator(".heat").nth(k).locator(".w").evaluate_all(
                "els => els.flatMap((e, i) => e.classList.contains('changed') ? [i] : [])")
            assert positions == sorted(c[key] for c in sample["changed"])
    # s1: SHOCKING and believe flip sign (the two largest changes); the others are unmarked
    assert pg.locator("[data-sample-id=s1] .heat").nth(0).locator(".w.changed").evaluate_all(
        "els => els.map(e => e.dataset.display)") == ["SHOCKING", "believe"]
    # the page stays short: ten samples of two headlines each, their history folded
    assert pg.locator("article.sample details[open]").count() == 0
    heights = pg.locator("article.sample").evaluate_all("els => els.map(e => e.getBoundingClientRect().height)")
    assert len(heights) == 10 and max(heights) < 420, heights
    assert pg.evaluate("document.documentElement.scrollHeight") < 5000


def test_comparison_table_keeps_words_seen_k_times_and_sorts(show) -> None:
    result = attribution_result(compare=True)
    pg = show(job_page(result))
    table = pg.locator("#comparison table")
    words = table.locator("tbody th")
    listed = words.all_inner_texts()
    assert listed and all(r["count"] >= 3 for r in result["comparison"]["changed"])
    assert set(listed) == {r["word"] for r in result["comparison"]["changed"]}
    assert "shocking" not in listed  # seen once: not in the table
    table.locator("thead button", has_text="word").click()
    assert words.all_inner_texts() == sorted(listed)
    table.locator("thead button", has_text="count").click()
    counts = [int(t) for t in table.locator("tbody td:nth-child(5)").all_inner_texts()]
    assert counts == sorted(counts, reverse=True)


def test_tracin_prediction_badge_and_bars_from_zero(show) -> None:
    result = tracin_result()
    pg = show(job_page(result, kind="tracin"))
    first, second = pg.locator("article.test-triple").nth(0), pg.locator("article.test-triple").nth(1)
    expect(first.locator(".badge.in-train")).to_have_text("in the training set")
    expect(second.locator(".badge.in-train")).to_have_count(0)
    expect(first.locator("dl.prediction")).to_contain_text("+3.25")
    expect(first.locator("dl.prediction")).to_contain_text("1 of 14")
    expect(second.locator("dl.prediction")).to_contain_text("7.5 of 14")
    expect(first.locator("table").first.locator("tbody tr").first).to_contain_text("the test triple itself")
    widths = first.locator("table").first.locator(".bar.range > span").evaluate_all(
        "els => els.map(e => e.getBoundingClientRect().width)")
    full = first.locator("table").first.locator(".bar.range").first.bounding_box()["width"]
    # 0.0148, 0.0143, 0.0138 from zero: the largest fills the bar, the others within 7 % of it (as the SDK draws)
    assert widths[0] == pytest.approx(full, abs=1.5)
    assert widths[1] == pytest.approx(full * 0.0143 / 0.0148, abs=1.5)
    assert widths[2] == pytest.approx(full * 0.0138 / 0.0148, abs=1.5)
    expect(first.locator("th.range-note").first).to_have_text("bars: 0 … 0.0148")
    values = first.locator("table").first.locator("tbody td.num:nth-child(3)").all_inner_texts()
    assert values == ["+0.0148", "+0.0143", "+0.0138"]


@pytest.mark.parametrize("which", ["attributions", "comparison", "tracin"])
def test_no_horizontal_overflow_at_390_px(show, which) -> None:
    if which == "tracin":
        html = job_page(tracin_result(), kind="tracin")
    else:
        html = job_page(attribution_result(compare=which == "comparison"), options={"values": "1"})
    pg = show(html, width=390)
    _no_sideways_scroll(pg)
    if which != "tracin":
        pg.get_by_label("Table").check()
        _no_sideways_scroll(pg)


def test_pager_keeps_the_reading_options(show) -> None:
    result = attribution_result()
    html = job_page(result, options={"values": "1", "view": "table"})
    assert re.search(r'href="\?page=2&amp;values=1&amp;view=table"', html)
    pg = show(html)
    expect(pg.locator("section.attr")).to_have_class(re.compile("show-values"))
    expect(pg.locator("section.attr")).to_have_class(re.compile("view-table"))


def _lds_result() -> dict:
    names = ["tracin", "tracin_last", "trak", "trak_ensemble", "random"]
    est = {n: {"lds": {"mean": 0.1 * i, "low": 0.1 * i - 0.05, "high": 0.1 * i + 0.05, "n": 100},
               "n_undefined": 0, "seconds": 1.5,
               **({} if n == "tracin" else {"ratio_to_tracin": {"ratio": float(i), "low": i - 0.2, "high": i + 0.2,
                                                                "n": 100}})}
           for i, n in enumerate(names, 1)}
    return {"metric": "lds", "dataset": "umls", "m": 64, "alpha": 0.5, "n_test": 100, "subset_size": 2608,
            "n_train": 5216, "output": "margin", "trainings": 0, "ground_truth": {"reused": 138},
            "estimators": est, "noise_ceiling": {"agreement": {"mean": 0.49, "low": 0.459, "high": 0.522},
                                                  "ceiling": 0.688, "per_test": []}}


@pytest.mark.parametrize("width", [1280, 390])
def test_the_evaluation_page_shows_ratios_and_the_ceiling_and_fits_a_phone(show, width) -> None:
    pg = show(job_page(_lds_result(), kind="evaluate_attribution"), width)
    row = pg.locator("table.evaluation tbody tr").filter(has_text="trak_ensemble")
    expect(row.locator("td").last).to_have_text("4 [3.8, 4.2]")
    expect(pg.locator(".evaluation-ceiling")).to_contain_text("about 0.688")
    chart = pg.locator("figure.evaluation-chart svg").first
    assert chart.bounding_box()["width"] <= width  # the bar chart scales down with the page
    if width == 390:
        _no_sideways_scroll(pg)
