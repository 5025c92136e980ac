"""MIND's per-impression metrics (``models.news.train.impression_metrics``) against values computed by hand and
against the formulas of MIND's own scoring script (``evaluate.py`` of the MIND competition)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from models.news.train import impression_metrics


def test_a_ranking_with_its_clicks_second_and_fifth() -> None:
    # scores rank the candidates 0, 1, 2, 4, 3: the clicks (1 and 3) come 2nd and 5th
    m = impression_metrics(np.array([0, 1, 0, 1, 0]), np.array([0.9, 0.8, 0.7, 0.1, 0.5]))
    assert m["mrr"] == pytest.approx(0.35, rel=1e-12)  # (1/2 + 1/5) / 2
    dcg = 1 / math.log2(3) + 1 / math.log2(6)  # gains 2^1 - 1 at ranks 2 and 5
    ideal = 1 / math.log2(2) + 1 / math.log2(3)  # both clicks first
    assert dcg / ideal == pytest.approx(0.6240505, abs=1e-7)
    assert m["ndcg@5"] == pytest.approx(dcg / ideal, rel=1e-12)
    assert m["ndcg@10"] == m["ndcg@5"]  # five candidates: the cut-off changes nothing
    assert m["auc"] == pytest.approx(2 / 6)  # of the 2 x 3 (click, non-click) pairs, 0.8 beats 0.7 and 0.5


def test_the_cut_offs_count_only_the_top_k() -> None:
    # twelve candidates ranked by descending score; the clicks come 7th and 11th
    labels = np.zeros(12, dtype=int)
    labels[[6, 10]] = 1
    scores = np.arange(12, 0, -1, dtype=float)
    m = impression_metrics(labels, scores)
    assert m["mrr"] == pytest.approx((1 / 7 + 1 / 11) / 2)
    assert m["ndcg@5"] == 0.0  # no click in the top five
    assert m["ndcg@10"] == pytest.approx((1 / math.log2(8)) / (1 + 1 / math.log2(3)))  # only rank 7 is in the top 10
    assert m["auc"] == pytest.approx((4 + 1) / 20)  # rank 7 beats ranks 8, 9, 10, 12; rank 11 beats 12; 2 x 10 pairs


def test_a_perfect_ranking() -> None:
    m = impression_metrics(np.array([0, 0, 1, 1]), np.array([0.1, 0.2, 0.9, 0.8]))
    assert m == {"auc": 1.0, "mrr": pytest.approx((1 + 1 / 2) / 2), "ndcg@5": pytest.approx(1.0),
                 "ndcg@10": pytest.approx(1.0)}


# MIND's evaluate.py (https://msnews.github.io, the competition's scoring script), as published:
def _mind_dcg_score(y_true, y_score, k=10):
    order = np.argsort(y_score)[::-1]
    y_true = np.take(y_true, order[:k])
    gains = 2 ** y_true - 1
    discounts = np.log2(np.arange(len(y_true)) + 2)
    return np.sum(gains / discounts)


def _mind_ndcg_score(y_true, y_score, k=10):
    best = _mind_dcg_score(y_true, y_true, k)
    actual = _mind_dcg_score(y_true, y_score, k)
    return actual / best


def _mind_mrr_score(y_true, y_score):
    order = np.argsort(y_score)[::-1]
    y_true = np.take(y_true, order)
    rr_score = y_true / (np.arange(len(y_true)) + 1)
    return np.sum(rr_score) / np.sum(y_true)


def test_equals_minds_evaluate_py_on_random_impressions() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 40))
        labels = (rng.random(n) < 0.2).astype(int)
        labels[rng.integers(n)] = 1
        if labels.all():
            labels[0] = 0
        scores = rng.normal(size=n)
        m = impression_metrics(labels, scores)
        assert m["mrr"] == pytest.approx(_mind_mrr_score(labels, scores), rel=1e-12)
        assert m["ndcg@5"] == pytest.approx(_mind_ndcg_score(labels, scores, 5), rel=1e-12)
        assert m["ndcg@10"] == pytest.approx(_mind_ndcg_score(labels, scores, 10), rel=1e-12)
