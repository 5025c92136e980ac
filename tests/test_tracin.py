"""TracIn-CP on ConvE: Captum oracle, ghost vs materialised gradients, symmetry, self-influence, projection."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from models.common import NonFiniteError
from models.explain.tracin import MemoryCheckpoint, interval_weights
from models.kg.checkpoint import KGBundle, load
from models.kg.conve import triple_loss
from models.kg.influence import tracin_report
from models.kg.tracin import (
    OUTPUT_TABLE,
    ConvETracIn,
    ghost_factors,
    ghost_kernel,
    per_example_grads,
    resolve_layers,
    tracin_precision,
)
from models.kg.train import TrainConfig, train_conve
from models.kg.triples import load_nations
from tests.captum_oracle import captum_tracincp


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> KGBundle:
    """A tiny ConvE (dim 20) trained 3 epochs on Nations with a checkpoint every epoch (real BN statistics)."""
    out = tmp_path_factory.mktemp("conve")
    cfg = TrainConfig(epochs=3, batch_size=256, lr=0.01, embedding_dim=20, embedding_height=4, num_filters=4,
                      checkpoint_every=1, seed=1)
    train_conve(load_nations(), cfg, out, device="cpu")
    b = load(out, "cpu")
    # distinct learning rates per checkpoint, so a wrong weighting cannot pass
    for c, lr in zip(b.checkpoints, (0.01, 0.004, 0.002), strict=True):
        c.lr = lr
    return b


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize(("captum_layers", "ours", "kind"), [
    (None, "all", "train"),
    (["model.fc", "model.conv"], ["fc", "conv"], "score_bce"),
])
def test_equals_captum_tracincp(bundle, captum_layers, ours, kind):
    ds = bundle.dataset
    test, train = ds.test[:4], ds.train[:48]
    tracin = captum_tracincp(bundle, train, layers=captum_layers, loss=kind)
    ref = tracin.influence((test, test), k=None)
    ref_self = tracin.self_influence(outer_loop_by_checkpoints=True)
    engine = ConvETracIn(bundle.model, bundle.checkpoints, layers=ours, loss=kind, batch_size=20)
    scores, _ = engine.influence(test, train)
    assert scores.shape == ref.shape
    assert _rel(scores, ref) <= 1e-4
    assert _rel(engine.self_influence(train), ref_self) <= 1e-4
    # a single checkpoint's lr weighting, checked separately: dropping one checkpoint must change the scores
    partial, _ = ConvETracIn(bundle.model, bundle.checkpoints[:2], layers=ours, loss=kind).influence(test, train)
    assert _rel(partial, ref) > 1e-3


LAYER_SETS = ["all", "last", ["ent.weight"], ["rel.weight", "ent_bias"], ["conv", "bn0", "bn1"],
              ["bn2", "fc.bias"], [OUTPUT_TABLE]]


@pytest.mark.parametrize("layers", LAYER_SETS, ids=str)
@pytest.mark.parametrize("kind", ["train", "score_bce", "margin"])
def test_ghost_equals_materialised_gradients(bundle, layers, kind):
    ds = bundle.dataset
    test, train = ds.test[:5], ds.train[:37]
    ghost = ConvETracIn(bundle.model, bundle.checkpoints, layers=layers, loss=kind, method="ghost", batch_size=16)
    ref = ConvETracIn(bundle.model, bundle.checkpoints, layers=layers, loss=kind, method="vmap", batch_size=16)
    s_g, t_g, tr_g = ghost.influence(test, train, train_self=True)
    s_r, t_r, tr_r = ref.influence(test, train, train_self=True)
    assert _rel(s_g, s_r) <= 1e-4
    assert _rel(t_g, t_r) <= 1e-4
    assert _rel(tr_g, tr_r) <= 1e-4
    assert _rel(ghost.self_influence(train), ref.self_influence(train)) <= 1e-4


def test_last_equals_explicit_loop_of_output_layer_gradients(bundle):
    """``last`` = fc + entity table in its output role; checked against one backward per triple."""
    model = bundle.model
    ds = bundle.dataset
    test, train = ds.test[:3], ds.train[:10]
    ckpt = bundle.checkpoints[-1]
    model.load_state_dict(ckpt.state_dict())
    model.eval()

    def grads(triples: torch.Tensor) -> torch.Tensor:
        rows = []
        for trip in triples:
            out_w = model.ent.weight.detach().clone().requires_grad_(True)
            loss = triple_loss(model, trip[None], "train", out_weight=out_w).sum()
            g = torch.autograd.grad(loss, [model.fc.weight, model.fc.bias, out_w])
            rows.append(torch.cat([x.flatten() for x in g]))
        return torch.stack(rows)

    explicit = ckpt.lr * grads(test) @ grads(train).t()
    fast, _ = ConvETracIn(model, [ckpt], layers="last").influence(test, train)
    assert _rel(fast, explicit) <= 1e-4
    mat = per_example_grads(model, train, resolve_layers(model, "last"))
    assert _rel(mat, grads(train)) <= 1e-5


def test_symmetry_and_self_influence(bundle):
    ds = bundle.dataset
    a, b = ds.train[:12], ds.valid[:9]
    engine = ConvETracIn(bundle.model, bundle.checkpoints, layers="all")
    ab, a_self, b_self = engine.influence(a, b, train_self=True)
    ba, _ = engine.influence(b, a)
    assert _rel(ab, ba.t()) <= 1e-5
    aa, _ = engine.influence(a, a)
    si = engine.self_influence(a)
    assert _rel(torch.diagonal(aa), si) <= 1e-5
    assert _rel(a_self, si) <= 1e-5 and _rel(b_self, engine.self_influence(b)) <= 1e-5
    assert (si > 0).all()


def test_projection_is_seeded_and_converges(bundle):
    ds = bundle.dataset
    test, train = ds.test[:6], ds.train[:64]
    exact, _ = ConvETracIn(bundle.model, bundle.checkpoints, layers=["fc.weight"]).influence(test, train)
    flat = bundle.model.config.flat_dim
    errs = []
    for k in (4, flat - 1):
        p1, _ = ConvETracIn(bundle.model, bundle.checkpoints, layers=["fc.weight"], projection_dim=k, seed=3) \
            .influence(test, train)
        p2, _ = ConvETracIn(bundle.model, bundle.checkpoints, layers=["fc.weight"], projection_dim=k, seed=3) \
            .influence(test, train)
        assert torch.equal(p1, p2)
        errs.append(_rel(p1, exact))
    assert errs[1] < errs[0]
    assert errs[1] < 0.5


def test_half_precision_forward_stays_close(bundle):
    ds = bundle.dataset
    test, train = ds.test[:4], ds.train[:40]
    exact, _ = ConvETracIn(bundle.model, bundle.checkpoints, layers="all").influence(test, train)
    half, _ = ConvETracIn(bundle.model, bundle.checkpoints, layers="all", precision="bf16").influence(test, train)
    assert half.dtype == torch.float32
    corr = torch.corrcoef(torch.stack([exact.flatten(), half.flatten()]))[0, 1]
    assert corr > 0.95


def test_auto_precision_is_fp32_on_cpu(bundle):
    assert ConvETracIn(bundle.model, bundle.checkpoints).precision == "fp32"


def test_auto_precision_is_fp32_on_cuda_too():
    # half precision is an explicit choice: unscaled fp16 and bf16 both moved single layers' influence by
    # percents (the test below); nothing on the GPU is touched to resolve this
    assert tracin_precision("auto", "cuda") == "fp32"
    assert tracin_precision("fp16", "cuda") == "fp16"


def _many_entity_conve(n: int = 3000):
    """A ConvE whose scores sit near the smoothed label 1/N, as a trained model's do: its per-triple gradients
    ∂ℓ/∂s are of order 1/N², below fp16's smallest subnormal (6e-8) for a few thousand entities."""
    from models.kg.conve import ConvE, ConvEConfig

    torch.manual_seed(0)
    model = ConvE(ConvEConfig(num_entities=n, num_relations=5, embedding_dim=16, embedding_height=4,
                              num_filters=4)).eval()
    with torch.no_grad():
        model.ent_bias.copy_(-math.log(n) + 0.5 * torch.randn(n))
    for p in model.parameters():
        p.requires_grad_(False)
    g = torch.Generator().manual_seed(1)
    q = torch.stack([torch.randint(0, n, (24,), generator=g), torch.randint(0, 10, (24,), generator=g),
                     torch.randint(0, n, (24,), generator=g)], 1)
    return model, q


@pytest.mark.parametrize("layers", [["rel.weight"], ["conv", "bn0", "bn1"], ["fc"], ["ent.weight"], "all"], ids=str)
def test_fp16_path_matches_fp32_on_many_entities(layers):
    """CPU fp16 autocast reproduces the GPU's fp16 underflow; the loss-scaled fp16 path must stay within fp16's
    rounding (11-bit mantissa, ~1e-3 after two factors) of fp32 on every layer group. Unscaled, rel.weight was
    4% off and conv 3% at N = 4,000."""
    model, q = _many_entity_conve()
    names = resolve_layers(model, layers)
    ref = ghost_factors(model, q, names, precision="fp32")
    half = ghost_factors(model, q, names, precision="fp16")
    k_ref, k_half = ghost_kernel(ref, ref, names), ghost_kernel(half, half, names)
    assert float((k_half - k_ref).norm() / k_ref.norm()) < 2e-3


def test_interval_weights_sum_the_epoch_rates():
    assert interval_weights([2, 3, 6], 0.1, 0.5) == pytest.approx([0.1 + 0.05, 0.025, 0.0125 + 0.00625 + 0.003125])
    assert interval_weights([1, 2], 0.01) == pytest.approx([0.01, 0.01])
    with pytest.raises(ValueError, match="increase"):
        interval_weights([2, 2], 0.1)


def test_report_records_the_weights_and_interval_weighting_scales_them(bundle):
    ds = bundle.dataset
    test = [list(t) for t in ds.decode(ds.test[:2])]
    ckpts = [bundle.checkpoints[0].name, bundle.checkpoints[2].name]  # epochs 1 and 3
    last, _ = tracin_report(bundle, test, mode="test", top_k=None, checkpoints=ckpts)
    inter, _ = tracin_report(bundle, test, mode="test", top_k=None, checkpoints=ckpts, lr_weight="interval")
    lr0 = bundle.training["lr"]
    assert [c["weight"] for c in last["checkpoints"]] == [c["lr"] for c in last["checkpoints"]]
    # the second selected checkpoint stands for epochs 2 and 3 (lr_decay 1: twice the rate)
    assert [c["weight"] for c in inter["checkpoints"]] == pytest.approx([lr0, 2 * lr0])
    assert inter["lr_weight"] == "interval" and last["lr_weight"] == "last"
    with pytest.raises(ValueError, match="lr_weight"):
        tracin_report(bundle, test, lr_weight="mean")


def test_non_finite_scores_fail_naming_the_triples(bundle):
    ds = bundle.dataset
    state = {k: v.clone() for k, v in bundle.checkpoints[-1].state_dict().items()}
    h = int(ds.test[0, 0])
    state["ent.weight"][h] = float("nan")  # every query with this head becomes NaN
    bad = MemoryCheckpoint(state, 0.01, "nan")
    broken = KGBundle(bundle.model, ds, [bad], bundle.path, bundle.training, bundle.metrics)
    bad.epoch = 1
    test = [list(t) for t in ds.decode(ds.test[:1])]
    with pytest.raises(NonFiniteError, match="non-finite") as err:
        tracin_report(broken, test, mode="test", top_k=3)
    assert tuple(test[0]) in [tuple(t) for t in err.value.items]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"layers": ["nope"]}, "unknown layer"),
    ({"layers": ["ent.weight", OUTPUT_TABLE]}, "output role"),
    ({"loss": "mse"}, "loss"),
    ({"method": "loop"}, "method"),
    ({"projection_dim": 0}, "projection_dim"),
    ({"method": "vmap", "precision": "bf16"}, "fp32"),
])
def test_bad_options_raise(bundle, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ConvETracIn(bundle.model, bundle.checkpoints, **kwargs)


def test_checkpoint_files_carry_epoch_and_lr(bundle):
    from models.kg.checkpoint import read_checkpoint_info

    infos = [read_checkpoint_info(Path(c.path)) for c in bundle.checkpoints]
    assert [i.epoch for i in infos] == [1, 2, 3]
    assert all(i.lr == pytest.approx(0.01) for i in infos)


def test_non_reciprocal_model_ghost_equals_vmap():
    from models.kg.conve import ConvE, ConvEConfig

    torch.manual_seed(0)
    ds = load_nations()
    model = ConvE(ConvEConfig(len(ds.entities), len(ds.relations), embedding_dim=12, embedding_height=3,
                              num_filters=3, reciprocal=False)).eval()
    for bn in (model.bn0, model.bn1, model.bn2):  # non-trivial eval statistics
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    ckpts = [MemoryCheckpoint({k: v.clone() for k, v in model.state_dict().items()}, 0.1, "only")]
    test, train = ds.test[:4], ds.train[:30]
    for layers in ("all", "last"):
        ghost, g_self = ConvETracIn(model, ckpts, layers=layers).influence(test, train)
        ref, r_self = ConvETracIn(model, ckpts, layers=layers, method="vmap").influence(test, train)
        assert _rel(ghost, ref) <= 1e-4 and _rel(g_self, r_self) <= 1e-4


def _ranked_reference(row: torch.Tensor, k: int | None, positive: bool) -> list[int]:
    """Columns of the positive (negative) entries of a dense score row, strongest first, stable in column order."""
    cols = [j for j in range(len(row)) if (row[j] > 0 if positive else row[j] < 0)]
    cols.sort(key=lambda j: (-float(row[j]) if positive else float(row[j]), j))
    return cols if k is None else cols[:k]


@pytest.mark.parametrize(("method", "layers", "batch_size", "test_block"), [
    ("ghost", "all", 37, None),
    ("ghost", "all", 64, 2),      # several test blocks
    ("ghost", "last", 500, 3),
    ("vmap", ["fc", "ent_bias"], 50, 2),
])
def test_streaming_top_k_equals_the_dense_scores(bundle, method, layers, batch_size, test_block):
    """The bounded-memory pass (training chunks outer, checkpoints inner, running top-k) gives element-wise the
    dense matrix's top-k, its counts and self-influences, with and without per-row candidate sets."""
    from models.explain.tracin import CandidatePairs

    ds = bundle.dataset
    test, train = ds.test[:5], ds.train[:300]
    engine = ConvETracIn(bundle.model, bundle.checkpoints, layers=layers, method=method, batch_size=batch_size)
    scores, test_self, tr_self = engine.influence(test, train, train_self=True)
    gen = torch.Generator().manual_seed(3)
    per_row = [torch.nonzero(torch.rand(len(train), generator=gen) < 0.4).flatten() for _ in range(len(test))]
    for cand in (None, CandidatePairs.from_columns(per_row, len(train))):
        dense = torch.full((len(test), len(train)), -7.0).numpy()
        top = engine.top_influence(test, train, 4, candidates=cand, test_block=test_block, dense=dense)
        torch.testing.assert_close(top.test_self, test_self, rtol=1e-5, atol=1e-9)
        for i in range(len(test)):
            cols = torch.arange(len(train)) if cand is None else per_row[i]
            row = torch.full((len(train),), float("nan"))
            row[cols] = scores[i, cols]
            torch.testing.assert_close(torch.from_numpy(dense[i]), row, rtol=1e-5, atol=1e-9, equal_nan=True)
            s = scores[i]
            assert int(top.n_candidates[i]) == len(cols)
            assert int(top.n_positive[i]) == int((s[cols] > 0).sum())
            assert int(top.n_negative[i]) == int((s[cols] < 0).sum())
            for positive in (True, False):
                masked = torch.zeros(len(train))
                masked[cols] = s[cols]
                want = _ranked_reference(masked, 4, positive)
                got = top.listed(i, positive)
                assert [g[0] for g in got] == want
                torch.testing.assert_close(torch.tensor([g[1] for g in got]), s[want], rtol=1e-5, atol=1e-9)
                torch.testing.assert_close(torch.tensor([g[2] for g in got]), tr_self[want], rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("method", ["ghost", "vmap"])
def test_test_factors_are_reused_across_train_ranges_and_give_the_same_scores(bundle, method, monkeypatch):
    """Shards of one request score different training ranges against the same test triples: with a
    ``test_cache`` the test factors are computed once, and every range's result equals the uncached one."""
    ds = bundle.dataset
    test, train = ds.test[:5], ds.train[:240]
    layers = "all" if method == "ghost" else ["fc", "ent_bias"]
    engine = ConvETracIn(bundle.model, bundle.checkpoints, layers=layers, method=method, batch_size=40)
    calls: list[int] = []
    real = engine._features

    def counting(triples, model=None):
        calls.append(len(triples))
        return real(triples, model)

    monkeypatch.setattr(engine, "_features", counting)
    cache: dict = {}
    n_ck = len(bundle.checkpoints)
    for lo, hi in ((0, 120), (120, 240)):
        calls.clear()
        cached = engine.top_influence(test, train[lo:hi], 4, test_cache=cache)
        test_calls = calls.count(len(test))
        assert test_calls == (n_ck if lo == 0 else 0)  # computed for the first range only
        plain = engine.top_influence(test, train[lo:hi], 4)
        for name in ("test_self", "n_candidates", "n_positive", "n_negative", "pro_idx", "opp_idx"):
            torch.testing.assert_close(getattr(cached, name), getattr(plain, name), rtol=0, atol=0)
        for name in ("pro_val", "opp_val", "pro_self", "opp_self"):
            torch.testing.assert_close(getattr(cached, name), getattr(plain, name), rtol=1e-6, atol=0)
    # other test triples are not served from the cache
    calls.clear()
    engine.top_influence(ds.test[5:10], train[:40], 4, test_cache=cache)
    assert calls.count(5) == n_ck  # their own factors, one per checkpoint


def test_streaming_top_k_keeps_column_order_among_ties():
    from models.explain.tracin import _merge_top

    neg = float("-inf")
    vals, idx, slf = torch.full((1, 3), neg), torch.full((1, 3), -1), torch.zeros(1, 3)
    for start in (0, 4):  # two chunks of four columns with equal values across them
        new = torch.tensor([[1.0, 2.0, 2.0, neg]])
        cols = torch.arange(start, start + 4)[None]
        vals, idx, slf = _merge_top(vals, idx, slf, new, cols, cols.float(), 3)
    assert idx.tolist() == [[1, 2, 5]] and vals.tolist() == [[2.0, 2.0, 2.0]]


def test_fp16_on_cpu_runs_fp32_and_says_so(bundle):
    """fp16 on a CPU is never silently unscaled bf16: it runs fp32 and the result's warnings record it."""
    from models.kg.influence import plan

    engine = ConvETracIn(bundle.model, bundle.checkpoints, precision="fp16", device="cpu")
    assert engine.precision == "fp32" and engine.requested_precision == "fp16"
    assert len(engine.warnings) == 1 and "fp16" in engine.warnings[0] and "fp32" in engine.warnings[0]
    assert tracin_precision("fp16", "cpu") == "fp32" and tracin_precision("bf16", "cpu") == "bf16"
    assert ConvETracIn(bundle.model, bundle.checkpoints, precision="bf16").warnings == []
    ds = bundle.dataset
    p = plan(bundle, ds.decode(ds.test[:1]), precision="fp16", device="cpu")
    assert p.settings["precision"] == "fp32" and p.settings["requested_precision"] == "fp16"
    assert p.settings["warnings"] == engine.warnings


@pytest.mark.parametrize("other", [{"layers": ["fc"]}, {"checkpoints": 1}, {"loss": "score_bce"},
                                   {"projection_dim": 8}], ids=str)
def test_cached_test_factors_are_not_shared_across_settings(bundle, other):
    """Two requests with the same test triples but other layers, checkpoints, loss or projection must not
    share cached test factors: each result equals its own uncached one."""
    ds = bundle.dataset
    test, train = ds.test[:5], ds.train[:80]
    kwargs = dict(other)
    ckpts = bundle.checkpoints[:kwargs.pop("checkpoints")] if "checkpoints" in kwargs else bundle.checkpoints
    first = ConvETracIn(bundle.model, bundle.checkpoints, layers="all", batch_size=40)
    second = ConvETracIn(bundle.model, ckpts, **{"layers": "all", "batch_size": 40, **kwargs})
    cache: dict = {}
    first.top_influence(test, train, 4, test_cache=cache)
    cached = second.top_influence(test, train, 4, test_cache=cache)
    plain = second.top_influence(test, train, 4)
    for name in ("test_self", "pro_idx", "opp_idx"):
        torch.testing.assert_close(getattr(cached, name), getattr(plain, name), rtol=1e-6, atol=0)
    # the same settings in a new engine (another shard of the same request) still share them
    again = ConvETracIn(bundle.model, ckpts, **{"layers": "all", "batch_size": 40, **kwargs})
    assert again.factor_key() == second.factor_key() != first.factor_key()


def test_default_loss_gives_proponents_and_opponents(bundle):
    """The request's default loss is 'score_bce' (the stored-feature estimators take featurize's 'margin'), and on a
    small trained ConvE it yields both signs, where the training loss gives (almost) no opponents."""
    from core.kinds.tracin import DEFAULT_LOSS, TracInRequest

    req = TracInRequest(model="m", test_triples=[["a", "b", "c"]])
    assert req.loss == DEFAULT_LOSS == "score_bce"
    assert TracInRequest(model="m", test_triples=[["a", "b", "c"]], estimator="trak").loss == "margin"
    assert TracInRequest(model="m", test_triples=[["a", "b", "c"]], estimator="trak", loss="score_bce").loss \
        == "score_bce"
    # the dashboard's form sends every field, an empty loss as null: the same defaults
    assert TracInRequest(model="m", test_triples=[["a", "b", "c"]], loss=None).loss == "score_bce"
    assert TracInRequest(model="m", test_triples=[["a", "b", "c"]], estimator="trak", loss=None).loss == "margin"
    ds = bundle.dataset
    test, train = ds.test[:4], ds.train[:120]
    scores, _ = ConvETracIn(bundle.model, bundle.checkpoints, loss=req.loss).influence(test, train)
    assert (scores > 0).any() and (scores < 0).any()
    assert ((scores < 0).any(1)).float().mean() >= 0.5  # most test triples have opponents to list
