"""Attribution quality maths (models/kg/evaluation.py): LDS against scipy's Spearman, the bootstrap interval, AUC
against scikit-learn, the tail corruption, the recall curve, the margin and the estimator registry."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn.metrics import roc_auc_score

from models.kg import estimators, evaluation, trak_config
from models.kg.conve import ConvE, ConvEConfig


def _ground_truth(seed: int = 0, m_models: int = 12, n_train: int = 40, n_test: int = 9):
    rng = np.random.default_rng(seed)
    masks = np.stack([evaluation.subset_mask(n_train, 0.5, s) for s in range(m_models)])
    scores = rng.normal(size=(n_test, n_train))
    # actual outputs: the linear model plus noise, one column constant, one with ties
    outputs = evaluation.predicted_outputs(masks, scores) + rng.normal(scale=2.0, size=(m_models, n_test))
    outputs[:, 3] = 1.5
    outputs[:, 5] = np.round(outputs[:, 5])
    return masks, outputs, scores


def test_lds_equals_scipy_spearman_per_test_triple():
    masks, outputs, scores = _ground_truth()
    got = evaluation.lds_per_test(masks, outputs, scores)
    want = np.array([stats.spearmanr(masks.astype(float) @ scores[j], outputs[:, j]).statistic
                     if np.ptp(outputs[:, j]) else np.nan for j in range(scores.shape[0])])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, equal_nan=True)
    np.testing.assert_allclose(got, evaluation.lds_reference(masks, outputs, scores), rtol=1e-12, equal_nan=True)
    assert np.isnan(got[3]) and np.isfinite(np.delete(got, 3)).all()
    # the predicted output of a subset is the sum of the scores of its triples
    np.testing.assert_allclose(evaluation.predicted_outputs(masks, scores)[2], scores[:, masks[2]].sum(1))


def test_lds_of_the_true_linear_model_is_one():
    masks, _, scores = _ground_truth(1)
    outputs = evaluation.predicted_outputs(masks, scores) * 3.0 + 7.0
    np.testing.assert_allclose(evaluation.lds_per_test(masks, outputs, scores), 1.0)
    np.testing.assert_allclose(evaluation.lds_per_test(masks, -outputs, scores), -1.0)


def test_bootstrap_interval_contains_the_mean_and_is_reproducible_by_seed():
    values = np.random.default_rng(3).normal(0.1, 0.2, size=50)
    values[7] = np.nan  # undefined LDS values are left out, and counted out
    a = evaluation.mean_interval(values, seed=11)
    assert a["n"] == 49 and a["mean"] == pytest.approx(np.nanmean(values))
    assert a["low"] < a["mean"] < a["high"]
    assert a == evaluation.mean_interval(values, seed=11)
    b = evaluation.mean_interval(values, seed=12)
    assert (b["low"], b["high"]) != (a["low"], a["high"])
    ref = stats.bootstrap((values[np.isfinite(values)],), np.mean, confidence_level=0.95, n_resamples=2000,
                          method="percentile", rng=np.random.default_rng(11))
    assert (a["low"], a["high"]) == (ref.confidence_interval.low, ref.confidence_interval.high)
    single = evaluation.mean_interval(np.array([0.3, np.nan]), seed=0)
    assert single["low"] == single["mean"] == single["high"] == 0.3
    assert evaluation.mean_interval(np.array([np.nan]), seed=0)["mean"] is None


def test_subset_masks_hold_alpha_of_the_triples_and_follow_their_seed():
    m = evaluation.subset_mask(101, 0.5, 4)
    assert m.dtype == bool and m.sum() == 51
    assert (m == evaluation.subset_mask(101, 0.5, 4)).all()
    assert (m != evaluation.subset_mask(101, 0.5, 5)).any()
    assert evaluation.subset_seeds(7, 3) == evaluation.subset_seeds(7, 4)[:3]
    sel = evaluation.test_selection(20, 5, 0)
    assert len(sel) == 5 and (np.diff(sel) > 0).all() and (sel == evaluation.test_selection(20, 5, 0)).all()
    assert len(evaluation.test_selection(4, 10, 0)) == 4


def test_roc_auc_equals_scikit_learn_with_ties():
    rng = np.random.default_rng(0)
    labels = rng.random(300) < 0.2
    scores = np.round(rng.normal(size=300) + labels, 1)  # many ties
    assert evaluation.roc_auc(labels, scores) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
    with pytest.raises(ValueError):
        evaluation.roc_auc(np.zeros(5, bool), np.arange(5.0))


def test_corrupted_tails_are_recorded_and_recoverable():
    train = torch.tensor([[i % 7, i % 3, (i * 5) % 11] for i in range(200)])
    out, idx, new = evaluation.corrupt_tails(train, 11, 0.1, seed=3)
    assert len(idx) == 20 and (np.diff(idx) > 0).all()
    changed = torch.nonzero((out != train).any(1)).flatten().numpy()
    np.testing.assert_array_equal(changed, idx)  # exactly the recorded triples changed, only their tails
    assert (out[:, :2] == train[:, :2]).all()
    assert (out[torch.from_numpy(idx), 2].numpy() == new).all()
    assert (new != train[torch.from_numpy(idx), 2].numpy()).all() and (new >= 0).all() and (new < 11).all()
    again = evaluation.corrupt_tails(train, 11, 0.1, seed=3)
    assert torch.equal(again[0], out) and (again[1] == idx).all()
    restored = out.clone()
    restored[torch.from_numpy(idx), 2] = train[torch.from_numpy(idx), 2]
    assert torch.equal(restored, train)


def test_recall_curve_and_found_at():
    labels = np.zeros(100, bool)
    labels[:10] = True
    perfect = -np.arange(100.0)  # the corrupted ones first
    assert evaluation.found_at(labels, perfect, 0.10) == 1.0
    assert evaluation.found_at(labels, perfect, 0.05) == 0.5
    worst = np.arange(100.0)
    assert evaluation.found_at(labels, worst, 0.20) == 0.0
    curve = evaluation.recall_curve(labels, perfect)
    assert curve["inspected"][0] == 0.0 and curve["found"][0] == 0.0 and curve["found"][-1] == 1.0
    assert curve["found"][10] == evaluation.found_at(labels, perfect, 0.10)
    rng = np.random.default_rng(1)
    s = rng.normal(size=100)
    c = evaluation.recall_curve(labels, s)
    for q in (10, 20, 37):
        assert c["found"][q] == evaluation.found_at(labels, s, q / 100)
    assert all(a <= b for a, b in zip(c["found"], c["found"][1:], strict=False))


def test_margin_is_the_log_odds_of_the_true_tail():
    torch.manual_seed(0)
    model = ConvE(ConvEConfig(num_entities=9, num_relations=2, embedding_dim=8, embedding_height=2,
                              num_filters=2)).eval()
    triples = torch.tensor([[0, 0, 3], [4, 1, 2], [8, 0, 8]])
    got = evaluation.margins(model, triples)
    with torch.no_grad():
        p = torch.softmax(model(triples[:, 0], triples[:, 1]).double(), 1).gather(1, triples[:, 2:3]).squeeze(1)
    np.testing.assert_allclose(got, torch.log(p / (1 - p)).numpy(), rtol=1e-9)


def test_estimator_registry_resolves_every_name():
    assert set(estimators.names()) >= {"tracin", "tracin_last", "random"}
    for name in estimators.names():
        scores, self_scores = estimators.get(name).load()
        assert callable(scores) and callable(self_scores)
    with pytest.raises(KeyError, match="unknown estimator"):
        estimators.get("nope")


def test_conve_implements_exactly_the_registrys_evaluated_estimators():
    """One registry, one meaning: ConvE's table implements the names ``core.estimators`` marks ``evaluated``, and
    the two agree on which average over an ensemble."""
    from core import estimators as registry

    assert estimators.names() == registry.names(evaluated=True)
    assert estimators.ensembles() == registry.names(evaluated=True, ensemble=True)


def test_tracin_estimator_is_tracin_and_random_is_seeded(tmp_path):
    from models.kg.checkpoint import KGBundle, save_checkpoint
    from models.kg.tracin import ConvETracIn
    from models.kg.train import TrainConfig, build_model
    from models.kg.triples import load_nations

    ds = load_nations()
    torch.manual_seed(0)
    model = build_model(ds, TrainConfig(embedding_dim=8, embedding_height=2, num_filters=2)).eval()
    ckpts = []
    for epoch in (1, 2):  # two checkpoints of slightly different weights
        with torch.no_grad():
            for prm in model.parameters():
                prm.add_(0.05 * torch.randn_like(prm))
        ckpts.append(save_checkpoint(model, tmp_path / f"epoch_{epoch}.safetensors", epoch, 0.01 / epoch))
    bundle = KGBundle(model, ds, ckpts, tmp_path)
    test, train = ds.test[:3], ds.train[:50]
    run = evaluation.run_estimator("tracin_last", bundle, test, train, output="loss")  # POST /tracin's output
    want = ConvETracIn(bundle.model, bundle.checkpoints, layers="last").influence(test, train)[0]
    np.testing.assert_allclose(run.values, want.double().numpy(), rtol=1e-6)
    assert run.values.shape == (3, 50) and run.seconds >= 0
    selfs = evaluation.run_estimator("tracin", bundle, None, train, self_scores=True)
    want = ConvETracIn(bundle.model, bundle.checkpoints).self_influence(train)
    np.testing.assert_allclose(selfs.values, want.double().numpy(), rtol=1e-6)
    r1 = evaluation.run_estimator("random", bundle, test, train).values
    assert (r1 == evaluation.run_estimator("random", bundle, test, train).values).all()
    report = evaluation.mislabel_report(bundle, np.array([1, 5, 9]), ["random"])
    assert set(report["random"]) == {"auc", "auc_interval", "found_at_10", "found_at_20", "recall_curve",
                                     "seconds"}


def test_the_ground_truth_address_changes_with_everything_it_depends_on():
    from core.kinds.evaluate import EvaluateAttributionRequest
    from models.kg.triples import load_nations
    from workers.context import JobError
    from workers.jobs.evaluate import FULL, EvaluationPlan, _identity, _models, _same_data

    ds = load_nations()
    base = {"recipe": {"epochs": 1, "embedding_dim": 20, "seed": 0}, "alpha": 0.5, "m": 3, "seed": 0,
            "dataset": "nations", "estimators": ["random"]}

    def request(body):
        return EvaluateAttributionRequest.model_validate(body)

    def identity(body, data=ds):
        return _identity(request(body), data)

    ident = identity(base)
    assert ident == identity(dict(base)) and ident["seeds"] == evaluation.subset_seeds(0, 3)
    for change in ({"alpha": 0.4}, {"m": 4}, {"seed": 1}, {"recipe": {**base["recipe"], "epochs": 2}}):
        other = identity({**base, **change})
        assert other["lds"] != ident["lds"], change
    # the full-data model depends on the recipe, the data and the evaluation's seed (another replicate) only
    assert identity({**base, "alpha": 0.4, "m": 9})["full"] == ident["full"]
    assert identity({**base, "recipe": {**base["recipe"], "seed": 1}})["full"] != ident["full"]
    assert identity({**base, "seed": 1})["full"] != ident["full"]
    changed = evaluation.with_train(ds, ds.train[1:], keep_eval=True)
    assert identity(base, changed)["lds"] != ident["lds"]
    assert evaluation.data_version(changed) != evaluation.data_version(ds)
    # ensemble members only when an ensemble estimator is asked for; a member is the recipe's full-data model with
    # the member's seed (the address of any model of that recipe, seed and data)
    assert ident["members"] == []
    ens = identity({**base, "estimators": ["trak_ensemble"], "ensemble": 3})
    assert len(ens["members"]) == 3 and ens["lds"] == ident["lds"] and ens["full"] == ident["full"]
    seeds = evaluation.member_seeds(evaluation.full_model_seed(0, 0), 3)
    assert [r["seed"] for r in ens["member_recipes"]] == seeds
    assert ens["members"][1] == evaluation.content_key(what="full", recipe={**ens["full_recipe"], "seed": seeds[1]},
                                                       data=ident["data_version"],
                                                       checkpoints=evaluation.FULL_MODEL_CHECKPOINTS)
    assert identity({**base, "estimators": ["trak"], "ensemble": 3})["members"] == []
    # the models an evaluation needs, in the fixed order a shard's range points into: subsets, replicates, the
    # full-data model, the ensemble members
    assert _models(request(base)) == [0, 1, 2, FULL]
    assert _models(request({**base, "estimators": ["trak_ensemble"], "ensemble": 2, "replicates": True})) == [
        0, 1, 2, 3, 4, 5, FULL, FULL - 1, FULL - 2]
    # a shard refuses data that changed since its evaluation was planned
    plan = EvaluationPlan(data_version=ident["data_version"])
    _same_data(ident, plan, request(base))
    with pytest.raises(JobError, match="changed since the evaluation started"):
        _same_data(identity(base, changed), plan, request(base))


def _quality_benchmark():
    """benchmarks/quality.py as a module (it is a script, not a package member)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "quality.py"
    spec = importlib.util.spec_from_file_location("quality_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.slow
def test_the_quality_benchmark_runs_small(capsys):
    bench = _quality_benchmark()
    bench.main(["--datasets", "nations", "--m", "3", "--epochs", "1", "--n-test", "6", "--embedding-dim", "20",
                "--estimators", "tracin_last,random", "--sections", "lds,mislabel", "--replicates"])
    out = capsys.readouterr().out
    lds_rows = [r for r in (line.split() for line in out.splitlines() if line.startswith("nations "))
                if r[1] in ("tracin_last", "random")]
    assert [r[1] for r in lds_rows] == ["tracin_last", "random"] * 2  # the LDS table, then mislabel detection
    assert "0.07-0.13" not in out  # tracin itself was not measured: no published figure beside it
    assert "published AUC (dattri, context)" in out
    import re

    assert "Noise ceiling" in out
    assert re.search(r"^nations +-?\d\.\d{3} +\[-?\d\.\d{3}, -?\d\.\d{3}\] +\d\.\d{3} +(tracin_last|random) "
                     r"+-?\d\.\d{3} +-$", out, re.M), out


@pytest.mark.slow
def test_the_quality_benchmark_prints_the_ensemble_by_size_equal_to_the_estimator(capsys):
    import re

    bench = _quality_benchmark()
    bench.main(["--datasets", "nations", "--m", "3", "--epochs", "1", "--n-test", "6", "--embedding-dim", "20",
                "--estimators", "tracin,trak,trak_ensemble", "--ensemble", "3", "--ensemble-scaling",
                "--sections", "lds"])
    out = capsys.readouterr().out
    sizes = re.findall(r"^nations +(\d) +(-?\d\.\d{3}) +\[", out, re.M)
    assert [k for k, _ in sizes] == ["1", "2", "4"]
    lds: dict[str, str] = {}
    for r in (line.split() for line in out.splitlines() if line.startswith("nations ")):
        lds.setdefault(r[1], r[2])  # the LDS table comes first
    assert sizes[0][1] == lds["trak"] and sizes[-1][1] == lds["trak_ensemble"]  # one model; all four


@pytest.mark.slow
def test_the_quality_benchmarks_compute_matched_ensembles_reuse_the_lds_tables_scores(capsys):
    import re

    bench = _quality_benchmark()
    bench.main(["--datasets", "nations", "--m", "3", "--epochs", "1", "--n-test", "6", "--embedding-dim", "20",
                "--estimators", "tracin,graddot,random", "--ensemble", "2", "--compute-matched",
                "--sections", "lds"])
    out = capsys.readouterr().out
    rows = re.findall(r"^nations +(\d) +(tracin|graddot|random) +(-?\d\.\d{3}) +\[\S+ \S+\] +"
                      r"(\d+\.\d) \+ (\d+\.\d) +(\d+\.\d\d) +(\S+) ", out, re.M)
    # random is not ensembled; one row per size 1, 2 and 3 (all three models) for each of the other two
    assert [(k, e) for k, e, *_ in rows] == [(k, e) for k in "123" for e in ("tracin", "graddot")], out
    lds: dict[str, str] = {}
    for r in (line.split() for line in out.splitlines() if line.startswith("nations ")):
        lds.setdefault(r[1], r[2])  # the LDS table comes first
    one = {e: v for k, e, v, *_ in rows if k == "1"}
    assert one == {"tracin": lds["tracin"], "graddot": lds["graddot"]}  # one model: the LDS table's
    assert [x for k, e, *_, x in rows if e == "tracin"] == ["-"] * 3
    assert all(float(extra) == 0 for k, _, _, _, extra, *_ in rows if k == "1")
    assert float(rows[-1][4]) > 0  # the members' training time is counted from the second model on


def test_each_seed_of_the_quality_benchmark_has_its_own_models(tmp_path):
    import argparse

    bench = _quality_benchmark()
    for cache in (None, str(tmp_path / "cache")):
        args = [argparse.Namespace(cache_dir=cache, embedding_dim=20, epochs=1, seed=s, dropout=None, alpha=0.5,
                                   m=4, fraction=0.1) for s in (0, 1)]
        for what in ("full", "subsets", "member7"):
            dirs = [bench._cache_dir(a, tmp_path / "work", "nations", what) for a in args]
            assert dirs[0] != dirs[1] and f"-v{evaluation.LDS_DESIGN}-" in dirs[0].name, (cache, what)


@pytest.mark.slow
def test_the_quality_benchmark_pools_seeds_as_the_weighted_mean_of_each_seeds_lds(capsys):
    import re

    bench = _quality_benchmark()
    bench.main(["--datasets", "nations", "--m", "4", "--epochs", "1", "--n-test", "8", "--embedding-dim", "20",
                "--estimators", "tracin,random", "--seeds", "0,1", "--sections", "lds"])
    out = capsys.readouterr().out
    per_seed = {(s, e): (float(v), int(n)) for s, e, v, n in
                re.findall(r"^nations/s(\d) +(tracin|random) +(-?\d\.\d{3}) +\[\S+ \S+\] +(\d+) ", out, re.M)}
    assert sorted(per_seed) == [("0", "random"), ("0", "tracin"), ("1", "random"), ("1", "tracin")]
    ratios = dict(re.findall(r"^nations/s(\d) +random / tracin +(-?\d+\.\d\d) ", out, re.M))
    pooled = {e: (float(v), int(n), rest) for e, v, n, rest in
              re.findall(r"^nations +(tracin|random) +(-?\d\.\d{3}) +\[\S+ \S+\] +\[\S+ \S+\] +(\d+) +(.*)$", out,
                         re.M)}
    assert set(pooled) == {"tracin", "random"}
    for est in ("tracin", "random"):
        (m0, n0), (m1, n1) = per_seed[("0", est)], per_seed[("1", est)]
        assert pooled[est][1] == n0 + n1
        assert pooled[est][0] == pytest.approx((m0 * n0 + m1 * n1) / (n0 + n1), abs=1.5e-3)
    assert pooled["tracin"][2].split() == ["-", "-", "-", "-"]
    assert "hierarchical percentile bootstrap (resampling the seeds, then test triples" in out
    assert pooled["random"][2].split()[-2:] == [ratios["0"], ratios["1"]]  # each seed's own ratio
    with pytest.raises(SystemExit):  # argparse's error: exit status 2, the message on stderr
        bench.main(["--seeds", "0,x", "--sections", "lds"])
    assert "--seeds must be comma-separated integers" in capsys.readouterr().err


def test_the_reduce_step_fails_when_a_model_is_missing(redis_settings):
    """A shard that failed for good leaves its model missing: the LDS is never computed on part of the ground
    truth; nor on data that changed since the parent planned its shards."""
    from types import SimpleNamespace

    from rq.job import Job
    from rq.serializers import JSONSerializer

    from core import registry
    from core.contract.kind import ReduceRequest
    from core.kinds.evaluate import EvaluateAttributionRequest
    from models.kg.triples import load_nations
    from workers.context import JobError
    from workers.jobs.evaluate import PLAN_META, _identity, run_reduce

    request = EvaluateAttributionRequest.model_validate({
        "dataset": "nations", "recipe": {"epochs": 1, "embedding_dim": 20, "embedding_height": 4}, "alpha": 0.5,
        "m": 3, "seed": 0, "n_test": 5, "estimators": ["random"]})
    conn = registry.connection(redis_settings)
    version = _identity(request, load_nations())["data_version"]
    parent = Job.create("workers.runner.execute", args=("evaluate_attribution", {}), connection=conn, id="p",
                        serializer=JSONSerializer, meta={PLAN_META: {"data_version": version}})
    parent.save()
    ctx = SimpleNamespace(settings=redis_settings, owner="system", device="cpu", job_id="p-reduce", use_shared=list,
                          job=SimpleNamespace(connection=conn, serializer=JSONSerializer))
    reduce = ReduceRequest[EvaluateAttributionRequest](parent="p", shards=4, request=request)
    with pytest.raises(JobError, match="4 of the evaluation's models are missing") as err:
        run_reduce(reduce, ctx)
    assert err.value.code == "too_many_failures"
    parent.meta[PLAN_META] = {"data_version": "another"}
    parent.save_meta()
    with pytest.raises(JobError, match="changed since the evaluation started") as err:
        run_reduce(reduce, ctx)
    assert err.value.code == "dataset_changed"


def _tiny_bundle(tmp_path, seed: int, train=None):
    from models.kg.checkpoint import KGBundle, save_checkpoint
    from models.kg.train import TrainConfig, build_model
    from models.kg.triples import load_nations

    ds = load_nations()
    if train is not None:
        ds = evaluation.with_train(ds, train, keep_eval=True)
    torch.manual_seed(seed)
    model = build_model(ds, TrainConfig(embedding_dim=8, embedding_height=2, num_filters=2)).eval()
    ckpts = []
    for epoch in (1, 2):
        with torch.no_grad():
            for prm in model.parameters():
                prm.add_(0.05 * torch.randn_like(prm))
        ckpts.append(save_checkpoint(model, tmp_path / f"m{seed}-epoch_{epoch}.safetensors", epoch, 0.01 / epoch))
    return KGBundle(model, ds, ckpts, tmp_path)


def test_trak_ensemble_is_trak_averaged_over_the_full_model_and_its_members(tmp_path, monkeypatch):
    monkeypatch.setattr(trak_config, "TRAK_PROJ_DIM", 256)  # averaging does not depend on k; a small one is fast
    full, a, b = (_tiny_bundle(tmp_path, s) for s in (0, 1, 2))
    test, train = full.dataset.test[:3], full.dataset.train
    single = [evaluation.run_estimator("trak", x, test, train).values for x in (full, a, b)]
    got = evaluation.run_estimator("trak_ensemble", full, test, train, members=[a, b]).values
    np.testing.assert_allclose(got, (single[0] + single[1] + single[2]) / 3, rtol=1e-6, atol=1e-9)
    assert not np.allclose(single[0], single[1])  # the members are other models: averaging changes the scores
    alone = evaluation.run_estimator("trak_ensemble", full, test, train).values
    np.testing.assert_allclose(alone, single[0], rtol=1e-6, atol=1e-9)
    other = _tiny_bundle(tmp_path, 3, train=train[1:])
    with pytest.raises(ValueError, match="other training triples"):
        evaluation.run_estimator("trak_ensemble", full, test, train, members=[other])
    # members are not passed to an estimator that does not ensemble
    np.testing.assert_array_equal(evaluation.run_estimator("trak", full, test, train, members=[a, b]).values,
                                  single[0])
    assert estimators.ensembles() == ("trak_ensemble",)


@pytest.mark.parametrize("name", ["tracin", "graddot", "gradcos"])
def test_an_estimators_ensemble_is_its_mean_over_each_model_run_alone(tmp_path, name):
    full, a, b = (_tiny_bundle(tmp_path, s) for s in (0, 1, 2))
    test, train = full.dataset.test[:3], full.dataset.train
    single = [evaluation.run_estimator(name, x, test, train).values for x in (full, a, b)]
    got = evaluation.ensemble_scores(name, full, full.checkpoints, test, train, [a, b]).numpy()
    np.testing.assert_allclose(got, (single[0] + single[1] + single[2]) / 3, rtol=0, atol=1e-12)
    assert not np.allclose(single[0], single[1])  # the members are other models: averaging changes the scores
    runs = evaluation.member_runs(name, full, full.checkpoints, test, train, [a, b])
    assert [r.values.tolist() for r in runs] == [v.tolist() for v in single] and all(r.seconds >= 0 for r in runs)
    np.testing.assert_array_equal(evaluation.ensemble_scores(name, full, full.checkpoints, test, train).numpy(),
                                  single[0])  # no members: the estimator itself
    other = _tiny_bundle(tmp_path, 3, train=train[1:])
    with pytest.raises(ValueError, match="other training triples"):
        evaluation.ensemble_scores(name, full, full.checkpoints, test, train, [other])


def test_only_the_estimators_that_depend_on_one_trained_model_are_ensembled(tmp_path):
    assert set(evaluation.ENSEMBLE_BASES) <= set(estimators.names())
    assert not set(evaluation.ENSEMBLE_BASES) & {"random", *estimators.ensembles()}
    full = _tiny_bundle(tmp_path, 0)
    for name in ("random", "trak_ensemble"):
        with pytest.raises(ValueError, match="cannot be ensembled"):
            evaluation.ensemble_scores(name, full, full.checkpoints, full.dataset.test[:2], full.dataset.train)


def test_trak_projects_to_4096_and_less_where_the_features_would_not_fit(tmp_path, monkeypatch):
    from models.kg import trak

    assert trak_config.trak_proj_dim(1_592) == trak_config.trak_proj_dim(8_544) == 4096  # Nations ... Kinships
    assert trak_config.trak_proj_dim(272_115) == 1024  # FB15k-237's size: [n, k] float32 within 2 GiB
    assert 4 * trak_config.trak_proj_dim(272_115) * 272_115 <= trak_config.TRAK_MAX_FEATURE_BYTES
    assert trak_config.trak_proj_dim(10**12) == trak_config.TRAK_MIN_PROJ_DIM
    # both estimator functions use it, for the training triples they are given
    seen = []
    monkeypatch.setattr(trak, "trak_scores", lambda *a, **kw: seen.append(kw["proj_dim"]))
    monkeypatch.setattr(trak, "self_scores", lambda *a, **kw: seen.append(kw["proj_dim"]))
    monkeypatch.setattr(trak_config, "TRAK_MAX_FEATURE_BYTES", 4 * 1024 * 100)  # 100 triples at k=1024
    train = torch.zeros(100, 3, dtype=torch.long)
    evaluation.trak_scores(None, [], train[:1], train)
    evaluation.trak_self_scores(None, [], train)
    evaluation.trak_scores(None, [], train[:1], train[:50])
    assert seen == [1024, 1024, 2048]


def test_member_seeds_are_reproducible_bounded_and_not_the_subsets_seeds():
    seeds = evaluation.member_seeds(0, 16)
    assert seeds == evaluation.member_seeds(0, 16) and seeds[:4] == evaluation.member_seeds(0, 4)
    assert len(set(seeds)) == 16 and all(0 <= s <= 2**31 - 1 for s in seeds)
    assert not set(seeds) & set(range(0, 1000))  # never a subset model's consecutive seed
    assert evaluation.member_seeds(1, 4) != evaluation.member_seeds(0, 4)
    assert evaluation.member_seeds(0, 0) == []


def test_ratio_interval_is_paired_and_skips_undefined_test_triples():
    rng = np.random.default_rng(0)
    b = rng.normal(0.3, 0.2, 60)
    a = 2 * b + rng.normal(0, 0.05, 60)
    r = evaluation.ratio_interval(a, b, seed=4)
    assert r["ratio"] == pytest.approx(a.mean() / b.mean()) and r["n"] == 60
    assert r["low"] <= r["ratio"] <= r["high"] and r["high"] - r["low"] < 0.2  # paired: tight around 2
    assert r == evaluation.ratio_interval(a, b, seed=4)
    a2 = list(a)
    a2[7] = None
    b2 = list(b)
    b2[9] = float("nan")
    r2 = evaluation.ratio_interval(a2, b2, seed=4)
    keep = np.ones(60, bool)
    keep[[7, 9]] = False
    assert r2["n"] == 58 and r2["ratio"] == pytest.approx(a[keep].mean() / b[keep].mean())
    with pytest.raises(ValueError, match="different lengths"):
        evaluation.ratio_interval(a[:5], b, seed=0)


def test_pooled_interval_pools_replicates_and_resamples_within_each():
    rng = np.random.default_rng(0)
    b = [rng.normal(0.3, 0.2, 50), rng.normal(0.2, 0.2, 70)]
    a = [2 * b[0] + rng.normal(0, 0.05, 50), 1.5 * b[1] + rng.normal(0, 0.05, 70)]
    a1 = list(a[1])
    a1[3] = None  # an undefined test triple is left out of both sums
    r = evaluation.pooled_interval([(a[0], b[0]), (a1, b[1])], seed=3)
    keep = np.ones(70, bool)
    keep[3] = False
    want = (a[0].sum() + a[1][keep].sum()) / (b[0].sum() + b[1][keep].sum())
    assert r["value"] == pytest.approx(want) and r["n"] == 119 and r["replicates"] == 2
    assert r["low"] < r["value"] < r["high"]
    assert r == evaluation.pooled_interval([(a[0], b[0]), (a1, b[1])], seed=3)
    # the mean of a, without a reference
    m = evaluation.pooled_interval([(a[0], None), (a[1], None)], seed=3)
    assert m["value"] == pytest.approx(np.concatenate(a).mean()) and m["low"] < m["value"] < m["high"]
    # paired: a = c·b in every test triple of every replicate leaves no doubt about the ratio
    exact = evaluation.pooled_interval([(1.7 * b[0], b[0]), (1.7 * b[1], b[1])], seed=3)
    assert exact["low"] == pytest.approx(1.7) and exact["high"] == pytest.approx(1.7)
    # hierarchical: two replicates each constant within itself still disagree, and the interval says so (a bootstrap
    # of test triples within each replicate would give none)
    flat = evaluation.pooled_interval([(np.full(10, 0.8), None), (np.full(30, 0.2), None)], seed=3)
    assert flat["value"] == pytest.approx(0.35) and flat["low"] < 0.3 and flat["high"] > 0.6
    assert flat["method"] == "hierarchical_bootstrap" and flat["resampled"] == ["replicates", "test triples"]
    assert flat["per_replicate"] == [pytest.approx(0.8), pytest.approx(0.2)]
    t = flat["t_interval"]
    want = stats.t.interval(0.95, 1, loc=0.5, scale=stats.sem([0.8, 0.2]))
    assert t["method"] == "t_over_replicates" and (t["low"], t["high"]) == (pytest.approx(want[0]),
                                                                            pytest.approx(want[1]))
    one = evaluation.pooled_interval([(a[0], b[0])], seed=3)
    assert one["t_interval"] is None and one["resampled"] == ["test triples"] and one["low"] < one["high"]
    with pytest.raises(ValueError, match="every replicate or for none"):
        evaluation.pooled_interval([(a[0], b[0]), (a[1], None)], seed=0)
    with pytest.raises(ValueError, match="different lengths"):
        evaluation.pooled_interval([(a[0][:5], b[0])], seed=0)


def _brute_hierarchical(strata, seed, n_resamples, confidence=0.95):
    """The two-level bootstrap one resample, one replicate slot and one test triple at a time."""
    xs, ys = [], []
    for a, b in strata:
        a = np.array([np.nan if v is None else v for v in a], float)
        b = np.ones(len(a)) if b is None else np.array([np.nan if v is None else v for v in b], float)
        keep = np.isfinite(a) & np.isfinite(b)
        xs.append(a[keep])
        ys.append(b[keep])
    reps, n_max = len(xs), max(len(x) for x in xs)
    rng = np.random.default_rng(seed)
    chosen = rng.integers(0, reps, size=(n_resamples, reps))
    uniforms = [rng.random((n_resamples, n_max)) for _ in range(reps)]
    out = []
    for k in range(n_resamples):
        num = den = 0.0
        for j in range(reps):
            r = chosen[k, j]
            for t in range(len(xs[r])):
                i = int(uniforms[j][k, t] * len(xs[r]))
                num += xs[r][i]
                den += ys[r][i]
        out.append(num / den)
    tail = (1 - confidence) / 2 * 100
    return np.percentile(out, [tail, 100 - tail])


def test_pooled_interval_is_the_hierarchical_bootstrap_of_a_brute_force_reference():
    rng = np.random.default_rng(5)
    b = [rng.normal(0.3, 0.2, n) for n in (7, 12, 9)]
    a = [c * v + rng.normal(0, 0.05, len(v)) for c, v in zip((1.5, 2.0, 2.5), b, strict=True)]
    a[1] = list(a[1])
    a[1][4] = None
    for strata in ([(x, y) for x, y in zip(a, b, strict=True)], [(x, None) for x in a]):
        got = evaluation.pooled_interval(strata, seed=9, n_resamples=300)
        want = _brute_hierarchical(strata, 9, 300)
        np.testing.assert_allclose([got["low"], got["high"]], want, rtol=1e-12)


def test_the_pooled_interval_widens_when_replicates_disagree():
    rng = np.random.default_rng(1)
    noise = [rng.normal(0, 0.1, 60) for _ in range(4)]
    agree = evaluation.pooled_interval([(0.3 + e, None) for e in noise], seed=2)
    apart = evaluation.pooled_interval([(c + e, None) for c, e in zip((0.1, 0.25, 0.35, 0.5), noise, strict=True)],
                                       seed=2)
    assert agree["value"] == pytest.approx(apart["value"], abs=1e-12)
    width = {k: r["high"] - r["low"] for k, r in (("agree", agree), ("apart", apart))}
    assert width["apart"] > 3 * width["agree"]
    t_width = {k: r["t_interval"]["high"] - r["t_interval"]["low"] for k, r in (("agree", agree), ("apart", apart))}
    assert t_width["apart"] > 3 * t_width["agree"]


def test_lds_report_gives_each_estimator_relative_to_tracin(tmp_path):
    full = _tiny_bundle(tmp_path, 0)
    test, train = full.dataset.test[:6], full.dataset.train[:40]
    full.dataset = evaluation.with_train(full.dataset, train, keep_eval=True)
    masks = np.stack([evaluation.subset_mask(40, 0.5, s) for s in range(8)])
    outputs = np.random.default_rng(1).normal(size=(8, 6))
    report = evaluation.lds_report(full, masks, outputs, test, ["tracin", "random"], seed=0)
    ratio = report["random"]["ratio_to_tracin"]
    a = np.array(report["random"]["per_test"], dtype=float)
    b = np.array(report["tracin"]["per_test"], dtype=float)
    ok = np.isfinite(a) & np.isfinite(b)
    assert ratio["ratio"] == pytest.approx(a[ok].mean() / b[ok].mean())
    assert "ratio_to_tracin" not in report["tracin"]
    assert "ratio_to_tracin" not in evaluation.lds_report(full, masks, outputs, test, ["random"], seed=0)["random"]


def test_the_estimator_counter_reads_n_of_n_once_every_estimator_is_done(tmp_path):
    """A succeeded evaluation's last progress report is "2 / 2 estimators", not the "1 / 2" reported as the last
    estimator started (the job page shows the last report)."""
    full = _tiny_bundle(tmp_path, 0)
    test, train = full.dataset.test[:4], full.dataset.train[:30]
    full.dataset = evaluation.with_train(full.dataset, train, keep_eval=True)
    seen: list[tuple[int, int]] = []

    def progress(done, total, message):
        seen.append((done, total))

    evaluation.mislabel_report(full, np.array([1, 5, 9]), ["tracin_last", "random"], progress=progress)
    assert seen == [(0, 2), (1, 2), (2, 2)]
    seen.clear()
    masks = np.stack([evaluation.subset_mask(30, 0.5, s) for s in range(6)])
    outputs = np.random.default_rng(1).normal(size=(6, 4))
    evaluation.lds_report(full, masks, outputs, test, ["tracin_last", "random"], seed=0, progress=progress)
    assert seen == [(0, 2), (1, 2), (2, 2)]


def test_suspect_order_is_the_ranking_the_recall_curve_inspects():
    scores = np.array([0.5, 2.0, 0.5, -1.0, 2.0, 0.1])
    order = evaluation.suspect_order(scores)
    # largest first, ties in training order (an independent sort of (-score, index))
    assert order.tolist() == [i for _, i in sorted((-v, i) for i, v in enumerate(scores))] == [1, 4, 0, 2, 5, 3]
    labels = np.zeros(6, bool)
    labels[[4, 2]] = True
    assert evaluation.found_at(labels, scores, 0.34) == 0.5  # the top 3 (1, 4, 0) hold one of the two
    assert evaluation.recall_curve(labels, scores, points=6)["found"][4] == 1.0  # the top 4 hold both


def test_noise_ceiling_is_the_replicates_spearman_and_bounds_a_prediction_from_the_subset():
    rng = np.random.default_rng(0)
    g = rng.normal(size=(64, 6))                 # what the subset decides
    f = g + rng.normal(size=(64, 6))             # one model of each subset
    f2 = g + rng.normal(size=(64, 6))            # its replicate: the same subset, another seed
    out = evaluation.noise_ceiling(f, f2, seed=0)
    want = [stats.spearmanr(f[:, j], f2[:, j]).statistic for j in range(6)]
    np.testing.assert_allclose(out["per_test"], want, rtol=1e-12)
    assert out["agreement"]["mean"] == pytest.approx(np.mean(want))
    assert out["ceiling"] == pytest.approx(np.mean(np.sqrt(np.clip(want, 0, None))))
    # the true g, the best prediction there is, correlates with f at about the ceiling, not above it by much
    best = np.mean([stats.spearmanr(g[:, j], f[:, j]).statistic for j in range(6)])
    assert best == pytest.approx(out["ceiling"], abs=0.15) and out["agreement"]["mean"] < best


def _plan(seed: int, m: int = 64, n_train: int = 400, recipe_seed: int = 0) -> dict:
    """Every draw of one LDS replicate: masks, their seeds, training seeds, test draw, full-data model seed."""
    seeds = evaluation.subset_seeds(seed, m)
    return {"masks": [evaluation.subset_mask(n_train, 0.5, s) for s in seeds], "mask_seeds": seeds,
            "train_seeds": evaluation.subset_train_seeds(seed, m),
            "replicate_seeds": evaluation.subset_replicate_seeds(seed, m),
            "test": evaluation.test_selection(1000, 100, seed),
            "full": evaluation.full_model_seed(seed, recipe_seed)}


def test_independent_replicates_share_no_subset_seed_mask_test_draw_or_full_data_model():
    plans = [_plan(s) for s in (0, 1, 2)]
    for i in range(3):
        for j in range(i + 1, 3):
            a, b = plans[i], plans[j]
            seeds_a = {*a["mask_seeds"], *a["train_seeds"], *a["replicate_seeds"], a["full"]}
            seeds_b = {*b["mask_seeds"], *b["train_seeds"], *b["replicate_seeds"], b["full"]}
            assert not seeds_a & seeds_b
            masks_a = {m.tobytes() for m in a["masks"]}
            assert not masks_a & {m.tobytes() for m in b["masks"]}
            assert not (a["test"] == b["test"]).all()
    for p in plans:  # within a replicate too, no seed plays two roles
        seeds = [*p["mask_seeds"], *p["train_seeds"], *p["replicate_seeds"], p["full"]]
        assert len(set(seeds)) == len(seeds) and all(0 <= s <= 2**31 - 1 for s in seeds)
        assert not set(seeds) & set(range(1000))  # never the consecutive seeds of the old design
        assert not set(seeds) & set(evaluation.member_seeds(p["full"], 16))
    # one replicate's plan is reproducible, and the recipe's own seed changes the full-data model
    again = _plan(1)
    assert all((x == y).all() for x, y in zip(again["masks"], plans[1]["masks"], strict=True))
    assert {k: v for k, v in again.items() if k not in ("masks", "test")} == {
        k: v for k, v in plans[1].items() if k not in ("masks", "test")}
    assert (again["test"] == plans[1]["test"]).all()
    assert evaluation.full_model_seed(1, 7) != plans[1]["full"]
    with pytest.raises(ValueError, match="role"):
        evaluation.design_seed(0, "no-such-role")


def test_the_stored_ground_truth_is_addressed_by_the_design_version(monkeypatch):
    from core.kinds.evaluate import EvaluateAttributionRequest
    from models.kg.triples import load_nations
    from workers.jobs import evaluate as jobs

    ds = load_nations()
    request = EvaluateAttributionRequest.model_validate({"m": 3, "seed": 2})
    ident = jobs._identity(request, ds)
    assert ident["seeds"] == evaluation.subset_seeds(2, 3)
    assert ident["train_seeds"] == evaluation.subset_train_seeds(2, 3)
    assert ident["full_recipe"]["seed"] == evaluation.full_model_seed(2, request.recipe.seed)
    monkeypatch.setattr(evaluation, "LDS_DESIGN", evaluation.LDS_DESIGN + 1)
    other = jobs._identity(request, ds)
    assert other["lds"] != ident["lds"]


def _dense_output_tracin(bundle, test, train, layers, output):
    """Σ_c η_c ⟨∇(test side), ∇ℓ(train)⟩ from explicit per-example gradients and dot products in float64."""
    import copy

    from models.kg.tracin import resolve_layers
    from models.kg.trak import dense_gradients

    model = copy.deepcopy(bundle.model).double().eval()
    names = resolve_layers(model, layers)
    total = torch.zeros(len(test), len(train), dtype=torch.float64)
    for ck in bundle.checkpoints:
        model.load_state_dict(ck.state_dict("cpu"))
        model.double().eval()
        g_test = dense_gradients(model, test, names, "margin" if output == "margin" else "train")
        total += ck.lr * g_test @ dense_gradients(model, train, names, "train").t()
    return total.numpy()


@pytest.mark.parametrize(("name", "layers"), [("tracin", "all"), ("tracin_last", "last")])
def test_tracin_on_the_margin_equals_a_dense_reference_and_states_its_output(tmp_path, name, layers):
    full = _tiny_bundle(tmp_path, 0)
    test, train = full.dataset.test[:4], full.dataset.train[:40]
    margin = evaluation.run_estimator(name, full, test, train).values          # the evaluation's default
    want = _dense_output_tracin(full, test, train, layers, "margin")
    np.testing.assert_allclose(margin, want, rtol=2e-4, atol=1e-6 * np.abs(want).max())
    loss = evaluation.run_estimator(name, full, test, train, output="loss").values
    np.testing.assert_allclose(loss, _dense_output_tracin(full, test, train, layers, "loss"), rtol=2e-4,
                               atol=1e-6 * np.abs(want).max())
    assert not np.allclose(margin, loss, rtol=0.05)
    # the margin's gradient as the test side: a positive score says a step on the training triple raises the margin
    assert evaluation.output_of(name) == "margin" and evaluation.output_of(name, "loss") == "loss"
    assert evaluation.output_of("trak", "loss") == "margin" and evaluation.output_of("random") is None
    masks = np.random.default_rng(0).random((5, 40)) < 0.5
    outputs = np.random.default_rng(1).normal(size=(5, 4))
    report = evaluation.lds_report(full, np.pad(masks, ((0, 0), (0, len(full.dataset.train) - 40))), outputs,
                                   test, [name, "random"], seed=0, output="loss")
    assert report[name]["output"] == "loss" and report["random"]["output"] is None
    with pytest.raises(ValueError, match="output must be one of"):
        evaluation.run_estimator(name, full, test, train, output="logit")


def test_graddot_and_gradcos_are_the_last_checkpoints_dot_products_and_cosines(tmp_path):
    import copy

    from models.kg.trak import dense_gradients

    full = _tiny_bundle(tmp_path, 0)
    test, train = full.dataset.test[:3], full.dataset.train[:30]
    model = copy.deepcopy(full.model).double().eval()
    model.load_state_dict(full.checkpoints[-1].state_dict("cpu"))
    model.double().eval()
    from models.kg.tracin import resolve_layers

    names = resolve_layers(model, "all")
    for output in ("margin", "loss"):
        gt = dense_gradients(model, test, names, "margin" if output == "margin" else "train")
        gb = dense_gradients(model, train, names, "train")
        dot = (gt @ gb.t()).numpy()
        cos = dot / np.outer(gt.norm(dim=1).numpy(), gb.norm(dim=1).numpy())
        got_dot = evaluation.run_estimator("graddot", full, test, train, output=output).values
        got_cos = evaluation.run_estimator("gradcos", full, test, train, output=output).values
        np.testing.assert_allclose(got_dot, dot, rtol=2e-4, atol=1e-6 * np.abs(dot).max())
        np.testing.assert_allclose(got_cos, cos, rtol=2e-4, atol=1e-5)
    selfs = evaluation.run_estimator("graddot", full, None, train, self_scores=True).values
    np.testing.assert_allclose(selfs, (gb * gb).sum(1).numpy(), rtol=2e-4)
    assert (evaluation.run_estimator("gradcos", full, None, train, self_scores=True).values == 1).all()
