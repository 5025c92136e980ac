"""The attribution and TracIn pages rendered from results (no browser): a fanned-out run's summary, old results
without the newer fields, and the reading options' fallbacks."""

from __future__ import annotations

import re

from tests.analysis_pages import attribution_result, job_page, tracin_result


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_a_fanned_out_summary_renders_its_counts_word_statistics_and_csv_link() -> None:
    result = attribution_result()
    result.pop("samples")
    result["n_samples"] = 500
    result["word_stats"] = {"fake": {"top": [{"word": "secret", "mean": 1.5, "std": 0.1, "count": 40}],
                                     "bottom": [{"word": "senate", "mean": -0.5, "std": 0.1, "count": 30}],
                                     "words": 2}}
    html = job_page(result, artifacts=[{"name": "words.csv", "size": 10}])
    text = _text(html)
    assert "Attributions 500 samples" in text and "summary of 500 samples" in text
    assert "secret +1.5" in text and "senate −0.5" in text
    assert "/artifacts/words.csv" in html
    assert "colour-bar" not in html  # no scale without words to colour


def test_an_older_result_without_display_words_spans_or_history_still_renders() -> None:
    result = attribution_result(n=2)
    for s in result["samples"]:
        for key in ("display_words", "spans", "history"):
            s.pop(key)
    result.pop("warn_relative_delta")
    html = job_page(result)
    assert 'data-display="shocking"' in html and "History" not in _text(html)


def test_unknown_reading_options_fall_back_to_the_defaults() -> None:
    html = job_page(attribution_result(n=2), options={"scale": "<x>", "view": "bogus", "values": "yes"})
    assert 'class="card attr" id="attributions"' in html and "&lt;x&gt;" not in html and "<x>" not in html
    assert 'value="global" data-attr-scale checked' in html


def test_tracin_page_of_a_self_ranking_shows_its_range_and_count() -> None:
    result = tracin_result()
    result.pop("results")
    result.update(mode="self", returned=3, n_candidates=1592,
                  ranking=[{"train_triple": ["a", "r", str(i)], "self_influence": 0.02 - i * 1e-4} for i in range(250)])
    text = _text(job_page(result, kind="tracin"))
    assert "bars: 1.00e-04 … 0.02" in text  # the 200 rows shown, not the 250 ranked
    assert "The first 200 are shown; the CSV has all 250." in text
