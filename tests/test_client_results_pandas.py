"""``to_pandas()`` on every SDK result class: one row per ranked item (TracIn), per epoch or curve point
(training), per estimator (evaluations), per cell (ablations), with the columns their docstrings name."""

from __future__ import annotations

import pandas as pd
import pytest
from explainq_client.results import (
    SELF_INFLUENCE_COLUMNS,
    TRACIN_COLUMNS,
    AblationResult,
    EvaluationResult,
    TracInResult,
    TrainingResult,
)

from core.contract.results.ablation import AblationResult as AblationModel
from core.contract.results.evaluation import LdsResult, MislabelResult
from tests.result_examples import example


def _pair(triple, influence, is_test=False):
    return {"train_triple": triple, "influence": influence, "train_self_influence": 0.5, "is_test_triple": is_test}


QUERY = {
    "mode": "test",
    "results": [
        {"test_triple": ["usa", "embassy", "uk"], "self_influence": 1.0, "n_candidates": 9,
         "proponents": [_pair(["uk", "embassy", "usa"], 0.3, True), _pair(["usa", "treaties", "uk"], 0.2)],
         "opponents": [_pair(["usa", "war", "uk"], -0.1)]},
        {"test_triple": ["uk", "ngo", "usa"], "self_influence": 2.0, "n_candidates": 9,
         "proponents": [_pair(["uk", "ngo", "india"], 0.05)], "opponents": []},
    ],
}


def test_a_tracin_query_is_one_row_per_ranked_training_triple():
    frame = TracInResult(QUERY, "tracin").to_pandas()
    assert list(frame.columns) == TRACIN_COLUMNS and len(frame) == 4
    first = frame.iloc[0]
    assert (first.test_head, first.role, first["rank"], first.train_head, first.influence) == \
        ("usa", "proponent", 1, "uk", 0.3) and bool(first.is_test_triple)
    assert list(frame.role) == ["proponent", "proponent", "opponent", "proponent"]
    assert list(frame["rank"]) == [1, 2, 1, 1] and list(frame.test_relation) == ["embassy"] * 3 + ["ngo"]


def test_a_self_influence_ranking_is_one_row_per_entry_and_an_empty_result_keeps_its_columns():
    ranking = [{"train_triple": ["a", "r", "b"], "self_influence": 3.0},
               {"train_triple": ["c", "r", "d"], "self_influence": 1.0}]
    frame = TracInResult({"mode": "self", "ranking": ranking}).to_pandas()
    assert list(frame.columns) == SELF_INFLUENCE_COLUMNS
    assert list(frame["rank"]) == [1, 2] and list(frame.train_tail) == ["b", "d"]
    assert list(TracInResult({"mode": "test", "results": []}).to_pandas().columns) == TRACIN_COLUMNS


def test_a_training_result_is_one_row_per_epoch_or_curve_point():
    history = [{"epoch": 1, "loss": 2.0, "valid": {"mrr": 0.1, "hits@10": 0.3}},
               {"epoch": 2, "loss": 1.5, "valid": {"mrr": 0.2, "hits@10": 0.4}, "lr": 0.01}]
    steps = [{"step": 10, "epoch": 0.5, "loss": 2.2}, {"step": 20, "epoch": 1.0, "loss": 2.0}]
    result = TrainingResult({"history": history, "steps": steps}, "train_conve")
    frame = result.to_pandas()
    assert list(frame.columns) == ["epoch", "loss", "valid_mrr", "valid_hits@10", "lr"]
    assert list(frame.epoch) == [1, 2] and list(frame.valid_mrr) == [0.1, 0.2] and pd.isna(frame.lr[0])
    curve = result.to_pandas(of="steps")
    assert list(curve.columns) == ["step", "epoch", "loss"] and list(curve.step) == [10, 20]
    assert list(TrainingResult({}).to_pandas(of="steps").columns) == ["step", "epoch", "loss"]
    with pytest.raises(ValueError, match="history"):
        result.to_pandas(of="epochs")


def test_an_lds_evaluation_is_one_row_per_estimator():
    data = example(LdsResult)
    frame = EvaluationResult(data, "evaluate_attribution").to_pandas()
    assert list(frame.estimator) == list(data["estimators"])
    assert {"estimator", "lds_mean", "lds_low", "lds_high", "n_undefined", "seconds"} <= set(frame.columns)
    assert "per_test" not in frame.columns
    name = frame.estimator[0]
    assert frame.lds_mean[0] == data["estimators"][name]["lds"]["mean"]


def test_a_mislabel_evaluation_is_one_row_per_estimator():
    data = example(MislabelResult)
    frame = EvaluationResult(data, "evaluate_mislabel").to_pandas()
    assert {"estimator", "auc", "found_at_10", "found_at_20", "seconds"} <= set(frame.columns)
    assert "recall_curve_inspected" not in frame.columns and len(frame) == len(data["estimators"])


def test_a_mislabel_evaluation_lists_its_suspects_one_row_per_estimator_and_triple():
    import pandas as pd
    from explainq_client.results import SUSPECT_COLUMNS

    data = example(MislabelResult)
    name = next(iter(data["estimators"]))
    two = [{"rank": 1, "train_index": 7, "triple": ["a", "r", "=x"], "self_influence": 0.25, "corrupted": True,
            "original_tail": "b"},
           {"rank": 2, "train_index": 3, "triple": ["c", "r", "d"], "self_influence": -0.5, "corrupted": False,
            "original_tail": None}]
    data["estimators"][name]["suspects"] = two
    result = EvaluationResult(data, "evaluate_mislabel")
    assert result.suspects() == [{"estimator": name, "rank": 1, "train_index": 7, "head": "a", "relation": "r",
                                  "tail": "=x", "self_influence": 0.25, "corrupted": True, "original_tail": "b"},
                                 {"estimator": name, "rank": 2, "train_index": 3, "head": "c", "relation": "r",
                                  "tail": "d", "self_influence": -0.5, "corrupted": False, "original_tail": None}]
    assert result.suspects("another") == []
    frame = result.to_pandas(of="suspects")
    assert list(frame.columns) == SUSPECT_COLUMNS and list(frame.train_index) == [7, 3]
    assert list(frame.corrupted) == [True, False] and pd.isna(frame.original_tail[1])
    assert "suspects" not in result.to_pandas().columns  # the per-estimator table leaves the list out
    lds = EvaluationResult(example(LdsResult), "evaluate_attribution")
    assert lds.suspects() == [] and list(lds.to_pandas(of="suspects").columns) == SUSPECT_COLUMNS
    # the notebook and terminal views show the top of each list, names escaped in HTML
    data["estimators"][name]["suspects"][0]["triple"] = ["<b>a</b>", "r", "=x"]
    shown = EvaluationResult(data, "evaluate_mislabel")
    assert "&lt;b&gt;a&lt;/b&gt; · r · =x" in shown._repr_html_() and "<b>a</b>" not in shown._repr_html_()
    lines = shown.text().splitlines()
    at = lines.index(f"{name}: its top suspects")
    assert lines[at + 1].split() == ["rank", "training", "triple", "self-influence", "corrupted"]
    assert lines[at + 2].split() == ["1", "<b>a</b>", "·", "r", "·", "=x", "0.25", "yes", "(was", "b)"]
    assert "its top suspects" not in lds.text() and "its top suspects" not in lds._repr_html_()
    with pytest.raises(ValueError, match="suspects"):
        result.to_pandas(of="ranking")


def test_an_ablation_is_one_row_per_cell():
    data = example(AblationModel)
    frame = AblationResult(data, "ablations").to_pandas()
    cells = [(ls, rep) for ls, reps in data["results"].items() for rep in reps]
    assert list(zip(frame.layer_set, frame.representation, strict=True)) == cells
    assert {"test_acc_mean", "test_acc_std"} <= set(frame.columns)
