r"""Faithfulness of word attributions: comprehensiveness, sufficiency and deletion / insertion curves.

An attribution ranks the words of an input. A faithful ranking puts first the words the model's score depends on.
For a scalar score :math:`F`, an input :math:`x` of :math:`n` words and a baseline :math:`x'` (the same baseline
IG integrates from), let :math:`x_{\setminus S}` be :math:`x` with the token positions of the words in :math:`S`
replaced by the baseline's, and :math:`x_{S}` the input with only the words in :math:`S` kept (every other word
replaced). With :math:`R_k` the first :math:`k` words of the ranking:

- comprehensiveness (DeYoung et al. 2020, ERASER) at fraction :math:`q`:
  :math:`F(x) - F(x_{\setminus R_{k_q}})`, the score lost when the top words are masked (higher is more
  faithful);
- sufficiency (ERASER) at :math:`q`: :math:`F(x) - F(x_{R_{k_q}})`, the score lost when only the top words are
  kept (lower is more faithful);
- deletion curve (Petsiuk et al. 2018, RISE): :math:`D_j = F(x_{\setminus R_j})` for :math:`j = 0..n` (words
  removed in ranking order; a faithful ranking makes it fall fast), insertion curve :math:`I_j = F(x_{R_j})`
  (words added in ranking order from the baseline; a faithful ranking makes it rise fast). Their areas are taken
  over the fraction of words :math:`j / n \in [0, 1]` (trapezoid rule), so the area is the curve's mean score and
  samples of different lengths are comparable: ``deletion_auc`` lower and ``insertion_auc`` higher is better.

:math:`k_q = \lceil q n \rceil` (at least 1). ERASER scores class probabilities; here :math:`F` is the model's own
score (for the news recommenders, the candidate-user dot product), so the numbers are in score units. The
ranking is by attribution, highest first; ties keep word order (a stable sort), so the masks are deterministic.

A ranking is only meaningful next to its floor: :func:`random_order` is a seeded random ranking (the seed and a
hash of the sample's id, so a sample gets the same order whatever its position in a run or shard).

Bounds: a curve has at most :data:`MAX_CURVE_POINTS` + 1 points (every :math:`j` for titles of up to that many
words, evenly spaced :math:`j` plus the :math:`k_q` beyond), so a sample costs at most
``orders * 2 * (MAX_CURVE_POINTS + 1 + len(fractions))`` masked variants, fewer after identical variants are
merged (every order shares :math:`x` and :math:`x'`). All variants of a chunk of samples are scored in batched
forwards of at most ``max_rows`` rows (:func:`score_variants`); :func:`score_variants_reference` scores them one
by one.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

FRACTIONS = (0.01, 0.05, 0.1, 0.2, 0.5)  # ERASER's bins (DeYoung et al. 2020): AOPC averages over them
ALPHA = 0.05  # the family-wise level of the Holm-adjusted tests
EFFECT_RESAMPLES = 1000  # bootstrap resamples of the effect size's interval (seeded)
MAX_CURVE_POINTS = 64
MAX_ROWS = 256  # masked variants per batched forward (forward only: no graph is kept)
CURVE_GRID = 21  # points of the mean curves over samples (fractions 0, 0.05, ..., 1)
ORDERS = ("ig", "random", "occlusion")

ForwardFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def top_k(n_words: int, fraction: float) -> int:
    """Words in the top ``fraction`` of ``n_words``: ceil(fraction * n), at least 1 (and at most n)."""
    return min(n_words, max(1, math.ceil(fraction * n_words - 1e-9)))


def rank_words(attributions: Sequence[float]) -> np.ndarray:
    """Word indices by attribution, highest first; equal attributions keep word order."""
    return np.argsort(-np.asarray(attributions, dtype=np.float64), kind="stable")


def random_order(n_words: int, seed: int, key: str) -> np.ndarray:
    """A random ranking of ``n_words`` words, from ``seed`` and ``key`` (e.g. the sample id) only."""
    digest = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "little")
    return np.random.default_rng([int(seed), digest]).permutation(n_words)


def curve_points(n_words: int, fractions: Sequence[float] = FRACTIONS) -> list[int]:
    """The ``j`` (words removed or added) at which the curves are evaluated: every one of 0..n up to
    :data:`MAX_CURVE_POINTS` words, else that many evenly spaced ones; always with every :func:`top_k`."""
    if n_words <= MAX_CURVE_POINTS:
        return list(range(n_words + 1))
    grid = {round(i * n_words / MAX_CURVE_POINTS) for i in range(MAX_CURVE_POINTS + 1)}
    return sorted(grid | {top_k(n_words, q) for q in fractions})


def variant_masks(order: Sequence[int], words: Sequence[Sequence[int]], length: int, points: Sequence[int]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Masks ``(P, length)`` (True = replaced by the baseline) of the deletion variants (the first ``j`` ranked
    words masked) and the insertion variants (every word but the first ``j`` ranked masked), ``j`` in
    ``points``. Positions in no word (structural tokens, padding) are never masked."""
    deletion = np.zeros((len(points), length), dtype=bool)
    every = np.zeros(length, dtype=bool)
    for w in words:
        every[list(w)] = True
    insertion = np.repeat(every[None], len(points), axis=0)
    for p, j in enumerate(points):
        for w in order[:j]:
            deletion[p, list(words[int(w)])] = True
            insertion[p, list(words[int(w)])] = False
    return deletion, insertion


@torch.no_grad()
def score_variants(forward: ForwardFn, inputs: torch.Tensor, baselines: torch.Tensor, rows: torch.Tensor,
                   masks: torch.Tensor, max_rows: int = MAX_ROWS) -> np.ndarray:
    """F of every masked variant (fp64): variant ``v`` is sample ``rows[v]`` of ``inputs`` ``(N, L, D)`` with the
    positions ``masks[v]`` ``(L,)`` taken from ``baselines``; at most ``max_rows`` variants per forward."""
    out = np.empty(rows.shape[0], dtype=np.float64)
    device = inputs.device
    for s in range(0, rows.shape[0], max_rows):
        r = rows[s:s + max_rows].to(device)
        m = masks[s:s + max_rows].to(device)
        x = torch.where(m[..., None], baselines[r], inputs[r]).float()
        out[s:s + r.shape[0]] = forward(x, r).double().cpu().numpy()
    return out


@torch.no_grad()
def score_variants_reference(forward: ForwardFn, inputs: torch.Tensor, baselines: torch.Tensor,
                             rows: torch.Tensor, masks: torch.Tensor) -> np.ndarray:
    """The plain loop: each variant built position by position and scored alone."""
    out = np.empty(rows.shape[0], dtype=np.float64)
    for v in range(rows.shape[0]):
        i = int(rows[v])
        x = inputs[i].clone().float()
        for pos in range(x.shape[0]):
            if bool(masks[v, pos]):
                x[pos] = baselines[i, pos]
        out[v] = float(forward(x[None], torch.tensor([i], device=inputs.device))[0])
    return out


@dataclass
class SampleWords:
    """One sample of a chunk: its words' token positions and one word ranking per order name."""
    words: list[list[int]]
    orders: dict[str, np.ndarray]


def sample_words(name: str, key: str, words: Sequence[Sequence[int]], attributions: Sequence[float],
                 occlusion_scores: Sequence[float], seed: int) -> SampleWords:
    """One sample's three word orders: IG's ranking of ``attributions`` (one per word), the seeded random order
    (keyed by ``key``, the sample's id) and occlusion's ranking of ``occlusion_scores`` (one per token: each word's
    is its tokens' sum). ``name`` says which sample a mismatch of words and attributions is about."""
    if len(words) != len(attributions):
        raise ValueError(f"{name}: {len(words)} words, {len(attributions)} attributions")
    occ_words = [float(sum(occlusion_scores[q] for q in w)) for w in words]
    return SampleWords(list(words), {"ig": rank_words(attributions), "random": random_order(len(words), seed, key),
                                     "occlusion": rank_words(occ_words)})


def _auc(points: Sequence[int], n_words: int, curve: Sequence[float]) -> float:
    x = np.asarray(points, dtype=np.float64) / max(n_words, 1)
    return float(np.trapezoid(np.asarray(curve, dtype=np.float64), x))


def evaluate(forward: ForwardFn, inputs: torch.Tensor, baselines: torch.Tensor, samples: Sequence[SampleWords],
             fractions: Sequence[float] = FRACTIONS, max_rows: int = MAX_ROWS, reference: bool = False
             ) -> list[dict[str, Any]]:
    """Comprehensiveness, sufficiency and deletion / insertion curves of every order of every sample of a chunk
    (``inputs``/``baselines`` ``(N, L, D)``, ``samples[i]`` the words of row ``i``). Identical variants of a
    sample are scored once; all variants of the chunk go through :func:`score_variants` (or, with
    ``reference``, every variant, merged or not, through :func:`score_variants_reference`)."""
    length = inputs.shape[1]
    rows: list[int] = []
    masks: list[np.ndarray] = []
    layout: list[dict[str, tuple[list[int], list[int]]]] = []
    plans: list[tuple[int, list[int]]] = []
    for i, sw in enumerate(samples):
        n = len(sw.words)
        points = curve_points(n, fractions)
        seen: dict[bytes, int] = {}
        per: dict[str, tuple[list[int], list[int]]] = {}
        for name, order in sw.orders.items():
            if sorted(int(o) for o in order) != list(range(n)):
                raise ValueError(f"order {name!r} of sample {i} is not a permutation of its {n} words")
            deletion, insertion = variant_masks(order, sw.words, length, points)
            idx: list[list[int]] = [[], []]
            for kind, block in enumerate((deletion, insertion)):
                for m in block:
                    key = m.tobytes()
                    if reference or key not in seen:
                        seen[key] = len(rows)
                        rows.append(i)
                        masks.append(m)
                    idx[kind].append(len(rows) - 1 if reference else seen[key])
            per[name] = (idx[0], idx[1])
        layout.append(per)
        plans.append((n, points))
    if not rows:
        return []
    r = torch.tensor(rows, dtype=torch.long)
    m = torch.from_numpy(np.stack(masks))
    scores = (score_variants_reference(forward, inputs, baselines, r, m) if reference
              else score_variants(forward, inputs, baselines, r, m, max_rows))
    out = []
    for (n, points), per in zip(plans, layout, strict=True):
        rec: dict[str, Any] = {"n_words": n, "fractions": list(fractions),
                               "k": [top_k(n, q) for q in fractions], "points": points, "orders": {}}
        for name, (d_idx, i_idx) in per.items():
            deletion = scores[d_idx]
            insertion = scores[i_idx]
            full = float(deletion[0])  # j = 0: nothing removed
            at = {j: p for p, j in enumerate(points)}
            rec["orders"][name] = {
                "comprehensiveness": [full - float(deletion[at[k]]) for k in rec["k"]],
                "sufficiency": [full - float(insertion[at[k]]) for k in rec["k"]],
                "deletion": deletion.tolist(),
                "insertion": insertion.tolist(),
                "deletion_auc": _auc(points, n, deletion),
                "insertion_auc": _auc(points, n, insertion),
            }
        out.append(rec)
    return out


# --------------------------------------------------------------------------------------- over many samples
# (metric, alternative of "first order minus the other" under which the first order is more faithful)
TESTED = (("comprehensiveness", "greater"), ("sufficiency", "less"), ("deletion_auc", "less"),
          ("insertion_auc", "greater"))


def _metric(rec: Mapping[str, Any], order: str, metric: str) -> float | None:
    o = (rec.get("orders") or {}).get(order)
    if not isinstance(o, Mapping):
        return None
    v = o.get(metric)
    if isinstance(v, list):  # comprehensiveness / sufficiency: their mean over the fractions (ERASER's AOPC)
        return float(np.mean(v)) if v else None
    return None if v is None else float(v)


TIE_RTOL = 1e-6  # the scores are fp32: differences within this of the pair's magnitude are rounding, i.e. ties


def paired_test(first: Sequence[float], second: Sequence[float], alternative: str) -> dict[str, Any]:
    """Wilcoxon signed-rank test of ``first - second`` (scipy), one-sided ``alternative``. Differences within
    :data:`TIE_RTOL` of the larger of the pair are ties; ties are dropped (``zero_method="wilcox"``), and with no
    difference left there is no statistic."""
    from scipy.stats import wilcoxon

    a = np.asarray(first, dtype=np.float64)
    b = np.asarray(second, dtype=np.float64)
    d = a - b
    d[np.abs(d) <= TIE_RTOL * np.maximum(np.abs(a), np.abs(b))] = 0.0
    out: dict[str, Any] = {"n": int(d.size), "n_nonzero": int(np.count_nonzero(d)),
                           "median_difference": float(np.median(d)) if d.size else None,
                           "alternative": alternative, "statistic": None, "p_value": None}
    if out["n_nonzero"] == 0:
        return out
    res = wilcoxon(d, zero_method="wilcox", alternative=alternative)
    out["statistic"], out["p_value"] = float(res.statistic), float(res.pvalue)
    return out


def rank_biserial(d: np.ndarray) -> float | None:
    """The matched-pairs rank-biserial correlation of differences ``d`` (ties at zero dropped): (sum of the ranks of
    |d| for positive d - for negative d) / the sum of all ranks, in [-1, 1]; None without a non-zero difference."""
    from scipy.stats import rankdata

    d = d[d != 0]
    if d.size == 0:
        return None
    ranks = rankdata(np.abs(d))
    return float((ranks[d > 0].sum() - ranks[d < 0].sum()) / ranks.sum())


def effect_interval(d: np.ndarray, seed: int = 0, resamples: int = EFFECT_RESAMPLES) -> list[float] | None:
    """A 95% percentile bootstrap interval of :func:`rank_biserial` over the samples (resampled with replacement,
    seeded)."""
    if np.count_nonzero(d) == 0:
        return None
    rng = np.random.default_rng(seed)
    values = [rank_biserial(d[rng.integers(0, d.size, d.size)]) for _ in range(resamples)]
    values = [v for v in values if v is not None]
    return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))] if values else None


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family of p-values (None stays None and is not counted)."""
    present = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m = len(present)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(present):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def summarize(records: Sequence[Mapping[str, Any]], fractions: Sequence[float] = FRACTIONS) -> dict[str, Any]:
    """Over samples: each order's mean comprehensiveness / sufficiency per fraction and mean curve areas, its
    mean curves on :data:`CURVE_GRID` fractions of words (each sample's curve linearly interpolated), and
    Wilcoxon signed-rank tests of IG against each other order (per metric; comprehensiveness and sufficiency
    averaged over the fractions first, ERASER's AOPC), each with its Holm-adjusted p-value over the family of
    tests (``p_holm``, ``significant_holm`` at :data:`ALPHA`) and its effect size in IG's favour (the matched-pairs
    rank-biserial correlation, with a 95% bootstrap interval over samples)."""
    records = [r for r in records if isinstance(r, Mapping) and r.get("orders")]
    grid = np.linspace(0.0, 1.0, CURVE_GRID)
    orders = [o for o in ORDERS if any(o in r["orders"] for r in records)]
    table: dict[str, Any] = {}
    curves: dict[str, Any] = {}
    for o in orders:
        recs = [r for r in records if o in r["orders"]]
        comp = np.array([r["orders"][o]["comprehensiveness"] for r in recs], dtype=np.float64)
        suff = np.array([r["orders"][o]["sufficiency"] for r in recs], dtype=np.float64)
        table[o] = {"n": len(recs), "comprehensiveness": comp.mean(0).tolist(), "sufficiency": suff.mean(0).tolist(),
                    "deletion_auc": float(np.mean([r["orders"][o]["deletion_auc"] for r in recs])),
                    "insertion_auc": float(np.mean([r["orders"][o]["insertion_auc"] for r in recs]))}
        dele, ins = [], []
        for r in recs:
            x = np.asarray(r["points"], dtype=np.float64) / max(r["n_words"], 1)
            dele.append(np.interp(grid, x, r["orders"][o]["deletion"]))
            ins.append(np.interp(grid, x, r["orders"][o]["insertion"]))
        curves[o] = {"deletion": np.mean(dele, 0).tolist(), "insertion": np.mean(ins, 0).tolist()}
    tests = []
    if "ig" in orders:
        for other in (o for o in orders if o != "ig"):
            for metric, alternative in TESTED:
                pairs = [(a, b) for r in records
                         if (a := _metric(r, "ig", metric)) is not None and (b := _metric(r, other, metric)) is not None]
                a = np.array([a for a, _ in pairs], dtype=np.float64)
                b = np.array([b for _, b in pairs], dtype=np.float64)
                test = paired_test(a, b, alternative)
                # the effect in IG's favour: positive when IG is the more faithful of the pair
                d = a - b if alternative == "greater" else b - a
                d[np.abs(d) <= TIE_RTOL * np.maximum(np.abs(a), np.abs(b))] = 0.0
                test["effect_rank_biserial"] = rank_biserial(d)
                test["effect_interval"] = effect_interval(d)
                tests.append({"metric": metric, "against": other, **test})
    for t, adjusted in zip(tests, holm([t["p_value"] for t in tests]), strict=True):
        t["p_holm"] = adjusted
        t["significant_holm"] = adjusted is not None and adjusted <= ALPHA
    return {"n_samples": len(records), "fractions": list(fractions), "orders": table,
            "curves": {"fraction": grid.tolist(), **curves}, "tests": tests, "alpha": ALPHA}
