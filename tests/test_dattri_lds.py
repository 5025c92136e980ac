"""explainq's LDS (``models.kg.evaluation.lds_per_test``, which the classifier evaluations share) equals dattri's
own ``dattri.metric.lds`` on the same score and ground-truth matrices (dattri is a dev dependency: these tests
fail, not skip, without it)."""

from __future__ import annotations

import numpy as np
import torch

from models.kg import evaluation as ev


def _dattri(masks: np.ndarray, outputs: np.ndarray, scores: np.ndarray) -> np.ndarray:
    from dattri.metric import lds

    indices = torch.from_numpy(np.stack([np.flatnonzero(m) for m in masks]))  # [M, subset size]
    corr, _ = lds(torch.from_numpy(scores).T.contiguous(), (torch.from_numpy(outputs), indices))
    return corr.numpy()


def _case(seed: int, n_subsets: int = 30, n_train: int = 80, n_test: int = 12, ties: bool = False):
    rng = np.random.default_rng(seed)
    masks = np.stack([ev.subset_mask(n_train, 0.5, int(s)) for s in rng.integers(0, 2**31, n_subsets)])
    scores = rng.normal(size=(n_test, n_train))
    # ground truth partly explained by the scores, as a real attribution's would be
    outputs = ev.predicted_outputs(masks, scores) + rng.normal(scale=3.0, size=(n_subsets, n_test))
    if ties:
        outputs = np.round(outputs)          # tied outputs
        scores = np.round(scores * 2) / 2    # tied scores
    return masks, outputs, scores


def test_lds_equals_dattris_metric():
    masks, outputs, scores = _case(0)
    ours = ev.lds_per_test(masks, outputs, scores)
    theirs = _dattri(masks, outputs, scores)
    assert np.isfinite(ours).all() and np.ptp(ours) > 0.1
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-12)


def test_lds_equals_dattris_metric_with_ties_and_a_constant_column():
    masks, outputs, scores = _case(1, ties=True)
    outputs[:, 3] = 7.0  # a test example whose subset models all agree: undefined for both
    ours = ev.lds_per_test(masks, outputs, scores)
    theirs = _dattri(masks, outputs, scores)
    assert np.isnan(ours[3]) and np.isnan(theirs[3])
    np.testing.assert_allclose(np.delete(ours, 3), np.delete(theirs, 3), rtol=0, atol=1e-12)
