"""Gradient feature store: stored scores equal direct scores, streaming top-k equals a full sort, only new rows are
computed, the key follows every input, and ``POST /featurize`` validates, refuses another owner's model and runs."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from core import registry
from core.filestore import Store
from models.explain import features as F
from models.explain.tracin import MemoryCheckpoint
from models.kg import stored as KF
from models.kg.checkpoint import KGBundle, load
from models.kg.train import TrainConfig, train_conve
from models.kg.trak import tracin_projected_scores, trak_scores
from models.kg.triples import load_nations

TINY = {"epochs": 2, "batch_size": 256, "lr": 0.01, "embedding_dim": 8, "embedding_height": 2, "num_filters": 2,
        "checkpoint_every": 1, "seed": 1}
OPTS = {"layers": "all", "proj_dim": 16, "seed": 4}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("conve")
    train_conve(load_nations(), TrainConfig(**TINY), out, device="cpu")
    return out


@pytest.fixture(scope="module")
def bundle(model_dir) -> KGBundle:
    return load(model_dir, "cpu")


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(str(tmp_path / "store"), tmp_path / "cache")


def test_featurized_scores_equal_direct_scores(bundle, store):
    test, train = bundle.dataset.test[:3], bundle.dataset.train[:400]
    rep = KF.featurize(store, bundle, "all", train=train, **OPTS)
    assert rep["rows_computed"] == 2 * len(train)
    idx = KF.feature_index(store, bundle, "all", train=train, **OPTS)
    direct = trak_scores(bundle, "all", test, train, **OPTS)
    stored = idx.scores(idx.queries(test, "trak"), tile_rows=150)        # several tiles, one partial
    torch.testing.assert_close(stored, direct, rtol=1e-4, atol=1e-6 * float(direct.abs().max()))
    direct_t = tracin_projected_scores(bundle, "all", test, train, **OPTS)
    stored_t = idx.scores(idx.queries(test, "tracin_projected"), tile_rows=150)
    torch.testing.assert_close(stored_t, direct_t, rtol=1e-4, atol=1e-6 * float(direct_t.abs().max()))
    # the streaming top-k over the stored tiles is the full sort of the direct scores
    top = idx.top_k(idx.queries(test, "trak"), 7, tile_rows=111)
    ref = F.full_sort_top_k(direct, 7)
    assert torch.equal(top.pro_idx, ref.pro_idx) and torch.equal(top.opp_idx, ref.opp_idx)
    assert torch.equal(top.n_positive, ref.n_positive) and torch.equal(top.n_negative, ref.n_negative)


def test_segments_and_tiles_are_bounded_and_many_segments_answer_the_same(bundle, store, monkeypatch):
    assert F.segment_rows(256) == 65_536 and F.segment_rows(8192) == 8192
    assert F.tile_rows_for(1) == 65_536 and F.tile_rows_for(10_000) == 2**24 // 10_000
    monkeypatch.setattr(F, "segment_rows", lambda k: 128)
    train, test = bundle.dataset.train[:400], bundle.dataset.test[:2]
    KF.featurize(store, bundle, "all", train=train, **OPTS)
    idx = KF.feature_index(store, bundle, "all", train=train, **OPTS)
    assert [(s.start, s.end) for s in idx.views[0].segs] == [(0, 128), (128, 256), (256, 384), (384, 400)]
    direct = trak_scores(bundle, "all", test, train, **OPTS)
    torch.testing.assert_close(idx.scores(idx.queries(test), tile_rows=100), direct, rtol=1e-4,
                               atol=1e-6 * float(direct.abs().max()))


def test_tiled_top_k_equals_full_sort_with_ties_and_short_rows():
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(-3, 4, (5, 61), generator=g).float()       # many ties and zeros
    scores[4] = -1.0                                                   # no positive score at all
    for k in (0, 1, 4, 40):
        for tile in (1, 7, 61, 100):
            tiles = ((c, scores[:, c:c + tile]) for c in range(0, 61, tile))
            got, ref = F.streaming_top_k(tiles, 5, k), F.full_sort_top_k(scores, k)
            for name in ("pro_idx", "pro_val", "opp_idx", "opp_val", "n_positive", "n_negative"):
                assert torch.equal(getattr(got, name), getattr(ref, name)), (k, tile, name)
    assert bool((F.full_sort_top_k(scores, 4).pro_idx[4] == -1).all())


def test_appended_rows_and_a_new_checkpoint_compute_only_what_is_new(bundle, store, monkeypatch):
    train = bundle.dataset.train
    counted = []
    real = KF.GradientProjector.features

    def counting(self, triples):
        counted.append(len(triples))
        return real(self, triples)

    monkeypatch.setattr(KF.GradientProjector, "features", counting)
    first = bundle.checkpoints[:1]
    rep = KF.featurize(store, bundle, first, train=train[:300], **OPTS)
    assert sum(counted) == 300 and rep["checkpoints"][0]["computed"] == 300
    counted.clear()
    rep = KF.featurize(store, bundle, first, train=train[:300], **OPTS)          # nothing new
    assert sum(counted) == 0 and rep["rows_computed"] == 0
    rep = KF.featurize(store, bundle, first, train=train[:420], **OPTS)          # 120 appended triples
    assert sum(counted) == 120 and rep["checkpoints"][0] == {**rep["checkpoints"][0], "reused": 300,
                                                             "computed": 120}
    counted.clear()
    rep = KF.featurize(store, bundle, "all", train=train[:420], **OPTS)          # the second checkpoint is new
    assert sum(counted) == 420 and [c["computed"] for c in rep["checkpoints"]] == [0, 420]
    # and the appended store answers exactly as one featurized in one go
    monkeypatch.undo()
    idx = KF.feature_index(store, bundle, "all", train=train[:420], **OPTS)
    test = bundle.dataset.test[:2]
    direct = trak_scores(bundle, "all", test, train[:420], **OPTS)
    torch.testing.assert_close(idx.scores(idx.queries(test)), direct, rtol=1e-4,
                               atol=1e-6 * float(direct.abs().max()))


def test_a_changed_row_recomputes_from_there_and_missing_rows_are_refused(bundle, store):
    train = bundle.dataset.train[:200].clone()
    ck = bundle.checkpoints[:1]
    KF.featurize(store, bundle, ck, train=train, **OPTS)
    with pytest.raises(F.NotFeaturized, match="50 of 250"):
        KF.feature_index(store, bundle, ck, train=bundle.dataset.train[:250], **OPTS)
    with pytest.raises(F.NotFeaturized):
        KF.feature_index(store, bundle, ck, train=train, **{**OPTS, "seed": 5})
    changed = train.clone()
    changed[150] = bundle.dataset.train[500]
    rep = KF.featurize(store, bundle, ck, train=changed, **OPTS)
    assert rep["checkpoints"][0]["reused"] == 0 and rep["checkpoints"][0]["computed"] == 200


def test_key_changes_with_each_keyed_input(bundle):
    ck = bundle.checkpoints[0]
    digest = F.weights_digest(ck)
    base = KF.settings_for(bundle, "all", "train", 16, 0)
    k0 = base.key(bundle.model.config, digest)
    assert k0 == KF.settings_for(bundle, "all", "train", 16, 0).key(bundle.model.config, digest)
    others = [
        KF.settings_for(bundle, "last", "train", 16, 0).key(bundle.model.config, digest),
        KF.settings_for(bundle, "all", "score_bce", 16, 0).key(bundle.model.config, digest),
        KF.settings_for(bundle, "all", "train", 17, 0).key(bundle.model.config, digest),
        KF.settings_for(bundle, "all", "train", 16, 1).key(bundle.model.config, digest),
        base.key(bundle.model.config, F.weights_digest(bundle.checkpoints[1])),
    ]
    cfg = copy.deepcopy(bundle.model.config)
    cfg.label_smoothing = 0.2
    others.append(base.key(cfg, digest))
    state = ck.state_dict()
    state["bn2.running_var"] = state["bn2.running_var"] + 1e-3          # a buffer, not a parameter
    others.append(base.key(bundle.model.config, F.weights_digest(MemoryCheckpoint(state, ck.lr))))
    assert len({k0, *others}) == len(others) + 1
    # the same weights in memory give the same digest as the file
    assert F.weights_digest(MemoryCheckpoint(ck.state_dict(), ck.lr)) == digest


def test_stored_report_lists_the_direct_top_k_and_self_scores(bundle, store):
    from models.kg.trak import self_scores

    train = bundle.dataset.train[:400]
    KF.featurize(store, bundle, "all", train=train, **OPTS)
    names = bundle.dataset.decode(bundle.dataset.test[:2])
    result, rows = KF.stored_report(store, bundle, names, estimator="trak", top_k=5, train=train, **OPTS)
    direct = trak_scores(bundle, "all", bundle.dataset.test[:2], train, **OPTS)
    ref = F.full_sort_top_k(direct, 5)
    self_direct = self_scores(bundle, "all", train, **OPTS)
    for i, entry in enumerate(result["results"]):
        assert entry["n_candidates"] == len(train) and entry["test_triple"] == names[i]
        got = [bundle.dataset.encode([p["train_triple"]])[0].tolist() for p in entry["proponents"]]
        assert got == train[ref.pro_idx[i]].tolist()
        for p, j in zip(entry["proponents"], ref.pro_idx[i].tolist(), strict=True):
            assert p["influence"] == pytest.approx(float(direct[i, j]), rel=1e-4)
            assert p["train_self_influence"] == pytest.approx(float(self_direct[j]), rel=1e-4)
    assert len(rows) == sum(len(e["proponents"]) + len(e["opponents"]) for e in result["results"])
    assert result["estimator"] == "trak" and result["approximate"] is True and result["projection"] == "kronecker"
    # not the configuration the evaluations measured (loss, k, damping, seed differ): the result says so
    from models.kg.evaluation import trak_configuration

    conf = result["configuration"]
    assert conf["evaluated"] == trak_configuration(len(train)) and conf["matches_evaluated"] is False
    assert conf["ran"] == {"checkpoints": "all", "layers": "all", "loss": "train", "projection_dim": 16,
                           "damping": 0.01, "seed": 4, "projection": "kronecker"}
    assert any("evaluated: 'margin'" in w and "projection_dim 16 (evaluated:" in w for w in result["warnings"])


def test_trak_as_evaluated_is_named_as_such_and_the_evaluation_runs_its_configuration(bundle, store, monkeypatch):
    """The configuration POST /tracin's trak results compare with is the one the evaluations' trak estimator runs:
    trak_configuration feeds evaluation.trak_scores (captured), and stored features of that configuration match it."""
    from models.kg import evaluation, trak_config
    from models.kg import trak as kg_trak

    monkeypatch.setattr(trak_config, "TRAK_PROJ_DIM", 16)  # a small k: the configuration, not its size, is tested
    train = bundle.dataset.train[:300]
    conf = evaluation.trak_configuration(len(train))
    seen = {}
    real = kg_trak.trak_scores

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(kg_trak, "trak_scores", spy)
    evaluation.trak_scores(bundle, bundle.checkpoints, bundle.dataset.test[:2], train)
    assert {k: seen[k] for k in ("layers", "loss", "damping", "seed")} == {
        k: conf[k] for k in ("layers", "loss", "damping", "seed")} and seen["proj_dim"] == conf["projection_dim"]
    opts = {"layers": "all", "proj_dim": 16, "seed": 0}
    KF.featurize(store, bundle, "all", train=train, loss="margin", **opts)
    names = bundle.dataset.decode(bundle.dataset.test[:2])
    result, _ = KF.stored_report(store, bundle, names, estimator="trak", top_k=3, train=train, loss="margin",
                                 damping=trak_config.TRAK_DAMPING, **opts)
    assert result["configuration"]["matches_evaluated"] is True and not result["warnings"]
    projected, _ = KF.stored_report(store, bundle, names, estimator="tracin_projected", top_k=3, train=train,
                                    loss="margin", **opts)
    assert projected["configuration"]["evaluated"] is None and projected["configuration"]["matches_evaluated"] is None


def test_margin_features_equal_projected_per_example_autograd_of_the_margin(bundle, store):
    """Stored ``loss="margin"`` features are, element-wise, Pᵀ∇m(z) for m the negated margin of the tail query
    (h, r, ?), logsumexp_{e≠t} s_e − s_t: one ``torch.autograd.grad`` per triple over every parameter in float64,
    projected by the explicit matrix of the same seeded projection."""
    from models.explain.trak import projection_matrix
    from models.kg.tracin import resolve_layers
    from models.kg.trak import parameter_shapes

    train, k, seed = bundle.dataset.train[:12], 16, 4
    rep = KF.featurize(store, bundle, "all", train=train, layers="all", loss="margin", proj_dim=k, seed=seed)
    assert rep["loss"] == "margin" and rep["proj_dim"] == k
    index = KF.feature_index(store, bundle, "all", train=train, layers="all", loss="margin", proj_dim=k, seed=seed)
    model = copy.deepcopy(bundle.model).double().eval()
    names = resolve_layers(model, "all")
    params = [model.get_parameter(n) for n in names]
    assert len(index.ckpts) >= 2
    for ck, view, own in zip(index.ckpts, index.views, index.seeds, strict=True):
        model.load_state_dict(ck.state_dict("cpu"))
        model.double().eval()
        P = projection_matrix(parameter_shapes(model, names), k, own, torch.float64)
        rows = []
        for h, r, t in train.tolist():
            logits = model(torch.tensor([h]), torch.tensor([r]))[0]
            others = torch.cat([logits[:t], logits[t + 1:]])
            margin = torch.logsumexp(others, 0) - logits[t]
            grads = torch.autograd.grad(margin, params)
            rows.append(torch.cat([g.reshape(-1) for g in grads]))
        ref = torch.stack(rows) @ P
        got = view.rows(0, len(train)).double()
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


class _Ctx:
    """The part of a worker's job context the featurize and stored-feature TracIn jobs use, in process."""

    def __init__(self, bundle, out):
        self.bundle, self.artifacts_dir, self.device, self.settings = bundle, out, "cpu", None

    def model(self, name):
        return self.bundle

    def progress(self, *args, **kwargs):
        pass

    def artifact_path(self, name):
        return self.artifacts_dir / name

    def artifacts(self):
        return []


def test_served_trak_defaults_are_the_evaluated_configuration():
    """The request models' defaults are models.kg.trak_config's (the one definition the evaluation's trak runs):
    POST /featurize stores the evaluated features, POST /tracin's trak reads them with the evaluated damping, and
    tracin_projected reads the same features; an empty projection size is the evaluated k for the model."""
    from core.kinds.featurize import FeaturizeRequest
    from core.kinds.tracin import TracInRequest
    from models.kg import trak_config

    conf = trak_config.trak_configuration(1592)
    feat = FeaturizeRequest(model="m")
    assert {"checkpoints": feat.checkpoints, "layers": feat.layers, "loss": feat.loss, "seed": feat.seed} == {
        k: conf[k] for k in ("checkpoints", "layers", "loss", "seed")}
    assert feat.proj_dim is None and conf["projection_dim"] == trak_config.trak_proj_dim(1592) == 4096
    for estimator in ("trak", "tracin_projected"):
        query = TracInRequest(model="m", test_triples=[["a", "b", "c"]], estimator=estimator)
        assert (query.checkpoints, query.layers, query.loss, query.seed, query.projection_dim) == (
            feat.checkpoints, feat.layers, feat.loss, feat.seed, feat.proj_dim)
    assert TracInRequest(model="m", test_triples=[["a", "b", "c"]], estimator="trak").damping == conf["damping"]
    # the schema the dashboard and the SDK read says the same
    schema = FeaturizeRequest.model_json_schema()["properties"]
    assert schema["loss"]["default"] == conf["loss"] and schema["proj_dim"].get("default") is None
    assert TracInRequest.model_json_schema()["properties"]["damping"]["default"] == conf["damping"]


def test_a_default_featurize_serves_a_default_trak_query_that_runs_what_the_evaluation_measures(
        bundle, store, tmp_path, monkeypatch):
    """The featurize and TracIn jobs' own code, given default requests: the features are the evaluated ones, the
    trak query finds them, states the evaluated configuration as what it ran, and its scores are the evaluation's
    trak estimator's (models.kg.evaluation.trak_scores) on the same model."""
    from core.kinds.featurize import FeaturizeRequest
    from core.kinds.tracin import TracInRequest
    from models.kg import evaluation, trak_config
    from workers.jobs import featurize as featurize_job
    from workers.jobs import tracin as tracin_job

    monkeypatch.setattr(trak_config, "TRAK_PROJ_DIM", 16)  # a small k: the configuration, not its size, is tested
    monkeypatch.setattr(featurize_job, "get_store", lambda settings: store)
    monkeypatch.setattr(tracin_job, "get_store", lambda settings: store)
    monkeypatch.setattr(registry, "get_model", lambda *args, **kwargs: None)
    ctx = _Ctx(bundle, tmp_path)
    train = bundle.dataset.train
    conf = trak_config.trak_configuration(len(train))
    stored = featurize_job.run(FeaturizeRequest(model="m"), ctx)
    assert (stored.loss, stored.proj_dim, stored.seed, stored.projection) == (
        conf["loss"], conf["projection_dim"], conf["seed"], conf["projection"])
    assert stored.configuration.matches_evaluated is True
    assert stored.configuration.evaluated == trak_config.stored_configuration(len(train))
    names = bundle.dataset.decode(bundle.dataset.test[:2])
    result = tracin_job.run(TracInRequest(model="m", test_triples=names, estimator="trak", top_k=3), ctx)
    assert result.configuration.ran == conf and result.configuration.matches_evaluated is True
    assert not result.warnings
    assert (result.loss, result.projection_dim, result.damping, result.seed) == (
        conf["loss"], conf["projection_dim"], conf["damping"], conf["seed"])
    measured = evaluation.trak_scores(bundle, bundle.checkpoints, bundle.dataset.test[:2], train)
    row_of = {tuple(t): j for j, t in enumerate(train.tolist())}
    for i, entry in enumerate(result.results):
        assert entry.proponents and entry.opponents
        for item in entry.proponents + entry.opponents:
            j = row_of[tuple(bundle.dataset.encode([item.train_triple])[0].tolist())]
            assert item.influence == pytest.approx(float(measured[i, j]), rel=1e-4, abs=1e-9)
        assert [p.influence for p in entry.proponents] == pytest.approx(
            torch.topk(measured[i], 3).values.tolist(), rel=1e-4)


def test_stored_report_fails_on_a_non_finite_score(bundle, store, monkeypatch):
    from models.common import NonFiniteError

    train = bundle.dataset.train[:100]
    KF.featurize(store, bundle, "all", train=train, **OPTS)
    real = F.FeatureIndex.queries

    def poisoned(self, *a, **kw):
        qs = real(self, *a, **kw)
        qs[0][1, 0] = float("nan")
        return qs

    monkeypatch.setattr(F.FeatureIndex, "queries", poisoned)
    names = bundle.dataset.decode(bundle.dataset.test[:2])
    with pytest.raises(NonFiniteError, match=r"non-finite influence for 1 triple\(s\)") as exc:
        KF.stored_report(store, bundle, names, top_k=3, train=train, **OPTS)
    assert exc.value.items == [names[1]]


# ------------------------------------------------------------------------------------------------ the job kind
ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"Authorization": "Bearer key-bob"}


@pytest.fixture(scope="module")
def api(tmp_path_factory, model_dir):
    """The app over a private Redis (no workers): alice owns ``conve-a``."""
    from tests.service import Service

    svc = Service(tmp_path_factory.mktemp("feathome"), queues=(), api_keys="alice:key-alice,bob:key-bob",
                  start=False)
    registry.register_model(svc.settings, "conve-a", kind="conve", loader="models.kg.checkpoint:load",
                            path=model_dir, owner="alice")
    registry.register_model(svc.settings, "conve-shared", kind="conve", loader="models.kg.checkpoint:load",
                            path=model_dir, owner=registry.SYSTEM)
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()


@pytest.mark.parametrize(("patch", "loc", "status"), [
    ({"model": "nope"}, ["body", "model"], 422),
    ({"checkpoints": ["epoch_9"]}, ["body", "checkpoints", 0], 422),
    ({"layers": ["fc", "nope"]}, ["body", "layers", 1], 422),
    ({"layers": ["ent.weight", "ent.weight:output"]}, ["body", "layers"], 422),
    ({"proj_dim": 0}, ["body", "proj_dim"], 422),
    ({"proj_dim": 8193}, ["body", "proj_dim"], 422),
    ({"seed": -1}, ["body", "seed"], 422),
    ({"loss": "mse"}, ["body", "loss"], 422),
    ({"batch_size": 0}, ["body", "batch_size"], 422),
    ({"estimator": "trak"}, ["body", "estimator"], 422),
])
def test_featurize_validation_names_the_field(api, patch, loc, status):
    r = api.client.post("/featurize", json={"model": "conve-a", **patch}, headers=ALICE)
    assert r.status_code == status, r.text
    assert [d["loc"] for d in r.json()["detail"]] == [loc]


def test_another_owners_model_is_refused(api):
    r = api.client.post("/featurize", json={"model": "conve-a"}, headers=BOB)
    assert r.status_code == 409, r.text
    assert r.json()["detail"]["loc"] == ["body", "model"]
    ok = api.client.post("/featurize", json={"model": "conve-a", "proj_dim": 32}, headers=ALICE)
    assert ok.status_code == 202, ok.text
    assert ok.json()["kind"] == "featurize"


def test_a_shared_demo_model_may_be_featurized_by_any_key(api):
    """A system-owned model (a demo every key can explain) is nobody else's: any key may store its features."""
    r = api.client.post("/featurize", json={"model": "conve-shared", "proj_dim": 32}, headers=BOB)
    assert r.status_code == 202, r.text


TRACIN = {"model": "conve-a", "test_triples": [["usa", "embassy", "uk"]], "projection_dim": 16, "top_k": 3}


@pytest.mark.parametrize(("patch", "loc"), [
    ({"estimator": "trak", "mode": "self", "test_triples": None}, ["body", "mode"]),
    ({"estimator": "trak", "filter": {"n_hops": 1}}, ["body", "filter"]),
    ({"estimator": "trak", "top_k": None}, ["body", "top_k"]),
    ({"estimator": "tracin_projected", "damping": 0.1}, ["body", "damping"]),
    ({"estimator": "trak", "precision": "bf16"}, ["body", "precision"]),
    ({"estimator": "trak", "damping": 0}, ["body", "damping"]),
    ({"seed": 3}, ["body", "seed"]),
    ({"damping": 0.5}, ["body", "damping"]),
    ({"estimator": "datamodels"}, ["body", "estimator"]),
    ({"estimator": "trak", "lr_weight": "interval"}, ["body", "lr_weight"]),
])
def test_tracin_stored_estimator_validation_names_the_field(api, patch, loc):
    r = api.client.post("/tracin", json={**TRACIN, **patch}, headers=BOB)
    assert r.status_code == 422, r.text
    assert [d["loc"] for d in r.json()["detail"]] == [loc]


@pytest.mark.parametrize("patch", [
    {"estimator": "exact", "seed": 0, "damping": 0.3},            # the dashboard's form sends every field
    {"estimator": "trak", "lr_weight": "last", "seed": 0},
    {"estimator": "tracin_projected", "damping": 0.3},
])
def test_fields_sent_with_their_default_values_are_accepted(api, patch):
    r = api.client.post("/tracin", json={**TRACIN, "model": "conve-shared", **patch}, headers=BOB)
    assert r.status_code == 202, r.text


def test_kind_limit_matches_the_estimator():
    from core.kinds.featurize import MAX_PROJ_DIM
    from models.explain.trak import MAX_PROJ_DIM as ENGINE_MAX

    assert MAX_PROJ_DIM == ENGINE_MAX


@pytest.mark.slow
def test_featurize_job_end_to_end(tmp_path, model_dir):
    """A real worker stores the features; a second request computes nothing."""
    from tests.service import Service

    with Service(tmp_path / "home", queues=("explain,bulk",), start=False) as svc:
        registry.register_model(svc.settings, "conve-a", kind="conve", loader="models.kg.checkpoint:load",
                                path=model_dir, owner="anonymous")  # the caller's name when auth is off
        svc.start()
        results = []
        for _ in range(2):
            r = svc.client.post("/featurize", json={"model": "conve-a", "proj_dim": 16, "layers": "last"})
            assert r.status_code == 202, r.text
            job = svc.wait(r.json()["id"], timeout_s=180)
            assert job["status"] == "succeeded", (job, svc.worker_logs())
            results.append(svc.client.get(job["result_url"]).json())
        assert results[0]["rows_computed"] == 2 * results[0]["n_train"] == 2 * 1592
        assert results[1]["rows_computed"] == 0
        assert [c["key"] for c in results[0]["checkpoints"]] == [c["key"] for c in results[1]["checkpoints"]]
        assert json.loads(svc.artifact(job["id"], "result.json"))["rows_computed"] == 0
        assert "/" not in json.dumps(results[1]["checkpoints"])  # keys and names only, never a server path
        # POST /tracin scores against the stored features; other settings were never featurized
        body = {"model": "conve-a", "test_triples": [["usa", "embassy", "uk"]], "top_k": 4, "layers": "last",
                "projection_dim": 16, "estimator": "trak"}
        r = svc.client.post("/tracin", json=body)
        job = svc.wait(r.json()["id"], timeout_s=180)
        assert job["status"] == "succeeded", (job, svc.worker_logs())
        result = svc.client.get(job["result_url"]).json()
        entry = result["results"][0]
        assert result["estimator"] == "trak" and entry["n_candidates"] == 1592
        assert len(entry["proponents"]) == min(4, entry["n_positive"]) and entry["proponents"][0]["influence"] > 0
        r = svc.client.post("/tracin", json={**body, "seed": 9})
        job = svc.wait(r.json()["id"], timeout_s=180)
        assert job["status"] == "failed" and job["error"]["code"] == "not_featurized", job
