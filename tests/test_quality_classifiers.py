"""The classifier evaluation (models/export/evaluation.py) and benchmarks/quality_classifiers.py: the subset model
is the recipe from the given initial weights on its subset, the margins are the estimators' output, the label
flips, the paired difference and the AUC interval; the benchmark's quick run end to end (slow)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from models.export import evaluation as ef
from models.export.demo import DIGITS_LABELS, digits_arrays, digits_program
from models.export.train import Split
from models.kg import evaluation as ev
from models.training import TrainOptions

SPEC = {"input": {"kind": "image", "mean": [0.3]}, "labels": DIGITS_LABELS}


def _small(n: int = 48):
    a = digits_arrays()
    return (Split(torch.tensor(a["train"][0][:n]), torch.tensor(a["train"][1][:n])),
            Split(torch.tensor(a["test"][0][:5]), torch.tensor(a["test"][1][:5])))


def test_a_subset_model_is_the_recipe_from_the_initial_weights_on_its_subset(tmp_path):
    torch.set_num_threads(1)
    init = digits_program(tmp_path / "init", seed=3, architecture="mlp") / "model.pt2"
    data, test = _small()
    opts = TrainOptions(epochs=1, batch_size=16, lr=0.05)
    sub = ef.train_subset(init, SPEC, data, opts, 0.5, seed=11, train_seed=5, test=test)
    assert sub["mask"].sum() == 24 and (sub["mask"] == ev.subset_mask(48, 0.5, 11)).all()
    keep = torch.from_numpy(np.flatnonzero(sub["mask"]))
    direct = ef.train_recipe(init, SPEC, Split(data.inputs[keep], data.labels[keep]), opts, 5)
    np.testing.assert_allclose(sub["outputs"], ef.margins(direct, test), rtol=0, atol=0)
    # the margin: log p / (1 - p) of the row's label
    p = torch.softmax(direct.logits(test.inputs).double(), 1)[torch.arange(5), test.labels].numpy()
    np.testing.assert_allclose(sub["outputs"], np.log(p / (1 - p)), rtol=1e-5)
    other = ef.train_subset(init, SPEC, data, opts, 0.5, seed=11, train_seed=6, test=test)
    assert not np.allclose(other["outputs"], sub["outputs"])  # another training seed, another model


def test_flip_labels_changes_a_seeded_fraction_to_other_classes():
    labels = torch.arange(200) % 10
    flipped, idx = ef.flip_labels(labels, 10, 0.1, seed=4)
    assert len(idx) == 20 and len(set(idx.tolist())) == 20
    changed = np.flatnonzero((flipped != labels).numpy())
    np.testing.assert_array_equal(changed, idx)
    assert int(flipped.min()) >= 0 and int(flipped.max()) <= 9
    again, idx2 = ef.flip_labels(labels, 10, 0.1, seed=4)
    assert torch.equal(again, flipped) and (idx2 == idx).all()
    with pytest.raises(ValueError, match="fraction"):
        ef.flip_labels(labels, 10, 0.0, seed=4)


def test_difference_interval_is_the_paired_mean_difference():
    rng = np.random.default_rng(0)
    a = rng.normal(0.3, 0.1, 60)
    b = a - 0.05 + rng.normal(0, 0.01, 60)
    a_none = [None, *a[1:]]
    d = ef.difference_interval(a_none, list(b), seed=1)
    assert d["n"] == 59 and math.isclose(d["difference"], float((a[1:] - b[1:]).mean()))
    assert d["low"] < d["difference"] < d["high"] and d["low"] > 0.04  # paired: tight around 0.05


def test_auc_interval_brackets_scikit_learns_auc():
    rng = np.random.default_rng(2)
    labels = np.zeros(300, dtype=bool)
    labels[:30] = True
    scores = rng.normal(size=300) + labels * 1.0
    out = ef.auc_interval(labels, scores, seed=0, n_resamples=400)
    assert math.isclose(out["auc"], roc_auc_score(labels, scores))
    assert out["low"] < out["auc"] < out["high"] and out["positives"] == 30


def test_the_quality_benchmark_has_the_classifier_section_by_default():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "quality.py"
    spec = importlib.util.spec_from_file_location("quality_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert "classifiers" in bench.SECTIONS
    ran = []

    def fake(name):
        return lambda args, datasets, work: ran.append((name, args.classifier_quick)) or []

    sections = dict(bench.SECTIONS)
    bench.SECTIONS.update({name: fake(name) for name in sections})
    try:
        bench.main([])                                   # every section by default, classifiers among them
        bench.main(["--sections", "classifiers", "--classifier-quick"])
    finally:
        bench.SECTIONS.update(sections)
    defaults = ["lds", "mislabel", "featurize", "faithfulness", "classifiers"]  # counterfactual only when asked
    assert ran == [*((name, False) for name in defaults), ("classifiers", True)]


@pytest.mark.slow
def test_the_classifier_quality_benchmark_runs_quick():
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "quality_classifiers.py"
    spec = importlib.util.spec_from_file_location("quality_classifiers", path)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up
    try:
        spec.loader.exec_module(bench)
    finally:
        del sys.modules[spec.name]
    out = bench.run(bench.parse(["--quick"]))
    names = {"explainq tracin", "dattri TracIn", "explainq trak", "dattri TRAK", "explainq ekfac",
             "dattri EK-FAC IF"}
    assert names <= set(out["lds"]) and any(n.startswith("explainq trak_ensemble") for n in out["lds"])
    for name, lds in out["lds"].items():
        assert lds["n"] == 12 and math.isfinite(lds["mean"]), (name, lds)
        assert lds["low"] <= lds["mean"] <= lds["high"]
    assert set(out["difference"]) == {"tracin", "trak", "ekfac", "trak_dense", "trak_former"}
    # the same exact TracIn in both libraries: the same LDS on every test example
    assert abs(out["difference"]["tracin"]["difference"]) < 1e-9
    assert set(out["mislabel"]) == names | {"explainq trak, dense projection"}
    assert all(0 <= a["auc"] <= 1 for a in out["mislabel"].values())
    text = "\n".join(out["lines"])
    for heading in ("Development grid", "Measurement", "explainq - dattri", "Best estimator", "noise ceiling",
                    "Mislabel detection", "context, not our measurement"):
        assert heading in text
    assert sum(line.endswith("chosen") for line in out["lines"]) == 6  # one setting chosen per tuned estimator
