"""A gradient feature store, model-agnostic: each training example's projected gradient φ_c(z)
(:mod:`models.explain.trak`) per checkpoint, computed once and kept in the file store, so that a later TRAK or
projected-TracIn query of the model is one tiled matrix product over the stored rows.

The model enters through a :class:`FeatureSource` (a model family's side of the store): the training examples
featurized by default, its checkpoints, its configuration (part of the key), its layer resolution, the losses it
offers and a factory of its :class:`models.explain.trak.Projector`. ConvE's is :class:`models.kg.stored.ConvEFeatures`.

Layout (keys under ``features/``, content-addressed; the store is any object with ``put_dir``, ``list_dirs``,
``local_dir`` and ``exists``, in the service :class:`core.filestore.Store`)::

    features/<feature key>/<segment digest>/features.npy   float32 [rows, k]   φ of the segment's examples
                                            gram.npy       float64 [k, k]      ΦᵀΦ of those rows
                                            meta.json      rows, examples digest, the settings

The feature key is a SHA-256 of everything that changes a feature: the checkpoint's weights (every tensor of its
state dict, so the model version enters through what it holds, and two versions with identical weights share
features), the model's configuration, the resolved layers, the loss, the projection dimension and seed (and,
for a source that draws a projection per checkpoint, that checkpoint's own seed:
:meth:`FeatureSource.projection_seed`), the dtype and the store format. The segment digest is a SHA-256 of the segment's examples (integer examples, such as
ConvE's ``[n, 3]`` triple ids, as int64; in order).

Which rows are new. For a training set ``T`` (``[n, ...]``, in order) and one feature key, the stored
segments are chained greedily from row 0: at each offset the longest stored segment whose digest equals that of
the rows it would cover is taken. What the chain leaves uncovered (appended examples, or everything for a new
checkpoint or new settings) is computed, in segments of at most ``SEGMENT_ROWS`` rows (fewer for a large k:
``segment_rows``), and stored. So appending
examples featurizes only them, and a new checkpoint only its own rows; an example changed in the middle recomputes
from there on. Segments are never overwritten (a key that appeared meanwhile, written by another worker with the
same content, is taken as it is).

Scoring. With ``Q_c = φ_c(test)(G_c + λ_c I)⁻¹ / C`` for TRAK (``G_c`` the sum of the chain's Gram blocks, as
:func:`models.explain.trak.projected_trak_scores` computes it in one piece) or ``Q_c = η_c φ_c(test)`` for projected
TracIn, a query's scores are ``Σ_c Q_c Φ_cᵀ``, computed over tiles of ``TILE_ROWS`` training rows (fewer for many
test examples: ``tile_rows_for``; each checkpoint's rows read from its memory-mapped segments), each tile merged
into a running top-k per test example (a stable sort, so ties keep training order exactly as a full sort of the
row). Memory is the tile, never test × train.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import tempfile
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.explain.tracin import CheckpointLike
from models.explain.trak import (
    DEFAULT_DAMPING,
    Projector,
    check_proj_dim,
    damped_cholesky,
    gram_of,
    resolve_checkpoints,
    trak_query,
)

FORMAT = "explainq-grad-features-1"
PREFIX = "features"
SEGMENT_ROWS = 65_536      # rows per stored segment (a featurize pass writes each as soon as it is computed)
SEGMENT_BYTES = 256 * 2**20  # ... and at most this many bytes of features in one (large k: fewer rows)
TILE_ROWS = 65_536         # training rows per tile of a query
TILE_SCORES = 2**24        # ... and at most this many scores in one tile (many test examples: fewer rows)


def segment_rows(proj_dim: int) -> int:
    """Rows per stored segment for projection dimension ``proj_dim`` (memory of one segment bounded)."""
    return max(1024, min(SEGMENT_ROWS, SEGMENT_BYTES // (4 * int(proj_dim))))


def tile_rows_for(n_test: int) -> int:
    """Training rows per query tile for ``n_test`` test examples (the score tile bounded)."""
    return max(1024, min(TILE_ROWS, TILE_SCORES // max(1, n_test)))
ESTIMATORS = ("trak", "tracin_projected")
ProgressFn = Callable[[int, int, str], None]


SMALL_QUERY = 16          # test examples up to which a query runs on one thread (see ``threads_for``)


@contextlib.contextmanager
def threads_for(m: int) -> Iterator[None]:
    """One intra-op thread for a query of at most ``SMALL_QUERY`` test examples, restored afterwards. Its operations
    are small (one row of 65,536 scores per tile), too small to gain from a second thread, and on a busy machine
    the threads' synchronisation cost more than the work: measured on 2 shared cores at 272k rows, the top-k
    took 0.08 to 2.4 s on two threads and 0.035 s on one."""
    before = torch.get_num_threads()
    if m > SMALL_QUERY or before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class FeatureSource(ABC):
    """A model family's side of the feature store: what to featurize, with which projector, under which key.

    ``losses``: the loss names its projector accepts. ``checkpoints`` and :meth:`checkpoint` (a name or epoch to
    a checkpoint) select what is featurized (:func:`models.explain.trak.resolve_checkpoints`).
    """

    losses: tuple[str, ...]

    @property
    @abstractmethod
    def checkpoints(self) -> Sequence[CheckpointLike]:
        """Every checkpoint of the model, in order."""

    @abstractmethod
    def checkpoint(self, name: str) -> CheckpointLike:
        """The checkpoint called ``name``; ``KeyError`` when there is none."""

    @property
    @abstractmethod
    def examples(self) -> torch.Tensor:
        """The training examples featurized by default, one per row (in order: rows are what segments chain)."""

    @property
    @abstractmethod
    def config(self) -> dict[str, Any]:
        """The model's configuration as a JSON-able dict (part of every feature key)."""

    @abstractmethod
    def resolve_layers(self, layers: str | Sequence[str]) -> tuple[str, ...]:
        """The parameter names ``layers`` stands for (``ValueError`` for an unknown one), as its projector resolves
        them: the stored settings and the key hold these."""

    @abstractmethod
    def projector(self, layers: tuple[str, ...], loss: str, proj_dim: int, seed: int,
                  device: torch.device | str | None, dtype: torch.dtype, batch_size: int) -> Projector:
        """A projector of the model for these settings (``device`` None: the model's)."""

    def projection_seed(self, loss: str, seed: int, ckpt: CheckpointLike) -> int | None:
        """The seed of checkpoint ``ckpt``'s projection when it is not ``seed`` itself (None: every checkpoint is
        projected with ``seed``). A source that draws a projection per checkpoint returns it here; it is part of
        that checkpoint's feature key."""
        return None


class NotFeaturized(LookupError):
    """The store does not hold features of every training example for a checkpoint and these settings."""


def _digest_tensor(h: Any, t: torch.Tensor) -> None:
    t = t.detach().cpu().contiguous()
    h.update(f"{t.dtype}\0{tuple(t.shape)}\0".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def weights_digest(ckpt: Any) -> str:
    """SHA-256 of a checkpoint's state dict (names, dtypes, shapes, bytes), cached by file path and mtime."""
    path = getattr(ckpt, "path", None)
    stamp = None
    if path is not None:
        st = Path(path).stat()
        stamp = (str(path), st.st_size, st.st_mtime_ns)
        if stamp in _DIGESTS:
            return _DIGESTS[stamp]
    h = hashlib.sha256()
    for name, t in sorted(ckpt.state_dict("cpu").items()):
        h.update(f"{name}\0".encode())
        _digest_tensor(h, t)
    out = h.hexdigest()
    if stamp is not None:
        if len(_DIGESTS) > 256:
            _DIGESTS.clear()
        _DIGESTS[stamp] = out
    return out


_DIGESTS: dict[tuple, str] = {}


def examples_digest(examples: torch.Tensor) -> str:
    """SHA-256 of a segment's examples: integer (and boolean) examples as int64, floating ones as they are."""
    h = hashlib.sha256()
    _digest_tensor(h, examples if examples.is_floating_point() or examples.is_complex() else examples.to(torch.int64))
    return h.hexdigest()


@dataclass(frozen=True)
class FeatureSettings:
    """What, besides the checkpoint's weights, changes a feature."""

    layers: tuple[str, ...]   # resolved parameter names
    loss: str
    proj_dim: int
    seed: int

    def key(self, model_config: Any, ckpt_digest: str, projection_seed: int | None = None) -> str:
        """The feature key; ``projection_seed``: the checkpoint's own projection seed, where the source draws one
        per checkpoint (:meth:`FeatureSource.projection_seed`; absent from the key otherwise)."""
        cfg = model_config.to_dict() if hasattr(model_config, "to_dict") else dict(model_config)
        content = {"format": FORMAT, "config": cfg, "weights": ckpt_digest, "layers": list(self.layers),
                   "loss": self.loss, "proj_dim": self.proj_dim, "seed": self.seed, "dtype": "float32"}
        if projection_seed is not None:
            content["projection_seed"] = int(projection_seed)
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def settings_for(source: FeatureSource, layers: str | Sequence[str], loss: str, proj_dim: int,
                 seed: int) -> FeatureSettings:
    """Validated settings (the layers resolved against the model, as its projector does)."""
    if loss not in source.losses:
        raise ValueError(f"loss must be one of {source.losses}, got {loss!r}")
    check_proj_dim(proj_dim)
    return FeatureSettings(source.resolve_layers(layers), loss, int(proj_dim), int(seed))


@dataclass
class Segment:
    start: int
    end: int
    digest: str


def _stored_segments(store: Any, key: str) -> dict[int, set[str]]:
    """rows -> digests of the stored segments of feature key ``key``."""
    out: dict[int, set[str]] = {}
    for name in store.list_dirs(f"{PREFIX}/{key}"):
        try:
            meta = json.loads(store.read_bytes(f"{PREFIX}/{key}/{name}/meta.json"))
        except Exception:  # a segment still being written elsewhere, or damaged: not usable
            continue
        if meta.get("format") == FORMAT and meta.get("digest") == name:
            out.setdefault(int(meta["rows"]), set()).add(name)
    return out


def chain(store: Any, key: str, train: torch.Tensor) -> tuple[list[Segment], int]:
    """The stored segments covering ``train`` from row 0 (greedy, longest first) and the first row they leave."""
    stored = _stored_segments(store, key)
    sizes = sorted(stored, reverse=True)
    segs: list[Segment] = []
    off, n = 0, len(train)
    while off < n:
        for rows in sizes:
            if off + rows <= n:
                d = examples_digest(train[off:off + rows])
                if d in stored[rows]:
                    segs.append(Segment(off, off + rows, d))
                    off += rows
                    break
        else:
            break
    return segs, off


def featurize(store: Any, source: FeatureSource, checkpoints: Any = "all", *,
              layers: str | Sequence[str] = "all", loss: str = "train", proj_dim: int = 256, seed: int = 0,
              train: torch.Tensor | None = None, device: torch.device | str | None = None, batch_size: int = 256,
              progress: ProgressFn | None = None) -> dict[str, Any]:
    """Compute and store what is missing of the features of ``train`` (default: the source's training examples)
    for each checkpoint. Returns per checkpoint its feature key and the rows reused and computed."""
    ckpts = resolve_checkpoints(source, checkpoints)
    train = source.examples if train is None else train
    fs = settings_for(source, layers, loss, proj_dim, seed)
    proj = source.projector(fs.layers, loss, proj_dim, seed, device, torch.float32, batch_size)
    plans = []
    for ck in ckpts:
        own = source.projection_seed(loss, seed, ck)
        key = fs.key(source.config, weights_digest(ck), own)
        segs, off = chain(store, key, train)
        plans.append((ck, key, segs, off, own))
    todo = sum(len(train) - off for *_, off, _own in plans)
    done = 0
    report = []
    t0 = time.perf_counter()
    for ck, key, _segs, off, own in plans:
        computed = len(train) - off
        if computed:
            _reseed(proj, seed if own is None else own)
            proj.load(ck)
        seg = segment_rows(proj_dim)
        for s0 in range(off, len(train), seg):
            rows = train[s0:s0 + seg]
            phi = torch.empty(len(rows), proj.proj_dim, dtype=torch.float32)
            for b0 in range(0, len(rows), max(batch_size, 4096)):
                part = rows[b0:b0 + max(batch_size, 4096)]
                phi[b0:b0 + len(part)] = proj.features(part).cpu()
                done += len(part)
                if progress is not None:
                    progress(done, todo, f"checkpoint {ck.name}: {s0 + b0 + len(part)}/{len(train)} rows")
            _put_segment(store, key, rows, phi, fs)
        report.append({"checkpoint": ck.name, "key": key, "rows": len(train), "reused": off, "computed": computed})
    return {"format": FORMAT, "layers": list(fs.layers), "loss": loss, "proj_dim": int(proj_dim), "seed": int(seed),
            "n_train": len(train), "checkpoints": report, "rows_computed": todo,
            "seconds": round(time.perf_counter() - t0, 3)}


def _reseed(proj: Projector, seed: int) -> None:
    if int(getattr(proj, "seed", seed)) != int(seed):
        proj.reseed(seed)  # type: ignore[attr-defined]


def _put_segment(store: Any, key: str, rows: torch.Tensor, phi: torch.Tensor, fs: FeatureSettings) -> None:
    digest = examples_digest(rows)
    target = f"{PREFIX}/{key}/{digest}"
    if store.exists(target):
        return
    tmp = Path(tempfile.mkdtemp(prefix="features-"))
    try:
        np.save(tmp / "features.npy", phi.numpy())
        np.save(tmp / "gram.npy", gram_of(phi).numpy())
        (tmp / "meta.json").write_text(json.dumps({"format": FORMAT, "rows": len(rows), "digest": digest,
                                                   "layers": list(fs.layers), "loss": fs.loss,
                                                   "proj_dim": fs.proj_dim, "seed": fs.seed}))
        try:
            store.put_dir(tmp, target)
        except Exception:
            if not store.exists(target):  # not a concurrent writer of the same content: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class _Rows:
    """One checkpoint's stored features as a row-addressable view over its memory-mapped segments."""

    def __init__(self, store: Any, key: str, segs: list[Segment]) -> None:
        self.segs = segs
        self.maps = []
        gram = None
        for s in segs:
            d = store.local_dir(f"{PREFIX}/{key}/{s.digest}")
            self.maps.append(np.load(d / "features.npy", mmap_mode="r"))
            g = torch.from_numpy(np.load(d / "gram.npy"))
            gram = g if gram is None else gram + g
        self.gram = gram
        self._chol: dict[float, torch.Tensor] = {}

    def chol(self, damping: float) -> torch.Tensor:
        """The Cholesky factor of ``gram + λI``, computed once per damping."""
        if damping not in self._chol:
            self._chol[damping] = damped_cholesky(self.gram, damping)
        return self._chol[damping]

    def rows(self, r0: int, r1: int) -> torch.Tensor:
        parts = []
        for s, m in zip(self.segs, self.maps, strict=True):
            lo, hi = max(r0, s.start), min(r1, s.end)
            if lo < hi:
                parts.append(np.asarray(m[lo - s.start:hi - s.start]))
        with warnings.catch_warnings():  # read-only memory map: the tensor is only ever read
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(parts[0] if len(parts) == 1 else np.concatenate(parts))


@dataclass
class TopK:
    """Per test example: the ``k`` largest positive scores (proponents) and most negative (opponents), column
    positions (-1 in unused slots) and values, with counts of positive and negative scores."""

    pro_idx: torch.Tensor
    pro_val: torch.Tensor
    opp_idx: torch.Tensor
    opp_val: torch.Tensor
    n_positive: torch.Tensor
    n_negative: torch.Tensor


def _merge(vals: torch.Tensor, idx: torch.Tensor, new_vals: torch.Tensor, c0: int,
           k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest of the running ``vals`` (lower columns) and a tile ``new_vals`` starting at column ``c0``,
    ties in column order. Only the tile's candidates are sorted: every entry at least the tile's k-th largest
    (``topk`` of as many as the row with the most such entries has), put in column order, then stably sorted by
    value, which is exactly a stable sort of the whole tile's first ``k``."""
    kk = min(k, new_vals.shape[1])
    thr = torch.topk(new_vals, kk, dim=1).values[:, -1:]
    width = int(((new_vals >= thr) & (new_vals > float("-inf"))).sum(1).max())
    if width == 0:  # nothing in this tile (-inf marks what is not ranked)
        return vals, idx
    cand_v, cand_i = torch.topk(new_vals, width, dim=1)
    by_col = torch.argsort(cand_i, dim=1)
    cand_v, cand_i = cand_v.gather(1, by_col), cand_i.gather(1, by_col) + c0
    v = torch.cat([vals, cand_v], 1)
    order = torch.sort(v, dim=1, descending=True, stable=True).indices[:, :k]
    return v.gather(1, order), torch.cat([idx, cand_i], 1).gather(1, order)


def streaming_top_k(tiles: Iterator[tuple[int, torch.Tensor]], m: int, k: int) -> TopK:
    """Running top-k over ``(first column, scores [m, t])`` tiles in column order."""
    neg = float("-inf")
    pv, pi = torch.full((m, k), neg), torch.full((m, k), -1, dtype=torch.long)
    ov, oi = torch.full((m, k), neg), torch.full((m, k), -1, dtype=torch.long)
    n_pos = torch.zeros(m, dtype=torch.long)
    n_neg = torch.zeros(m, dtype=torch.long)
    for c0, s in tiles:
        s = s.float()
        pos, negm = s > 0, s < 0
        n_pos += pos.sum(1)
        n_neg += negm.sum(1)
        if k:
            pv, pi = _merge(pv, pi, s.masked_fill(~pos, neg), c0, k)
            ov, oi = _merge(ov, oi, (-s).masked_fill(~negm, neg), c0, k)
    return TopK(pi.masked_fill(torch.isinf(pv), -1), pv.masked_fill(torch.isinf(pv), 0.0),
                oi.masked_fill(torch.isinf(ov), -1), (-ov).masked_fill(torch.isinf(ov), 0.0), n_pos, n_neg)


def full_sort_top_k(scores: torch.Tensor, k: int) -> TopK:
    """The reference of :func:`streaming_top_k`: a stable sort of each whole row."""
    m = scores.shape[0]
    pi, pv = torch.full((m, k), -1, dtype=torch.long), torch.zeros(m, k)
    oi, ov = torch.full((m, k), -1, dtype=torch.long), torch.zeros(m, k)
    for i, row in enumerate(scores.float()):
        for sign, idx, val in ((1.0, pi, pv), (-1.0, oi, ov)):
            sel = torch.nonzero(sign * row > 0).flatten()
            order = sel[torch.argsort(sign * row[sel], descending=True, stable=True)][:k]
            idx[i, :len(order)] = order
            val[i, :len(order)] = row[order]
    return TopK(pi, pv, oi, ov, (scores > 0).sum(1), (scores < 0).sum(1))


class FeatureIndex:
    """The stored features of ``train`` for ``checkpoints`` and one set of settings, opened for queries.

    Raises :class:`NotFeaturized` when a checkpoint's rows are not all stored (featurize first).
    """

    def __init__(self, store: Any, source: FeatureSource, checkpoints: Any = "all", *,
                 layers: str | Sequence[str] = "all", loss: str = "train", proj_dim: int = 256, seed: int = 0,
                 train: torch.Tensor | None = None, batch_size: int = 256) -> None:
        self.source = source
        self.ckpts = resolve_checkpoints(source, checkpoints)
        self.train = source.examples if train is None else train
        self.settings = settings_for(source, layers, loss, proj_dim, seed)
        self.proj = source.projector(self.settings.layers, loss, proj_dim, seed, "cpu", torch.float32, batch_size)
        self.views: list[_Rows] = []
        self.keys: list[str] = []
        self.seeds: list[int] = []
        for ck in self.ckpts:
            own = source.projection_seed(loss, seed, ck)
            self.seeds.append(int(seed) if own is None else own)
            key = self.settings.key(source.config, weights_digest(ck), own)
            segs, off = chain(store, key, self.train)
            if off < len(self.train):
                raise NotFeaturized(f"checkpoint {ck.name!r}: {len(self.train) - off} of {len(self.train)} training "
                                    "examples have no stored features for these settings; run featurize first")
            self.keys.append(key)
            self.views.append(_Rows(store, key, segs))

    def test_features(self, test: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for ck, s in zip(self.ckpts, self.seeds, strict=True):
            _reseed(self.proj, s)
            self.proj.load(ck)
            out.append(self.proj.features(test))
        return out

    def queries(self, test: torch.Tensor, estimator: str = "trak", damping: float = DEFAULT_DAMPING,
                weights: Sequence[float] | None = None) -> list[torch.Tensor]:
        """Per checkpoint the test-side ``Q_c`` ``[m, k]`` (module docstring)."""
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
        with threads_for(len(test)):
            phis = self.test_features(test)
        if estimator == "trak":
            return [trak_query(v.gram, damping, p, v.chol(float(damping))) / len(phis)
                    for v, p in zip(self.views, phis, strict=True)]
        return [eta * p for eta, p in zip(self.weights(weights), phis, strict=True)]

    def weights(self, weights: Sequence[float] | None = None) -> list[float]:
        """Projected TracIn's checkpoint weights: ``weights``, or the stored learning rates."""
        etas = [float(c.lr) for c in self.ckpts] if weights is None else [float(w) for w in weights]
        if len(etas) != len(self.ckpts):
            raise ValueError(f"{len(etas)} weights for {len(self.ckpts)} checkpoints")
        return etas

    def self_scores(self, rows: Sequence[int], estimator: str = "trak", damping: float = DEFAULT_DAMPING,
                    weights: Sequence[float] | None = None) -> torch.Tensor:
        """The estimator's score of each stored training row in ``rows`` on itself (from the stored features)."""
        if not rows:
            return torch.zeros(0)
        phis = [torch.cat([v.rows(j, j + 1) for j in rows]) for v in self.views]
        return self._self(phis, estimator, damping, weights)

    def self_scores_of(self, examples: torch.Tensor, estimator: str = "trak", damping: float = DEFAULT_DAMPING,
                       weights: Sequence[float] | None = None) -> torch.Tensor:
        """The same for examples given as such (their features computed now)."""
        return self._self(self.test_features(examples), estimator, damping, weights)

    def _self(self, phis: list[torch.Tensor], estimator: str, damping: float,
              weights: Sequence[float] | None) -> torch.Tensor:
        if estimator == "trak":
            parts = [(trak_query(v.gram, damping, p, v.chol(float(damping))) * p).sum(1) / len(phis)
                     for v, p in zip(self.views, phis, strict=True)]
        else:
            parts = [eta * (p * p).sum(1) for eta, p in zip(self.weights(weights), phis, strict=True)]
        return torch.stack(parts).sum(0)

    def tiles(self, qs: list[torch.Tensor], tile_rows: int | None = None) -> Iterator[tuple[int, torch.Tensor]]:
        """``(first row, Σ_c Q_c Φ_c[rows]ᵀ)`` over tiles of ``tile_rows`` training rows (default
        :func:`tile_rows_for` the number of test examples)."""
        n = len(self.train)
        tile_rows = tile_rows_for(qs[0].shape[0]) if tile_rows is None else tile_rows
        for r0 in range(0, n, tile_rows):
            r1 = min(n, r0 + tile_rows)
            s = None
            for q, v in zip(qs, self.views, strict=True):
                part = q @ v.rows(r0, r1).t()
                s = part if s is None else s + part
            yield r0, s

    def scores(self, qs: list[torch.Tensor], tile_rows: int | None = None) -> torch.Tensor:
        """Every score ``[m, n]`` (for small sets and tests; queries use :meth:`top_k`)."""
        return torch.cat([s for _, s in self.tiles(qs, tile_rows)], 1)

    def top_k(self, qs: list[torch.Tensor], k: int, tile_rows: int | None = None) -> TopK:
        with threads_for(qs[0].shape[0]):
            return streaming_top_k(self.tiles(qs, tile_rows), qs[0].shape[0], k)
