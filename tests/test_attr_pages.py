"""The attribution and TracIn pages rendered from results (no browser): how many entries a result holds inline
of how many in all (and the artifact with every one), samples without the optional fields, a result of an earlier
version (shown as JSON), and the reading options' fallbacks."""

from __future__ import annotations

import re
from html import unescape

import pytest

from tests.analysis_pages import JOB_ID, attribution_result, job_page, self_ranking_result, tracin_result


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_a_result_with_more_samples_than_inline_says_how_many_and_links_samples_jsonl() -> None:
    result = attribution_result(n=12, total=500)
    result["word_stats"] = {"fake": {"top": [{"word": "secret", "mean": 1.5, "std": 0.1, "count": 40}],
                                     "bottom": [{"word": "senate", "mean": -0.5, "std": 0.1, "count": 30}],
                                     "words": 2}}
    html = job_page(result, artifacts=[{"name": "words.csv", "size": 10}])
    text = _text(html)
    assert "Attributions 500 samples" in text
    assert "Showing the first 12 of 500 samples; all of them are in samples.jsonl" in text
    assert f'href="/jobs/{JOB_ID}/artifacts/samples.jsonl"' in html
    assert "secret +1.5" in text and "senate −0.5" in text and "the highest and lowest of 2 words" in text
    assert "/artifacts/words.csv" in html
    assert "page 1 of 2" in text  # the pages are of the samples the result holds


def test_every_sample_inline_needs_no_note() -> None:
    html = job_page(attribution_result(n=3))
    assert "listed-more" not in html and "Attributions 3 samples" in _text(html)


def test_a_comparison_counts_the_samples_both_models_attributed() -> None:
    result = attribution_result(n=3, compare=True, total=40)
    text = _text(job_page(result))
    assert "40 of 40 samples attributed by both" in text


def test_samples_without_display_words_spans_or_history_still_render() -> None:
    result = attribution_result(n=2)
    for s in result["samples"]:
        for key in ("display_words", "spans", "history"):
            s[key] = None  # optional per sample: null when the pipeline has none
    html = job_page(result)
    assert 'data-display="shocking"' in html and "History" not in _text(html)


def test_unknown_reading_options_fall_back_to_the_defaults() -> None:
    html = job_page(attribution_result(n=2), options={"scale": "<x>", "view": "bogus", "values": "yes"})
    assert 'class="card attr" id="attributions"' in html and "&lt;x&gt;" not in html and "<x>" not in html
    assert 'value="global" data-attr-scale checked' in html


def test_tracin_page_of_a_self_ranking_shows_its_range_and_count() -> None:
    result = self_ranking_result(250)
    html = job_page(result, kind="tracin")
    text = _text(html)
    assert "bars: 0 … 0.02" in text  # from zero, on the largest of the 200 rows shown
    assert "250 of 250 training triples" in text
    assert "Showing the first 200 of 250 ranked training triples; all of them are in self_influence.jsonl" in text
    assert f'href="/jobs/{JOB_ID}/artifacts/self_influence.jsonl"' in html
    top = _text(job_page(self_ranking_result(1592, top_k=5), kind="tracin"))
    assert "5 of 1592 training triples" in top
    assert "Showing the first 5 of 1592 ranked training triples" in top


def test_tracin_page_of_more_test_triples_than_inline_says_so_and_links_results_jsonl() -> None:
    html = job_page(tracin_result(total=500), kind="tracin")
    text = _text(html)
    assert text.count("filtered rank of the tail") == 2  # the two inline entries are drawn
    assert "Showing the first 2 of 500 test triples; all of them are in results.jsonl" in text
    assert f'<a class="mono" href="/jobs/{JOB_ID}/artifacts/results.jsonl" download>results.jsonl</a>' in html
    assert "listed-more" not in job_page(tracin_result(), kind="tracin")


def test_an_unvalidated_result_is_shown_as_json_with_a_note_not_drawn() -> None:
    old = {"model": "conve-a", "mode": "test", "results": {"artifact": "results.jsonl", "count": 500}}
    html = job_page(old, kind="tracin", schema="unvalidated")
    assert 'id="result-unvalidated"' in html and "written by an earlier version" in _text(html)
    assert 'id="tracin"' not in html and '"count": 500' in html
    assert 'id="result-unvalidated"' not in job_page(tracin_result(), kind="tracin", schema="InfluenceResult")


def test_tracin_bars_start_at_zero_on_one_scale_per_test_triple_as_the_sdk_draws_them() -> None:
    from explainq_client.render import tracin_html

    from app.ui.analysis import tracin_context

    result = tracin_result()
    per_test = tracin_context(result)["per_test"]
    first = per_test[0]
    widths = [p["width"] for p in first["proponents_"]["rows"]]
    # 0.0148, 0.0143, 0.0138: a 7 % spread draws bars within 7 % of each other, never from nothing to full
    assert widths == pytest.approx([100.0, 0.0143 / 0.0148 * 100, 0.0138 / 0.0148 * 100])
    assert [p["width"] for p in first["opponents_"]["rows"]] == pytest.approx([0.002 / 0.0148 * 100,
                                                                               0.001 / 0.0148 * 100])
    assert first["proponents_"]["scale"] == first["opponents_"]["scale"] == 0.0148
    sdk = [float(w) for w in re.findall(r"height:10px;width:([0-9.]+)%", tracin_html(result))]
    page = [round(p["width"], 1) for r in per_test for key in ("proponents_", "opponents_") for p in r[key]["rows"]]
    assert sdk == page  # the same picture in the dashboard and the SDK
    text = _text(job_page(result, kind="tracin"))
    assert "bars: 0 … 0.0148" in text and "Bars start at zero" in text


def test_a_test_triple_without_opponents_says_why_and_what_to_try() -> None:
    result = tracin_result()
    for entry in result["results"]:
        entry.update(opponents=[], n_positive=entry["n_candidates"], n_negative=0)
    text = unescape(_text(job_page(result, kind="tracin")))
    assert text.count("No opponents: all 1500 candidates raised the model's belief in this triple") == 2
    assert 'loss "score_bce"' in text and 'loss "margin"' in text and "none (see below)" in text
    result["loss"] = "score_bce"
    text = unescape(_text(job_page(result, kind="tracin")))
    assert "No opponents" in text and 'loss "margin"' in text and 'run the query again with loss' not in text
    result["loss"] = "margin"
    text = unescape(_text(job_page(result, kind="tracin")))
    assert "No opponents" in text and "already used the margin" in text and "Try the margin" not in text
    assert "No opponents" not in _text(job_page(tracin_result(), kind="tracin"))



def test_the_sdk_says_the_same_of_a_test_triple_without_opponents() -> None:
    from explainq_client.render import tracin_html, tracin_text

    result = tracin_result()
    assert "no opponents" not in tracin_text(result) and "no opponents" not in tracin_html(result)
    for entry in result["results"]:
        entry.update(opponents=[], n_negative=0)
    text, html = tracin_text(result), unescape(tracin_html(result))
    assert text.count("no opponents: every candidate raised") == 2 and "loss='score_bce'" in text
    assert html.count("no opponents: every candidate raised") == 2 and "'margin'" in html


def test_the_sdks_no_opponents_note_follows_the_loss_the_query_used() -> None:
    from explainq_client.render import no_opponents

    entry = {"opponents": [], "n_negative": 0}
    assert "loss='score_bce'" in no_opponents({"loss": "train"}, entry)
    assert "loss 'margin'" in no_opponents({"loss": "score_bce"}, entry)
    margin = no_opponents({"loss": "margin"}, entry)
    assert "already used the margin" in margin and "ask stored features" not in margin
    assert no_opponents({"loss": "margin"}, {"opponents": [{"influence": -1.0}], "n_negative": 1}) is None
