"""TRAK-style estimator on ConvE: element-wise equal to its dense float64 reference, seeded projection."""

from __future__ import annotations

import pytest
import torch

from models.explain import trak
from models.explain.trak import projection_factor, projection_matrix, split_dim
from models.kg import trak as kg_trak
from models.kg.checkpoint import KGBundle, load
from models.kg.tracin import OUTPUT_TABLE, ConvETracIn, per_example_grads
from models.kg.train import TrainConfig, train_conve
from models.kg.trak import (
    GradientProjector,
    dense_gradients,
    parameter_shapes,
    reference_trak_scores,
    self_scores,
    tracin_projected_scores,
    trak_scores,
)
from models.kg.triples import load_nations


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> KGBundle:
    """A tiny ConvE (dim 8) trained 2 epochs on Nations, a checkpoint each epoch (real BatchNorm statistics)."""
    out = tmp_path_factory.mktemp("conve")
    cfg = TrainConfig(epochs=2, batch_size=256, lr=0.01, embedding_dim=8, embedding_height=2, num_filters=2,
                      checkpoint_every=1, seed=1)
    train_conve(load_nations(), cfg, out, device="cpu")
    return load(out, "cpu")


LAYERS = ["all", "last", ["ent.weight"], [OUTPUT_TABLE, "rel.weight"], ["conv", "bn0", "bn1", "bn2"],
          ["ent_bias", "fc.bias"]]


@pytest.mark.parametrize("layers", LAYERS, ids=str)
def test_scores_equal_the_dense_reference(bundle, layers):
    ds = bundle.dataset
    test, train = ds.test[:2], ds.train[:16]
    fast = trak_scores(bundle, "all", test, train, layers=layers, proj_dim=12, seed=3, dtype=torch.float64)
    ref = reference_trak_scores(bundle, "all", test, train, layers=layers, proj_dim=12, seed=3)
    assert fast.shape == (2, 16)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-12 * float(ref.abs().max()))
    fast_self = self_scores(bundle, "all", train, layers=layers, proj_dim=12, seed=3, dtype=torch.float64)
    ref_self = reference_trak_scores(bundle, "all", test, train, layers=layers, proj_dim=12, seed=3,
                                     self_only=True)
    torch.testing.assert_close(fast_self, ref_self, rtol=1e-5, atol=1e-12 * float(ref_self.abs().max()))


@pytest.mark.parametrize("loss", ["score_bce", "margin"])
def test_other_loss_damping_and_one_checkpoint_equal_the_reference(bundle, loss):
    ds = bundle.dataset
    test, train = ds.test[:2], ds.train[:14]
    ck = [bundle.checkpoints[1].name]
    kw = dict(layers="all", proj_dim=10, seed=5, damping=0.3, loss=loss)
    fast = trak_scores(bundle, ck, test, train, dtype=torch.float64, **kw)
    ref = reference_trak_scores(bundle, ck, test, train, **kw)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-12 * float(ref.abs().max()))
    # the two checkpoints differ: averaging over both is not either alone
    both = trak_scores(bundle, "all", test, train, dtype=torch.float64, **kw)
    assert float((both - fast).abs().max()) > 1e-3 * float(fast.abs().max())


def test_margin_loss_is_the_negated_output_the_lds_measures(bundle):
    """``loss="margin"`` differentiates exactly the quantity an evaluation's subset models report
    (``models.kg.evaluation.margins``), negated; on the tail query alone."""
    import copy

    from models.kg.evaluation import margins

    model = copy.deepcopy(bundle.model).double().eval()
    triples = bundle.dataset.test[:20]
    with torch.no_grad():
        logits = model(triples[:, 0], triples[:, 1])
    ours = kg_trak._loss(logits, triples[:, 2], 0.1, "margin")
    torch.testing.assert_close(ours, -torch.as_tensor(margins(model, triples)), rtol=1e-12, atol=1e-12)


def test_dense_gradients_equal_tracin_per_example_grads(bundle):
    """The reference's own gradients against TracIn's (a separate loss implementation), in float32."""
    names = ("ent.weight", "rel.weight", "conv.weight", "fc.weight", "ent_bias")
    trip = bundle.dataset.train[:6]
    ours = dense_gradients(bundle.model, trip, names)
    theirs = per_example_grads(bundle.model, trip, names)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7)


def test_projection_is_deterministic_by_seed_and_chunked(bundle, monkeypatch):
    a = projection_factor(7, "fc.weight", "L", 10, 4)
    assert torch.equal(a, projection_factor(7, "fc.weight", "L", 10, 4))
    assert not torch.equal(a, projection_factor(8, "fc.weight", "L", 10, 4))
    assert not torch.equal(a, projection_factor(7, "fc.weight", "R", 10, 4))
    assert not torch.equal(a, projection_factor(7, "fc.bias", "L", 10, 4))
    # rows come from per-chunk generators: shrinking the chunk changes rows past the first chunk only
    monkeypatch.setattr(trak, "PROJ_CHUNK", 3)
    b = projection_factor(7, "fc.weight", "L", 10, 4)
    gen = torch.Generator().manual_seed(trak._seed_of(7, "fc.weight", "L", 1))
    assert torch.equal(b[3:6], torch.randn(3, 4, generator=gen, dtype=torch.float64).float())
    assert not torch.equal(a, b)
    monkeypatch.undo()
    train = bundle.dataset.train[:20]
    s1 = trak_scores(bundle, "all", train[:2], train, proj_dim=9, seed=1)
    assert torch.equal(s1, trak_scores(bundle, "all", train[:2], train, proj_dim=9, seed=1))
    assert not torch.allclose(s1, trak_scores(bundle, "all", train[:2], train, proj_dim=9, seed=2))


def test_projection_matrix_is_unbiased_kronecker(bundle):
    """E[P Pᵀ] = I: the mean of P Pᵀ over many seeds approaches the identity (a wrong scale cannot pass)."""
    names = ("fc.bias", "bn2.weight")
    shapes = parameter_shapes(bundle.model, names)
    acc = sum(projection_matrix(shapes, 16, s) @ projection_matrix(shapes, 16, s).t() for s in range(300)) / 300
    eye = torch.eye(acc.shape[0], dtype=acc.dtype)
    assert float(torch.diagonal(acc).mean()) == pytest.approx(1.0, abs=0.05)
    assert float((acc - eye).abs().max()) < 0.35
    assert split_dim(12) == (3, 4) and split_dim(256) == (16, 16) and split_dim(13) == (1, 13)


def test_projected_tracin_approaches_exact_tracin(bundle):
    ds = bundle.dataset
    test, train = ds.test[:3], ds.train[:30]
    exact, _ = ConvETracIn(bundle.model, bundle.checkpoints, layers="last").influence(test, train)
    errs = []
    for k in (16, 1024):
        approx = tracin_projected_scores(bundle, "all", test, train, layers="last", proj_dim=k, seed=0)
        errs.append(float((approx - exact).abs().max() / exact.abs().max()))
    assert errs[1] < errs[0] and errs[1] < 0.25


def test_projector_features_are_the_projected_gradients(bundle):
    """φ = Pᵀ∇ℓ for one checkpoint, checked directly (no inverse in between)."""
    ck = bundle.checkpoints[0]
    proj = GradientProjector(bundle.model, "all", proj_dim=6, seed=2, dtype=torch.float64)
    proj.load(ck)
    trip = bundle.dataset.train[:5]
    model = proj._work
    P = projection_matrix(parameter_shapes(model, proj.names), 6, 2)
    torch.testing.assert_close(proj.features(trip), dense_gradients(model, trip, proj.names) @ P, rtol=1e-9,
                               atol=1e-14)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"proj_dim": 0}, "proj_dim"), ({"proj_dim": 10**6}, "proj_dim"), ({"damping": 0.0}, "damping"),
    ({"damping": float("nan")}, "damping"), ({"loss": "mse"}, "loss"), ({"layers": ["nope"]}, "unknown layer"),
])
def test_bad_options_raise(bundle, kwargs, match):
    t = bundle.dataset.train[:3]
    with pytest.raises(ValueError, match=match):
        trak_scores(bundle, "all", t, t, **kwargs)


def test_bad_shapes_raise(bundle):
    t = bundle.dataset.train[:3]
    with pytest.raises(ValueError, match="test must be"):
        trak_scores(bundle, "all", t[:, :2], t)
    with pytest.raises(ValueError, match="train must be"):
        self_scores(bundle, "all", t[0])


def test_non_reciprocal_model_and_memory_checkpoints_equal_the_reference(bundle):
    """One query per triple (no inverse relations), with BatchNorm statistics away from their defaults."""
    from models.explain.tracin import MemoryCheckpoint
    from models.kg.conve import ConvE, ConvEConfig

    torch.manual_seed(3)
    ds = bundle.dataset
    model = ConvE(ConvEConfig(len(ds.entities), len(ds.relations), 8, 2, 2, reciprocal=False)).eval()
    states = []
    for s in range(2):
        state = {k: v.clone() for k, v in model.state_dict().items()}
        for k in state:
            if k.endswith("running_var"):
                state[k] = state[k] + 0.5 * (s + 1)
            elif k.endswith("running_mean"):
                state[k] = state[k] + 0.1 * (s + 1)
        states.append(MemoryCheckpoint(state, lr=0.01, label=f"c{s}"))
    b = KGBundle(model, ds, states, bundle.path)
    test, train = ds.test[:2], ds.train[:12]
    fast = trak_scores(b, "all", test, train, proj_dim=8, seed=1, dtype=torch.float64)
    ref = reference_trak_scores(b, "all", test, train, proj_dim=8, seed=1)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-12 * float(ref.abs().max()))
