"""Per-layer representations of LoRA factors, batched over adapters (and layers of equal shape).

A *factor representation* maps a batch of matrices ``X [B, a, b]`` to features ``[B, f]`` (f depends only on the
shape); a layer's features are ``rep(down) ++ rep(up)``. ``spectral_delta`` instead maps a layer's pair to the
spectrum of its weight update ΔW = s·up·down.

Fixes with respect to the source scripts:

- spectra hold only the singular values that exist: k = min(10, min(a, b)) values for an a x b factor (one
  for a rank-1 factor, not one value and nine zeros of padding), k = min(10, r) for ΔW of rank r;
- the condition number is s_1 / s_min over the numerically nonzero values among the top k (tolerance
  s_1·max(a, b)·eps, as ``matrix_rank``), 1 for a zero matrix; never s_1 / 1e-8;
- skew and kurtosis of a constant matrix are 0, not (0/1e-8)³ noise.

The spectrum of ΔW = s·U·D (U: out x r, D: r x in) is exact in O(r²(out + in)): with U = Q_u R_u and
Dᵀ = Q_d R_d (thin QR), ΔW = s·Q_u (R_u R_dᵀ) Q_dᵀ, and Q_u, Q_d have orthonormal columns, so the singular
values of ΔW are |s| times those of the r x r matrix R_u R_dᵀ. ``delta_singular_values`` also offers
``torch.svd_lowrank`` and the full SVD of the materialised ΔW, as references.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

FEATURE_CODE_VERSION = "lora-features-1"
TOP_K = 10
HIST_BINS = 50
DISTRIBUTION_Q = (0.05, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95)
RANK_Q = (0.01, 0.05, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.99)


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0], -1)


def _std(flat: torch.Tensor) -> torch.Tensor:
    return flat.std(dim=1, correction=1 if flat.shape[1] > 1 else 0)


def _moments(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Skewness E[z³] and kurtosis E[z⁴] of z = (x − mean)/std (std unbiased, as the source); 0 for constants."""
    mean = flat.mean(dim=1, keepdim=True)
    std = _std(flat).unsqueeze(1)
    safe = torch.where(std > 0, std, torch.ones_like(std))
    z = torch.where(std > 0, (flat - mean) / safe, torch.zeros_like(flat))
    return (z**3).mean(dim=1), (z**4).mean(dim=1)


def small_side_svdvals(x: torch.Tensor) -> torch.Tensor:
    """Singular values of a batch ``[B, a, b]`` (descending, min(a, b) of them) through the QR of the tall side:
    X = Q R with Q orthonormal leaves the singular values of R (p x p, p = min(a, b))."""
    a, b = x.shape[-2:]
    if a == b:
        return torch.linalg.svdvals(x)
    r = torch.linalg.qr(x.mT if a < b else x, mode="r").R
    return torch.linalg.svdvals(r)


def spectral_from_singular_values(s: torch.Tensor, shape: tuple[int, int], top_k: int = TOP_K) -> torch.Tensor:
    """Spectral features from the singular values ``s [B, p]`` (descending, all real) of matrices of ``shape``.

    With k = min(top_k, p) and σ_i the top k values: σ (k), σ/Σσ (k), relative gaps (σ_i − σ_{i+1})/σ_i
    (k − 1, 0 where σ_i = 0), the entropy −Σ p_i log p_i of p = σ/Σσ, the guarded condition number and the
    nuclear norm Σ_{i≤p} σ_i. That is 3k + 2 values.
    """
    s = s.clamp_min(0)
    k = min(top_k, s.shape[1])
    top = s[:, :k]
    total = top.sum(dim=1, keepdim=True)
    norm = torch.where(total > 0, top / torch.where(total > 0, total, torch.ones_like(total)), torch.zeros_like(top))
    head, tail = top[:, :-1], top[:, 1:]
    gaps = torch.where(head > 0, (head - tail) / torch.where(head > 0, head, torch.ones_like(head)),
                       torch.zeros_like(head))
    entropy = -torch.special.xlogy(norm, norm).sum(dim=1)
    s1 = top[:, :1]
    tol = s1 * max(shape) * torch.finfo(s.dtype).eps
    nonzero = top > tol
    smallest = torch.where(nonzero, top, torch.full_like(top, math.inf)).amin(dim=1, keepdim=True)
    cond = torch.where(s1 > 0, s1 / torch.where(torch.isfinite(smallest), smallest, s1.clamp_min(1e-30)),
                       torch.ones_like(s1))
    nuclear = s.sum(dim=1, keepdim=True)
    return torch.cat([top, norm, gaps, entropy[:, None], cond, nuclear], dim=1)


# ---- factor representations ----------------------------------------------------------------------------
def flat_vec(x: torch.Tensor) -> torch.Tensor:
    """All entries of the matrix."""
    return _flat(x)


def simple_stats(x: torch.Tensor) -> torch.Tensor:
    """Frobenius norm, mean, std, max, min."""
    f = _flat(x)
    return torch.stack([torch.linalg.vector_norm(f, dim=1), f.mean(1), _std(f), f.amax(1), f.amin(1)], dim=1)


def rank_based(x: torch.Tensor) -> torch.Tensor:
    """Percentiles 1, 5, 10, 25, 50, 75, 90, 95, 99, the IQR and the 1–99 range."""
    f = _flat(x)
    q = torch.quantile(f, torch.tensor(RANK_Q, dtype=f.dtype, device=f.device), dim=1).T
    return torch.cat([q, (q[:, 5] - q[:, 3])[:, None], (q[:, 8] - q[:, 0])[:, None]], dim=1)


def stats(x: torch.Tensor) -> torch.Tensor:
    """Mean, std, median, min, max, skewness, kurtosis."""
    f = _flat(x)
    skew, kurt = _moments(f)
    return torch.stack([f.mean(1), _std(f), f.median(dim=1).values, f.amin(1), f.amax(1), skew, kurt], dim=1)


def spectral(x: torch.Tensor) -> torch.Tensor:
    """Spectral features (``spectral_from_singular_values``) of the factor itself."""
    return spectral_from_singular_values(small_side_svdvals(x), tuple(x.shape[-2:]))


def matrix_norms(x: torch.Tensor) -> torch.Tensor:
    """Frobenius, nuclear, spectral, L1 (max column abs sum), L∞ (max row abs sum), nuclear/F, spectral/F."""
    s = small_side_svdvals(x)
    fro = torch.linalg.matrix_norm(x, ord="fro")
    nuc, spec = s.sum(1), s[:, 0]
    ax = x.abs()
    l1, linf = ax.sum(dim=1).amax(dim=1), ax.sum(dim=2).amax(dim=1)
    safe = torch.where(fro > 0, fro, torch.ones_like(fro))
    return torch.stack([fro, nuc, spec, l1, linf, nuc / safe, spec / safe], dim=1)


def distribution(x: torch.Tensor) -> torch.Tensor:
    """Quantiles 5..95 (7), IQR, mean absolute deviation, coefficient of variation std/(|mean|+1e-8),
    skewness, kurtosis."""
    f = _flat(x)
    q = torch.quantile(f, torch.tensor(DISTRIBUTION_Q, dtype=f.dtype, device=f.device), dim=1).T
    mean = f.mean(1)
    mad = (f - mean[:, None]).abs().mean(1)
    cv = _std(f) / (mean.abs() + 1e-8)
    skew, kurt = _moments(f)
    return torch.cat([q, torch.stack([q[:, 4] - q[:, 2], mad, cv, skew, kurt], dim=1)], dim=1)


def frequency(x: torch.Tensor) -> torch.Tensor:
    """2-D FFT magnitudes |F|: the top k = min(10, a·b), their mean, std (population), max and the energy share
    Σ_top |F|² / Σ |F|² of the top k."""
    mag = torch.fft.fft2(x).abs().reshape(x.shape[0], -1)
    k = min(TOP_K, mag.shape[1])
    top = mag.topk(k, dim=1).values
    energy = (mag**2).sum(1)
    conc = torch.where(energy > 0, (top**2).sum(1) / torch.where(energy > 0, energy, torch.ones_like(energy)),
                       torch.zeros_like(energy))
    return torch.cat([top, torch.stack([mag.mean(1), mag.std(1, correction=0), mag.amax(1), conc], dim=1)], dim=1)


def batched_histogram(flat: torch.Tensor, bins: int = HIST_BINS) -> torch.Tensor:
    """Per-row histogram counts over [min, max] of each row, ``bins`` equal bins, the last one closed (as
    ``torch.histogram``). A constant row puts everything in the middle bin."""
    lo, hi = flat.amin(1, keepdim=True), flat.amax(1, keepdim=True)
    width = hi - lo
    pos = torch.where(width > 0, (flat - lo) / torch.where(width > 0, width, torch.ones_like(width)) * bins,
                      torch.full_like(flat, bins / 2))
    idx = pos.floor().long().clamp_(0, bins - 1)
    counts = torch.zeros(flat.shape[0], bins, dtype=flat.dtype, device=flat.device)
    return counts.scatter_add_(1, idx, torch.ones_like(flat))


def info_theoretic(x: torch.Tensor) -> torch.Tensor:
    """Entropy −Σ p log p of a 50-bin histogram of the entries, and the same divided by log 50."""
    counts = batched_histogram(_flat(x))
    p = counts / counts.sum(1, keepdim=True)
    h = -torch.special.xlogy(p, p).sum(1)
    return torch.stack([h, h / math.log(HIST_BINS)], dim=1)


def ensemble(x: torch.Tensor) -> torch.Tensor:
    """spectral ++ matrix_norms ++ distribution ++ frequency ++ info_theoretic."""
    return torch.cat([spectral(x), matrix_norms(x), distribution(x), frequency(x), info_theoretic(x)], dim=1)


# ---- weight-update spectrum ---------------------------------------------------------------------------
def delta_singular_values(down: torch.Tensor, up: torch.Tensor, scale: torch.Tensor | None = None,
                          method: str = "exact", q: int | None = None) -> torch.Tensor:
    """Singular values (descending) of ΔW = scale·up·down for a batch: down [B, r, in], up [B, out, r].

    ``exact``: from the r x r core R_u R_dᵀ (all min(r, out, in) values, O(r²(out+in))).
    ``full``: ``torch.linalg.svdvals`` of the materialised ΔW, truncated to min(r, out, in) values (the rest
    are zero in exact arithmetic).
    ``lowrank``: ``torch.svd_lowrank(ΔW, q)`` (q defaults to min(r + 5, out, in)), truncated likewise; exact
    up to rounding when q ≥ rank.
    """
    r = down.shape[-2]
    out_f, in_f = up.shape[-2], down.shape[-1]
    p = min(r, out_f, in_f)
    if method == "exact":
        ru = torch.linalg.qr(up, mode="r").R  # [B, min(out, r), r]
        rd = torch.linalg.qr(down.mT, mode="r").R  # [B, min(in, r), r]
        s = torch.linalg.svdvals(ru @ rd.mT)
    elif method == "full":
        s = torch.linalg.svdvals(up @ down)
    elif method == "lowrank":
        q = q if q is not None else min(r + 5, out_f, in_f)
        _, s, _ = torch.svd_lowrank(up @ down, q=q, niter=2)
    else:
        raise ValueError(f"method must be exact, full or lowrank, got {method!r}")
    s = s[:, :p]
    if scale is not None:
        s = s * scale.to(s.dtype).abs()[:, None]
    return s


def spectral_delta(down: torch.Tensor, up: torch.Tensor, scale: torch.Tensor | None = None,
                   method: str = "exact") -> torch.Tensor:
    """Spectral features (``spectral_from_singular_values``) of ΔW = scale·up·down, 3·min(10, r) + 2 values."""
    s = delta_singular_values(down, up, scale, method)
    return spectral_from_singular_values(s, (up.shape[-2], down.shape[-1]))


def delta_norms(down: torch.Tensor, up: torch.Tensor, scale: torch.Tensor | None = None,
                method: str = "exact") -> torch.Tensor:
    """Norms of ΔW = scale·up·down from its singular values (exactly, through the r x r core): Frobenius
    √Σσ², nuclear Σσ, spectral σ_1, effective rank exp(−Σ p log p) with p = σ/Σσ (Roy & Vetterli; 1 for rank
    one, r for a flat spectrum), and stable rank Σσ²/σ_1² (0 for ΔW = 0). 5 values.

    Unlike every factor representation, these depend on ΔW only, so they do not change when an adapter moves
    scale between its factors (up·c, down/c) or rotates its rank space (up·Q, Qᵀ·down)."""
    s = delta_singular_values(down, up, scale, method).clamp_min(0)
    fro = torch.sqrt((s**2).sum(1))
    nuc = s.sum(1)
    spec = s[:, 0]
    p = torch.where(nuc[:, None] > 0, s / torch.where(nuc > 0, nuc, torch.ones_like(nuc))[:, None],
                    torch.zeros_like(s))
    erank = torch.where(nuc > 0, torch.exp(-torch.special.xlogy(p, p).sum(1)), torch.zeros_like(nuc))
    srank = torch.where(spec > 0, fro**2 / torch.where(spec > 0, spec, torch.ones_like(spec)) ** 2,
                        torch.zeros_like(spec))
    return torch.stack([fro, nuc, spec, erank, srank], dim=1)


@dataclass(frozen=True)
class Representation:
    name: str
    fn: Callable[..., torch.Tensor]
    on: str  # "factors": rep(down) ++ rep(up); "delta": fn(down, up, scale)


REPRESENTATIONS: dict[str, Representation] = {
    r.name: r
    for r in [
        Representation("simple_stats", simple_stats, "factors"),
        Representation("rank_based", rank_based, "factors"),
        Representation("stats", stats, "factors"),
        Representation("spectral", spectral, "factors"),
        Representation("matrix_norms", matrix_norms, "factors"),
        Representation("distribution", distribution, "factors"),
        Representation("frequency", frequency, "factors"),
        Representation("info_theoretic", info_theoretic, "factors"),
        Representation("ensemble", ensemble, "factors"),
        Representation("flat_vec", flat_vec, "factors"),
        Representation("spectral_delta", spectral_delta, "delta"),
        Representation("delta_norms", delta_norms, "delta"),
    ]
}
# the source's representations: functions of the factors, so they change when an adapter splits its scale
# between up and down differently; the "delta" ones are functions of ΔW and do not
SOURCE_REPRESENTATIONS = [name for name, r in REPRESENTATIONS.items() if r.on == "factors"]
