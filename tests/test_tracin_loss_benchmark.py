"""benchmarks/tracin_loss.py's helpers (the benchmark itself is run by hand: see docs/tracin.md)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.tracin_loss import recipe, sign_shares, table


def test_sign_shares_counts_negatives_and_rows_with_opponents():
    scores = np.array([[0.5, -0.1, 0.2, 0.0], [0.3, 0.4, 0.1, 0.2]])
    out = sign_shares(scores, top_k=10)
    assert out["negative"] == pytest.approx(1 / 8)
    assert out["positive"] == pytest.approx(6 / 8)  # a zero is neither
    assert out["with_opponents"] == pytest.approx(0.5)
    assert sign_shares(scores, top_k=0)["with_opponents"] == 0.0  # nothing listed, no opponents shown
    with pytest.raises(ValueError, match="non-empty"):
        sign_shares(np.zeros((0, 3)), top_k=10)


def test_recipe_and_table():
    cfg = recipe(10, 100, 0)
    assert (cfg.epochs, cfg.batch_size, cfg.lr, cfg.embedding_dim, cfg.checkpoint_every, cfg.seed) \
        == (10, 128, 0.01, 100, 2, 0)
    lines = table([{"dataset": "nations", "loss": "train", "negative": 0.0, "with_opponents": 0.0, "auc": 0.5,
                    "low": 0.45, "high": 0.55, "seconds": 12.3}])
    assert lines[0].split()[:2] == ["graph", "loss"]
    assert "0.500 [0.450, 0.550]" in lines[1]
