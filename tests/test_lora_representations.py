"""Representations: exact ΔW spectra, low-rank/full SVD agreement, oracles, batching."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.lora import representations as R
from models.lora.data import LayerFactors
from models.lora.features import layer_features


def _factors(b: int, r: int, out_f: int, in_f: int, seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    down = torch.randn(b, r, in_f, generator=g, dtype=dtype) / in_f**0.5
    up = torch.randn(b, out_f, r, generator=g, dtype=dtype) * 0.01
    scale = torch.rand(b, generator=g, dtype=dtype) + 0.5
    return down, up, scale


@pytest.mark.parametrize("r,out_f,in_f", [(1, 40, 24), (4, 40, 24), (8, 6, 30), (3, 3, 3)])
def test_delta_spectrum_exact_equals_full_svd(r: int, out_f: int, in_f: int) -> None:
    down, up, scale = _factors(5, r, out_f, in_f)
    exact = R.delta_singular_values(down, up, scale, "exact")
    delta = scale[:, None, None] * (up @ down)
    full = torch.linalg.svdvals(delta)[:, : min(r, out_f, in_f)]
    assert exact.shape == full.shape
    torch.testing.assert_close(exact, full, rtol=1e-10, atol=1e-14)
    f_exact = R.spectral_delta(down, up, scale, "exact")
    f_full = R.spectral_from_singular_values(full, (out_f, in_f))
    torch.testing.assert_close(f_exact, f_full, rtol=1e-8, atol=1e-12)
    assert f_exact.shape[1] == 3 * min(10, r, out_f, in_f) + 2


@pytest.mark.parametrize("r", [1, 4])
def test_lowrank_matches_full_when_rank_fits(r: int) -> None:
    torch.manual_seed(0)  # svd_lowrank draws a random test matrix
    down, up, scale = _factors(6, r, 64, 48)
    full = R.spectral_delta(down, up, scale, "full")
    low = R.spectral_delta(down, up, scale, "lowrank")
    torch.testing.assert_close(low, full, rtol=1e-6, atol=1e-12)


def test_rank_one_spectrum_has_no_padding() -> None:
    down, up, scale = _factors(3, 1, 32, 16)
    f = R.spectral_delta(down, up, scale)
    # [σ1, σ1/Σσ, entropy, cond, nuclear]: one real value, no zeros standing in for missing ones
    assert f.shape == (3, 5)
    s1 = scale * torch.linalg.vector_norm(up[:, :, 0], dim=1) * torch.linalg.vector_norm(down[:, 0], dim=1)
    torch.testing.assert_close(f[:, 0], s1)
    torch.testing.assert_close(f[:, 1:4], torch.tensor([[1.0, 0.0, 1.0]], dtype=f.dtype).expand(3, 3))
    torch.testing.assert_close(f[:, 4], s1)
    factor = R.spectral(down)  # a 1 x 16 factor: one singular value
    assert factor.shape == (3, 5)


def test_condition_number_is_guarded() -> None:
    x = torch.zeros(3, 6, 5, dtype=torch.float64)
    x[0] = torch.diag(torch.tensor([4.0, 2.0, 1.0, 0.5, 0.25], dtype=torch.float64)).repeat(2, 1)[:6]
    x[1, 0, 0], x[1, 1, 1] = 3.0, 1.0  # rank 2: cond over the nonzero part = 3
    feats = R.spectral(x)
    k = 5
    cond = feats[:, 3 * k]
    assert torch.isclose(cond[1], torch.tensor(3.0, dtype=torch.float64))
    assert cond[2] == 1.0  # zero matrix
    assert torch.isfinite(feats).all()
    s = torch.linalg.svdvals(x[0])
    assert torch.isclose(cond[0], s[0] / s[-1])


def test_small_side_svdvals() -> None:
    for shape in [(4, 1, 30), (4, 30, 2), (4, 7, 7)]:
        x = torch.randn(*shape, dtype=torch.float64)
        torch.testing.assert_close(R.small_side_svdvals(x), torch.linalg.svdvals(x))


def test_oracles_numpy_and_torch_histogram() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 20, generator=g, dtype=torch.float64)
    flat = x.reshape(4, -1).numpy()
    # rank_based / distribution quantiles = numpy's linear interpolation
    np.testing.assert_allclose(R.rank_based(x)[:, :9].numpy(), np.quantile(flat, R.RANK_Q, axis=1).T, rtol=1e-12)
    np.testing.assert_allclose(R.distribution(x)[:, :7].numpy(), np.quantile(flat, R.DISTRIBUTION_Q, axis=1).T)
    # simple_stats
    ss = R.simple_stats(x).numpy()
    np.testing.assert_allclose(ss[:, 0], np.linalg.norm(flat, axis=1))
    np.testing.assert_allclose(ss[:, 2], flat.std(axis=1, ddof=1))
    # moments with the unbiased std, as the source
    z = (flat - flat.mean(1, keepdims=True)) / flat.std(1, ddof=1, keepdims=True)
    st = R.stats(x).numpy()
    np.testing.assert_allclose(st[:, 5], (z**3).mean(1))
    np.testing.assert_allclose(st[:, 6], (z**4).mean(1))
    # frequency: numpy FFT
    mag = np.abs(np.fft.fft2(x.numpy())).reshape(4, -1)
    fr = R.frequency(x).numpy()
    np.testing.assert_allclose(fr[:, :10], -np.sort(-mag, axis=1)[:, :10])
    np.testing.assert_allclose(fr[:, 10], mag.mean(1))
    # matrix norms: numpy
    mn = R.matrix_norms(x).numpy()
    for i in range(4):
        np.testing.assert_allclose(mn[i, :5], [np.linalg.norm(x[i].numpy(), "fro"), np.linalg.norm(x[i].numpy(), "nuc"),
                                               np.linalg.norm(x[i].numpy(), 2), np.linalg.norm(x[i].numpy(), 1),
                                               np.linalg.norm(x[i].numpy(), np.inf)])
    # histogram: torch.histogram per row
    counts = R.batched_histogram(x.reshape(4, -1))
    for i in range(4):
        ref, _ = torch.histogram(x[i].flatten(), bins=R.HIST_BINS)
        assert torch.equal(counts[i], ref)


def test_constant_matrix_is_finite_everywhere() -> None:
    x = torch.ones(2, 1, 16)
    for name, rep in R.REPRESENTATIONS.items():
        if rep.on == "factors":
            assert torch.isfinite(rep.fn(x)).all(), name


@pytest.mark.parametrize("name", list(R.REPRESENTATIONS))
def test_layer_batching_equals_per_layer_per_item(name: str) -> None:
    g = torch.Generator().manual_seed(2)
    shapes = [((1, 12), (12, 1)), ((1, 12), (12, 1)), ((2, 20), (12, 2))]
    factors = {f"l{i}": LayerFactors(torch.randn(3, *d, generator=g), torch.randn(3, *u, generator=g) * 0.01,
                                     torch.tensor([1.0, 2.0, 0.5]))
               for i, (d, u) in enumerate(shapes)}
    got = layer_features(factors, name, torch.device("cpu"), torch.float64)
    rep = R.REPRESENTATIONS[name]
    for lname, f in factors.items():
        for i in range(3):
            d, u, s = f.down[i:i + 1].double(), f.up[i:i + 1].double(), f.scale[i:i + 1].double()
            ref = rep.fn(d, u, s) if rep.on == "delta" else torch.cat([rep.fn(d), rep.fn(u)], dim=1)
            torch.testing.assert_close(got[lname][i:i + 1], ref, rtol=1e-9, atol=1e-12)


def test_delta_norms_are_functions_of_delta_w_only() -> None:
    g = torch.Generator().manual_seed(11)
    down, up = torch.randn(3, 4, 20, generator=g, dtype=torch.float64), torch.randn(3, 12, 4, generator=g,
                                                                                     dtype=torch.float64)
    scale = torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)
    f = R.delta_norms(down, up, scale)
    # against the materialised ΔW
    dw = scale[:, None, None] * up @ down
    s = torch.linalg.svdvals(dw)[:, :4]
    p = s / s.sum(1, keepdim=True)
    expect = torch.stack([torch.linalg.matrix_norm(dw), s.sum(1), s[:, 0], torch.exp(-(p * p.log()).sum(1)),
                          (s**2).sum(1) / s[:, 0] ** 2], 1)
    torch.testing.assert_close(f, expect, rtol=1e-9, atol=1e-12)
    # the same ΔW with the scale split differently and the rank space rotated: identical, while a factor
    # representation of the same adapter changes
    q, _ = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=torch.float64))
    up2, down2 = 3.0 * up @ q, q.T @ down / 3.0
    torch.testing.assert_close(R.delta_norms(down2, up2, scale), f, rtol=1e-9, atol=1e-12)
    assert not torch.allclose(R.simple_stats(up2), R.simple_stats(up))
    # rank one: effective and stable rank are 1; zero: all zeros
    one = R.delta_norms(down[:, :1], up[:, :, :1])
    torch.testing.assert_close(one[:, 3:], torch.ones(3, 2, dtype=torch.float64))
    assert torch.equal(R.delta_norms(torch.zeros(1, 2, 5), torch.zeros(1, 3, 2)), torch.zeros(1, 5))
