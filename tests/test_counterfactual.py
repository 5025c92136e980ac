"""Counterfactual removal (models/kg/counterfactual.py): the top-k removal, the exact reproduction of the full model
when nothing is removed, the seeded random baseline, the bootstrap interval and the report's drops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.kg import counterfactual as cf
from models.kg import evaluation
from models.kg.train import TrainConfig

CFG = TrainConfig(epochs=1, batch_size=16, lr=0.01, embedding_dim=8, embedding_height=2, num_filters=2,
                  checkpoint_every=1, seed=123)


@pytest.fixture(scope="module")
def tiny():
    """Nations' 14 entities with 48 of its training triples, and 3 of its test triples."""
    from models.kg.triples import load_nations

    ds = load_nations()
    return evaluation.with_train(ds, ds.train[:48]), ds.test[:3]


def test_top_proponents_are_the_k_highest_positive_scores_ties_by_index():
    s = np.array([0.5, -1.0, 2.0, 0.5, 0.0, 3.0, 0.5])
    assert cf.top_proponents(s, 3).tolist() == [5, 2, 0]
    assert cf.top_proponents(s, 4).tolist() == [5, 2, 0, 3]  # the tie at 0.5: lower index first
    assert cf.top_proponents(s, 10).tolist() == [5, 2, 0, 3, 6]  # only the positive ones, never 0 or -1
    rng = np.random.default_rng(0)
    for _ in range(20):
        v = np.round(rng.normal(size=30), 1)
        want = [i for i in sorted(range(30), key=lambda i: (-v[i], i)) if v[i] > 0][:7]
        assert cf.top_proponents(v, 7).tolist() == want
    with pytest.raises(ValueError):
        cf.top_proponents(s, -1)


def test_random_removals_are_seeded_sized_and_disjoint_when_asked():
    a = cf.random_removals(100, 10, seed=0, test_index=3, draws=3)
    assert all(np.array_equal(x, y) for x, y in zip(a, cf.random_removals(100, 10, 0, 3, 3), strict=True))
    assert all(len(np.unique(x)) == 10 and x.min() >= 0 and x.max() < 100 for x in a)
    assert not np.array_equal(a[0], a[1])  # the draws of one test triple differ
    assert not np.array_equal(a[0], cf.random_removals(100, 10, 0, 4, 1)[0])  # another test triple: another draw
    assert not np.array_equal(a[0], cf.random_removals(100, 10, 1, 3, 1)[0])  # another seed: another draw
    exclude = np.arange(0, 100, 2)
    for x in cf.random_removals(100, 10, 0, 3, 5, exclude=exclude):
        assert not set(x.tolist()) & set(exclude.tolist())
    with pytest.raises(ValueError):
        cf.random_removals(12, 10, 0, 0, 1, exclude=np.arange(5))


def test_the_counterfactual_seeds_are_not_the_lds_seeds():
    ours = {cf.cf_seed(s, r, i) for s in range(3) for r in cf.CF_ROLES for i in range(20)}
    lds = {evaluation.design_seed(s, r, i) for s in range(3) for r in evaluation.ROLES for i in range(20)}
    assert len(ours) == 3 * len(cf.CF_ROLES) * 20 and not ours & lds
    with pytest.raises(ValueError):
        cf.cf_seed(0, "full")


def test_bootstrap_mean_is_a_brute_force_percentile_bootstrap():
    v = np.random.default_rng(5).normal(0.3, 1.0, size=17)
    got = cf.bootstrap_mean(v, seed=9, n_resamples=500)
    rng = np.random.default_rng(9)
    idx = rng.integers(0, len(v), (500, len(v)))
    means = sorted(sum(v[i] for i in row) / len(v) for row in idx)  # one resample at a time
    # numpy's linear percentile by hand: position q (n - 1)
    def pct(q):
        pos = q * (len(means) - 1)
        lo = int(np.floor(pos))
        return means[lo] + (pos - lo) * (means[min(lo + 1, len(means) - 1)] - means[lo])
    assert got["mean"] == pytest.approx(v.mean())
    assert got["low"] == pytest.approx(pct(0.025), abs=1e-12) and got["high"] == pytest.approx(pct(0.975), abs=1e-12)
    assert got["low"] < got["mean"] < got["high"]
    assert cf.bootstrap_mean(v, seed=10, n_resamples=500)["low"] != got["low"]
    assert cf.bootstrap_mean([], seed=0)["mean"] is None


def test_retraining_with_nothing_removed_and_the_same_seed_reproduces_the_full_model_exactly(tiny, tmp_path):
    from models.kg.checkpoint import load

    ds, test = tiny
    evaluation.train_model(ds, CFG, tmp_path / "full", device="cpu")
    full = evaluation.margins(load(tmp_path / "full").model, test)
    same, _ = cf.retrain_margins(ds, CFG, np.zeros(0, np.int64), CFG.seed, test)
    assert np.array_equal(full, same)  # bit for bit: a drop is owed to the removal, not to the run
    other, _ = cf.retrain_margins(ds, CFG, np.zeros(0, np.int64), CFG.seed + 1, test)
    assert not np.allclose(full, other)  # another seed is another model
    removed, _ = cf.retrain_margins(ds, CFG, np.array([0, 5, 7]), CFG.seed, test)
    assert not np.allclose(full, removed)


def test_the_report_removes_exactly_each_estimators_top_k_and_records_the_drop(tiny, monkeypatch):
    ds, test = tiny
    n = len(ds.train)
    rng = np.random.default_rng(1)
    scores = {"a": rng.normal(size=(len(test), n)), "b": rng.normal(size=(len(test), n))}
    scores["b"][1] = -1.0
    scores["b"][1, [4, 9]] = [2.0, 1.0]  # only two positive: two removed though k is 3
    trained: list[tuple[int, torch.Tensor]] = []
    real = cf.train_conve

    def recording(dataset, cfg, out_dir, device=None):
        trained.append((cfg.seed, dataset.train.clone()))
        return real(dataset, cfg, out_dir, device=device)

    monkeypatch.setattr(cf, "train_conve", recording)
    full, _ = cf.retrain_margins(ds, CFG, np.zeros(0, np.int64), CFG.seed, test)
    trained.clear()
    report = cf.counterfactual_report(ds, CFG, full, test, scores, k=3, seed=0, draws=1)
    want = {"a": [cf.top_proponents(scores["a"][j], 3) for j in range(3)],
            "b": [cf.top_proponents(scores["b"][j], 3) for j in range(3)]}
    assert report["estimators"]["b"]["removed"][1] == [4, 9] and report["estimators"]["b"]["n_removed"][1] == 2
    for name in scores:
        for j in range(3):
            removed = report["estimators"][name]["removed"][j]
            assert removed == want[name][j].tolist()
            assert np.argsort(-scores[name][j])[:len(removed)].tolist() == removed
            kept = ds.train[torch.from_numpy(cf.keep_mask(n, np.array(removed)))]
            # that training set, and only it, was trained with the full model's seed
            assert any(s == CFG.seed and len(t) == n - len(removed) and torch.equal(t, kept) for s, t in trained)
    # every retraining but the noise one used the full model's seed; the noise one nothing removed
    noise = [(s, t) for s, t in trained if s != CFG.seed]
    assert len(noise) == 1 and noise[0][0] == cf.cf_seed(0, "noise") and torch.equal(noise[0][1], ds.train)
    assert report["retrainings"] == len(trained)  # one per distinct (seed, removal), none repeated
    assert len({(s, tuple(map(tuple, t.tolist()))) for s, t in trained}) == len(trained)
    # the drop is the full margin minus the margin retrained without the removed triples, per test triple
    j = 2
    again, _ = cf.retrain_margins(ds, CFG, np.array(want["a"][j]), CFG.seed, test)
    assert report["estimators"]["a"]["per_test"][j] == pytest.approx(full[j] - again[j], abs=1e-12)
    rand = np.array(report["random_baseline"]["per_test"])
    drop = np.array(report["estimators"]["a"]["per_test"])
    assert report["estimators"]["a"]["minus_random"]["mean"] == pytest.approx((drop - rand).mean())
    assert report["estimators"]["a"]["beats_random"]["mean"] == pytest.approx((drop > rand).mean())
    with pytest.raises(ValueError, match="scores of 'a'"):
        cf.counterfactual_report(ds, CFG, full, test, {"a": scores["a"][:, :5]}, k=3, seed=0)


def test_the_report_with_a_second_seed_compares_each_against_its_own_full_model(tiny, monkeypatch):
    ds, test = tiny
    scores = {"a": np.random.default_rng(2).normal(size=(len(test), len(ds.train)))}
    full, _ = cf.retrain_margins(ds, CFG, np.zeros(0, np.int64), CFG.seed, test)
    report = cf.counterfactual_report(ds, CFG, full, test, scores, k=2, seed=0, draws=1, n_seeds=2)
    second = cf.cf_seed(0, "seed", 1)
    assert report["seeds"] == [CFG.seed, second]
    ref2, _ = cf.retrain_margins(ds, CFG, np.zeros(0, np.int64), second, test)
    drops = []
    for s, ref in ((CFG.seed, full), (second, ref2)):
        m, _ = cf.retrain_margins(ds, CFG, np.array(report["estimators"]["a"]["removed"][0]), s, test)
        drops.append(ref[0] - m[0])
    assert report["estimators"]["a"]["per_test"][0] == pytest.approx(np.mean(drops), abs=1e-12)


def _quality_benchmark():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "quality.py"
    spec = importlib.util.spec_from_file_location("quality_benchmark_cf", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.parametrize("argv, message", [
    (["--cf-estimators", "trak_ensemble"], "--cf-estimators: 'trak_ensemble' is not a single-model estimator"),
    (["--cf-k", "0"], "--cf-k, --cf-tests, --cf-draws and --cf-seeds must be >= 1"),
])
def test_the_benchmarks_counterfactual_flags_are_checked(argv, message, capsys):
    with pytest.raises(SystemExit):
        _quality_benchmark().main(["--sections", "counterfactual", *argv])
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_the_quality_benchmarks_counterfactual_section_runs_small(capsys):
    _quality_benchmark().main(["--sections", "counterfactual", "--epochs", "1", "--embedding-dim", "20",
                               "--cf-tests", "2", "--cf-k", "3", "--cf-draws", "1",
                               "--cf-estimators", "tracin,random"])
    out = capsys.readouterr().out
    rows = [line.split()[1] for line in out.splitlines() if line.startswith("nations ")]
    assert rows == ["random", "tracin", "random"], out  # the baseline row, then each estimator
    assert "7 retrainings" in out, out  # 1 noise + 2 test triples x (2 estimators + 1 draw)
