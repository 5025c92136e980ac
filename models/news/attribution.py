r"""Which words of a headline made the recommender score it for this user?

The attributed function is the model's own score of the candidate,

.. math:: F(e) = \langle \mathrm{news\_encoder}(e),\ u \rangle,

where :math:`e` is the output of the candidate's token embedding layer for one view (title, or body for NAML),
``news_encoder`` is every later layer of the real news encoder (for NRMS-MiniLM: position/type embeddings,
LayerNorm, all six transformer layers, word-level multi-head self-attention and additive attention), and
:math:`u` is the user vector, computed from the history once per sample under ``no_grad`` and cached. NAML views
are attributed one at a time while the other view's embeddings are held at their real values.

Baselines: ``pad`` (default) puts the [PAD] id at every content position and passes it through the same embedding
layer; ``zero`` uses zero vectors there. Structural tokens ([CLS], [SEP], or ``<s>``, ``</s>``) keep their real
embedding in the baseline, so their attribution is exactly zero and they are dropped from word reports; ``[UNK]``
is content like any word. Words are the fast tokenizer's word ids (:mod:`models.news.text`).

History: the user vector is built from the last ``max_history`` history titles
(:func:`models.news.data.recent_history`), exactly as ``NewsRecommender.score_texts`` and training do.

Batching: samples are sorted by length and cut into chunks of ``batch_size`` (:mod:`models.news.chunks`; each
padded only to its own longest sample; padded positions are masked out and equal in input and baseline, so they get
exactly zero attribution); each chunk is integrated with ``alpha_batch_size`` alphas per batched pass (see
:mod:`models.explain.ig`).
"""

from __future__ import annotations

import math
import statistics
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from models.common import NonFiniteError, resolve_precision
from models.explain.ig import (
    IGResult,
    integrated_gradients,
    integrated_gradients_adaptive,
    integrated_gradients_reference,
    probe_bytes_per_row,
    relative_delta,
    rows_for_budget,
)
from models.explain.occlusion import occlusion
from models.explain.records import view_record
from models.explain.rules import AttributionOptions, refine_by_doubling
from models.news.chunks import Chunk, build_chunk, can_pack, length_chunks
from models.news.data import Sample, recent_history
from models.news.modules import NewsRecommender
from models.news.summary import ReportAccumulator, compare, compare_sample

ProgressFn = Callable[[int, int, str], None]


class AttributionError(RuntimeError):
    """A failure a person can act on, naming the samples concerned."""


@dataclass
class IGOptions(AttributionOptions):
    """The attribution options of a news recommender: every pipeline's, and how many history titles build the
    user vector."""

    max_history: int = 50


@dataclass
class _Prepared:
    sample: Sample
    user: torch.Tensor  # (D,)
    enc: dict[str, tuple[torch.Tensor, torch.Tensor]]  # view -> (ids (L,), mask (L,)), unpadded
    word_ids: dict[str, list[int | None] | None] | None = None  # view -> the tokenizer's word id per token
    offsets: dict[str, list[tuple[int, int] | None] | None] | None = None  # view -> each token's span in the text
    texts: dict[str, str] | None = None  # view -> the text as given (title, body)


# ------------------------------------------------------------------------------------------------ preparation
def _check_sample(s: Sample) -> str | None:
    if not isinstance(s.candidate, str) or not s.candidate.strip():
        return "candidate must be a non-empty string"
    if not isinstance(s.history, list) or not s.history:
        return "history must be a non-empty list of titles"
    if not all(isinstance(t, str) for t in s.history):
        return "every history title must be a string"
    return None


@torch.no_grad()
def user_vectors(model: NewsRecommender, samples: Sequence[Sample], max_history: int = 50,
                 chunk: int = 64, pack: bool | None = None) -> list[torch.Tensor]:
    """One user vector per sample from its history, computed once (no_grad). Titles shared across samples are
    encoded once; with ``pack`` (default: :func:`packs_by_default`) several to a row, without padding."""
    if pack is None:
        pack = packs_by_default(model)
    encode = model.encode_news_packed if pack else model.encode_news  # type: ignore[attr-defined]
    keys: dict[tuple[str, str], int] = {}
    recent = [recent_history(s.history, s.history_bodies or [""] * len(s.history), max_history) for s in samples]
    for titles, bodies in recent:
        for t, b in zip(titles, bodies, strict=True):
            keys.setdefault((t, b), len(keys))
    items = list(keys)
    vecs = []
    for i in range(0, len(items), chunk):
        part = items[i:i + chunk]
        vecs.append(encode(model.tokenize([t for t, _ in part], [b for _, b in part])))
    table = torch.cat(vecs) if vecs else torch.empty(0)
    out = []
    for titles, bodies in recent:
        idx = [keys[(t, b)] for t, b in zip(titles, bodies, strict=True)]
        h = table[torch.tensor(idx, device=table.device)]
        out.append(model.user_vector(h[None], torch.ones(1, len(idx), device=h.device))[0].float())
    return out


def _prepare(model: NewsRecommender, samples: Sequence[Sample], max_history: int,
             errors: list[dict[str, Any]]) -> list[_Prepared]:
    ok: list[Sample] = []
    for s in samples:
        problem = _check_sample(s)
        if problem is None and s.history_bodies is not None and len(s.history_bodies) != len(s.history):
            problem = "history_bodies must have one entry per history title"
        if problem is None:
            ok.append(s)
        else:
            errors.append({"id": s.id, "error": problem})
    users = user_vectors(model, ok, max_history) if ok else []
    prepared = []
    for s, u in zip(ok, users, strict=True):
        enc = model.tokenize([s.candidate], [s.candidate_body or ""])
        views = {v: (e.ids[0], e.mask[0]) for v, e in enc.items()}
        title_ids = views["title"][0]
        if not any(int(i) not in model.tokenizer.special_ids for i in title_ids):
            errors.append({"id": s.id, "error": "candidate title has no tokens after tokenisation"})
            continue
        if not torch.isfinite(u).all():
            errors.append({"id": s.id, "error": "user vector is not finite"})
            continue
        prepared.append(_Prepared(s, u, views, {v: e.word_ids[0] if e.word_ids else None for v, e in enc.items()},
                                  {v: e.offsets[0] if e.offsets else None for v, e in enc.items()},
                                  {"title": s.candidate, "body": s.candidate_body or ""}))
    return prepared


# -------------------------------------------------------------------------------------------------- one chunk
def packs_by_default(model: NewsRecommender) -> bool:
    """Whether IG and the user vectors pack rows: on a CPU (where padded tokens cost FLOPs in proportion; CUDA
    prefers fewer, larger launches) and for token encoders where packing pays (transformers, not word
    embeddings)."""
    return model.device.type != "cuda" and can_pack(model) and bool(getattr(model, "pack_pays", False))


# model -> {(view, baseline, device, baseline token pattern): the baseline's news vector}. For a single-view model
# the baseline input x' depends only on which positions are structural tokens (kept) and the title's length, so its
# news vector is shared by every candidate with that pattern, across requests.
_BASELINE_NEWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
BASELINE_CACHE_SIZE = 4096


def clear_caches(model: NewsRecommender) -> None:
    """Forget the cached memory probes and baseline news vectors of ``model`` (e.g. after changing its weights in
    place; a loaded checkpoint is frozen and never needs this)."""
    _PROBES.pop(model, None)
    _BASELINE_NEWS.pop(model, None)


@torch.no_grad()
def baseline_scores(model: NewsRecommender, ch: Chunk, view: str, baseline: str) -> torch.Tensor | None:
    """F(x') of every sample of the chunk (fp64 on CPU) from cached baseline news vectors, or None when the model
    reads more than one view (NAML holds the other view at its real value, so x' differs per sample). A pattern
    seen for the first time is encoded alone, in fp32, by the model's padded path."""
    if len(model.views) != 1:
        return None
    cache = _BASELINE_NEWS.setdefault(model, {})
    vecs = []
    for i, length in enumerate(ch.lengths):
        pattern = tuple(-1 if c else int(t) for t, c in zip(ch.ids[i, :length].tolist(),
                                                           ch.content[i, :length].tolist(), strict=True))
        key = (view, baseline, str(model.device), pattern)
        if key not in cache:
            if len(cache) >= BASELINE_CACHE_SIZE:
                cache.clear()
            ones = torch.ones(1, length, dtype=torch.long, device=model.device)
            cache[key] = model.news_from_embeddings({view: ch.base[i:i + 1, :length].float()}, {view: ones})[0]
        vecs.append(cache[key])
    return (torch.stack(vecs).float() * ch.users).sum(-1).double().cpu()


def _reference_score(model: NewsRecommender, p: _Prepared, view: str, max_history: int
                     ) -> Callable[[torch.Tensor], torch.Tensor]:
    """The source's per-step function, with the correct F: re-encodes the history and the whole candidate."""
    dev = model.device
    s = p.sample
    others = {ov: (model.embed(ov, p.enc[ov][0][None].to(dev)).detach(), p.enc[ov][1][None].to(dev))
              for ov in model.views if ov != view}
    mask = p.enc[view][1][None].to(dev)
    hist, bodies = recent_history(s.history, s.history_bodies or [""] * len(s.history), max_history)

    def score(x: torch.Tensor) -> torch.Tensor:
        h = model.encode_news(model.tokenize(hist, bodies))
        u = model.user_vector(h[None], torch.ones(1, h.shape[0], device=h.device))[0]
        embeds = {view: x, **{ov: e for ov, (e, _) in others.items()}}
        masks = {view: mask, **{ov: m for ov, (_, m) in others.items()}}
        return model.news_from_embeddings(embeds, masks)[0].float() @ u.float()

    return score


# ------------------------------------------------------------------------------------------------- the driver
@dataclass
class _ViewRun:
    view: str
    token_attr: dict[str, np.ndarray]  # sample id -> (L,)
    scores: dict[str, float]
    baseline_scores: dict[str, float]
    sums: dict[str, float]
    n_steps: int
    alpha_batch_size: int | None
    batch_size: int
    steps: dict[str, int] = field(default_factory=dict)  # sample id -> the rule it ended with
    evaluations: dict[str, int] = field(default_factory=dict)  # sample id -> gradient evaluations spent
    converged: dict[str, bool] = field(default_factory=dict)
    token_errors: dict[str, float | None] = field(default_factory=dict)  # sample id -> its per-token error estimate


# model -> {(view, baseline, precision, device, length bucket): bytes per interpolated row}. The probe costs two
# forward + backward passes; an interactive request of a few samples would pay them on every call.
_PROBES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def length_bucket(length: int) -> int:
    """The probe's length: the next power of two (at least 16), so one probe serves every shorter title (capped
    at the view's tokenizer limit by the caller)."""
    return max(16, 1 << max(0, length - 1).bit_length())


def _bytes_per_row(model: NewsRecommender, longest: _Prepared, view: str, baseline: str, precision: str) -> float:
    """Memory per interpolated row for inputs up to ``longest``'s length bucket; probed once per model,
    view, baseline, precision, device and bucket (the sample padded to the bucket length with [PAD], masked)."""
    ids, mask = longest.enc[view]
    bucket = length_bucket(int(ids.shape[0]))
    limit = model.config.get(f"max_{view}_len")  # the tokenizer never makes a longer input
    if isinstance(limit, int) and limit >= ids.shape[0]:
        bucket = min(bucket, limit)
    key = (view, baseline, precision, str(model.device), bucket)
    cache = _PROBES.setdefault(model, {})
    if key not in cache:
        pad = bucket - int(ids.shape[0])
        padded = _Prepared(longest.sample, longest.user, {**longest.enc, view: (
            torch.cat([ids, torch.full((pad,), model.tokenizer.pad_id, dtype=ids.dtype)]),
            torch.cat([mask, torch.zeros(pad, dtype=mask.dtype)]))})
        ch = build_chunk(model, [padded], view, baseline)
        cache[key] = probe_bytes_per_row(ch.forward, ch.x, ch.base, precision)
    return cache[key]


def _resolve_batches(model: NewsRecommender, prepared: Sequence[_Prepared], view: str, opts: IGOptions,
                     precision: str, n_steps: int) -> tuple[int, int | None, int | None]:
    """(batch_size, alpha_batch_size, rows) for this run; "auto" probes the memory of the longest samples
    (``rows``: interpolated rows per pass within the memory budget, None when nothing is auto)."""
    bs, abs_ = opts.batch_size, opts.alpha_batch_size
    rows = None
    if opts.method == "occlusion":
        return (len(prepared) if bs == "auto" else int(bs)), None, None
    if bs == "auto" or abs_ == "auto":
        longest = max(prepared, key=lambda p: int(p.enc[view][0].shape[0]))
        per_row = _bytes_per_row(model, longest, view, opts.baseline, precision)
        rows = rows_for_budget(per_row, model.device, opts.memory_budget)
        if abs_ == "auto":
            abs_ = min(n_steps, rows) if bs == "auto" else max(1, min(n_steps, rows // int(bs)))
        if bs == "auto":
            bs = max(1, rows // int(abs_))
    return max(1, min(int(bs), len(prepared))), int(abs_), rows


# Packing merges samples of different lengths into one pass. It pays where exact-length passes would be small (few
# interpolated rows each, so each pass's fixed costs dominate: a 2-sample interactive request) and costs where they
# are large (packed rows run up to twice the longest title, and attention grows with the square of the row).
# Measured with nrms-minilm-demo on 2 threads (samples x steps, rows per exact-length pass, packed vs padded
# seconds): 2 x 8, 8 rows, 0.196 vs 0.231; 32 x 8, 28 rows, 1.95 vs 2.21; 8 x 32, 64 rows, 1.85 vs 1.60.
PACK_BELOW_ROWS = 64


def _packing_pays(lengths: Sequence[int], batch_size: int, alpha_batch_size: int | None) -> bool:
    """Whether cutting chunks at length changes adds passes, and those passes would average fewer than
    ``PACK_BELOW_ROWS`` interpolated rows each."""
    if not lengths or alpha_batch_size is None:
        return False
    exact = length_chunks(lengths, batch_size, exact=True)
    if len(exact) <= -(-len(lengths) // batch_size):  # no pass to save (one length, or full chunks anyway)
        return False
    return alpha_batch_size * len(lengths) / len(exact) < PACK_BELOW_ROWS


# ----------------------------------------------------------------------------------- one view, chunk by chunk
@dataclass
class _ViewPlan:
    """How one view's chunks are integrated, resolved once before the first chunk."""
    view: str
    precision: str
    n_steps: int
    batch_size: int
    alpha_batch_size: int | None
    budget_rows: int | None  # interpolated rows per pass within the memory budget; None when nothing is auto
    lengths: list[int]  # tokens of each prepared sample in this view
    pack: bool  # encode rows packed several to a sequence (see build_chunk)
    exact: bool  # cut chunks where the length changes (see length_chunks)


def _plan_view(model: NewsRecommender, prepared: Sequence[_Prepared], view: str, opts: IGOptions,
               precision: str, n_steps: int) -> _ViewPlan:
    """Batch sizes, packing and chunking of ``view`` for this run (``n_steps``: the fixed or starting steps)."""
    batch_size, alpha_batch_size, budget_rows = _resolve_batches(model, prepared, view, opts, precision, n_steps)
    lengths = [int(p.enc[view][0].shape[0]) for p in prepared]
    # On CPU padding costs FLOPs in proportion: a model that packs rows takes samples of any length in one chunk
    # (no padding is computed) where exact-length passes would be small, others cut chunks at length changes. On
    # CUDA chunks are only sorted.
    pack = packs_by_default(model) and _packing_pays(lengths, batch_size, alpha_batch_size)
    exact = model.device.type != "cuda" and not pack
    return _ViewPlan(view, precision, n_steps, batch_size, alpha_batch_size, budget_rows, lengths, pack, exact)


@dataclass
class _ChunkAttributions:
    """Per sample of a chunk: token attributions (float64, unpadded), F(x) and F(x')."""
    attrs: list[np.ndarray]
    scores: list[float]
    baseline_scores: list[float]


def _reference_chunk(model: NewsRecommender, items: Sequence[_Prepared], plan: _ViewPlan,
                     opts: IGOptions) -> _ChunkAttributions:
    """The reference loop (``optimized=False``): one sample at a time, with the source's per-step function."""
    results = []
    for p in items:
        ch = build_chunk(model, [p], plan.view, opts.baseline)
        with torch.enable_grad():
            results.append(integrated_gradients_reference(
                _reference_score(model, p, plan.view, opts.max_history), ch.x[0], ch.base[0],
                n_steps=plan.n_steps, method=opts.method))
    return _ChunkAttributions([r.attributions[0].sum(-1).double().cpu().numpy() for r in results],
                              [float(r.scores[0]) for r in results],
                              [float(r.baseline_scores[0]) for r in results])


def _integrate(model: NewsRecommender, ch: Chunk, plan: _ViewPlan, opts: IGOptions) -> IGResult:
    """Occlusion, IG refined per sample until ``opts.tolerance`` is met, or IG at a fixed ``plan.n_steps``."""
    if opts.method == "occlusion":
        return occlusion(ch.forward, ch.x, ch.base, ch.content)
    if opts.tolerance is not None:
        auto_alphas = opts.alpha_batch_size == "auto"
        return integrated_gradients_adaptive(
            ch.forward, ch.x, ch.base, tolerance=opts.tolerance, method=opts.method,
            start_steps=plan.n_steps, max_steps=opts.max_steps,
            alpha_batch_size=None if auto_alphas else plan.alpha_batch_size,
            max_rows=plan.budget_rows if auto_alphas else None,
            precision=plan.precision, token_sums=True)
    return integrated_gradients(ch.forward, ch.x, ch.base, n_steps=plan.n_steps, method=opts.method,
                                alpha_batch_size=plan.alpha_batch_size, precision=plan.precision,
                                baseline_scores=baseline_scores(model, ch, plan.view, opts.baseline))


def _record_refinement(run: _ViewRun, items: Sequence[_Prepared], res: IGResult) -> None:
    """The steps, gradient evaluations and convergence of each sample of an adaptive chunk."""
    for j, p in enumerate(items):
        run.steps[p.sample.id] = int(res.steps[j])
        run.evaluations[p.sample.id] = int(res.evaluations[j])
        run.converged[p.sample.id] = bool(res.converged[j])
        e = float(res.token_errors[j])
        run.token_errors[p.sample.id] = e if math.isfinite(e) else None


def _optimized_chunk(model: NewsRecommender, items: Sequence[_Prepared], plan: _ViewPlan, opts: IGOptions,
                     run: _ViewRun) -> _ChunkAttributions:
    """The whole chunk in batched passes (every method but the reference loop)."""
    ch = build_chunk(model, items, plan.view, opts.baseline, pack=plan.pack)
    res = _integrate(model, ch, plan, opts)
    if opts.adaptive:
        _record_refinement(run, items, res)
    tok_attr = res.attributions.sum(-1).double().cpu().numpy()
    return _ChunkAttributions([tok_attr[i, : ch.lengths[i]] for i in range(len(items))],
                              res.scores.tolist(), res.baseline_scores.tolist())


def _attribute_chunk(model: NewsRecommender, items: Sequence[_Prepared], plan: _ViewPlan, opts: IGOptions,
                     run: _ViewRun) -> _ChunkAttributions:
    """One chunk's attributions; a failure of the computation raises AttributionError naming its samples."""
    ids = [p.sample.id for p in items]
    try:
        if not opts.optimized and opts.method != "occlusion":
            return _reference_chunk(model, items, plan, opts)
        return _optimized_chunk(model, items, plan, opts, run)
    except (RuntimeError, ValueError) as exc:
        raise AttributionError(f"attribution failed for samples {ids} (view {plan.view}): {exc}") from exc


def _check_finite(items: Sequence[_Prepared], out: _ChunkAttributions, view: str) -> None:
    """Raise NonFiniteError naming every sample with a NaN or infinite attribution or score."""
    bad = [p.sample.id for p, a, fx, fb in zip(items, out.attrs, out.scores, out.baseline_scores, strict=True)
           if not (np.isfinite(a).all() and math.isfinite(fx) and math.isfinite(fb))]
    if bad:
        raise NonFiniteError(f"non-finite attribution or score in view {view} for samples {bad}", bad)


def _store(run: _ViewRun, items: Sequence[_Prepared], out: _ChunkAttributions) -> None:
    """Record a chunk's attributions, completeness terms and attribution sums in the view's run."""
    for p, a, fx, fb in zip(items, out.attrs, out.scores, out.baseline_scores, strict=True):
        sid = p.sample.id
        run.token_attr[sid] = a
        run.scores[sid] = fx
        run.baseline_scores[sid] = fb
        run.sums[sid] = float(a.sum())


def _run_view(model: NewsRecommender, prepared: Sequence[_Prepared], view: str, opts: IGOptions, precision: str,
              n_steps: int, progress: ProgressFn | None, offset: int, total: int) -> _ViewRun:
    """Attribute ``view`` of every prepared sample, chunk by chunk; ``offset`` and ``total`` count samples over
    all views for ``progress``."""
    plan = _plan_view(model, prepared, view, opts, precision, n_steps)
    run = _ViewRun(view, {}, {}, {}, {}, n_steps, plan.alpha_batch_size, plan.batch_size)
    done = 0
    for chunk in length_chunks(plan.lengths, plan.batch_size, exact=plan.exact):
        items = [prepared[i] for i in chunk]
        out = _attribute_chunk(model, items, plan, opts, run)
        _check_finite(items, out, view)
        _store(run, items, out)
        done += len(items)
        if progress is not None:
            progress(offset + done, total, f"{view}: {offset + done}/{total} samples, n_steps={n_steps}")
    return run


def _rel(run: _ViewRun, sid: str) -> float:
    inert = all(float(a) == 0.0 for a in run.token_attr[sid])  # an empty view: nothing to attribute (ig.inert)
    return float(relative_delta(run.sums[sid], run.scores[sid], run.baseline_scores[sid], inert))


def _view_report(model: NewsRecommender, p: _Prepared, run: _ViewRun, top_k: int) -> dict[str, Any]:
    sid = p.sample.id
    ids = p.enc[run.view][0].tolist()
    tokens = model.tokenizer.convert_ids_to_tokens(ids)
    words = model.tokenizer.group_words(tokens, ids, (p.word_ids or {}).get(run.view))
    return view_record((p.texts or {}).get(run.view, ""), tokens, run.token_attr[sid], words, word_spans(words, (p.offsets or {}).get(run.view)),
                       run.scores[sid], run.baseline_scores[sid], run.sums[sid], _rel(run, sid), top_k)


def word_spans(words: Sequence[tuple[str, list[int]]], offsets: Sequence[tuple[int, int] | None] | None
               ) -> list[tuple[int, int] | None]:
    """Each word's character span in the text: from its first token's start to its last token's end (None when
    the tokenizer gave no offsets for its tokens)."""
    out: list[tuple[int, int] | None] = []
    for _, positions in words:
        spans = [offsets[i] for i in positions if offsets is not None and i < len(offsets) and offsets[i] is not None]
        out.append((min(a for a, _ in spans), max(b for _, b in spans)) if spans else None)
    return out


def word_stats(samples: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per label (real/fake/unlabelled): for every word, the mean and std of its attribution, its number of
    occurrences and the fraction of that label's samples it appears in; sorted by mean, highest first.
    (The streaming accumulator a sharded run's reduce step uses too, so both give identical numbers.)"""
    return ReportAccumulator().extend(samples).word_stats()


def compare_reports(base: dict[str, Any], other: dict[str, Any], threshold: float = 0.1,
                    min_count: int = 3, changed_min_count: int = 1, top_n: int | None = None) -> dict[str, Any]:
    """Words whose mean attribution (over all samples) moved by more than ``threshold`` from ``base`` to
    ``other`` (among words seen at least ``changed_min_count`` times), and the words new to ``other``'s
    top-positive lists (in at least ``min_count`` samples there and in none under ``base``). With ``top_n``,
    ``per_sample`` holds per sample attributed by both the ``top_n`` words whose attribution changed most
    (:func:`models.news.summary.compare_sample`), in ``base``'s sample order."""
    out = compare(ReportAccumulator().extend(base["samples"]), ReportAccumulator().extend(other["samples"]),
                  threshold, min_count, changed_min_count)
    if top_n is not None:
        by_id = {r["id"]: r for r in other["samples"]}
        out["top_n"] = top_n
        out["per_sample"] = [compare_sample(r, by_id[r["id"]], top_n) for r in base["samples"] if r["id"] in by_id]
    return out


# ------------------------------------------------------------------ explain: the paths, the views, the report
def _precision(model: NewsRecommender, opts: IGOptions) -> str:
    """The precision of the forward and backward passes (``opts.precision`` is validated even where
    :meth:`AttributionOptions.pass_precision` overrides it)."""
    return opts.pass_precision(resolve_precision(opts.precision, model.device))


@dataclass
class _Attributed:
    """Every view's run over the prepared samples (one per view, none without samples), the steps they ran at
    (an adaptive run's start; its samples' own steps are in the runs) and whether the tolerance was met (None
    without a tolerance, or without samples)."""
    runs: list[_ViewRun]
    n_steps: int
    tolerance_met: bool | None = None


def _run_views(model: NewsRecommender, prepared: Sequence[_Prepared], opts: IGOptions, precision: str,
               n_steps: int, progress: ProgressFn | None) -> list[_ViewRun]:
    """One run per view of the model (NAML: title, then body), each over every prepared sample."""
    if not prepared:
        return []
    total = len(prepared) * len(model.views)
    return [_run_view(model, prepared, v, opts, precision, n_steps, progress, k * len(prepared), total)
            for k, v in enumerate(model.views)]


def _relative_deltas(runs: Sequence[_ViewRun]) -> list[float]:
    return [_rel(r, sid) for r in runs for sid in r.token_attr]


def _attribute(model: NewsRecommender, prepared: Sequence[_Prepared], opts: IGOptions, precision: str,
               progress: ProgressFn | None) -> _Attributed:
    """Every view of every prepared sample: adaptive (every sample starts at ``opts.start_steps`` and is refined on
    its own), doubling (the reference loop with a tolerance), or one run at ``opts.n_steps`` (and occlusion,
    which ignores a tolerance)."""
    if opts.adaptive:
        runs = _run_views(model, prepared, opts, precision, opts.start_steps, progress)
        met = all(all(r.converged.values()) for r in runs) if runs else None
        return _Attributed(runs, opts.start_steps, met)
    if opts.tolerance is not None and opts.method != "occlusion":
        return _Attributed(*refine_by_doubling(
            opts, lambda n: _run_views(model, prepared, opts, precision, n, progress), _relative_deltas))
    return _Attributed(_run_views(model, prepared, opts, precision, opts.n_steps, progress), opts.n_steps)


def _sample_record(model: NewsRecommender, p: _Prepared, runs: Sequence[_ViewRun], opts: IGOptions
                   ) -> dict[str, Any]:
    """One sample's report: the first view's at the top level, the others (NAML's body) under ``views``."""
    main = _view_report(model, p, runs[0], opts.top_k)
    history, _ = recent_history(p.sample.history, None, opts.max_history)
    rec: dict[str, Any] = {"id": p.sample.id, "label": p.sample.label, **main, "history": history}
    if opts.adaptive:
        rec["n_steps"] = {r.view: r.steps[p.sample.id] for r in runs}
        rec["token_error"] = {r.view: r.token_errors.get(p.sample.id) for r in runs}
        rec["tolerance_met"] = all(r.converged[p.sample.id] for r in runs)
    if len(runs) > 1:
        rec["views"] = {r.view: _view_report(model, p, r, opts.top_k) for r in runs[1:]}
    if p.sample.meta:
        rec["meta"] = p.sample.meta
    return rec


def _sample_records(model: NewsRecommender, prepared: Sequence[_Prepared], runs: Sequence[_ViewRun],
                    opts: IGOptions, errors: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The report of every prepared sample whose id is not among ``errors``."""
    failed = {e["id"] for e in errors}
    return [_sample_record(model, p, runs, opts) for p in prepared if p.sample.id not in failed]


def _step_counts(att: _Attributed, opts: IGOptions, n_runs: int) -> tuple[int | None, int | None]:
    """The summary's ``n_steps`` (an adaptive run's largest per-sample rule) and ``gradient_evaluations``;
    both None for occlusion. ``n_runs``: samples times views."""
    if opts.method == "occlusion":
        return None, None
    if opts.adaptive:
        n_steps = max(st for r in att.runs for st in r.steps.values()) if att.runs else att.n_steps
        return n_steps, sum(sum(r.evaluations.values()) for r in att.runs)
    return att.n_steps, att.n_steps * n_runs


def _max_token_error(runs: Sequence[_ViewRun]) -> float | None:
    """The largest per-token error estimate of an adaptive run (None when no sample reached a second level)."""
    errors = [e for r in runs for e in r.token_errors.values() if e is not None]
    return max(errors) if errors else None


def _summary(model: NewsRecommender, opts: IGOptions, precision: str, att: _Attributed, n_prepared: int,
             out_samples: Sequence[dict[str, Any]], errors: Sequence[dict[str, Any]], started: float,
             prepare_seconds: float) -> dict[str, Any]:
    """The report's ``summary``: the run's settings, step counts, completeness and timings."""
    rels = _relative_deltas(att.runs)
    n_steps, evaluations = _step_counts(att, opts, n_prepared * len(model.views))
    by_view = ReportAccumulator(model.views[0]).extend(out_samples).delta_by_view()
    first = att.runs[0] if att.runs else None
    return {
        "n_samples": len(out_samples),
        "n_errors": len(errors),
        "method": opts.method,
        "n_steps": n_steps,
        "gradient_evaluations": evaluations,
        "precision": precision,
        "baseline": opts.baseline,
        "optimized": opts.optimized,
        "views": list(model.views),
        "median_relative_delta": statistics.median(rels) if rels else float("nan"),
        "max_relative_delta": max(rels) if rels else float("nan"),
        "relative_delta_by_view": by_view,
        "tolerance": opts.tolerance,
        "tolerance_met": att.tolerance_met,
        "max_token_error": _max_token_error(att.runs) if opts.adaptive else None,
        "batch_size": first.batch_size if first else None,
        "alpha_batch_size": first.alpha_batch_size if first else None,
        "seconds": time.perf_counter() - started,
        "seconds_prepare": prepare_seconds,  # tokenisation and the cached user vectors
    }


def explain(model: NewsRecommender, samples: Sequence[Sample], opts: IGOptions | None = None,
            progress: ProgressFn | None = None) -> dict[str, Any]:
    """Attribute every sample's candidate score to its words. Returns the JSON-ready report: ``samples``,
    ``errors`` (samples that could not be attributed, with the reason; never zeros), ``summary`` and
    ``word_stats``. A NaN or infinite attribution or score raises ``NonFiniteError`` naming the samples: a
    numerical failure of the model is not a property of the input, and is never hidden in a partial report."""
    opts = opts or IGOptions()
    opts.check()
    started = time.perf_counter()
    model.eval()
    precision = _precision(model, opts)
    errors: list[dict[str, Any]] = []
    with torch.no_grad():
        prepared = _prepare(model, samples, opts.max_history, errors)
    prepare_seconds = time.perf_counter() - started
    att = _attribute(model, prepared, opts, precision, progress)
    out_samples = _sample_records(model, prepared, att.runs, opts, errors)
    summary = _summary(model, opts, precision, att, len(prepared), out_samples, errors, started, prepare_seconds)
    report = {"samples": out_samples, "errors": errors, "summary": summary, "word_stats": word_stats(out_samples)}
    if opts.faithfulness and out_samples:
        from models.news.faithfulness import faithfulness_section

        n_done = len(prepared) * len(model.views)  # the attribution's progress stays full; the message moves on

        def faith_progress(done: int, total: int) -> None:
            if progress is not None:
                progress(n_done, n_done, f"faithfulness: {done}/{total} samples")

        report["faithfulness"] = faithfulness_section(model, prepared, out_samples, opts.baseline,
                                                      opts.faithfulness_seed, summary["seconds"],
                                                      reference=not opts.optimized, progress=faith_progress)
    return report


def samples_to_arrays(report: dict[str, Any]) -> dict[str, np.ndarray]:
    """Flat arrays for an npz artifact: token attributions concatenated, with offsets per sample."""
    samples = report["samples"]
    lengths = np.array([len(s["tokens"]) for s in samples], dtype=np.int64)
    return {
        "ids": np.array([s["id"] for s in samples]),
        "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        "tokens": np.array([t for s in samples for t in s["tokens"]]),
        "token_attributions": np.array([a for s in samples for a in s["token_attributions"]], dtype=np.float64),
        "score": np.array([s["score"] for s in samples]),
        "baseline_score": np.array([s["baseline_score"] for s in samples]),
        "attribution_sum": np.array([s["attribution_sum"] for s in samples]),
        "relative_delta": np.array([s["relative_delta"] for s in samples]),
    }
