r"""Counterfactual removal: does removing an estimator's top proponents of a test triple lower its margin more than
removing as many random training triples?

For a test triple ``z`` and an estimator with scores :math:`\tau(z)_i` on the margin (computed once, on the model
trained on all the training triples), remove the ``k`` training triples with the highest positive scores (fewer
when fewer are positive; ties broken by the lower index), retrain the recipe on the rest and record the drop
:math:`f_{full}(z) - f_{-S}(z)` of ``z``'s margin (:func:`models.kg.evaluation.margins`). The baseline removes ``k``
training triples drawn uniformly (seeded; ``draws`` of them, their drops averaged), optionally among the triples
no estimator proposed for ``z`` (``disjoint``).

**What is held fixed.** Every retraining uses the full-data model's training seed: the same initialisation (the
model is built right after seeding, and its shape does not depend on the training set) and the same random
streams. The removal is the only input that differs, but the seeded shuffle is a permutation of the ``n - k``
remaining triples, so the batches (and hence the dropout masks they meet) differ from the full run's as a
consequence: the drop is the effect of the removal *with* that reshuffle. Removing ``k`` random triples reshuffles
in exactly the same way, so the difference to the random baseline is the part of the drop owed to which triples
were removed. Retraining with nothing removed and the same seed reproduces the full model's margins exactly
(tested); retraining with nothing removed under another seed measures the training noise (``noise``), the scale
a drop has to be read against. With ``n_seeds`` > 1 every removal is also retrained from further seeds (each
against a full-data model of its own seed) and the drops are averaged over the seeds.

Every seed here is a digest of (this design's version, the evaluation's seed, a role, an index) like the LDS's
(:func:`models.kg.evaluation.design_seed`), under another prefix: no retraining here shares a seed with an LDS
subset model or replicate.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.kg.evaluation import CONFIDENCE, N_RESAMPLES, _digest_seed, margins, with_train
from models.kg.train import TrainConfig, train_conve
from models.kg.triples import TriplesDataset

CF_DESIGN = 1
CF_ROLES = ("random", "seed", "noise")


def cf_seed(seed: int, role: str, index: int = 0, max_seed: int = 2**31 - 1) -> int:
    """The seed of ``role`` (one of ``CF_ROLES``) number ``index`` in the counterfactual evaluation with ``seed``:
    ``random`` (a random baseline draw), ``seed`` (a further training seed), ``noise`` (the noise retraining)."""
    if role not in CF_ROLES:
        raise ValueError(f"unknown role {role!r}; one of {CF_ROLES}")
    return _digest_seed(f"counterfactual-design-{CF_DESIGN}|{int(seed)}|{role}|{int(index)}", max_seed)


def top_proponents(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the (at most) ``k`` highest positive entries of ``scores [n]``, highest first (ties: lower index
    first)."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    s = np.asarray(scores, dtype=np.float64)
    order = np.argsort(-s, kind="stable")
    return order[:k][s[order[:k]] > 0]


def random_removals(n_train: int, k: int, seed: int, test_index: int, draws: int,
                    exclude: np.ndarray | None = None) -> list[np.ndarray]:
    """``draws`` seeded draws of ``k`` training indices without replacement (sorted), for the ``test_index``-th test
    triple; with ``exclude``, drawn among the other indices only."""
    pool = np.setdiff1d(np.arange(n_train), np.asarray([] if exclude is None else exclude, dtype=np.int64))
    if k > len(pool):
        raise ValueError(f"cannot draw {k} of {len(pool)} training triples")
    out = []
    for d in range(draws):
        rng = np.random.default_rng([cf_seed(seed, "random", test_index), d])
        out.append(np.sort(rng.choice(pool, size=k, replace=False)))
    return out


def keep_mask(n_train: int, removed: np.ndarray) -> np.ndarray:
    mask = np.ones(n_train, dtype=bool)
    mask[np.asarray(removed, dtype=np.int64)] = False
    return mask


def retrain_margins(ds: TriplesDataset, cfg: TrainConfig, removed: np.ndarray, train_seed: int,
                    test: torch.Tensor, device: Any = "cpu", work_dir: Path | None = None) -> tuple[np.ndarray, float]:
    """The recipe ``cfg`` retrained with seed ``train_seed`` on ``ds.train`` without the triples ``removed``; its
    margins on ``test`` and the training time (the model lives in a temporary directory, not kept)."""
    mask = keep_mask(len(ds.train), removed)
    rcfg = TrainConfig(**{**asdict(cfg), "seed": int(train_seed), "checkpoint_every": cfg.epochs})
    if work_dir is not None:
        Path(work_dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="cf-retrain-", dir=work_dir))
    try:
        from models.kg.checkpoint import load

        t0 = time.perf_counter()
        train_conve(with_train(ds, ds.train[torch.from_numpy(mask)]), rcfg, work, device=device)
        seconds = time.perf_counter() - t0
        out = margins(load(work, device).model, test)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out, seconds


def bootstrap_mean(values: Sequence[float], seed: int, confidence: float = CONFIDENCE,
                   n_resamples: int = N_RESAMPLES) -> dict[str, Any]:
    """The mean of ``values`` with a percentile bootstrap interval: ``n_resamples`` resamples drawn at once as
    ``default_rng(seed).integers(0, n, (n_resamples, n))``, the interval the ``(1 - confidence) / 2`` and
    ``(1 + confidence) / 2`` percentiles (numpy's linear interpolation) of the resampled means. A paired difference
    is the bootstrap of the per-test differences."""
    v = np.asarray(values, dtype=np.float64)
    out: dict[str, Any] = {"mean": None, "low": None, "high": None, "n": int(len(v)), "confidence": confidence,
                           "n_resamples": n_resamples, "seed": seed}
    if len(v) == 0:
        return out
    out["mean"] = float(v.mean())
    idx = np.random.default_rng(seed).integers(0, len(v), (n_resamples, len(v)))
    means = v[idx].mean(1)
    tail = (1 - confidence) / 2 * 100
    out["low"], out["high"] = (float(x) for x in np.percentile(means, [tail, 100 - tail]))
    return out


def counterfactual_report(ds: TriplesDataset, cfg: TrainConfig, full_margins: np.ndarray, test: torch.Tensor,
                          scores: dict[str, np.ndarray], k: int, seed: int, draws: int = 2, n_seeds: int = 1,
                          disjoint: bool = False, score_seconds: dict[str, float] | None = None,
                          device: Any = "cpu", work_dir: Path | None = None,
                          progress: Callable[[int, int, str], None] | None = None) -> dict[str, Any]:
    """Counterfactual removal for the test triples ``test`` (ids ``[m, 3]``). ``cfg`` is the full-data model's recipe
    with its training seed, ``full_margins [m]`` that model's margins on ``test``, ``scores`` each estimator's
    scores ``[m, n_train]`` on the margin. Returns per estimator the per-test drops (averaged over the seeds), the
    mean drop, its difference to the random baseline's (paired, per test triple) and the fraction of test triples
    whose drop exceeds the baseline's, each with a bootstrap interval over test triples (:func:`bootstrap_mean`,
    seeded by ``seed``), the removed indices and the cost (scoring and retraining seconds); the baseline's drops;
    and ``noise``: the margin change of retraining with nothing removed under another seed."""
    n_train, m = len(ds.train), len(test)
    full_margins = np.asarray(full_margins, dtype=np.float64)
    if full_margins.shape != (m,):
        raise ValueError(f"full_margins has shape {full_margins.shape}, expected ({m},)")
    for name, s in scores.items():
        if np.shape(s) != (m, n_train):
            raise ValueError(f"scores of {name!r} have shape {np.shape(s)}, expected ({m}, {n_train})")
    if k < 1 or draws < 1 or n_seeds < 1:
        raise ValueError("k, draws and n_seeds must be >= 1")
    seeds = [int(cfg.seed)] + [cf_seed(seed, "seed", i) for i in range(1, n_seeds)]
    removed = {name: [top_proponents(scores[name][j], k) for j in range(m)] for name in scores}
    baseline = [random_removals(n_train, k, seed, j, draws,
                                np.unique(np.concatenate([removed[e][j] for e in scores] or [np.zeros(0, int)]))
                                if disjoint else None) for j in range(m)]
    cache: dict[tuple[int, tuple[int, ...]], tuple[np.ndarray, float]] = {}  # one retraining per distinct removal
    total = 1 + (len(seeds) - 1) + len(seeds) * m * (len(scores) + draws)
    done = [0]

    def run(removal: np.ndarray, train_seed: int) -> tuple[np.ndarray, float]:
        key = (train_seed, tuple(int(i) for i in np.sort(removal)))
        if key not in cache:
            if progress is not None:
                progress(done[0], total, f"retraining {done[0] + 1}/{total}")
            cache[key] = retrain_margins(ds, cfg, removal, train_seed, test, device, work_dir)
        done[0] += 1
        return cache[key]

    nothing = np.zeros(0, dtype=np.int64)
    noise_margins, noise_s = run(nothing, cf_seed(seed, "noise"))
    ref = {seeds[0]: full_margins}
    for s in seeds[1:]:
        ref[s] = run(nothing, s)[0]
    rand = np.zeros((len(seeds), m, draws))
    rand_s = 0.0
    for a, s in enumerate(seeds):
        for j in range(m):
            for d, r in enumerate(baseline[j]):
                mj, sec = run(r, s)
                rand[a, j, d] = ref[s][j] - mj[j]
                rand_s += sec
    rand_drop = rand.mean((0, 2))
    out: dict[str, Any] = {"k": k, "draws": draws, "seeds": seeds, "disjoint": disjoint, "n_test": m,
                           "noise": {"per_test": (full_margins - noise_margins).tolist(),
                                     "mean_abs": float(np.abs(full_margins - noise_margins).mean()),
                                     "sd": float((full_margins - noise_margins).std(ddof=1)) if m > 1 else None,
                                     "seed": cf_seed(seed, "noise"), "seconds": round(noise_s, 3)},
                           "random_baseline": {"drop": bootstrap_mean(rand_drop, seed),
                                               "per_test": rand_drop.tolist(),
                                               "removed": [[r.tolist() for r in b] for b in baseline],
                                               "retrain_seconds": round(rand_s, 3)},
                           "estimators": {}}
    for name in scores:
        drops = np.zeros((len(seeds), m))
        sec = 0.0
        for a, s in enumerate(seeds):
            for j in range(m):
                mj, t = run(removed[name][j], s)
                drops[a, j] = ref[s][j] - mj[j]
                sec += t
        drop = drops.mean(0)
        out["estimators"][name] = {
            "drop": bootstrap_mean(drop, seed), "minus_random": bootstrap_mean(drop - rand_drop, seed),
            "beats_random": bootstrap_mean((drop > rand_drop).astype(np.float64), seed),
            "per_test": drop.tolist(), "removed": [r.tolist() for r in removed[name]],
            "n_removed": [len(r) for r in removed[name]],
            "score_seconds": None if score_seconds is None else round(float(score_seconds.get(name, 0.0)), 3),
            "retrain_seconds": round(sec, 3)}
    out["retrainings"] = len(cache)
    if progress is not None:
        progress(total, total, "retrainings done")
    return out
