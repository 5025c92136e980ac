"""The evaluation's honesty about its own power: the "underpowered" warning of an LDS run whose ratio to TracIn
has too wide an interval, and the stratified bootstrap interval of mislabel AUC (checked against a plain loop
over the same resamples, seeded), shown by the evaluation page and the SDK."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from models.kg.evaluation import UNDERPOWERED_RATIO_WIDTH, auc_interval, roc_auc, underpowered


def _ratio(ratio, low, high, n=8):
    return {"ratio_to_tracin": {"ratio": ratio, "low": low, "high": high, "n": n, "confidence": 0.95,
                                "n_resamples": 2000, "seed": 0}}


def test_a_ratio_interval_wider_than_the_stated_width_is_called_underpowered() -> None:
    report = {"tracin": {}, "random": _ratio(0.84, -16.5, 18.2), "trak": _ratio(1.1, 0.9, 1.3),
              "graddot": _ratio(0.5, None, None)}
    warnings = underpowered(report)
    assert len(warnings) == 2 and UNDERPOWERED_RATIO_WIDTH == 1.0
    assert warnings[0].startswith("underpowered: random's LDS is 0.84 times TracIn's over 8 test triples")
    assert "[-16.5, 18.2], 34.7 wide (more than 1)" in warnings[0] and "n_test" in warnings[0]
    assert "graddot" in warnings[1] and "no finite interval" in warnings[1]
    assert underpowered(report, width=100.0) == [warnings[1]]


def _reference_interval(labels, scores, seed, n_resamples, confidence=0.95):
    """The same stratified resamples (the same draws, in blocks of ``block``), each AUC by roc_auc (a rank sum):
    the plain reference."""
    pos, neg = np.flatnonzero(labels), np.flatnonzero(~labels)
    rng = np.random.default_rng([seed, 0xA0C])
    block = min(250, (1 << 22) // len(np.unique(scores)))
    aucs = []
    for start in range(0, n_resamples, block):
        r = min(block, n_resamples - start)
        chosen = np.concatenate([rng.choice(pos, size=(r, len(pos))), rng.choice(neg, size=(r, len(neg)))], 1)
        aucs += [roc_auc(np.r_[np.ones(len(pos), bool), np.zeros(len(neg), bool)], scores[row]) for row in chosen]
    return np.quantile(aucs, [(1 - confidence) / 2, 1 - (1 - confidence) / 2])


def test_the_auc_interval_is_the_plain_loops_and_reproducible_by_seed() -> None:
    rng = np.random.default_rng(3)
    labels = np.zeros(300, bool)
    labels[rng.choice(300, 20, replace=False)] = True
    scores = np.round(rng.normal(size=300) + labels * 0.8, 1)  # ties
    got = auc_interval(labels, scores, seed=7, n_resamples=600)
    want = _reference_interval(labels, scores, 7, 600)
    assert (got["low"], got["high"]) == pytest.approx(tuple(want), abs=1e-12)
    auc = roc_auc(labels, scores)
    assert got["low"] < auc < got["high"] and got["n"] == 300
    assert auc_interval(labels, scores, seed=7, n_resamples=600) == got
    assert auc_interval(labels, scores, seed=8, n_resamples=600) != got
    # its width is what the binomial-like spread of an AUC with 20 positives suggests (Hanley & McNeil 1982)
    q1, q2 = auc / (2 - auc), 2 * auc ** 2 / (1 + auc)
    se = np.sqrt((auc * (1 - auc) + 19 * (q1 - auc ** 2) + 279 * (q2 - auc ** 2)) / (20 * 280))
    assert 0.6 < (got["high"] - got["low"]) / (2 * stats.norm.ppf(0.975) * se) < 1.5
    perfect = auc_interval(labels, labels.astype(float), seed=0, n_resamples=200)
    assert perfect["low"] == perfect["high"] == 1.0


def _mislabel_result() -> dict:
    from core.contract.results.evaluation import MislabelResult
    from tests.result_examples import example

    result = example(MislabelResult)
    for r in result["estimators"].values():
        r["auc"] = 0.71
        r["auc_interval"] = {"low": 0.64, "high": 0.78, "n": 1592, "confidence": 0.95, "n_resamples": 2000,
                             "seed": 0}
    return MislabelResult.model_validate(result).model_dump(mode="json")


def _lds_result() -> dict:
    from core.contract.results.evaluation import LdsResult
    from tests.result_examples import example

    result = example(LdsResult)
    result["underpowered_width"] = UNDERPOWERED_RATIO_WIDTH
    result["warnings"] = underpowered({"random": _ratio(0.84, -16.5, 18.2)})
    return LdsResult.model_validate(result).model_dump(mode="json")


def test_the_page_and_the_sdk_show_the_warning_and_the_auc_interval() -> None:
    from explainq_client import EvaluationResult

    from tests.analysis_pages import job_page

    lds = _lds_result()
    page = job_page(lds, kind="evaluate_attribution")
    assert 'class="warn-box underpowered"' in page and "34.7 wide" in page and "wider than 1" in page
    assert "34.7 wide" in EvaluationResult(lds, "evaluate_attribution").text()
    assert "34.7 wide" in EvaluationResult(lds, "evaluate_attribution")._repr_html_()
    mis = _mislabel_result()
    page = job_page(mis, kind="evaluate_mislabel")
    assert "[0.64, 0.78]" in page and "95% interval" in page
    assert "[0.64, 0.78]" in EvaluationResult(mis, "evaluate_mislabel").text()
