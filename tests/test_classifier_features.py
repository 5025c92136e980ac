"""The feature store for classifiers (``models.explain.classifier_features``): featurizing stores each checkpoint's
projected gradients once (a repeat computes nothing, appended rows compute only themselves), and a query's tiled
streaming top-k over the stored rows equals the dense TRAK and projected TracIn of the same settings, Q weights
included; texts of any width give the same stored rows."""

from __future__ import annotations

import pytest
import torch

from core.filestore import Store
from models.export.demo import DIGITS_LABELS, digits_arrays, digits_program
from models.export.program import build, load
from models.export.train import Split, save_model, train
from models.training import TrainOptions

SPEC = {"input": {"kind": "image", "mean": [0.3]}, "labels": DIGITS_LABELS}
K = 32


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    from models.export.influence import ProgramModule, classifier, read_checkpoints, rows

    tmp = tmp_path_factory.mktemp("features")
    init = digits_program(tmp / "init")
    exported = build(init / "model.pt2", SPEC)
    a = digits_arrays()
    data = Split(torch.tensor(a["train"][0][:72]), torch.tensor(a["train"][1][:72]))
    save_model(tmp / "out", exported, train(exported, data, TrainOptions(epochs=2, batch_size=24, lr=0.05,
                                                                         checkpoint_every=1)))
    module = ProgramModule(load(tmp / "out"))
    clf = classifier(module, read_checkpoints(tmp / "out", module).states)
    test = rows(torch.tensor(a["test"][0][:3]), torch.tensor(a["test"][1][:3]))
    yield clf, test, rows(data.inputs, data.labels), tmp
    torch.set_num_threads(threads)


def _store(tmp, name):
    return Store(str(tmp / name / "store"), tmp / name / "cache")


def test_featurize_once_append_rows_and_query_equal_the_dense_estimators(digits, monkeypatch):
    from models.explain import classifier_estimators as table
    from models.explain import features
    from models.explain.classifier_features import (
        ClassifierFeatures,
        store_weights,
        stored_self_scores,
        stored_top_k,
    )
    from models.explain.features import FeatureIndex, NotFeaturized, featurize, full_sort_top_k

    clf, test, train_rows, tmp = digits
    store = _store(tmp, "append")
    head = ClassifierFeatures(clf, train_rows[:40])
    first = featurize(store, head, loss="margin", proj_dim=K, seed=3)
    assert first["rows_computed"] == 2 * 40
    store_weights(store, head, first)
    assert featurize(store, head, loss="margin", proj_dim=K, seed=3)["rows_computed"] == 0
    whole = ClassifierFeatures(clf, train_rows)
    with pytest.raises(NotFeaturized):
        FeatureIndex(store, whole, loss="margin", proj_dim=K, seed=3)
    appended = featurize(store, whole, loss="margin", proj_dim=K, seed=3)
    assert [c["reused"] for c in appended["checkpoints"]] == [40, 40] and appended["rows_computed"] == 2 * 32
    index = FeatureIndex(store, whole, loss="margin", proj_dim=K, seed=3)
    with pytest.raises(NotFeaturized, match="TRAK weights"):  # Q of the whole training set is not stored yet
        stored_top_k(store, index, test, "trak", 5, 0.05)
    store_weights(store, whole, appended)
    dense = table.trak_scores(clf, "all", test, train_rows, proj_dim=K, seed=3, damping=0.05).float()
    monkeypatch.setattr(features, "TILE_ROWS", 16)  # several tiles: the streaming merge is exercised
    top = stored_top_k(store, index, test, "trak", 5, 0.05)
    want = full_sort_top_k(dense, 5)
    assert torch.equal(top.pro_idx, want.pro_idx) and torch.equal(top.opp_idx, want.opp_idx)
    torch.testing.assert_close(top.pro_val, want.pro_val, rtol=1e-4, atol=1e-5 * float(dense.abs().max()))
    self_dense = table.trak_self_scores(clf, "all", train_rows, proj_dim=K, seed=3, damping=0.05).float()
    torch.testing.assert_close(stored_self_scores(store, index, "trak", 0.05), self_dense, rtol=1e-4,
                               atol=1e-5 * float(self_dense.abs().max()))


def test_trak_features_have_a_projection_per_checkpoint_in_their_key(digits):
    """TRAK's stored features: each checkpoint its own projection seed, in its feature key, so features stored
    with one shared projection (the former layout's key: the same settings without it) are not read as these, and
    each checkpoint's stored Q is its own."""
    from models.explain.classifier_features import ClassifierFeatures, load_weights, store_weights
    from models.explain.features import FeatureIndex, NotFeaturized, featurize, settings_for, weights_digest
    from models.explain.trak import checkpoint_seed

    clf, _test, train_rows, tmp = digits
    store = _store(tmp, "keys")

    class Shared(ClassifierFeatures):  # the former layout: one projection for every checkpoint
        def projection_seed(self, loss, seed, ckpt):
            return None

    old = featurize(store, Shared(clf, train_rows), loss="margin", proj_dim=K, seed=5)
    source = ClassifierFeatures(clf, train_rows)
    with pytest.raises(NotFeaturized):
        FeatureIndex(store, source, loss="margin", proj_dim=K, seed=5)
    new = featurize(store, source, loss="margin", proj_dim=K, seed=5)
    assert new["rows_computed"] == len(clf.checkpoints) * len(train_rows)
    fs = settings_for(source, "all", "margin", K, 5)
    keys = [c["key"] for c in new["checkpoints"]]
    assert keys == [fs.key(source.config, weights_digest(ck), checkpoint_seed(5, i))
                    for i, ck in enumerate(clf.checkpoints)]
    assert not set(keys) & {c["key"] for c in old["checkpoints"]}
    store_weights(store, source, new)
    index = FeatureIndex(store, source, loss="margin", proj_dim=K, seed=5)
    v0, v1 = index.views[0].rows(0, 4), index.views[1].rows(0, 4)
    proj = source.projector(fs.layers, "margin", K, checkpoint_seed(5, 1), "cpu", torch.float32, 64)
    proj.load(clf.checkpoints[1])
    torch.testing.assert_close(v1, proj.features(train_rows[:4]))
    proj.reseed(checkpoint_seed(5, 0))
    proj.load(clf.checkpoints[0])
    torch.testing.assert_close(v0, proj.features(train_rows[:4]))
    from models.explain.classifier_estimators import trak_weights

    want_q = sum(trak_weights(clf, train_rows, ck) for ck in clf.checkpoints) / len(clf.checkpoints)
    torch.testing.assert_close(load_weights(store, index), want_q, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(want_q, trak_weights(clf, train_rows), atol=1e-3)
    # projected TracIn's features keep one projection (and their key) for every checkpoint
    tr = featurize(store, source, loss="train", proj_dim=K, seed=5)
    fs_train = settings_for(source, "all", "train", K, 5)
    assert [c["key"] for c in tr["checkpoints"]] == [fs_train.key(source.config, weights_digest(ck))
                                                     for ck in clf.checkpoints]


def test_stored_projected_tracin_equals_the_dense_one(digits):
    from models.explain import classifier_estimators as table
    from models.explain.classifier_features import ClassifierFeatures, stored_self_scores, stored_top_k
    from models.explain.features import FeatureIndex, featurize, full_sort_top_k

    clf, test, train_rows, tmp = digits
    store = _store(tmp, "tracin")
    source = ClassifierFeatures(clf, train_rows)
    featurize(store, source, loss="train", proj_dim=K, seed=1)
    index = FeatureIndex(store, source, loss="train", proj_dim=K, seed=1)
    dense = table.tracin_projected_scores(clf, "all", test, train_rows, output="loss", proj_dim=K, seed=1).float()
    top = stored_top_k(store, index, test, "tracin_projected", 4)
    assert torch.equal(top.pro_idx, full_sort_top_k(dense, 4).pro_idx)
    want_self = table.tracin_projected_self_scores(clf, "all", train_rows, proj_dim=K, seed=1).float()
    torch.testing.assert_close(stored_self_scores(store, index, "tracin_projected"), want_self, rtol=1e-4,
                               atol=1e-6)


def test_another_architecture_with_the_same_weights_gets_other_keys(digits):
    """The key holds the program's graph: the same parameter names and values in another program are not
    served its features."""
    from dataclasses import replace

    from models.explain.classifier_features import ClassifierFeatures
    from models.explain.features import settings_for, weights_digest

    clf, _, train_rows, _ = digits
    other = replace(clf, config={**clf.config, "graph": "0" * 64})
    fs = settings_for(ClassifierFeatures(clf, train_rows), "all", "margin", K, 0)
    digest = weights_digest(clf.checkpoints[-1])
    assert fs.key({"family": "classifier", **clf.config}, digest) != \
        fs.key({"family": "classifier", **other.config}, digest)


def test_text_rows_of_any_width_have_the_same_features(tmp_path):
    """A text's row padded wider gives the same projected gradient (the loss reads the width from the row), so
    test texts need not share the training rows' width."""
    from models.explain.tracin import MemoryCheckpoint
    from models.explain.trak import FuncProjector
    from models.hf.checkpoint import load as load_hf
    from models.hf.influence import TextModule, classifier, rows, width
    from tests.hf_fixtures import TEXTS, save_classifier

    hf = load_hf(save_classifier(tmp_path / "bert", "bert"))
    module = TextModule(hf)
    clf = classifier(module, [MemoryCheckpoint({k: v.clone() for k, v in module.state_dict().items()}, 1.0)])
    n = width(hf, TEXTS, 64)
    narrow, wide = rows(hf, TEXTS, [0, 1, 2, 0, 1], 64, n), rows(hf, TEXTS, [0, 1, 2, 0, 1], 64, n + 7)
    proj = FuncProjector(module, clf.margin, proj_dim=16, seed=0)
    proj.load(clf.checkpoints[0])
    torch.testing.assert_close(proj.features(wide), proj.features(narrow), rtol=1e-4, atol=1e-5)
