r"""How good is a data-attribution estimator? The linear datamodeling score (LDS) and mislabel detection for ConvE.

**LDS** (Park et al. 2023, "TRAK: Attributing Model Behavior at Scale", §2). Train ``M`` models on random subsets
:math:`S_1..S_M` of the training triples, each holding :math:`\lceil\alpha n\rceil` of the ``n`` triples (a seeded
draw per subset; its model is trained with the same recipe and a seed of its own; every seed of one evaluation is
derived from its seed by :func:`design_seed`, so independent replicates share none). For a test triple ``z`` the estimator's
scores :math:`\tau(z)_i` (computed once, on the model trained on all the data) predict the subset model's output by
the sum over the subset, :math:`g_s(z) = \sum_{i\in S_s} \tau(z)_i`; the actual output :math:`f_s(z)` is the
subset model's. :math:`\mathrm{LDS}(z) = \mathrm{spearman}_s(g_s(z), f_s(z))`, and an estimator's LDS is its
mean over test triples, reported with a percentile bootstrap interval over test triples (seeded).

The output is TRAK's multi-class margin of the true tail on the tail query ``(h, r, ?)`` of the model in eval mode:
:math:`f(z) = s_t - \log\sum_{e\ne t} \exp s_e`, the log-odds of the softmax probability of the true tail among all
entities. (It grows when the training loss of ``z`` falls, which is what TracIn's positive scores predict.)

**Mislabel detection**: replace the tail of a seeded fraction of the training triples by another entity drawn
uniformly (never the true tail), train on the corrupted graph, rank every training triple by an estimator's
self-influence (largest first) and report the ROC AUC of that ranking against the corrupted set and the fraction
of corrupted triples found after inspecting the top 10% and 20% (the whole recall curve is returned).

Estimators are named in :mod:`models.kg.estimators`; the ones defined here are TracIn (all layers, or the last
layers), TracIn with Adam's update direction on the training side (:mod:`models.kg.tracin_adam`), TRAK on the full-data model's checkpoints, TRAK's model ensemble (TRAK averaged over the full-data model and
further models of the same recipe trained with the seeds :func:`member_seeds` gives) and seeded noise. Any
estimator of ``ENSEMBLE_BASES`` can be averaged over the same members (:func:`ensemble_scores`: TRAK's ensemble
is that of ``"trak"``), so that an ensemble's gain can be compared at equal numbers of trained models. An LDS
report also gives each estimator's LDS as a ratio to TracIn's, with a paired bootstrap interval
(:func:`ratio_interval`).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats

from models.kg.checkpoint import KGBundle
from models.kg.estimators import get as get_estimator
from models.kg.train import TrainConfig, train_conve
from models.kg.trak_config import trak_configuration
from models.kg.triples import TriplesDataset

CONFIDENCE = 0.95
N_RESAMPLES = 2000
RECALL_POINTS = 100  # the recall curve at 1%, 2%, ... 100% of the training triples inspected
RANDOM_SEED = 0      # the "random" estimator's noise
REFERENCE = "tracin"  # an LDS report gives every other estimator's LDS as a ratio to this one's
# An LDS report calls an estimator's comparison with TracIn underpowered when the interval of its ratio to TracIn's
# LDS is wider than this: an interval that wide holds both "half as good" and "half again as good", so the run
# cannot rank the two (``underpowered``).
UNDERPOWERED_RATIO_WIDTH = 1.0
OUTPUTS = ("margin", "loss")  # the test-side function of the estimators that take ``output``
DEFAULT_OUTPUT = "margin"     # an evaluation's: the quantity the LDS measures (:func:`margins`)


def check_output(output: str) -> None:
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")


# ---------------------------------------------------------------------------------------------- identities
def data_version(ds: TriplesDataset) -> str:
    """A digest of everything of the dataset a model or an output depends on: vocabularies and every split."""
    h = hashlib.sha256()
    for vocab in (ds.entities.names, ds.relations.names):
        h.update(json.dumps(vocab).encode())
    for split in sorted(ds.splits):
        t = ds.splits[split].to(torch.int64).contiguous()
        h.update(f"\0{split}\0{tuple(t.shape)}\0".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def content_key(**parts: Any) -> str:
    """A digest of JSON-able ``parts`` (canonical: sorted keys): the address of a stored ground truth."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# How an LDS evaluation's randomness follows from its seed (a replicate's seed). Every seed it uses is a digest of
# (this version, the replicate's seed, a role, an index): the subset masks, the subset models' training seeds, their
# replicates' training seeds, the test draw and the full-data model, so two replicates share no subset, no
# initialisation and no test draw, and one replicate's plan is reproducible. The version is part of every stored
# ground truth's address: a ground truth of another design is never served for this one.
LDS_DESIGN = 2
ROLES = ("subset-mask", "subset-train", "subset-replicate", "test", "full")


def design_seed(seed: int, role: str, index: int = 0, max_seed: int = 2**31 - 1) -> int:
    """The seed of ``role`` (one of ``ROLES``) number ``index`` in the replicate with seed ``seed``."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; one of {ROLES}")
    return _digest_seed(f"lds-design-{LDS_DESIGN}|{int(seed)}|{role}|{int(index)}", max_seed)


def subset_seeds(seed: int, m: int) -> list[int]:
    """The seed of each subset's draw (its mask, :func:`subset_mask`) in the replicate with seed ``seed``."""
    return [design_seed(seed, "subset-mask", i) for i in range(m)]


def subset_train_seeds(seed: int, m: int) -> list[int]:
    """The training seed of each subset model in the replicate with seed ``seed``."""
    return [design_seed(seed, "subset-train", i) for i in range(m)]


def subset_replicate_seeds(seed: int, m: int) -> list[int]:
    """The training seed of each subset model's replicate (the same subset trained again, for the noise ceiling)."""
    return [design_seed(seed, "subset-replicate", i) for i in range(m)]


def full_model_seed(seed: int, recipe_seed: int = 0) -> int:
    """The training seed of the full-data model of the replicate with seed ``seed``, for a recipe whose own seed is
    ``recipe_seed`` (both change it)."""
    return design_seed(seed, "full", recipe_seed)


def subset_mask(n_train: int, alpha: float, seed: int) -> np.ndarray:
    """``bool[n_train]`` with ``ceil(alpha * n_train)`` triples kept, drawn without replacement."""
    k = min(n_train, max(1, math.ceil(alpha * n_train)))
    keep = np.random.default_rng([seed, 0x5EED]).permutation(n_train)[:k]
    mask = np.zeros(n_train, dtype=bool)
    mask[keep] = True
    return mask


def member_seeds(recipe_seed: int, k: int, max_seed: int = 2**31 - 1) -> list[int]:
    """The seeds of the ``k`` ensemble members of a full-data model trained with ``recipe_seed``: drawn from a
    digest of (recipe seed, member index), so they never follow the subset models' consecutive seeds (a member
    sharing a subset model's initialisation would share its training noise with the ground truth)."""
    return [_digest_seed(f"ensemble-member|{int(recipe_seed)}|{i}", max_seed) for i in range(k)]


def _digest_seed(text: str, max_seed: int) -> int:
    """A seed in ``[0, max_seed]`` from a digest of ``text``."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") % (max_seed + 1)


def test_selection(n_split: int, n_test: int, seed: int) -> np.ndarray:
    """Positions in the test split of the ``n_test`` evaluated test triples (a draw seeded by the replicate's
    ``seed`` in the role "test", sorted)."""
    n = min(n_split, n_test)
    return np.sort(np.random.default_rng([design_seed(seed, "test"), 0x7E57]).permutation(n_split)[:n])


# ---------------------------------------------------------------------------------------------- training
def with_train(ds: TriplesDataset, train: torch.Tensor, keep_eval: bool = False) -> TriplesDataset:
    """``ds`` with another training split (same vocabularies); without ``keep_eval`` it has no valid/test split,
    so training evaluates nothing it does not need."""
    splits = {"train": train}
    if keep_eval:
        splits.update({k: v for k, v in ds.splits.items() if k != "train"})
    return TriplesDataset(ds.name, ds.entities, ds.relations, splits, ds.entity_labels, ds.relation_labels)


@torch.no_grad()
def margins(model: torch.nn.Module, triples: torch.Tensor, batch_size: int = 512) -> np.ndarray:
    """TRAK's margin of the true tail, ``s_t - logsumexp_{e != t} s_e``, per triple ``float64[n]`` (eval mode)."""
    model.eval()
    device = next(model.parameters()).device
    out = []
    for i in range(0, len(triples), batch_size):
        b = triples[i:i + batch_size].to(device)
        s = model(b[:, 0], b[:, 1]).double()
        st = s.gather(1, b[:, 2:3]).squeeze(1)
        others = s.scatter(1, b[:, 2:3], float("-inf"))
        out.append((st - torch.logsumexp(others, 1)).cpu())
    return torch.cat(out).numpy() if out else np.zeros(0)


# The full-data models (and the mislabel evaluation's models) keep Adam's state with each checkpoint, which
# ``tracin_adam`` reads; the store addresses of those models name it (``content_key(..., checkpoints=...)``), so a
# model stored before it was kept is never served to an estimator that needs it.
FULL_MODEL_CHECKPOINTS = "weights+adam-state"


def train_model(ds: TriplesDataset, cfg: TrainConfig, out_dir: Path, device: Any = None,
                progress: Callable[[int, int, str, dict | None], None] | None = None) -> dict:
    """Train with :func:`models.kg.train.train_conve` into ``out_dir`` (a model directory), keeping Adam's state
    with every checkpoint (``FULL_MODEL_CHECKPOINTS``). The subset models (:func:`train_subset`) keep weights
    only: no estimator runs on them."""
    return train_conve(ds, cfg, out_dir, device=device, progress=progress, optimizer_state=True)


def train_subset(ds: TriplesDataset, cfg: TrainConfig, alpha: float, seed: int, device: Any = None,
                 progress: Callable[[int, int, str, dict | None], None] | None = None,
                 work_dir: Path | None = None, train_seed: int | None = None) -> dict[str, Any]:
    """One subset model: its mask, its outputs on the whole test split (``margins``) and its training time
    (the model itself is trained in a temporary directory under ``work_dir`` and not kept). The subset is drawn
    with ``seed`` (:func:`subset_seeds`) and the model trained with ``train_seed`` (:func:`subset_train_seeds`, or
    :func:`subset_replicate_seeds` for a replicate of the same subset; default: ``seed``)."""
    from models.kg.checkpoint import load

    mask = subset_mask(len(ds.train), alpha, seed)
    sub_cfg = TrainConfig(**{**asdict(cfg), "seed": seed if train_seed is None else train_seed,
                             "checkpoint_every": cfg.epochs})
    if work_dir is not None:
        Path(work_dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="lds-subset-", dir=work_dir))
    try:
        t0 = time.perf_counter()
        train_conve(with_train(ds, ds.train[torch.from_numpy(mask)]), sub_cfg, work, device=device,
                    progress=progress)
        seconds = time.perf_counter() - t0
        model = load(work, device or "cpu").model
        outputs = margins(model, ds.test)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"mask": mask, "outputs": outputs, "seed": seed, "seconds": seconds}


# ---------------------------------------------------------------------------------------------- LDS
def predicted_outputs(masks: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """``g[s, j] = sum_{i in S_s} scores[j, i]``: ``[M, m]`` from masks ``[M, n]`` and scores ``[m, n]``."""
    return masks.astype(np.float64) @ np.asarray(scores, dtype=np.float64).T


def lds_per_test(masks: np.ndarray, outputs: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Spearman correlation over the subsets, per test triple (``float64[m]``; NaN where either side is
    constant over the subsets). ``outputs`` is ``[M, m]``. Ranks with ties averaged, then Pearson of the ranks,
    all columns at once; :func:`lds_reference` is the same one ``scipy.stats.spearmanr`` at a time."""
    pred = predicted_outputs(masks, scores)
    rp = stats.rankdata(pred, axis=0)
    ra = stats.rankdata(np.asarray(outputs, dtype=np.float64), axis=0)
    rp = rp - rp.mean(0)
    ra = ra - ra.mean(0)
    den = np.sqrt((rp * rp).sum(0) * (ra * ra).sum(0))
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (rp * ra).sum(0) / den
    out[den == 0] = np.nan
    return out


def lds_reference(masks: np.ndarray, outputs: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """:func:`lds_per_test` one test triple at a time with ``scipy.stats.spearmanr`` (the reference)."""
    pred = predicted_outputs(masks, scores)
    out = np.empty(pred.shape[1])
    for j in range(pred.shape[1]):
        if np.ptp(pred[:, j]) == 0 or np.ptp(outputs[:, j]) == 0:
            out[j] = np.nan
        else:
            out[j] = stats.spearmanr(pred[:, j], outputs[:, j]).statistic
    return out


def mean_interval(values: np.ndarray, seed: int, confidence: float = CONFIDENCE,
                  n_resamples: int = N_RESAMPLES) -> dict[str, Any]:
    """Mean of the finite ``values`` with a percentile bootstrap interval over them (``scipy.stats.bootstrap``,
    seeded: the same seed gives the same interval)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    out: dict[str, Any] = {"mean": None, "low": None, "high": None, "n": int(len(v)), "confidence": confidence,
                           "n_resamples": n_resamples, "seed": seed}
    if len(v) == 0:
        return out
    mean = float(v.mean())
    out["mean"] = mean
    if len(v) < 2 or np.ptp(v) == 0:
        out["low"] = out["high"] = mean
        return out
    res = stats.bootstrap((v,), np.mean, confidence_level=confidence, n_resamples=n_resamples,
                          method="percentile", vectorized=True, rng=np.random.default_rng(seed))
    out["low"], out["high"] = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return out


def _defined(a: Sequence[float | None], b: Sequence[float | None]) -> tuple[np.ndarray, np.ndarray]:
    """Two estimators' per-test LDS on the same test triples, as float64 arrays, keeping the test triples where
    both are defined (None and NaN are not)."""
    x = np.asarray([np.nan if v is None else v for v in a], dtype=np.float64)
    y = np.asarray([np.nan if v is None else v for v in b], dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"per-test values of different lengths: {x.shape} and {y.shape}")
    keep = np.isfinite(x) & np.isfinite(y)
    return x[keep], y[keep]


def ratio_interval(a: Sequence[float | None], b: Sequence[float | None], seed: int,
                   confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES) -> dict[str, Any]:
    """mean(a) / mean(b) of two estimators' per-test LDS, over the test triples where both are defined, with a
    paired percentile bootstrap interval (the same test triples resampled for both; seeded)."""
    x, y = _defined(a, b)
    out: dict[str, Any] = {"ratio": None, "low": None, "high": None, "n": int(len(x)), "confidence": confidence,
                           "n_resamples": n_resamples, "seed": seed}
    if len(x) == 0 or y.mean() == 0:
        return out
    out["ratio"] = float(x.mean() / y.mean())
    if len(x) < 2:
        out["low"] = out["high"] = out["ratio"]
        return out

    def stat(u: np.ndarray, v: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.mean(u, axis=axis) / np.mean(v, axis=axis)

    with np.errstate(divide="ignore", invalid="ignore"):  # a resample whose mean(b) is 0: no finite interval
        res = stats.bootstrap((x, y), stat, paired=True, confidence_level=confidence, n_resamples=n_resamples,
                              method="percentile", vectorized=True, rng=np.random.default_rng(seed))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if math.isfinite(low) and math.isfinite(high):
        out["low"], out["high"] = low, high
    return out


def underpowered(estimators: dict[str, Any], width: float = UNDERPOWERED_RATIO_WIDTH) -> list[str]:
    """A warning per estimator whose ratio to TracIn (``ratio_to_tracin`` of an LDS report) has an interval wider
    than ``width``, or none at all though the ratio is defined (a resample's TracIn mean was 0)."""
    out = []
    for name, e in estimators.items():
        r = e.get("ratio_to_" + REFERENCE) or {}
        ratio = r.get("ratio")
        if ratio is None:
            continue
        low, high, n = r.get("low"), r.get("high"), r.get("n")
        what = (f"underpowered: {name}'s LDS is {ratio:.3g} times TracIn's over {n} test triples, ")
        if low is None or high is None:
            what += "with no finite interval (TracIn's mean LDS was 0 in some resamples)"
        elif high - low > width:
            what += (f"{round(100 * r.get('confidence', CONFIDENCE))} % interval [{low:.3g}, {high:.3g}], "
                     f"{high - low:.3g} wide (more than {width:g})")
        else:
            continue
        out.append(what + f": this run cannot tell {name} and TracIn apart; measure more test triples (n_test) "
                   "or train more subset models (m)")
    return out


POOLED_METHOD = "hierarchical_bootstrap"  # what pooled_interval's low/high are (see its docstring)


def pooled_interval(strata: Sequence[tuple[Sequence[float | None], Sequence[float | None] | None]], seed: int,
                    confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES) -> dict[str, Any]:
    """An estimator's LDS pooled over independent replicates of an evaluation (other seeds: another full-data model,
    other subsets, other test triples). ``strata`` holds one ``(a, b)`` per replicate: the estimator's per-test LDS
    and, for a ratio, the reference's on the same test triples (``b`` None: the pooled mean of ``a``). The value
    is the mean over every test triple of every replicate (of those where ``a``, and ``b`` if given, are defined),
    or the ratio of the two such means.

    Two intervals, each named in the result, so that the variation between replicates is in them:

    - ``low``/``high`` (``method`` "hierarchical_bootstrap"): a two-level percentile bootstrap. Each resample draws
      as many replicates as there are, with replacement, then, within each drawn replicate, as many of its test
      triples as it has, with replacement (paired: the same draw for ``a`` and ``b``), and takes the pooled value.
      The draws are, in order: the replicate indices ``[n_resamples, R]``, then for each slot ``j < R`` one uniform
      ``[n_resamples, n_max]`` array whose first ``n`` columns, scaled by the drawn replicate's ``n`` and floored,
      are its test triples. (The subsets within a replicate are not resampled: the LDS of a test triple is already a
      correlation over them.) With one replicate this is the bootstrap over test triples alone
      (``resampled`` says which levels were).
    - ``t_interval``: with at least two replicates, the Student t interval of the mean of the per-replicate values
      (each replicate's own mean, or ratio of means), R - 1 degrees of freedom; None with one replicate."""
    refs = [b is not None for _, b in strata]
    if any(refs) and not all(refs):
        raise ValueError("give a reference for every replicate or for none")
    xs, ys = [], []
    for a, b in strata:  # without a reference, the ratio to a constant 1: the mean
        x, y = _defined(a, [1.0] * len(a) if b is None else b)
        xs.append(x)
        ys.append(y)
    n = sum(len(x) for x in xs)
    reps = len(xs)
    per = [float(x.sum() / y.sum()) if len(x) and y.sum() != 0 else None for x, y in zip(xs, ys, strict=True)]
    out: dict[str, Any] = {"value": None, "low": None, "high": None, "n": int(n), "replicates": reps,
                           "method": POOLED_METHOD,
                           "resampled": ["replicates", "test triples"] if reps > 1 else ["test triples"],
                           "confidence": confidence, "n_resamples": n_resamples, "seed": seed,
                           "per_replicate": per, "t_interval": replicate_t_interval(per, confidence)}
    den = sum(float(y.sum()) for y in ys)
    if n == 0 or den == 0:
        return out
    out["value"] = sum(float(x.sum()) for x in xs) / den
    boot = _hierarchical_resamples(xs, ys, np.random.default_rng(seed), n_resamples)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = boot[0] / boot[1]
    if np.all(np.isfinite(ratios)):
        tail = (1 - confidence) / 2 * 100
        out["low"], out["high"] = (float(v) for v in np.percentile(ratios, [tail, 100 - tail]))
    return out


def _hierarchical_resamples(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], rng: np.random.Generator,
                            n_resamples: int) -> np.ndarray:
    """``[2, n_resamples]``: the sums of ``x`` and of ``y`` over each two-level resample (replicates, then test
    triples within each; the draw order :func:`pooled_interval` states)."""
    reps = len(xs)
    sizes = np.array([len(x) for x in xs])
    n_max = max(int(sizes.max()), 1)
    px = np.zeros((reps, n_max))
    py = np.zeros((reps, n_max))
    for r, (x, y) in enumerate(zip(xs, ys, strict=True)):
        px[r, :len(x)] = x
        py[r, :len(y)] = y
    chosen = rng.integers(0, reps, size=(n_resamples, reps))
    sums = np.zeros((2, n_resamples))
    cols = np.arange(n_max)
    for j in range(reps):
        u = rng.random((n_resamples, n_max))
        r = chosen[:, j]
        size = sizes[r]
        idx = np.minimum(np.floor(u * size[:, None]).astype(np.int64), np.maximum(size[:, None] - 1, 0))
        keep = cols[None, :] < size[:, None]
        sums[0] += np.where(keep, px[r[:, None], idx], 0.0).sum(1)
        sums[1] += np.where(keep, py[r[:, None], idx], 0.0).sum(1)
    return sums


def replicate_t_interval(values: Sequence[float | None], confidence: float = CONFIDENCE) -> dict[str, Any] | None:
    """The Student t interval of the mean of per-replicate values (None when fewer than two are defined):
    mean ± t_{(1+confidence)/2, R-1} · sd / √R, ``method`` "t_over_replicates"."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    if len(v) < 2:
        return None
    mean = float(v.mean())
    half = float(stats.t.ppf((1 + confidence) / 2, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))
    return {"method": "t_over_replicates", "mean": mean, "low": mean - half, "high": mean + half,
            "replicates": int(len(v)), "confidence": confidence}


def noise_ceiling(outputs: np.ndarray, replicates: np.ndarray, seed: int) -> dict[str, Any]:
    """How much of the ground truth any estimator can predict. ``outputs`` and ``replicates`` are ``[M, m]``:
    subset model s's outputs and those of a replicate trained on the same subset with another seed. With
    f = g(S) + ε (ε the training noise, independent between the two), corr(f, f') = var g / var f = r, and any
    prediction p computed from the subset alone has corr(p, f) = corr(p, g)·√r ≤ √r. Returns the replicates'
    agreement r per test triple (Spearman, as the LDS) with its mean and bootstrap interval, and the ceiling
    estimate: the mean over test triples of √max(r, 0)."""
    r = lds_per_test(np.eye(len(outputs), dtype=bool), outputs, np.asarray(replicates, dtype=np.float64).T)
    finite = r[np.isfinite(r)]
    return {"agreement": mean_interval(r, seed), "ceiling": float(np.sqrt(np.clip(finite, 0, None)).mean())
            if len(finite) else None, "per_test": [None if not np.isfinite(x) else float(x) for x in r]}


@dataclass
class EstimatorRun:
    name: str
    values: np.ndarray  # scores [m, n] (LDS) or self-scores [n] (mislabel)
    seconds: float


def output_of(name: str, output: str = DEFAULT_OUTPUT) -> str | None:
    """The test-side output estimator ``name`` uses when an evaluation asks for ``output``: ``output`` itself for
    one that takes it, its fixed one otherwise (TRAK: ``"margin"``), None for one without (``random``)."""
    outputs = get_estimator(name).outputs
    return output if output in outputs else (outputs[0] if outputs else None)


def run_estimator(name: str, bundle: KGBundle, test: torch.Tensor | None, train: torch.Tensor,
                  self_scores: bool = False, members: Sequence[KGBundle] = (),
                  output: str = DEFAULT_OUTPUT) -> EstimatorRun:
    """Time one estimator on the full-data model: its scores ``[m, n]`` or its self-scores ``[n]``. An ensemble
    estimator's scores also get ``members`` (the further models it averages over; their time is counted); one that
    takes an ``output`` (:func:`output_of`) gets ``output``."""
    check_output(output)
    estimator = get_estimator(name)
    scores_fn, self_fn = estimator.load()
    ckpts = bundle.checkpoints
    extra: dict[str, Any] = {"members": list(members)} if estimator.ensemble and not self_scores else {}
    if not self_scores and len(estimator.outputs) > 1:
        extra["output"] = output
    t0 = time.perf_counter()
    out = self_fn(bundle, ckpts, train) if self_scores else scores_fn(bundle, ckpts, test, train, **extra)
    values = out.detach().double().cpu().numpy() if isinstance(out, torch.Tensor) else np.asarray(out, np.float64)
    seconds = time.perf_counter() - t0
    expected = (len(train),) if self_scores else (len(test), len(train))
    if values.shape != expected:
        raise ValueError(f"estimator {name!r} returned shape {values.shape}, expected {expected}")
    if not np.isfinite(values).all():
        raise ValueError(f"estimator {name!r} returned non-finite scores")
    return EstimatorRun(name, values, seconds)


def lds_report(bundle: KGBundle, masks: np.ndarray, outputs: np.ndarray, test: torch.Tensor,
               estimators: Sequence[str], seed: int,
               progress: Callable[[int, int, str], None] | None = None,
               scores: dict[str, np.ndarray] | None = None, members: Sequence[KGBundle] = (),
               output: str = DEFAULT_OUTPUT) -> dict[str, Any]:
    """Each estimator's LDS per test triple, its mean with a bootstrap interval, its time and the test-side output
    it used (``output`` where it takes one: :func:`output_of`). ``outputs`` is ``[M, m]`` for the test triples
    ``test`` (ids); ``masks`` ``[M, n]`` over ``bundle.dataset.train``. ``scores``, when given, receives each
    estimator's scores ``[m, n]``; ``members``: the ensemble members (further full-data models) the ensemble
    estimators average over."""
    train = bundle.dataset.train
    out: dict[str, Any] = {}
    for k, name in enumerate(estimators):
        if progress is not None:
            progress(k, len(estimators), f"estimator {name}")
        run = run_estimator(name, bundle, test, train, members=members, output=output)
        per = lds_per_test(masks, outputs, run.values)
        if scores is not None:
            scores[name] = run.values
        out[name] = {"lds": mean_interval(per, seed), "per_test": [None if not np.isfinite(x) else float(x)
                                                                    for x in per],
                     "seconds": round(run.seconds, 4), "n_undefined": int((~np.isfinite(per)).sum()),
                     "output": output_of(name, output)}
    if REFERENCE in out:  # each estimator's LDS relative to TracIn's, paired over the same test triples
        for name in out:
            if name != REFERENCE:
                out[name]["ratio_to_" + REFERENCE] = ratio_interval(out[name]["per_test"],
                                                                    out[REFERENCE]["per_test"], seed)
    if progress is not None:  # every estimator done: the job's counter reads n / n, not n - 1 / n
        progress(len(estimators), len(estimators), "estimators done")
    return out


# ---------------------------------------------------------------------------------------------- mislabels
def corrupt_tails(train: torch.Tensor, num_entities: int, fraction: float, seed: int
                  ) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """``(corrupted copy of train, sorted indices of the corrupted triples, their new tails)``: ``round(fraction *
    n)`` triples (at least one) get a tail drawn uniformly among the other entities (seeded)."""
    if num_entities < 2:
        raise ValueError("tail replacement needs at least two entities")
    n = len(train)
    k = min(n, max(1, round(fraction * n)))
    rng = np.random.default_rng([seed, 0xBAD])
    idx = np.sort(rng.choice(n, size=k, replace=False))
    old = train[torch.from_numpy(idx), 2].numpy()
    new = (old + rng.integers(1, num_entities, size=k)) % num_entities
    out = train.clone()
    out[torch.from_numpy(idx), 2] = torch.from_numpy(new).to(out.dtype)
    return out, idx, new


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC of ``scores`` for binary ``labels`` (Mann-Whitney U over average ranks, so ties count half)."""
    labels = np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUC needs both corrupted and clean triples")
    ranks = stats.rankdata(np.asarray(scores, dtype=np.float64))
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def auc_interval(labels: np.ndarray, scores: np.ndarray, seed: int, confidence: float = CONFIDENCE,
                 n_resamples: int = N_RESAMPLES, block_cells: int = 1 << 22) -> dict[str, Any]:
    """A percentile bootstrap interval of :func:`roc_auc` over the training triples, stratified: each resample
    draws the corrupted and the clean triples with replacement, each as many as there are (so every resample has
    both). Seeded. Each resample's AUC is the Mann-Whitney count over the triples' distinct scores (weights:
    how often a resample drew each, ties counting half), O(n) per resample rather than a sort, in blocks of at most
    ``block_cells`` counts: FB15k-237's 272,115 triples cost seconds, not minutes. ``n`` is the number of
    triples."""
    labels = np.asarray(labels, dtype=bool)
    scores = np.asarray(scores, dtype=np.float64)
    pos, neg = np.flatnonzero(labels), np.flatnonzero(~labels)
    out: dict[str, Any] = {"low": None, "high": None, "n": int(len(labels)), "confidence": confidence,
                           "n_resamples": n_resamples, "seed": seed}
    if len(pos) == 0 or len(neg) == 0:
        return out
    _, group = np.unique(scores, return_inverse=True)  # tied scores share a group, groups in score order
    n_groups = int(group.max()) + 1
    rng = np.random.default_rng([seed, 0xA0C])
    block = max(1, min(250, block_cells // n_groups))
    aucs = []
    for start in range(0, n_resamples, block):
        r = min(block, n_resamples - start)
        offsets = (np.arange(r) * n_groups)[:, None]
        wpos = np.bincount((group[rng.choice(pos, size=(r, len(pos)))] + offsets).ravel(),
                           minlength=r * n_groups).reshape(r, n_groups)
        wneg = np.bincount((group[rng.choice(neg, size=(r, len(neg)))] + offsets).ravel(),
                           minlength=r * n_groups).reshape(r, n_groups)
        below = np.cumsum(wneg, axis=1) - wneg  # clean draws scored strictly lower than each group
        aucs.append((wpos * (below + 0.5 * wneg)).sum(1) / (len(pos) * len(neg)))
    values = np.concatenate(aucs)
    alpha = (1 - confidence) / 2
    out["low"], out["high"] = (float(v) for v in np.quantile(values, [alpha, 1 - alpha]))
    return out


def suspect_order(scores: np.ndarray) -> np.ndarray:
    """The training triples' indices by self-influence, largest first, ties in training order: the order in which
    the recall curve and found@ inspect them, and the job lists its suspects."""
    return np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")


def recall_curve(labels: np.ndarray, scores: np.ndarray, points: int = RECALL_POINTS) -> dict[str, list[float]]:
    """Fraction of the corrupted triples found after inspecting the top ``q`` of all triples by score (largest
    first, ties in training order), at ``q = 0, 1/points, ..., 1``."""
    labels = np.asarray(labels, dtype=bool)
    order = suspect_order(scores)
    found = np.concatenate([[0], np.cumsum(labels[order])])
    n, n_pos = len(labels), max(1, int(labels.sum()))
    fractions = [i / points for i in range(points + 1)]
    return {"inspected": fractions,
            "found": [float(found[math.ceil(q * n - 1e-9)] / n_pos) for q in fractions]}


def found_at(labels: np.ndarray, scores: np.ndarray, fraction: float) -> float:
    """Fraction of corrupted triples among the top ``ceil(fraction * n)`` by score."""
    labels = np.asarray(labels, dtype=bool)
    order = suspect_order(scores)
    k = math.ceil(fraction * len(labels) - 1e-9)
    return float(labels[order[:k]].sum() / max(1, labels.sum()))


def mislabel_report(bundle: KGBundle, corrupted: np.ndarray, estimators: Sequence[str],
                    progress: Callable[[int, int, str], None] | None = None,
                    scores: dict[str, np.ndarray] | None = None, seed: int = 0) -> dict[str, Any]:
    """Each estimator's self-influence ranking of ``bundle``'s training triples against the ``corrupted``
    indices: AUC with its stratified bootstrap interval (``auc_interval``, seeded by ``seed``), found@10%/20% and
    the recall curve, and its time. ``scores``, when given, receives each estimator's self-scores ``[n]``."""
    train = bundle.dataset.train
    labels = np.zeros(len(train), dtype=bool)
    labels[corrupted] = True
    out: dict[str, Any] = {}
    for k, name in enumerate(estimators):
        if progress is not None:
            progress(k, len(estimators), f"estimator {name}")
        run = run_estimator(name, bundle, None, train, self_scores=True)
        if scores is not None:
            scores[name] = run.values
        out[name] = {"auc": roc_auc(labels, run.values), "auc_interval": auc_interval(labels, run.values, seed),
                     "found_at_10": found_at(labels, run.values, 0.10),
                     "found_at_20": found_at(labels, run.values, 0.20),
                     "recall_curve": recall_curve(labels, run.values), "seconds": round(run.seconds, 4)}
    if progress is not None:  # every estimator done: the job's counter reads n / n, not n - 1 / n
        progress(len(estimators), len(estimators), "estimators done")
    return out


# ---------------------------------------------------------------------------------------------- estimators
def _tracin(bundle: KGBundle, checkpoints: Sequence, layers: str) -> Any:
    from models.kg.influence import checkpoint_weights
    from models.kg.tracin import ConvETracIn

    return ConvETracIn(bundle.model, list(checkpoints), layers=layers,
                  weights=checkpoint_weights(bundle, list(checkpoints), "last"))


def _tracin_output(bundle: KGBundle, checkpoints: Sequence, test: torch.Tensor, train: torch.Tensor,
                   layers: str, output: str) -> torch.Tensor:
    return _tracin_at(_tracin(bundle, checkpoints, layers), test, train, output)


def tracin_scores(bundle: KGBundle, checkpoints: Sequence, test: torch.Tensor, train: torch.Tensor,
                  output: str = DEFAULT_OUTPUT) -> torch.Tensor:
    """TracIn-CP, every parameter, learning-rate weighted (``POST /tracin``'s defaults). The training side is the
    training loss's gradient; the test side is the gradient of ``output``: ``"margin"`` (the negated margin of the
    tail query, the quantity the LDS measures: :meth:`models.kg.tracin.ConvETracIn.output_influence`) or
    ``"loss"`` (the training loss, as ``POST /tracin``). ConvE trains with Adam, whose steps are not the gradient
    steps TracIn-CP's derivation assumes: TracIn is a heuristic here, whatever the output."""
    return _tracin_output(bundle, checkpoints, test, train, "all", output)


def tracin_self_scores(bundle: KGBundle, checkpoints: Sequence, train: torch.Tensor) -> torch.Tensor:
    return _tracin(bundle, checkpoints, "all").self_influence(train)


def tracin_last_scores(bundle: KGBundle, checkpoints: Sequence, test: torch.Tensor,
                       train: torch.Tensor, output: str = DEFAULT_OUTPUT) -> torch.Tensor:
    """TracIn-CP on the output layers only (``layers="last"``), ``output`` as :func:`tracin_scores`."""
    return _tracin_output(bundle, checkpoints, test, train, "last", output)


def tracin_last_self_scores(bundle: KGBundle, checkpoints: Sequence, train: torch.Tensor) -> torch.Tensor:
    return _tracin(bundle, checkpoints, "last").self_influence(train)


def tracin_adam_scores(bundle: KGBundle, checkpoints: Sequence, test: torch.Tensor, train: torch.Tensor,
                       output: str = DEFAULT_OUTPUT) -> torch.Tensor:
    """TracIn with Adam's update direction (:mod:`models.kg.tracin_adam`): the training side is Adam's update
    Γ(∇ℓ) from the optimizer state saved with each checkpoint (LESS), the test side the plain gradient of
    ``output`` (as :func:`tracin_scores`), learning-rate weighted, every parameter. A checkpoint without the Adam
    state is a ValueError naming the estimator."""
    from models.kg import tracin_adam

    check_output(output)
    return tracin_adam.scores(bundle, list(checkpoints), test, train, output)


def tracin_adam_self_scores(bundle: KGBundle, checkpoints: Sequence, train: torch.Tensor) -> torch.Tensor:
    from models.kg import tracin_adam

    return tracin_adam.self_scores(bundle, list(checkpoints), train)


def _last_checkpoint(bundle: KGBundle, checkpoints: Sequence) -> Any:
    """TracIn on the last checkpoint alone (the latest epoch), unweighted: the gradients GradDot and GradCos use."""
    from models.kg.tracin import ConvETracIn

    last = max(checkpoints, key=lambda c: (c.epoch, list(checkpoints).index(c)))
    return ConvETracIn(bundle.model, [last], layers="all", weights=[1.0])


def _gradient_norms(tracin: Any, examples: torch.Tensor, margin: bool) -> torch.Tensor:
    """‖∇‖ per example at ``tracin``'s one checkpoint: of the negated margin (``margin``) or the training loss."""
    from models.kg.tracin import ghost_kernel

    g = tracin.gradients
    g.load(tracin.checkpoints[0])
    with torch.no_grad():
        if margin:
            f = g.margin_features(examples)
            sq = ghost_kernel(f, f, g.names, rowwise=True)
        else:
            sq = g.self_dots(g.features(examples), len(examples))
    return sq.clamp_min(0).sqrt().double().cpu()


def graddot_scores(bundle: KGBundle, checkpoints: Sequence, test: torch.Tensor, train: torch.Tensor,
                   output: str = DEFAULT_OUTPUT) -> torch.Tensor:
    """GradDot: ⟨∇(test side), ∇ℓ(train)⟩ at the last checkpoint alone, every parameter, unweighted (the test side
    as :func:`tracin_scores`'s ``output``)."""
    return _tracin_at(_last_checkpoint(bundle, checkpoints), test, train, output)


def _tracin_at(tracin: Any, test: torch.Tensor, train: torch.Tensor, output: str) -> torch.Tensor:
    check_output(output)
    return tracin.influence(test, train)[0] if output == "loss" else tracin.output_influence(test, train)


def gradcos_scores(bundle: KGBundle, checkpoints: Sequence, test: torch.Tensor, train: torch.Tensor,
                   output: str = DEFAULT_OUTPUT) -> torch.Tensor:
    """GradCos: :func:`graddot_scores` divided by the two gradients' norms (cosine similarity; 0 where a gradient
    is 0)."""
    tracin = _last_checkpoint(bundle, checkpoints)
    dots = _tracin_at(tracin, test, train, output).double()
    nt = _gradient_norms(tracin, test, output == "margin")
    nb = _gradient_norms(tracin, train, False)
    den = nt[:, None] * nb[None, :]
    return torch.where(den > 0, dots / den.clamp_min(1e-300), torch.zeros_like(dots))


def graddot_self_scores(bundle: KGBundle, checkpoints: Sequence, train: torch.Tensor) -> torch.Tensor:
    """‖∇ℓ(z)‖² at the last checkpoint."""
    return _gradient_norms(_last_checkpoint(bundle, checkpoints), train, False) ** 2


def gradcos_self_scores(bundle: KGBundle, checkpoints: Sequence, train: torch.Tensor) -> torch.Tensor:
    """A gradient's cosine with itself: 1 for every training triple (no ranking: AUC 0.5 by construction)."""
    return torch.ones(len(train), dtype=torch.float64)


# TRAK's configuration (the margin on both sides, k = 4096 halved while the features would not fit, damping 0.3,
# every checkpoint and layer, seed 0) is defined once, torch-free, in models.kg.trak_config: the service's defaults
# read the same one. trak_scores and trak_self_scores pass exactly trak_configuration(n_train).


def trak_scores(bundle: KGBundle, checkpoints: Sequence, test: torch.Tensor, train: torch.Tensor) -> torch.Tensor:
    from models.kg import trak

    cfg = trak_configuration(len(train))
    return trak.trak_scores(bundle, list(checkpoints), test, train, layers=cfg["layers"], loss=cfg["loss"],
                            proj_dim=cfg["projection_dim"], damping=cfg["damping"], seed=cfg["seed"])


def trak_ensemble_scores(bundle: KGBundle, checkpoints: Sequence, test: torch.Tensor, train: torch.Tensor,
                         members: Sequence[KGBundle] = ()) -> torch.Tensor:
    """TRAK's model ensemble: :func:`trak_scores` of the full-data model (on ``checkpoints``) and of every member
    (on all of its checkpoints), averaged with equal weights (:func:`ensemble_scores` of ``"trak"``). The members
    are models of the same recipe and training triples with other seeds; with none it is :func:`trak_scores`."""
    return ensemble_scores("trak", bundle, checkpoints, test, train, members)


# The estimators whose scores can be averaged over independently trained models of one recipe (a model ensemble,
# :func:`ensemble_scores`): each one's scores are a function of one trained model and its checkpoints, in the
# same units on every model, so the mean over models is the same estimator with the training noise of one model
# averaged out. ``tracin_adam`` reads the Adam state saved with each checkpoint, which the members keep too
# (:func:`train_model` trains them, ``FULL_MODEL_CHECKPOINTS``). Not ensembled: ``random`` (its noise does not
# depend on the model: the mean over models is the same noise) and ``trak_ensemble`` (already an ensemble: it is
# ``ensemble_scores("trak", ...)``).
ENSEMBLE_BASES = ("tracin", "tracin_last", "tracin_adam", "trak", "graddot", "gradcos")


def check_members(train: torch.Tensor, members: Sequence[KGBundle]) -> None:
    """A ValueError unless every member was trained on exactly ``train`` (the full-data model's triples)."""
    for member in members:
        if member.dataset.train.shape != train.shape or not bool((member.dataset.train == train).all()):
            raise ValueError("an ensemble member was trained on other training triples than the full-data model")


def member_runs(name: str, bundle: KGBundle, checkpoints: Sequence, test: torch.Tensor, train: torch.Tensor,
                members: Sequence[KGBundle] = (), output: str = DEFAULT_OUTPUT) -> list[EstimatorRun]:
    """Estimator ``name`` (one of ``ENSEMBLE_BASES``) run once on each model of an ensemble, timed: the full-data
    model on ``checkpoints``, then each member on all of its checkpoints (members checked as
    :func:`check_members`); ``output`` as :func:`run_estimator`. Their mean is :func:`ensemble_scores`."""
    if name not in ENSEMBLE_BASES:
        raise ValueError(f"estimator {name!r} cannot be ensembled; one of {ENSEMBLE_BASES}")
    check_members(train, members)
    estimator = get_estimator(name)
    scores_fn, _ = estimator.load()
    extra: dict[str, Any] = {}
    if len(estimator.outputs) > 1:
        check_output(output)
        extra["output"] = output
    runs = []
    for model, ckpts in [(bundle, checkpoints), *((m, m.checkpoints) for m in members)]:
        t0 = time.perf_counter()
        out = scores_fn(model, ckpts, test, train, **extra)
        values = out.detach().double().cpu().numpy()
        runs.append(EstimatorRun(name, values, time.perf_counter() - t0))
    return runs


def ensemble_scores(name: str, bundle: KGBundle, checkpoints: Sequence, test: torch.Tensor, train: torch.Tensor,
                    members: Sequence[KGBundle] = (), output: str = DEFAULT_OUTPUT) -> torch.Tensor:
    """The model ensemble of estimator ``name`` (one of ``ENSEMBLE_BASES``): its scores on the full-data model (on
    ``checkpoints``) and on each member (on all of its checkpoints), averaged with equal weights, float64. The
    members are models of the same recipe and training triples with other seeds (:func:`member_seeds`; a member
    trained on other triples is a ValueError); with none it is the estimator itself."""
    runs = member_runs(name, bundle, checkpoints, test, train, members, output)
    total = torch.from_numpy(runs[0].values.copy())
    for run in runs[1:]:
        total += torch.from_numpy(run.values)
    return total / len(runs)


def trak_self_scores(bundle: KGBundle, checkpoints: Sequence, train: torch.Tensor) -> torch.Tensor:
    from models.kg import trak

    cfg = trak_configuration(len(train))
    return trak.self_scores(bundle, list(checkpoints), train, layers=cfg["layers"], loss=cfg["loss"],
                            proj_dim=cfg["projection_dim"], damping=cfg["damping"], seed=cfg["seed"])


def random_scores(bundle: KGBundle, checkpoints: Sequence, test: torch.Tensor, train: torch.Tensor) -> torch.Tensor:
    """Standard normal noise, seeded (``RANDOM_SEED``): LDS about 0, AUC about 0.5."""
    gen = torch.Generator().manual_seed(RANDOM_SEED)
    return torch.randn(len(test), len(train), generator=gen, dtype=torch.float64)


def random_self_scores(bundle: KGBundle, checkpoints: Sequence, train: torch.Tensor) -> torch.Tensor:
    gen = torch.Generator().manual_seed(RANDOM_SEED)
    return torch.randn(len(train), generator=gen, dtype=torch.float64)
