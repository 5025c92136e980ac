"""The mislabel evaluation's suspects in a real browser (the system's Chromium; the dashboard's own job page over a
crafted MislabelResult, as tests/test_tracin_breakdown_browser.py): each estimator's list is a table of text,
the first open, the others open from the keyboard, corrupted rows say what the tail was, and nothing scrolls
sideways at 390 px. ``EXPLAINQ_UI_SCREENSHOTS=docs`` copies the screenshots there."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from core.contract.results.evaluation import MislabelResult
from tests.analysis_pages import LONG_WORD, job_page
from tests.browser import BROWSER_MARKS, expect
from tests.result_examples import example
from tests.test_ui_browser_analysis import show  # noqa: F401 (the page fixture)

pytestmark = BROWSER_MARKS


def _mislabel_result() -> dict:
    data = example(MislabelResult)
    est = next(iter(data["estimators"].values()))
    suspects = [{"rank": i + 1, "train_index": 40 - i, "triple": ["usa", "embassy", f"entity{i}"],
                 "self_influence": 0.5 / (i + 1), "corrupted": i % 3 == 0,
                 "original_tail": "uk" if i % 3 == 0 else None} for i in range(12)]
    suspects[1]["triple"] = [LONG_WORD, "intergovorgs", "burma"]  # wider than a phone
    data.update(dataset="nations", n_train=1592, n_corrupted=159, fraction=0.1, suspects_listed=12)
    data["estimators"] = {"tracin": {**est, "suspects": suspects},
                          "random": {**est, "suspects": [{**s, "rank": i + 1} for i, s in enumerate(reversed(suspects))]}}
    return MislabelResult.model_validate(data).model_dump(mode="json")


@pytest.mark.parametrize("width", [1280, 390])
def test_the_suspects_are_tables_of_text_and_fit(show, width, tmp_path) -> None:  # noqa: F811
    pg = show(job_page(_mislabel_result(), kind="evaluate_mislabel"), width=width)
    lists = pg.locator("details.suspects")
    expect(lists).to_have_count(2)
    first = lists.nth(0).locator("table.suspects")
    expect(first).to_be_visible()
    rows = first.locator("tbody tr")
    expect(rows).to_have_count(12)
    assert rows.nth(0).locator("td").all_inner_texts() == ["1", "usa · embassy · entity0", "0.5", "yes (was uk)"]
    assert rows.nth(2).locator("td").all_inner_texts()[-2:] == ["0.166667", "no"]
    expect(lists.nth(0).locator("summary")).to_have_text("tracin: 4 of its top 12 were corrupted")
    second = lists.nth(1).locator("table.suspects")
    expect(second).to_be_hidden()
    lists.nth(1).locator("summary").focus()
    pg.keyboard.press("Enter")
    expect(second).to_be_visible()
    assert second.locator("tbody tr").first.locator("td").all_inner_texts()[:2] == ["1", "usa · embassy · entity11"]
    assert pg.evaluate("document.documentElement.scrollWidth") <= width + 1, "the page scrolls sideways"
    for table in (first, second):  # every column in view: the table does not scroll inside its box either
        assert table.evaluate("t => t.parentElement.scrollWidth <= t.parentElement.clientWidth + 1")


@pytest.mark.slow
@pytest.mark.parametrize("width", [1280, 390])
def test_a_real_mislabel_runs_suspects_on_its_page(show, width, tmp_path) -> None:  # noqa: F811
    """A mislabel job run in process (nations, a tiny recipe, tracin_last and random): the page lists each
    estimator's top of its self_scores.npz ranking; the screenshots in docs/ are of this page."""
    import numpy as np

    from core.kinds.evaluate import EvaluateMislabelRequest
    from core.settings import Settings
    from tests.test_evaluate_api import TINY
    from workers.context import JobContext
    from workers.jobs.evaluate import run_mislabel

    ctx = JobContext(Settings(EXPLAINQ_HOME=str(tmp_path / "home")), device="cpu")
    result = run_mislabel(EvaluateMislabelRequest(recipe=TINY, estimators=["tracin_last", "random"], fraction=0.1,
                                                  seed=3), ctx).model_dump(mode="json")
    scores = np.load(ctx.artifact_path("self_scores.npz"))["tracin_last"]
    pg = show(job_page(result, kind="evaluate_mislabel"), width=width)
    first = pg.locator("details.suspects").nth(0)
    top = first.locator("tbody tr").first.locator("td").all_inner_texts()
    best = result["estimators"]["tracin_last"]["suspects"][0]
    assert best["self_influence"] == float(scores.max()) and top[1] == " · ".join(best["triple"])
    assert pg.evaluate("document.documentElement.scrollWidth") <= width + 1, "the page scrolls sideways"
    name = f"dashboard-mislabel-suspects{'-phone' if width < 500 else ''}.png"
    pg.locator("section.card", has=first).scroll_into_view_if_needed()
    first.scroll_into_view_if_needed()
    pg.screenshot(path=str(tmp_path / name))
    if os.environ.get("EXPLAINQ_UI_SCREENSHOTS"):
        target = Path(os.environ["EXPLAINQ_UI_SCREENSHOTS"])
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / name, target / name)


@pytest.mark.parametrize("width", [1280, 390])
def test_the_classifier_evaluation_pages_fit_a_phone(show, width) -> None:  # noqa: F811
    """The classifier evaluations' cards (a long model name, many flipped examples): nothing scrolls sideways at
    390 px, the settings tables and the flipped list fit their boxes, and the numbers read as text."""
    from tests.test_classifier_evaluation_pages import lds_result, mislabel_result

    lds = {**lds_result(), "model": LONG_WORD}
    pg = show(job_page(lds, kind="evaluate_classifier_attribution"), width=width)
    card = pg.locator("#classifier-evaluation")
    expect(card.locator("table.evaluation tbody tr").nth(1)).to_contain_text("1.31 [1.04, 1.77]")
    assert pg.evaluate("document.documentElement.scrollWidth") <= width + 1, "the LDS page scrolls sideways"
    for table in card.locator("table.evaluation-settings").all():
        assert table.evaluate("t => t.parentElement.scrollWidth <= t.parentElement.clientWidth + 1")
    pg = show(job_page({**mislabel_result(400), "model": LONG_WORD}, kind="evaluate_classifier_mislabel"),
              width=width)
    card = pg.locator("#classifier-evaluation")
    expect(card.locator("table.evaluation tbody tr").first).to_contain_text("[0.841, 0.902]")
    card.locator("details.flipped summary").click()
    expect(card.locator("p.flipped-list")).to_be_visible()
    assert pg.evaluate("document.documentElement.scrollWidth") <= width + 1, "the mislabel page scrolls sideways"
