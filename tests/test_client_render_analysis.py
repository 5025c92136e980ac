"""The SDK's notebook and terminal renderings of attribution and TracIn results follow the dashboard: one colour
scale for every sample, the words as the text has them with their values printed, the warnings, and TracIn's
prediction and in-training flag."""

from __future__ import annotations

from explainq_client.render import (
    attribution_html,
    attribution_text,
    diverging_color,
    tracin_html,
    tracin_text,
)

from tests.analysis_pages import attribution_result, tracin_result


def test_attribution_html_one_scale_display_words_values_and_warnings() -> None:
    result = attribution_result(n=3)
    html = attribution_html(result)
    assert ">SHOCKING<" in html and ">shocking<" not in html
    # s2's largest word (1.4) is drawn on the result's scale (2.6), not as its own sample's maximum
    assert diverging_color(0.2, 2.6) in html and diverging_color(0.2, 1.4) not in html
    assert "−2.6" in html or "-2.6" in html
    assert "<small style='font-size:10px'>+1.2</small>" in html  # values printed, no hover needed
    assert "&#x27;s2&#x27;: relative completeness error 0.42" in html or "'s2': relative completeness error 0.42" \
        in html
    assert "relative completeness error 0.42" in attribution_text(result)


def test_tracin_renders_prediction_and_in_training_flag() -> None:
    result = tracin_result()
    html, text = tracin_html(result), tracin_text(result)
    for out in (html, text):
        assert "model score 3.25, filtered rank 1 of 14" in out
        assert "filtered rank 7.5 of 14" in out
        assert out.count("[in the training set]") == 1
