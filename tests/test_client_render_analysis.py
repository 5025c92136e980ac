"""The SDK's notebook and terminal renderings of attribution and TracIn results follow the dashboard: one colour
scale for every sample, the words as the text has them with their values printed, the warnings, and TracIn's
prediction and in-training flag. Every kind's result, whole or sharded, renders in its one shape: the first entries
of a list the result holds in part, with how many there are in all (``listed``) and where they are; a result of an
earlier version (``unvalidated``) as JSON."""

from __future__ import annotations

import pytest
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


# ------------------------------------------------------------------------------------ one shape, listed totals
def _sharded_influence(total: int = 450) -> dict:
    """A sharded run's influence result: 200 test triples inline of ``total`` (all in results.jsonl)."""
    from core.contract.results.influence import InfluenceResult

    base = tracin_result()
    results = [{**base["results"][1], "test_triple": ["china", "intergovorgs", f"e{i}"]} for i in range(200)]
    return InfluenceResult.model_validate({
        **base, "n_test": total, "results": results, "shards": {"total": 3, "failed": [2]},
        "failed": {"shards": [2], "candidates": 12, "triples": []},
        "listed": {"results": {"total": total, "inline": 200, "artifact": "results.jsonl"}},
        "notes": ["the first 200 test triples are listed, all of them in results.jsonl"]}).model_dump(mode="json")


def test_renderers_draw_a_sharded_size_result_with_its_listed_totals() -> None:
    from explainq_client.results import TracInResult, make_result

    result = make_result("influence", _sharded_influence(), "tracin", "InfluenceResult")
    assert isinstance(result, TracInResult) and result.validated and result.total("results") == 450
    html, text = result._repr_html_(), result.text()
    assert html.count("filtered rank 7.5 of 14") == 50  # the first 50 test triples drawn
    assert ("showing 50 of 450 test triples; all of them are in <code>results.jsonl</code>: "
            "<code>job.entries(&#x27;results&#x27;)</code>") in html
    assert ("... showing 50 of 450 test triples; all of them are in results.jsonl: "
            "explainq-client entries <job id> results") in text
    for out in (html, text):
        assert "450 test triples" in out and "3 shards" in out and "estimator tracin" in out
        assert "shards 2 failed, leaving 12 candidates unscored" in out
        assert "the first 200 test triples are listed, all of them in results.jsonl" in out

    attributions = make_result("attributions", attribution_result(n=100, total=1000), "attributions")
    assert attributions.total("samples") == 1000 and len(attributions["samples"]) == 100
    html, text = attributions._repr_html_(), attributions.text()
    assert "showing 50 of 1000 samples; all of them are in <code>samples.jsonl</code>" in html
    assert "... showing 50 of 1000 samples; all of them are in samples.jsonl" in text

    from tests.analysis_pages import self_ranking_result

    ranking = make_result("influence", self_ranking_result(1592, top_k=5), "tracin")
    assert ranking.total("ranking") == 1592
    assert "showing 5 of 1592 ranked triples; all of them are in self_influence.jsonl" in ranking.text()


def test_an_unvalidated_result_is_a_plain_result_shown_as_json() -> None:
    import json

    from explainq_client.results import Result, make_result

    old = {"model": "kg", "mode": "test", "results": {"artifact": "results.jsonl", "count": 450},
           "n_candidates_scored": 9, "note": "<old>"}
    result = make_result("influence", old, "tracin", "unvalidated")
    assert type(result) is Result and result.validated is False and result.schema == "unvalidated"
    assert isinstance(result, dict) and result == old  # kept as stored
    assert json.loads(result.text()) == old
    html = result._repr_html_()
    assert "written by an earlier version of the server" in html and "&quot;count&quot;: 450" in html
    assert "&lt;old&gt;" in html and "<old>" not in html
    assert make_result("influence", _sharded_influence(), "tracin", "InfluenceResult").validated


def _kinds_with_results() -> list:
    from core.contract.kind import load_kinds

    return sorted((k for k in load_kinds().values() if k.result is not None and not k.internal),
                  key=lambda k: k.name)


@pytest.mark.parametrize("kind", _kinds_with_results(), ids=lambda k: k.name)
@pytest.mark.parametrize("split", ["whole", "sharded"])
def test_every_kinds_result_renders_as_html_and_table_whole_or_sharded(kind, split, monkeypatch, capsys) -> None:
    """Each public kind's result model (an example with every field filled) through its renderer's class: HTML,
    text, and ``explainq-client result <id> --table`` over a scripted server, the renderer from ``GET /kinds``."""
    import json

    import httpx
    from explainq_client import Client, cli
    from explainq_client.results import RESULT_TYPES, Result, make_result

    from tests.result_examples import as_run, example

    data = as_run(example(kind.result), kind.result, split == "sharded")
    result = make_result(kind.renderer, data, kind.name, kind.result.__name__)
    assert type(result) is RESULT_TYPES.get(kind.renderer or "", Result) and result.validated
    assert result._repr_html_().startswith("<div>")
    text = result.text()
    if kind.renderer is None:
        assert json.loads(text) == data
    else:
        assert text.strip() and not text.lstrip().startswith("{")
    for name, entry in (data.get("listed") or {}).items():
        assert result.total(name) == entry["total"]
        if entry["total"] > len(data.get(name) or []):
            assert f"{entry['artifact']}: explainq-client entries <job id> {name}" in text, name

    view = {"id": "j1", "kind": kind.name, "status": "succeeded"}
    kinds = {"kinds": [{"name": kind.name, "route": kind.route, "queue": kind.queue, "renderer": kind.renderer,
                        "result": kind.result.__name__}]}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/kinds":
            return httpx.Response(200, json=kinds)
        if request.url.path == "/jobs/j1/result":
            return httpx.Response(200, json=data, headers={"X-Explainq-Result-Schema": kind.result.__name__})
        return httpx.Response(200, json=view)

    monkeypatch.setattr(cli, "Client", lambda *a, **k: Client("http://x", transport=httpx.MockTransport(handler)))
    assert cli.run(["result", "j1", "--table"]) == cli.EXIT_OK
    printed = capsys.readouterr()
    assert printed.out == text + "\n" and printed.err == ""
