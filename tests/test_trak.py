"""TRAK-style estimator on ConvE: element-wise equal to its dense float64 reference, seeded projection."""

from __future__ import annotations

import math

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


# ------------------------------------------------------------------------------------------- projection variance
VARIANCE_SEEDS = 600     # Monte Carlo draws of the projection
SHAPE = (48, 72)         # a rank-one gradient block's matrix view (an fc.weight of a tiny ConvE)
K = 64                   # k = k₁ · k₂ = 8 · 8


def _rank_one(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(SHAPE[0], generator=g, dtype=torch.float64), torch.randn(SHAPE[1], generator=g,
                                                                                dtype=torch.float64)


def _projected(projection: str, blocks: list[torch.Tensor]) -> torch.Tensor:
    """``[seeds, len(blocks), k]``: each block's projection under each seed's P (the explicit matrix)."""
    flat = torch.stack([b.reshape(-1) for b in blocks])
    return torch.stack([flat @ projection_matrix({"fc.weight": SHAPE}, K, s, projection=projection)
                        for s in range(VARIANCE_SEEDS)])


def _cos(u: torch.Tensor, v: torch.Tensor) -> float:
    return float(u @ v / (u.norm() * v.norm()))


@pytest.mark.parametrize("projection", ["kronecker", "dense"])
def test_projection_is_unbiased_with_the_stated_relative_standard_deviation(projection):
    """Monte Carlo over projection seeds on rank-one gradient blocks G = α βᵀ: the squared norm and a dot product
    of projected blocks average to the exact ones (unbiased, within 4 standard errors), and their relative standard
    deviation matches models/explain/trak.py's formula within 12% of itself (a sample of 600 estimates a standard
    deviation of these skewed ratios to about ±6%): √((1 + 2/k₁)(1 + 2/k₂) − 1) ≈ √(2/k₁ + 2/k₂) for the Kronecker
    projection (0.75 at k = 64; √(2/k) = 0.18 would fail), √(2/k) for the dense one."""
    (a1, b1), (a2, b2) = _rank_one(1), _rank_one(2)
    a2 = a2 + 2 * a1  # correlated with the first, so the dot product is far from 0
    b2 = b2 + 2 * b1
    g1, g2 = torch.outer(a1, b1), torch.outer(a2, b2)
    phi = _projected(projection, [g1, g2])
    k1, k2 = split_dim(K)
    ca, cb = _cos(a1, a2), _cos(b1, b2)
    if projection == "kronecker":
        norm_rel = math.sqrt((1 + 2 / k1) * (1 + 2 / k2) - 1)
        dot_rel = math.sqrt((1 + (1 + 1 / ca**2) / k1) * (1 + (1 + 1 / cb**2) / k2) - 1)
        assert norm_rel == pytest.approx(math.sqrt(2 / k1 + 2 / k2), rel=0.07)  # 4/k is small
        assert norm_rel > 3 * math.sqrt(2 / K)
    else:
        norm_rel = math.sqrt(2 / K)
        dot_rel = math.sqrt((1 + 1 / _cos(g1.reshape(-1), g2.reshape(-1)) ** 2) / K)
    norms = (phi[:, 0] ** 2).sum(1) / float((g1 ** 2).sum())
    dots = (phi[:, 0] * phi[:, 1]).sum(1) / float((g1 * g2).sum())
    for ratio, rel in ((norms, norm_rel), (dots, dot_rel)):
        assert float(ratio.mean()) == pytest.approx(1.0, abs=4 * rel / math.sqrt(VARIANCE_SEEDS))
        assert float(ratio.std()) == pytest.approx(rel, rel=0.12)


def test_a_dense_func_projector_is_the_gradients_times_the_dense_matrix_and_bounded():
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    x = torch.randn(6, 8, dtype=torch.float64)

    def loss(forward, example):
        return forward(example[None, :5])[0].pow(2).sum() * example[5:].sum()

    proj = trak.FuncProjector(model, loss, "all", proj_dim=7, seed=3, dtype=torch.float64, projection="dense")
    assert proj.projection == "dense" and trak.FuncProjector(model, loss, proj_dim=7).projection == "kronecker"
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    grads = torch.stack([torch.cat([g.reshape(-1) for g in torch.autograd.grad(
        loss(model, e), list(model.parameters()))]) for e in x])
    P = projection_matrix(shapes, 7, 3, projection="dense")
    assert not torch.allclose(P, projection_matrix(shapes, 7, 3))
    torch.testing.assert_close(proj.features(x), grads @ P, rtol=1e-10, atol=1e-13)
    with pytest.raises(ValueError, match="projection must be one of"):
        trak.FuncProjector(model, loss, projection="sjlt")
    with pytest.raises(ValueError, match="projection 'dense' needs"):
        projection_matrix({"w": (1 << 20, 1 << 6)}, 2, 0, projection="dense")
