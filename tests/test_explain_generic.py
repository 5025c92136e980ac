"""The model-agnostic methods of ``models/explain`` on a model that is not ConvE, against dense computations written
here, and ConvE's fast paths against the generic ones on the same ConvE.

- TracIn-CP (:class:`models.explain.tracin.TracIn` with :class:`models.explain.tracin.FuncGradients`) on a small MLP
  classifier: scores, self-influence and the streaming top-k equal explicit per-example gradients (one
  ``torch.autograd.grad`` per example) multiplied out, in float64.
- TRAK (:class:`models.explain.trak.FuncProjector` and the ``projected_*`` scores) equal the explicit projection
  matrix (:func:`models.explain.trak.projection_matrix`) times those gradients with an explicit inverse; the feature
  store (:mod:`models.explain.features`) answers the same through a :class:`~models.explain.features.FeatureSource`
  written here.
- ConvE's ghost factors and its factored projector equal the generic ``torch.func`` paths on the same ConvE.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from models.explain import features as FS
from models.explain.gradients import per_example_gradients, resolve_parameters
from models.explain.tracin import CandidatePairs, FuncGradients, MemoryCheckpoint, TracIn
from models.explain.trak import (
    FuncProjector,
    Projector,
    projected_self_scores,
    projected_tracin_scores,
    projected_trak_scores,
    projection_matrix,
)

N_IN, N_HIDDEN, N_CLASSES = 5, 7, 3


# ------------------------------------------------------------------------------------------- a tiny classifier
def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(N_IN, N_HIDDEN), nn.Tanh(), nn.Linear(N_HIDDEN, N_CLASSES)).double()


def _data(n: int, seed: int) -> torch.Tensor:
    """``[n, N_IN + N_CLASSES]``: features, then the one-hot label (one example per row, float64)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, N_IN, generator=g, dtype=torch.float64)
    y = torch.randint(0, N_CLASSES, (n,), generator=g)
    return torch.cat([x, F.one_hot(y, N_CLASSES).double()], 1)


def mlp_loss(forward: Any, example: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of one example (the generic :data:`LossFn` form)."""
    x, onehot = example[:N_IN], example[N_IN:]
    return -(torch.log_softmax(forward(x[None])[0], -1) * onehot).sum()


@pytest.fixture(scope="module")
def mlp() -> tuple[nn.Module, list[MemoryCheckpoint]]:
    """An MLP and three checkpoints of different weights and learning rates."""
    torch.manual_seed(0)
    model = _mlp().eval()
    ckpts = []
    for i, lr in enumerate((0.1, 0.05, 0.02)):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.3 * torch.randn_like(p))
        ckpts.append(MemoryCheckpoint({k: v.clone() for k, v in model.state_dict().items()}, lr, f"c{i}"))
    return model, ckpts


def _explicit_grads(model: nn.Module, state: dict, examples: torch.Tensor, names: tuple[str, ...]) -> torch.Tensor:
    """``[n, P]``: one backward pass per example on a fresh copy of the model (the plain way)."""
    m = _mlp()
    m.load_state_dict(state)
    params = [m.get_parameter(n) for n in names]
    rows = []
    for ex in examples:
        loss = -(torch.log_softmax(m(ex[None, :N_IN])[0], -1) * ex[N_IN:]).sum()
        rows.append(torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)]))
    return torch.stack(rows)


@pytest.mark.parametrize("layers", ["all", ["2"], ["0.weight", "2.bias"]], ids=str)
def test_generic_tracin_equals_explicit_gradients(mlp, layers):
    model, ckpts = mlp
    test, train = _data(4, 1), _data(23, 2)
    engine = TracIn(FuncGradients(model, mlp_loss, layers), ckpts, batch_size=5)
    names = resolve_parameters(model, layers)
    assert engine.names == names and engine.dtype == torch.float64
    want = sum(c.lr * _explicit_grads(model, c.state, test, names) @ _explicit_grads(model, c.state, train, names).t()
               for c in ckpts)
    want_test_self = sum(c.lr * _explicit_grads(model, c.state, test, names).pow(2).sum(1) for c in ckpts)
    want_train_self = sum(c.lr * _explicit_grads(model, c.state, train, names).pow(2).sum(1) for c in ckpts)
    scores, test_self, train_self = engine.influence(test, train, train_self=True)
    assert scores.dtype == torch.float64
    torch.testing.assert_close(scores, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(test_self, want_test_self, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(train_self, want_train_self, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(engine.self_influence(train), want_train_self, rtol=1e-10, atol=1e-12)
    # the streaming pass (candidates, several test blocks, training chunks) ranks exactly the dense scores
    gen = torch.Generator().manual_seed(5)
    per_row = [torch.nonzero(torch.rand(len(train), generator=gen) < 0.6).flatten() for _ in range(len(test))]
    top = engine.top_influence(test, train, 3, candidates=CandidatePairs.from_columns(per_row, len(train)),
                               test_block=3)
    torch.testing.assert_close(top.test_self, want_test_self, rtol=1e-10, atol=1e-12)
    for i, cols in enumerate(per_row):
        row = want[i, cols]
        for positive in (True, False):
            sel = cols[row > 0] if positive else cols[row < 0]
            ranked = sorted(sel.tolist(), key=lambda j: (-float(want[i, j]) if positive else float(want[i, j]), j))
            got = top.listed(i, positive)
            assert [g[0] for g in got] == ranked[:3]
            for j, value, self_inf in got:
                assert value == pytest.approx(float(want[i, j]), rel=1e-10)
                assert self_inf == pytest.approx(float(want_train_self[j]), rel=1e-10)


def test_generic_gradients_and_layers(mlp):
    model, ckpts = mlp
    ex = _data(6, 3)
    names = resolve_parameters(model, "all")
    assert names == ("0.weight", "0.bias", "2.weight", "2.bias")
    assert resolve_parameters(model, ["2", "0.bias"]) == ("2.weight", "2.bias", "0.bias")
    with pytest.raises(ValueError, match="unknown layer"):
        resolve_parameters(model, ["3"])
    m = _mlp()
    m.load_state_dict(ckpts[1].state)
    torch.testing.assert_close(per_example_gradients(m, names, mlp_loss, ex),
                               _explicit_grads(model, ckpts[1].state, ex, names), rtol=1e-12, atol=1e-14)
    # factor_key follows the checkpoints and the weights, not the engine object
    a = TracIn(FuncGradients(model, mlp_loss), ckpts)
    assert a.factor_key() == TracIn(FuncGradients(model, mlp_loss), ckpts).factor_key()
    assert a.factor_key() != TracIn(FuncGradients(model, mlp_loss), ckpts[:2]).factor_key()
    assert a.factor_key() != TracIn(FuncGradients(model, mlp_loss), ckpts, weights=[1.0, 1.0, 1.0]).factor_key()


# ------------------------------------------------------------------------------------------- TRAK, generic
def _dense_trak(model, ckpts, test, train, names, k, seed, damping):
    """The explicit computation: φ = G P, (ΦᵀΦ + λI)⁻¹ by ``torch.linalg.inv``, averaged over checkpoints."""
    P = projection_matrix({n: tuple(model.get_parameter(n).shape) for n in names}, k, seed)
    scores, selfs, tracin = 0, 0, 0
    for c in ckpts:
        phi_tr = _explicit_grads(model, c.state, train, names) @ P
        phi_te = _explicit_grads(model, c.state, test, names) @ P
        gram = phi_tr.t() @ phi_tr
        inv = torch.linalg.inv(gram + damping * float(torch.trace(gram)) / k * torch.eye(k, dtype=torch.float64))
        scores = scores + phi_te @ inv @ phi_tr.t() / len(ckpts)
        selfs = selfs + torch.einsum("ik,kl,il->i", phi_tr, inv, phi_tr) / len(ckpts)
        tracin = tracin + c.lr * phi_te @ phi_tr.t()
    return scores, selfs, tracin, P


@pytest.mark.parametrize(("layers", "k"), [("all", 12), (["2.weight", "0.bias"], 7)], ids=str)
def test_generic_trak_equals_explicit_projection_and_inverse(mlp, layers, k):
    model, ckpts = mlp
    test, train = _data(3, 4), _data(30, 5)
    names = resolve_parameters(model, layers)
    want, want_self, want_tracin, P = _dense_trak(model, ckpts, test, train, names, k, 9, 0.05)
    proj = FuncProjector(model, mlp_loss, layers, proj_dim=k, seed=9, dtype=torch.float64, batch_size=8)
    assert isinstance(proj, Projector) and proj.names == names
    proj.load(ckpts[0])
    torch.testing.assert_close(proj.features(train), _explicit_grads(model, ckpts[0].state, train, names) @ P,
                               rtol=1e-10, atol=1e-13)
    torch.testing.assert_close(projected_trak_scores(proj, ckpts, test, train, 0.05), want, rtol=1e-8, atol=1e-12)
    torch.testing.assert_close(projected_self_scores(proj, ckpts, train, 0.05), want_self, rtol=1e-8, atol=1e-12)
    torch.testing.assert_close(projected_tracin_scores(proj, ckpts, test, train), want_tracin, rtol=1e-10,
                               atol=1e-13)


class _DirStore:
    """The file store's interface over a local directory (what the feature store needs of it)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def exists(self, key: str) -> bool:
        return (self.root / key).exists()

    def list_dirs(self, prefix: str) -> list[str]:
        d = self.root / prefix
        return sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []

    def read_bytes(self, key: str) -> bytes:
        return (self.root / key).read_bytes()

    def put_dir(self, src: Path, key: str) -> None:
        shutil.copytree(src, self.root / key)

    def local_dir(self, key: str) -> Path:
        return self.root / key


class _MLPFeatures(FS.FeatureSource):
    """The MLP as the feature store sees it: no ConvE anywhere."""

    losses = ("ce",)

    def __init__(self, model: nn.Module, ckpts: list[MemoryCheckpoint], train: torch.Tensor) -> None:
        self.model, self._ckpts, self._train = model, ckpts, train

    @property
    def checkpoints(self) -> list[MemoryCheckpoint]:
        return self._ckpts

    def checkpoint(self, name: str) -> MemoryCheckpoint:
        return next(c for c in self._ckpts if c.name == name)

    @property
    def examples(self) -> torch.Tensor:
        return self._train

    @property
    def config(self) -> dict[str, Any]:
        return {"in": N_IN, "hidden": N_HIDDEN, "classes": N_CLASSES}

    def resolve_layers(self, layers):
        return resolve_parameters(self.model, layers)

    def projector(self, layers, loss, proj_dim, seed, device, dtype, batch_size) -> Projector:
        return FuncProjector(self.model, mlp_loss, layers, proj_dim, seed, device, dtype, batch_size)


def test_feature_store_takes_any_family(mlp, tmp_path, monkeypatch):
    model, ckpts = mlp
    train, test = _data(50, 6), _data(2, 7)
    source = _MLPFeatures(model, ckpts, train)
    store = _DirStore(tmp_path)
    monkeypatch.setattr(FS, "segment_rows", lambda k: 20)
    rep = FS.featurize(store, source, "all", loss="ce", proj_dim=6, seed=2)
    assert rep["rows_computed"] == 3 * 50 and rep["layers"] == list(resolve_parameters(model, "all"))
    assert FS.featurize(store, source, "all", loss="ce", proj_dim=6, seed=2)["rows_computed"] == 0
    # float examples are digested as they are: one changed feature value recomputes from its segment on
    changed = train.clone()
    changed[45, 0] += 1e-9
    again = FS.featurize(store, source, [ckpts[0]], train=changed, loss="ce", proj_dim=6, seed=2)
    assert again["checkpoints"][0]["reused"] == 40 and again["checkpoints"][0]["computed"] == 10
    index = FS.FeatureIndex(store, source, "all", loss="ce", proj_dim=6, seed=2)
    proj = FuncProjector(model, mlp_loss, "all", 6, 2, dtype=torch.float32)
    direct = projected_trak_scores(proj, ckpts, test, train)
    torch.testing.assert_close(index.scores(index.queries(test, "trak"), tile_rows=17), direct, rtol=1e-4,
                               atol=1e-6 * float(direct.abs().max()))
    # the key holds the source's configuration
    fs = FS.settings_for(source, "all", "ce", 6, 2)
    key = rep["checkpoints"][0]["key"]
    assert fs.key(source.config, FS.weights_digest(ckpts[0])) == key
    segment = store.list_dirs(f"features/{key}")[0]
    assert json.loads(store.read_bytes(f"features/{key}/{segment}/meta.json"))["loss"] == "ce"
    with pytest.raises(ValueError, match="loss must be one of"):
        FS.settings_for(source, "all", "train", 6, 2)


# ------------------------------------------------------------------------------------------- ConvE: fast = generic
@pytest.fixture(scope="module")
def conve():
    """A small random ConvE with BatchNorm statistics away from their defaults, two checkpoints, random triples."""
    from models.kg.conve import ConvE, ConvEConfig

    torch.manual_seed(1)
    model = ConvE(ConvEConfig(num_entities=23, num_relations=4, embedding_dim=8, embedding_height=2,
                              num_filters=2)).eval()
    ckpts = []
    for i, lr in enumerate((0.01, 0.004)):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.2 * torch.randn_like(p))
            for bn in (model.bn0, model.bn1, model.bn2):
                bn.running_mean.uniform_(-0.5, 0.5)
                bn.running_var.uniform_(0.5, 2.0)
        ckpts.append(MemoryCheckpoint({k: v.clone() for k, v in model.state_dict().items()}, lr, f"c{i}"))
    g = torch.Generator().manual_seed(2)
    triples = torch.stack([torch.randint(0, 23, (40,), generator=g), torch.randint(0, 4, (40,), generator=g),
                           torch.randint(0, 23, (40,), generator=g)], 1)
    return model, ckpts, triples


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("loss", ["train", "score_bce"])
@pytest.mark.parametrize("layers", ["all", ["fc", "ent_bias"], ["ent.weight", "rel.weight"], ["conv", "bn0", "bn1"]],
                         ids=str)
def test_conve_ghost_equals_the_generic_path(conve, layers, loss):
    from models.kg.tracin import ConvETracIn
    from models.kg.trak import triple_loss_fn

    model, ckpts, triples = conve
    test, train = triples[:5], triples[5:]
    ghost = ConvETracIn(model, ckpts, layers=layers, loss=loss, batch_size=16)
    generic = TracIn(FuncGradients(model, triple_loss_fn(model.config, loss), layers), ckpts, batch_size=16)
    assert ghost.names == generic.names
    s_g, t_g, tr_g = ghost.influence(test, train, train_self=True)
    s_f, t_f, tr_f = generic.influence(test, train, train_self=True)
    torch.testing.assert_close(s_g, s_f, rtol=1e-5, atol=1e-5 * float(s_f.abs().max()))
    torch.testing.assert_close(t_g, t_f, rtol=1e-5, atol=1e-6 * float(t_f.abs().max()))
    torch.testing.assert_close(tr_g, tr_f, rtol=1e-5, atol=1e-6 * float(tr_f.abs().max()))
    torch.testing.assert_close(ghost.self_influence(train), generic.self_influence(train), rtol=1e-5,
                               atol=1e-6 * float(tr_f.abs().max()))
    # ConvE's own materialised path (method="vmap") is the generic one, parameter for parameter
    vmap, _ = ConvETracIn(model, ckpts, layers=layers, loss=loss, method="vmap").influence(test, train)
    assert _rel(vmap, s_f) <= 1e-6


@pytest.mark.parametrize("loss", ["train", "score_bce", "margin"])
@pytest.mark.parametrize("layers", ["all", ["fc", "conv", "ent_bias"], ["ent.weight", "bn2"]], ids=str)
def test_conve_projector_equals_the_generic_projector(conve, layers, loss):
    from models.kg.trak import GradientProjector, triple_loss_fn

    model, ckpts, triples = conve
    fast = GradientProjector(model, layers, loss, proj_dim=10, seed=4, dtype=torch.float64, batch_size=16)
    generic = FuncProjector(model, triple_loss_fn(model.config, loss), layers, proj_dim=10, seed=4,
                            dtype=torch.float64, batch_size=16)
    assert fast.names == generic.names
    for ck in ckpts:
        fast.load(ck)
        generic.load(ck)
        for name in fast.names:  # the same seeded factors, by parameter name
            for side in ("L", "R"):
                assert torch.equal(fast.factor(name, side), generic.factor(name, side))
        a, b = fast.features(triples), generic.features(triples)
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12 * float(b.abs().max()))
    test, train = triples[:4], triples[4:]
    torch.testing.assert_close(projected_trak_scores(fast, ckpts, test, train, 0.1),
                               projected_trak_scores(generic, ckpts, test, train, 0.1), rtol=1e-7, atol=1e-12)
    assert math.isfinite(float(projected_self_scores(generic, ckpts, train).sum()))
