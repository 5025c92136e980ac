"""Worker side of ``POST /tracin``: TracIn-CP (or TRAK / projected TracIn over stored features) on a ConvE model.

The job receives its validated :class:`core.kinds.tracin.TracInRequest` and returns an
:class:`core.contract.results.influence.InfluenceResult`, the same whichever way it was computed:

- whole: one pass (``models.kg.influence.report``);
- from stored features (``estimator`` ``trak`` or ``tracin_projected``): one tiled pass over what ``POST
  /featurize`` stored (``models.kg.stored.stored_report``), no fan-out;
- as shards: a request whose candidate training triples exceed one shard (modes ``test`` and ``self``) fans out
  (the kind's ``FanOut``: each shard scores a contiguous range of the candidates, every test triple against that
  range, streaming, with a running top-k; the test triples are read from the parent), and the reduce step merges
  the per-test-triple lists (the strongest ``top_k`` of the union, exactly as one pass ranks them).

Every path hands its entries to the one builder per mode (``models.kg.influence.TestReport``, ``self_report``),
which writes the artifacts: ``influence.csv`` (every listed pair), ``results.jsonl`` (modes test and single: one
line per test triple, the entries ``results`` lists the first of), ``self_influence.jsonl`` (mode self: every
candidate, ranked), ``scores.npy`` + ``candidates.tsv`` (``top_k: null`` in mode test: every score) and
``result.json``.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
import weakref
from pathlib import Path
from typing import Any

from core import estimators
from core.artifacts import artifacts_key
from core.contract.kind import ReduceRequest, ShardRequest
from core.contract.results.influence import InfluenceResult
from core.fanout import shard_id
from core.filestore import get_store
from core.kinds.tracin import TracInRequest
from workers.context import JobContext, JobError
from workers.fanout import (
    Planned,
    auto_shard_size,
    fan_out,
    parent_ranges,
    record_rate,
    shard_done,
    shard_key,
    shard_records,
    write_jsonl,
)
from workers.fanout import run_shard as run_shard_once

# Before any shard of a model has run: (test triple × candidate × checkpoint) scores per second. A 2-core CPU does
# about 6e4 on ConvE-200 over 14,541 entities, all layers; the measured rate replaces this after the first shard.
DEFAULT_PAIRS_PER_S = 6e4
SELF_COST = 16.0  # a candidate's self-influence costs about as much as this many test pairs (its own factors)


# the test-side factors of the last parent whose shards ran here: its shards share test triples, model and settings
_TEST_FACTORS: dict[str, Any] = {"parent": None, "bundle": None, "cache": {}}


def _test_factor_cache(parent: str, bundle: Any) -> dict:
    """The factor cache for ``parent``'s shards in this worker. Another parent, or the model reloaded (a new bundle
    object), starts an empty one, so one parent's factors at most are held (one block, ``TEST_FACTOR_BUDGET``);
    the parent's reduce step, or a whole TracIn request, on this worker drops them."""
    ref = _TEST_FACTORS["bundle"]
    if _TEST_FACTORS["parent"] != parent or ref is None or ref() is not bundle:
        _TEST_FACTORS.update(parent=parent, bundle=weakref.ref(bundle), cache={})
    return _TEST_FACTORS["cache"]


def _drop_test_factors(parent: str | None = None) -> None:
    if parent is None or _TEST_FACTORS["parent"] == parent:
        _TEST_FACTORS.update(parent=None, bundle=None, cache={})


def _bundle(ctx: JobContext, name: str) -> Any:
    from models.kg.checkpoint import KGBundle

    bundle = ctx.model(name)
    if not isinstance(bundle, KGBundle):
        raise JobError("wrong_model", f"model {name!r} is not a ConvE model")
    return bundle


def _plan(request: TracInRequest, bundle: Any, ctx: JobContext) -> Any:
    from models.kg.influence import FilterSpec, TracInOptions, plan

    fields = {f.name for f in dataclasses.fields(TracInOptions)} - {"filter"}
    options = TracInOptions(**request.model_dump(include=fields),
                            filter=FilterSpec(**request.filter.model_dump()) if request.filter else None)
    try:
        return plan(bundle, request.test_triples, options, ctx.device)
    except (KeyError, ValueError) as exc:
        # the API validates names, checkpoints and layers; this catches a model re-trained in between
        raise JobError("invalid_request", str(exc.args[0] if exc.args else exc)) from None


def _cost_per_candidate(request: TracInRequest, n_test: int, n_ckpts: int) -> float:
    return n_ckpts * (SELF_COST if request.mode == "self" else SELF_COST + max(1, n_test))


def _shard_size(request: TracInRequest, ctx: JobContext, n_test: int, n_ckpts: int) -> int:
    if request.shard_size != "auto":
        return int(request.shard_size)
    return auto_shard_size(ctx, f"tracin-{request.mode}", request.model,
                           _cost_per_candidate(request, n_test, n_ckpts), DEFAULT_PAIRS_PER_S, lo=256,
                           hi=10_000_000)


def _progress(ctx: JobContext) -> Any:
    def progress(done: int, total: int, message: str | None = None) -> None:
        ctx.progress(done, total, "batches", message=message or f"batch {done}/{total}")
    return progress


def _scoring_errors() -> tuple[type[Exception], ...]:
    from models.common import NonFiniteError

    return (NonFiniteError,)


def _result(request: TracInRequest, fields: dict[str, Any], out_dir: Path) -> InfluenceResult:
    """The result model of a report's fields, its copy written to ``result.json`` under ``out_dir``."""
    result = InfluenceResult.model_validate({"model": request.model, **fields})
    (out_dir / "result.json").write_text(result.model_dump_json(exclude={"artifacts"}))
    return result


def run(request: TracInRequest, ctx: JobContext) -> InfluenceResult | Planned:
    from models.kg.influence import report

    _drop_test_factors()  # a whole request: another parent's factors are not worth their memory now
    bundle = _bundle(ctx, request.model)
    if estimators.get(request.estimator).stored:
        return _run_stored(request, ctx, bundle)
    p = _plan(request, bundle, ctx)
    if request.mode in ("test", "self"):
        shard_size = _shard_size(request, ctx, len(p.test_ids), len(p.engine.checkpoints))
        if len(p.union) > shard_size:
            return fan_out(ctx, "tracin", request, len(p.union), shard_size, retries=request.shard_retries,
                           max_failed_fraction=request.max_failed_fraction)
    t0 = time.perf_counter()
    try:
        fields, _ = report(p, bundle, request.train_triples, _progress(ctx), out_dir=ctx.artifacts_dir)
    except _scoring_errors() as exc:
        raise JobError("non_finite_scores", str(exc)) from None
    except (KeyError, ValueError) as exc:
        raise JobError("invalid_request", str(exc.args[0] if exc.args else exc)) from None
    if request.mode in ("test", "self"):
        record_rate(ctx, f"tracin-{request.mode}", request.model,
                    len(p.union) * _cost_per_candidate(request, len(p.test_ids), len(p.engine.checkpoints)),
                    time.perf_counter() - t0)
    result = _result(request, fields, ctx.artifacts_dir)
    result.artifacts = ctx.artifacts()
    return result


def _run_stored(request: TracInRequest, ctx: JobContext, bundle: Any) -> InfluenceResult:
    """Estimators ``tracin_projected`` and ``trak``: one tiled pass over the features stored by ``POST /featurize``
    (no fan-out: the pass is one matrix product per tile, in bounded memory)."""
    from models.explain.features import NotFeaturized
    from models.kg.influence import checkpoint_weights
    from models.kg.stored import stored_report

    try:
        ckpts = bundle.checkpoints if request.checkpoints == "all" else \
            [bundle.checkpoint(str(c)) for c in request.checkpoints]
        weights = checkpoint_weights(bundle, ckpts, request.lr_weight)
        fields, _ = stored_report(
            get_store(ctx.settings), bundle, request.test_triples, estimator=request.estimator,
            top_k=request.top_k, checkpoints=ckpts, layers=request.layers, loss=request.loss,
            proj_dim=request.projection_dim, seed=request.seed, damping=request.damping, weights=weights,
            lr_weight=request.lr_weight, progress=_progress(ctx), out_dir=ctx.artifacts_dir,
            on_index=lambda index: ctx.use_shared(f"features/{k}" for k in index.keys))
    except NotFeaturized as exc:
        raise JobError("not_featurized", f"{exc.args[0]} (POST /featurize with the same checkpoints, layers, loss, "
                       "projection_dim and seed)") from None
    except _scoring_errors() as exc:
        raise JobError("non_finite_scores", str(exc)) from None
    except (KeyError, ValueError) as exc:
        raise JobError("invalid_request", str(exc.args[0] if exc.args else exc)) from None
    result = _result(request, fields, ctx.artifacts_dir)
    result.artifacts = ctx.artifacts()
    return result


# ------------------------------------------------------------------------------------------------ fan-out
def run_shard(shard: ShardRequest[TracInRequest], ctx: JobContext) -> dict[str, Any]:
    """Score candidates ``[start, end)`` of the parent's request: ``entries.jsonl`` (mode test: one line per test
    triple, its lists over this range) or ``self.jsonl`` (mode self: each candidate's self-influence)."""
    from models.kg.influence import LIST_ALL_MAX_PAIRS, pair_count, score_self, score_test

    request, start, end = shard.request, shard.start, shard.end

    def work() -> dict[str, Any]:
        bundle = _bundle(ctx, request.model)
        p = _plan(request, bundle, ctx)
        t0 = time.perf_counter()
        try:
            if request.mode == "self":
                idx, si = score_self(p, bundle, start, end, progress=_progress(ctx))
                write_jsonl(ctx.artifact_path("self.jsonl"),
                            ({"train_index": j, "self_influence": v} for j, v in zip(idx.tolist(), si.tolist(),
                                                                                     strict=True)))
                n_test = 0
            else:
                import numpy as np

                dense = None
                if request.top_k is None:
                    dense = np.lib.format.open_memmap(ctx.artifact_path("scores.npy"), mode="w+",
                                                      dtype=np.float32, shape=(len(p.test_ids), end - start))
                entries = score_test(p, bundle, request.top_k, start, end, progress=_progress(ctx), dense=dense,
                                     list_all=pair_count(p) <= LIST_ALL_MAX_PAIRS,
                                     test_cache=_test_factor_cache(shard.parent, bundle))
                if dense is not None:
                    dense.flush()
                    del dense
                write_jsonl(ctx.artifact_path("entries.jsonl"), entries)
                n_test = len(p.test_ids)
        except _scoring_errors() as exc:
            raise JobError("non_finite_scores", str(exc)) from None
        record_rate(ctx, f"tracin-{request.mode}", request.model,
                    (end - start) * _cost_per_candidate(request, n_test, len(p.engine.checkpoints)),
                    time.perf_counter() - t0)
        return {"n": end - start, "n_test": n_test}

    return run_shard_once(ctx, work)


def run_reduce(reduce: ReduceRequest[TracInRequest], ctx: JobContext) -> InfluenceResult:
    """Merge the shards through the same builder as one pass: the artifacts under the parent's id, and the
    result."""
    parent, n_shards, request = reduce.parent, reduce.shards, reduce.request
    _drop_test_factors(parent)  # every shard has run
    bundle = _bundle(ctx, request.model)
    p = _plan(request, bundle, ctx)
    ranges = _ranges(ctx, parent, n_shards)
    out_dir = ctx.settings.work_dir / f"{ctx.job_id}-merged"
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        done = [shard_done(ctx, parent, i) for i in range(n_shards)]
        failed = [i for i, d in enumerate(done) if d is None]
        unscored = sum(ranges[i][1] - ranges[i][0] for i in failed)
        limit = request.max_failed_fraction
        fraction = unscored / len(p.union) if len(p.union) else 0.0
        if fraction > limit:
            raise JobError("too_many_failures", f"shards {failed[:20]} failed for good: {unscored} of "
                           f"{len(p.union)} candidate training triples unscored ({fraction:.1%} > "
                           f"max_failed_fraction {limit:.1%})")
        if request.mode == "self":
            fields = _reduce_self(ctx, parent, bundle, p, n_shards, failed, out_dir)
        else:
            fields = _reduce_test(ctx, parent, request, bundle, p, ranges, failed, out_dir)
        result = _result(request, {
            **p.settings, **fields, "n_candidates": len(p.union), "seconds": round(time.perf_counter() - t0, 3),
            "failed": {"shards": failed, "candidates": unscored,
                       "triples": _failed_triples(bundle, p, ranges, failed)} if failed else None,
            "shards": {"total": n_shards, "failed": failed}}, out_dir)
        store = get_store(ctx.settings)
        store.sync_dir(out_dir, artifacts_key(parent))
        result.artifacts = store.list_files(artifacts_key(parent))
        return result
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def _ranges(ctx: JobContext, parent: str, n_shards: int) -> list[tuple[int, int]]:
    ranges = parent_ranges(ctx, parent)
    if len(ranges) != n_shards:
        raise JobError("parent_missing", f"the parent job {parent!r} has no plan of {n_shards} shards")
    return ranges


def _failed_triples(bundle: Any, p: Any, ranges: list[tuple[int, int]], failed: list[int]) -> list[list[str]]:
    """The candidate training triples left unscored by failed shards (the first 1,000)."""
    import torch

    idx = [j for i in failed for j in range(*ranges[i])][:1000]
    return bundle.dataset.decode(p.train[p.union[torch.tensor(idx, dtype=torch.long)]]) if idx else []


def _reduce_self(ctx: JobContext, parent: str, bundle: Any, p: Any, n_shards: int, failed: list[int],
                 out_dir: Path) -> dict[str, Any]:
    import torch

    from models.kg.influence import self_report

    idx, vals = [], []
    for i in range(n_shards):
        ctx.progress(i, n_shards, "shards", message=f"merging shard {i + 1}/{n_shards}")
        if i in failed:
            continue
        for rec in shard_records(ctx, parent, i, "self.jsonl"):
            idx.append(rec["train_index"])
            vals.append(rec["self_influence"])
    idx_t, si = torch.tensor(idx, dtype=torch.long), torch.tensor(vals, dtype=torch.float64)
    fields, _ = self_report(bundle.dataset, p.train, idx_t, si, p.settings["top_k"], out_dir)
    return fields


def _reduce_test(ctx: JobContext, parent: str, request: TracInRequest, bundle: Any, p: Any,
                 ranges: list[tuple[int, int]], failed: list[int], out_dir: Path) -> dict[str, Any]:
    from models.kg.influence import TestReport, dense_fields, merge_entries, pair_count, write_candidates

    ds = bundle.dataset
    top_k = request.top_k
    live = [i for i in range(len(ranges)) if i not in failed]
    iters = [shard_records(ctx, parent, i, "entries.jsonl") for i in live]
    n_test = len(p.test_ids)
    out = TestReport(bundle, p.test_ids, top_k, out_dir)
    for t in range(n_test):
        if t % 64 == 0:
            ctx.progress(t, n_test, "test triples", message=f"merging test triple {t + 1}/{n_test}")
        parts = [next(it) for it in iters]
        out.add(merge_entries(parts, top_k) if parts else {
            "test_triple": ds.decode(p.test_ids[t:t + 1])[0], "self_influence": None, "n_candidates": 0,
            "n_positive": 0, "n_negative": 0})
    fields: dict[str, Any] = {**out.finish(), "notes": []}
    if top_k is None:
        _merge_dense(ctx, parent, ranges, failed, n_test, len(p.union), out_dir / "scores.npy")
        write_candidates(ds, p.train, p.union, out_dir / "candidates.tsv")
        fields.update(dense_fields(n_test, len(p.union), pair_count(p), "scores.npy"))
    return fields


def _merge_dense(ctx: JobContext, parent: str, ranges: list[tuple[int, int]], failed: list[int], n_test: int,
                 n_cols: int, path: Path) -> None:
    """``scores.npy`` of the whole request from the shards' column blocks (NaN where a shard failed)."""
    import numpy as np

    store = get_store(ctx.settings)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n_test, n_cols))
    for i, (start, end) in enumerate(ranges):
        if i in failed:
            out[:, start:end] = np.nan
            continue
        local = ctx.settings.work_dir / f"{ctx.job_id}-block-{i}.npy"
        try:
            with store.open(shard_key(shard_id(parent, i), "scores.npy"), "rb") as src, open(local, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            block = np.load(local, mmap_mode="r")
            for r in range(0, n_test, 256):
                out[r:r + 256, start:end] = block[r:r + 256]
            del block
        finally:
            local.unlink(missing_ok=True)
    out.flush()
    del out
