"""The classifier evaluations' results where people read them: the dashboard's job page (renderer
``classifier_evaluation``, the ConvE evaluation card's pieces) and the SDK's result class, from results that the
kinds' own result models validate."""

from __future__ import annotations

import re

from core.contract.results.classifier_evaluation import ClassifierLdsResult, ClassifierMislabelResult
from tests.analysis_pages import job_page

RECIPE = {"epochs": 3, "batch_size": 16, "optimizer": "adamw", "lr": 0.0007, "momentum": 0.0, "weight_decay": 0.01,
          "checkpoint_every": 1, "max_length": 48, "seed": 5}
MODEL = {"key": "clf-full-1a2b", "seed": 812, "accuracy": {"train": 0.981, "test": 0.874},
         "checkpoints": [{"epoch": 1, "lr": 0.0007}, {"epoch": 3, "lr": 0.0007}]}


def _interval(n: int, **values: float | None) -> dict:
    return {"n": n, "confidence": 0.95, "n_resamples": 2000, "seed": 7, **values}


def _common(metric: str) -> dict:
    return {"metric": metric, "model": "bert-<i>sst</i>", "model_version": "mv1", "dataset": "<script>x</script>",
            "data_version": "dv1", "recipe": RECIPE, "seed": 7, "n_train": 1200, "trainings": 9, "artifacts": []}


def lds_result() -> dict:
    est = {
        "tracin": {"seconds": 41.25, "lds": _interval(40, mean=0.1834, low=0.1207, high=0.2461),
                   "per_test": [0.2] * 38 + [None, None], "n_undefined": 2, "ratio_to_tracin": None,
                   "output": "margin"},
        "trak": {"seconds": 12.5, "lds": _interval(40, mean=0.2411, low=0.1752, high=0.3069),
                 "per_test": [0.25] * 40, "n_undefined": 0,
                 "ratio_to_tracin": _interval(38, ratio=1.3146, low=1.0412, high=1.7733), "output": "margin"},
        "random": {"seconds": 0.01, "lds": _interval(40, mean=-0.0123, low=-0.0731, high=0.0502),
                   "per_test": [0.0] * 40, "n_undefined": 0,
                   "ratio_to_tracin": _interval(38, ratio=-0.1671, low=-0.4188, high=0.2855), "output": None},
    }
    data = {**_common("lds"), "m": 8, "alpha": 0.5, "design": 1, "seeds": list(range(8)),
            "train_seeds": list(range(100, 108)), "replicate_seeds": list(range(200, 208)), "subset_size": 600,
            "n_test": 40, "test_index": list(range(40)), "output": "margin",
            "ground_truth": {"key": "clf-gt", "full_model": "clf-full-1a2b", "trainings": 9, "reused": 8},
            "noise_ceiling": {"agreement": _interval(40, mean=0.6412, low=0.6019, high=0.6843), "ceiling": 0.7977,
                              "per_test": [0.64] * 40},
            "ensemble": {"members": 0, "seeds": [], "models": []}, "full_model": MODEL, "estimators": est,
            "warnings": ["underpowered: random's LDS is -0.167 times TracIn's over 38 test triples, its 95% "
                         "interval [-0.419, 0.286] is 0.704 wide"]}
    return ClassifierLdsResult.model_validate(data).model_dump(mode="json")


def mislabel_result(n_flipped: int = 6) -> dict:
    flipped = [3 + 17 * i for i in range(n_flipped)]

    def est(auc: float, low: float, high: float, f10: float, f20: float, seconds: float) -> dict:
        return {"seconds": seconds, "auc_interval": {**_interval(1200, low=low, high=high), "auc": auc,
                                                     "positives": n_flipped},
                "found_at_10": f10, "found_at_20": f20,
                "recall_curve": {"inspected": [0.0, 0.1, 0.2, 1.0], "found": [0.0, f10, f20, 1.0]}}

    data = {**_common("mislabel"), "trainings": 1, "fraction": 0.05, "n_flipped": n_flipped, "flipped": flipped,
            "mislabel_model": {**MODEL, "key": "clf-mislabel-9f"},
            "estimators": {"tracin": est(0.8731, 0.8412, 0.9017, 0.4167, 0.6667, 30.5),
                           "gradcos": est(0.7214, 0.6803, 0.7598, 0.25, 0.5, 4.75)}}
    return ClassifierMislabelResult.model_validate(data).model_dump(mode="json")


def _card(page: str) -> str:
    card = re.search(r'<section class="card" id="classifier-evaluation">(.*?)</section>', page, re.S)
    assert card is not None, page[-2000:]
    return card.group(1)


def _rows(html: str, table: str) -> dict[str, list[str]]:
    body = re.search(rf'<table class="compact {table}">.*?<tbody>(.*?)</tbody>', html, re.S).group(1)
    return {th: re.findall(r"<td>(.*?)</td>", tds)
            for th, tds in re.findall(r'<tr><th scope="row">(.*?)</th>(.*?)</tr>', body, re.S)}


def _settings(html: str) -> dict[str, dict[str, str]]:
    """Each settings table by its caption: its rows as {name: value}."""
    return {caption: dict(re.findall(r'<tr><th scope="row">(.*?)</th><td>(.*?)</td></tr>', body))
            for caption, body in re.findall(r'<table class="compact evaluation-settings"><caption>(.*?)</caption>'
                                            r'(.*?)</table>', html, re.S)}


def test_the_lds_page_draws_every_estimators_numbers_the_ceiling_and_the_settings_as_text() -> None:
    page = job_page(lds_result(), kind="evaluate_classifier_attribution")
    card = _card(page)
    assert "<h2>Result</h2>" not in page and "Linear datamodeling score" in card
    assert "<script>x</script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in card
    assert "<i>sst</i>" not in page and "bert-&lt;i&gt;sst&lt;/i&gt;" in card
    assert "8 subset models of 600 / 1200 training examples (α 0.5), 40 test examples" in card
    rows = _rows(card, "evaluation")
    assert list(rows) == ["tracin", "trak", "random"]
    # LDS mean, its interval, test examples, undefined, seconds, the ratio to TracIn with its interval
    assert rows["tracin"] == ["0.183", "[0.121, 0.246]", "40", "2", "41.25", "–"]
    assert rows["trak"] == ["0.241", "[0.175, 0.307]", "40", "0", "12.5", "1.31 [1.04, 1.77]"]
    assert rows["random"] == ["-0.012", "[-0.073, 0.05]", "40", "0", "0.01", "-0.17 [-0.42, 0.29]"]
    assert "<title>trak: 0.2411 [0.1752, 0.3069]</title>" in card  # the bar's accessible title
    assert "0.641 [0.602, 0.684]" in card and "above about 0.798" in card and "per test example" in card
    assert 'class="warn-box underpowered"' in card and "0.704 wide" in card
    settings = _settings(card)
    assert list(settings) == ["Subsets", "Recipe (every model)"]
    assert settings["Subsets"] == {
        "subset models (m)": "8", "α": "0.5", "subset size": "600", "training examples": "1200",
        "test examples": "40", "seed": "7", "design": "1", "replicates": "yes", "ensemble members": "0",
        "models trained": "9"}
    assert settings["Recipe (every model)"] == {
        "epochs": "3", "batch_size": "16", "optimizer": "adamw", "lr": "0.0007", "momentum": "0",
        "weight_decay": "0.01", "checkpoint_every": "1", "max_length": "48", "seed": "5"}
    assert "clf-full-1a2b" in card and "training seed 812" in card and "test 0.874" in card
    assert "8 reused" in card


def test_the_mislabel_page_draws_the_auc_intervals_the_flips_and_the_recall_curves() -> None:
    page = job_page(mislabel_result(), kind="evaluate_classifier_mislabel")
    card = _card(page)
    assert "Mislabel detection" in card and "6 of 1200 training labels flipped (fraction 0.05, seed 7)" in card
    rows = _rows(card, "evaluation")
    # the AUC (kept in the classifier result's auc_interval), its interval, found after 10 % and 20 %, seconds
    assert rows == {"tracin": ["0.873", "[0.841, 0.902]", "0.417", "0.667", "30.5"],
                    "gradcos": ["0.721", "[0.68, 0.76]", "0.25", "0.5", "4.75"]}
    assert card.count("<polyline") == 2 and "flipped examples found" in card
    settings = _settings(card)
    assert settings["Flips"] == {"fraction flipped": "0.05", "labels flipped": "6", "training examples": "1200",
                                 "seed": "7", "models trained": "1"}
    assert settings["Recipe"]["optimizer"] == "adamw" and settings["Recipe"]["lr"] == "0.0007"
    assert "clf-mislabel-9f" in card
    flipped = re.search(r'<p class="mono flipped-list">(.*?)</p>', card, re.S).group(1)
    assert flipped.split() == ["3", "20", "37", "54", "71", "88"]


def test_a_long_flip_list_shows_its_first_entries_and_says_how_many_more() -> None:
    from app.ui.evaluation import FLIPPED_SHOWN

    card = _card(job_page(mislabel_result(FLIPPED_SHOWN + 25), kind="evaluate_classifier_mislabel"))
    shown = re.search(r'<p class="mono flipped-list">([\d ]+)', card).group(1).split()
    assert len(shown) == FLIPPED_SHOWN and shown[-1] == str(3 + 17 * (FLIPPED_SHOWN - 1))
    assert "and 25 more" in card and f"the first {FLIPPED_SHOWN}" in card


def test_the_kinds_name_the_classifier_evaluation_renderer_and_its_model() -> None:
    from app.ui.router import RENDERERS
    from core.contract.kind import load_kinds
    from core.contract.results import BY_RENDERER
    from core.contract.results.classifier_evaluation import ClassifierEvaluationResult

    kinds = load_kinds()
    for name in ("evaluate_classifier_attribution", "evaluate_classifier_mislabel"):
        assert kinds[name].renderer == "classifier_evaluation" and kinds[name].describe()["renderer"] == \
            "classifier_evaluation"
    assert BY_RENDERER["classifier_evaluation"] is ClassifierEvaluationResult
    assert RENDERERS["classifier_evaluation"].template == "_classifier_evaluation.html"


def test_the_sdk_draws_the_classifier_evaluations_as_tables_and_charts() -> None:
    from explainq_client import EvaluationResult
    from explainq_client.results import make_result

    lds = make_result("classifier_evaluation", lds_result(), "evaluate_classifier_attribution",
                      "ClassifierLdsResult")
    assert isinstance(lds, EvaluationResult)
    text = lds.text()
    lines = text.splitlines()
    assert lines[0].startswith("LDS of bert-<i>sst</i> on <script>x</script>: 8 subset models at alpha 0.5 "
                               "(600 of 1200 training examples each), 40 test examples")
    table = [line.split() for line in lines if line.split()[:1] in (["tracin"], ["trak"], ["random"])]
    assert table[0][:4] == ["tracin", "0.183", "[0.121,", "0.246]"] and "examples" in text
    assert table[1][-3:] == ["1.3", "[1,", "1.8]"]
    assert "no LDS can be expected above about 0.798" in text
    assert "recipe: epochs 3, batch_size 16, optimizer adamw, lr 0.0007" in text
    html = lds._repr_html_()
    assert "<svg" in html and "<script>" not in html and "&lt;script&gt;" in html and "<i>sst" not in html
    assert "0.183" in html and "optimizer adamw" in html
    assert [r["estimator"] for r in lds.rows()] == ["tracin", "trak", "random"]
    assert lds.rows()[1]["ratio_to_tracin_ratio"] == 1.3146

    mis = make_result("classifier_evaluation", mislabel_result(), "evaluate_classifier_mislabel",
                      "ClassifierMislabelResult")
    text = mis.text()
    assert text.splitlines()[0] == ("mislabel detection of bert-<i>sst</i> on <script>x</script>: 6 of 1200 "
                                    "training labels flipped (fraction 0.05)")
    assert [line.split() for line in text.splitlines() if line.startswith("tracin ")] == [
        ["tracin", "0.873", "[0.841,", "0.902]", "0.417", "0.667", "30.5"]]
    html = mis._repr_html_()
    assert "polyline" in html and "flipped examples found" in html and "[0.841, 0.902]" in html
    assert mis.rows()[0]["auc_interval_auc"] == 0.8731 and mis.suspects() == []
