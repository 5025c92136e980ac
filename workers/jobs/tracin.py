"""Worker side of ``POST /tracin``: TracIn-CP over the model's checkpoints.

A request whose candidate training triples exceed one shard (modes ``test`` and ``self``) fans out: each shard
scores a contiguous range of the candidates (every test triple against that range, streaming, with a running
top-k), and the reduce step merges the per-test-triple lists (the strongest ``top_k`` of the union, exactly as one
pass ranks them), writes the artifacts and returns a compact summary. A smaller request runs as one job.

Artifacts: ``influence.csv`` (every listed pair), ``results.jsonl`` (mode test: one line per test triple, the entry
the unsharded result lists under ``results``), ``self_influence.jsonl`` (mode self: every candidate, ranked),
``scores.npy`` + ``candidates.tsv`` (``top_k: null`` in mode test: every score), ``result.json``.
"""

from __future__ import annotations

import json
import shutil
import time
import weakref
from pathlib import Path
from typing import Any

from core.artifacts import artifacts_key
from core.fanout import shard_id
from core.filestore import get_store
from workers.context import JobContext, JobError
from workers.context import json_safe as _clean
from workers.fanout import (
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


def _plan(payload: dict[str, Any], bundle: Any, ctx: JobContext) -> Any:
    from models.kg.influence import FilterSpec, plan

    filt = payload.get("filter")
    try:
        return plan(bundle, payload.get("test_triples"), mode=payload["mode"], top_k=payload["top_k"],
                    checkpoints=payload["checkpoints"], layers=payload["layers"], loss=payload["loss"],
                    projection_dim=payload.get("projection_dim"), precision=payload["precision"],
                    batch_size=payload["batch_size"], filter=FilterSpec(**filt) if filt else None,
                    method=payload.get("method", "ghost"), device=ctx.device,
                    lr_weight=payload.get("lr_weight", "last"))
    except (KeyError, ValueError) as exc:
        # the API validates names, checkpoints and layers; this catches a model re-trained in between
        raise JobError("invalid_request", str(exc.args[0] if exc.args else exc)) from None


def _cost_per_candidate(payload: dict[str, Any], n_test: int, n_ckpts: int) -> float:
    return n_ckpts * (SELF_COST if payload["mode"] == "self" else SELF_COST + max(1, n_test))


def _shard_size(payload: dict[str, Any], ctx: JobContext, n_test: int, n_ckpts: int) -> int:
    if payload.get("shard_size", "auto") != "auto":
        return int(payload["shard_size"])
    return auto_shard_size(ctx, f"tracin-{payload['mode']}", payload["model"],
                           _cost_per_candidate(payload, n_test, n_ckpts), DEFAULT_PAIRS_PER_S, lo=256,
                           hi=10_000_000)


def _progress(ctx: JobContext) -> Any:
    def progress(done: int, total: int, message: str | None = None) -> None:
        ctx.progress(done, total, "batches", message=message or f"batch {done}/{total}")
    return progress


def run(payload: dict, ctx: JobContext) -> dict:
    from models.common import NonFiniteError
    from models.kg.influence import report, write_candidates, write_csv

    _drop_test_factors()  # a whole request: another parent's factors are not worth their memory now
    bundle = _bundle(ctx, payload["model"])
    if payload.get("estimator", "exact") != "exact":
        return _run_stored(payload, ctx, bundle)
    p = _plan(payload, bundle, ctx)
    if payload["mode"] in ("test", "self"):
        shard_size = _shard_size(payload, ctx, len(p.test_ids), len(p.engine.checkpoints))
        if len(p.union) > shard_size:
            return _fan_out(payload, ctx, len(p.union), shard_size)
    scores_path = ctx.artifact_path("scores.npy") if payload["mode"] == "test" and payload["top_k"] is None \
        else None
    t0 = time.perf_counter()
    try:
        result, rows = report(p, bundle, payload.get("train_triples"), _progress(ctx), scores_path)
    except NonFiniteError as exc:
        raise JobError("non_finite_scores", str(exc)) from None
    except (KeyError, ValueError) as exc:
        raise JobError("invalid_request", str(exc.args[0] if exc.args else exc)) from None
    if payload["mode"] in ("test", "self"):
        record_rate(ctx, f"tracin-{payload['mode']}", payload["model"],
                    len(p.union) * _cost_per_candidate(payload, len(p.test_ids), len(p.engine.checkpoints)),
                    time.perf_counter() - t0)
    write_csv(rows, ctx.artifact_path("influence.csv"))
    if payload["mode"] == "test":
        write_jsonl(ctx.artifact_path("results.jsonl"), result["results"])
        if scores_path is not None:
            write_candidates(bundle.dataset, p.train, p.union, ctx.artifact_path("candidates.tsv"))
    ctx.artifact_path("result.json").write_text(json.dumps(_clean(result)))
    return {"model": payload["model"], **result, "artifacts": ctx.artifacts()}


def _run_stored(payload: dict[str, Any], ctx: JobContext, bundle: Any) -> dict[str, Any]:
    """Estimators ``tracin_projected`` and ``trak``: one tiled pass over the features stored by ``POST /featurize``
    (no fan-out: the pass is one matrix product per tile, in bounded memory)."""
    from models.common import NonFiniteError
    from models.explain.features import NotFeaturized, stored_report
    from models.kg.influence import checkpoint_weights, write_csv

    try:
        ckpts = bundle.checkpoints if payload["checkpoints"] == "all" else \
            [bundle.checkpoint(str(c)) for c in payload["checkpoints"]]
        weights = checkpoint_weights(bundle, ckpts, payload.get("lr_weight", "last"))
        result, rows = stored_report(
            get_store(ctx.settings), bundle, payload["test_triples"], estimator=payload["estimator"],
            top_k=payload["top_k"], checkpoints=ckpts, layers=payload["layers"], loss=payload["loss"],
            proj_dim=payload["projection_dim"], seed=payload.get("seed", 0), damping=payload.get("damping", 0.01),
            weights=weights, progress=_progress(ctx))
    except NotFeaturized as exc:
        raise JobError("not_featurized", f"{exc.args[0]} (POST /featurize with the same checkpoints, layers, loss, "
                       "projection_dim and seed)") from None
    except NonFiniteError as exc:
        raise JobError("non_finite_scores", str(exc)) from None
    except (KeyError, ValueError) as exc:
        raise JobError("invalid_request", str(exc.args[0] if exc.args else exc)) from None
    result["lr_weight"] = payload.get("lr_weight", "last")
    write_csv(rows, ctx.artifact_path("influence.csv"))
    write_jsonl(ctx.artifact_path("results.jsonl"), result["results"])
    ctx.artifact_path("result.json").write_text(json.dumps(_clean(result)))
    return {"model": payload["model"], **_clean(result), "artifacts": ctx.artifacts()}


# ------------------------------------------------------------------------------------------------ fan-out
def _slim(payload: dict[str, Any]) -> dict[str, Any]:
    """The request as shards and the reduce step carry it: the test triples are read from the parent's job."""
    out = dict(payload)
    if out.get("test_triples") is not None:
        out["test_triples"] = None
        out["test_triples_from_parent"] = True
    return out


def _full_request(ctx: JobContext, parent: str, request: dict[str, Any]) -> dict[str, Any]:
    if not request.get("test_triples_from_parent"):
        return request
    from rq.job import Job
    from rq.serializers import JSONSerializer

    try:
        job = Job.fetch(parent, connection=ctx.job.connection, serializer=JSONSerializer)
        triples = job.args[1]["test_triples"]
    except Exception as exc:  # the parent's record expired or was deleted: nothing sensible to compute
        raise JobError("parent_missing", f"the parent job {parent!r} (which holds the test triples) is gone: "
                       f"{exc}") from None
    return {**{k: v for k, v in request.items() if k != "test_triples_from_parent"}, "test_triples": triples}


def _fan_out(payload: dict[str, Any], ctx: JobContext, n: int, shard_size: int) -> dict[str, Any]:
    slim = _slim(payload)

    def shard_payload(index: int, start: int, end: int) -> dict[str, Any]:
        return {"parent": ctx.job_id, "index": index, "start": start, "end": end, "request": slim}

    return fan_out(ctx, shard_kind="tracin_shard", reduce_kind="tracin_reduce", request=slim, n_items=n,
                   shard_size=shard_size, unit="candidates", shard_payload=shard_payload, timeout_s=4 * 3600,
                   retries=payload.get("shard_retries", 1),
                   max_failed_fraction=payload.get("max_failed_fraction", 0.01))


def run_shard(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Score candidates ``[start, end)`` of the parent's request: ``entries.jsonl`` (mode test: one line per test
    triple, its lists over this range) or ``self.jsonl`` (mode self: each candidate's self-influence)."""
    from models.common import NonFiniteError
    from models.kg.influence import LIST_ALL_MAX_PAIRS, pair_count, score_self, score_test

    start, end = payload["start"], payload["end"]

    def work() -> dict[str, Any]:
        request = _full_request(ctx, payload["parent"], payload["request"])
        bundle = _bundle(ctx, request["model"])
        p = _plan(request, bundle, ctx)
        t0 = time.perf_counter()
        try:
            if request["mode"] == "self":
                idx, si = score_self(p, bundle, start, end, progress=_progress(ctx))
                write_jsonl(ctx.artifact_path("self.jsonl"),
                             ({"train_index": j, "self_influence": v} for j, v in zip(idx.tolist(), si.tolist(),
                                                                                      strict=True)))
                n_test = 0
            else:
                import numpy as np

                top_k = request["top_k"]
                dense = None
                if top_k is None:
                    dense = np.lib.format.open_memmap(ctx.artifact_path("scores.npy"), mode="w+",
                                                      dtype=np.float32, shape=(len(p.test_ids), end - start))
                entries = score_test(p, bundle, top_k, start, end, progress=_progress(ctx), dense=dense,
                                     list_all=pair_count(p) <= LIST_ALL_MAX_PAIRS,
                                     test_cache=_test_factor_cache(payload["parent"], bundle))
                if dense is not None:
                    dense.flush()
                    del dense
                write_jsonl(ctx.artifact_path("entries.jsonl"), entries)
                n_test = len(p.test_ids)
        except NonFiniteError as exc:
            raise JobError("non_finite_scores", str(exc)) from None
        record_rate(ctx, f"tracin-{request['mode']}", request["model"],
                    (end - start) * _cost_per_candidate(request, n_test, len(p.engine.checkpoints)),
                    time.perf_counter() - t0)
        return {"n": end - start, "n_test": n_test}

    return run_shard_once(ctx, work)


def run_reduce(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Merge the shards: the artifacts under the parent's id, and the summary as the parent's result."""
    parent, n_shards = payload["parent"], payload["shards"]
    _drop_test_factors(parent)  # every shard has run
    request = _full_request(ctx, parent, payload["request"])
    bundle = _bundle(ctx, request["model"])
    p = _plan(request, bundle, ctx)
    ranges = _ranges(ctx, parent, n_shards)
    out_dir = ctx.settings.work_dir / f"{ctx.job_id}-merged"
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        done = [shard_done(ctx, parent, i) for i in range(n_shards)]
        failed = [i for i, d in enumerate(done) if d is None]
        unscored = sum(ranges[i][1] - ranges[i][0] for i in failed)
        limit = request.get("max_failed_fraction", 0.01)
        fraction = unscored / len(p.union) if len(p.union) else 0.0
        if fraction > limit:
            raise JobError("too_many_failures", f"shards {failed[:20]} failed for good: {unscored} of "
                           f"{len(p.union)} candidate training triples unscored ({fraction:.1%} > "
                           f"max_failed_fraction {limit:.1%})")
        if request["mode"] == "self":
            result = _reduce_self(ctx, parent, request, bundle, p, n_shards, failed, out_dir)
        else:
            result = _reduce_test(ctx, parent, request, bundle, p, ranges, failed, out_dir)
        result["failed"] = {"shards": failed, "candidates": unscored,
                            "triples": _failed_triples(bundle, p, ranges, failed)}
        result["shards"] = {"total": n_shards, "failed": failed}
        result["seconds_merge"] = round(time.perf_counter() - t0, 3)
        result = {"model": request["model"], **_clean(result)}
        (out_dir / "result.json").write_text(json.dumps(result))
        store = get_store(ctx.settings)
        store.sync_dir(out_dir, artifacts_key(parent))
        result["artifacts"] = store.list_files(artifacts_key(parent))
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


def _reduce_self(ctx: JobContext, parent: str, request: dict[str, Any], bundle: Any, p: Any, n_shards: int,
                 failed: list[int], out_dir: Path) -> dict[str, Any]:
    import torch

    from models.kg.influence import LIST_ALL_MAX_PAIRS, csv_row, self_ranking, write_csv

    idx, vals = [], []
    for i in range(n_shards):
        ctx.progress(i, n_shards, "shards", message=f"merging shard {i + 1}/{n_shards}")
        if i in failed:
            continue
        for rec in shard_records(ctx, parent, i, "self.jsonl"):
            idx.append(rec["train_index"])
            vals.append(rec["self_influence"])
    idx_t, si = torch.tensor(idx, dtype=torch.long), torch.tensor(vals, dtype=torch.float64)
    ds = bundle.dataset
    full, _ = self_ranking(ds, p.train, idx_t, si, None)
    write_jsonl(out_dir / "self_influence.jsonl", full)
    top_k = request["top_k"]
    shown = full if top_k is None else full[:top_k]
    result: dict[str, Any] = {**p.settings, "n_candidates": len(p.union), "n_scored": len(full)}
    if len(shown) > LIST_ALL_MAX_PAIRS:
        result["ranking_truncated"] = (f"{len(shown)} ranked triples; the first {LIST_ALL_MAX_PAIRS} are listed "
                                       "here, all of them in self_influence.jsonl")
        shown = shown[:LIST_ALL_MAX_PAIRS]
    result["ranking"] = shown
    result["returned"] = len(shown)
    write_csv([csv_row(ds, None, r["train_triple"], "", r["self_influence"], "self") for r in shown],
              out_dir / "influence.csv")
    return result


def _reduce_test(ctx: JobContext, parent: str, request: dict[str, Any], bundle: Any, p: Any,
                 ranges: list[tuple[int, int]], failed: list[int], out_dir: Path) -> dict[str, Any]:
    import csv

    from models.kg.influence import (
        CSV_COLUMNS,
        GLOBAL_TOP,
        LIST_ALL_MAX_PAIRS,
        GlobalTop,
        add_predictions,
        entry_csv_rows,
        finish_entry,
        merge_entries,
        pair_count,
        predictions,
        write_candidates,
    )

    ds = bundle.dataset
    top_k = request["top_k"]
    k_global = GLOBAL_TOP if top_k is None else top_k
    live = [i for i in range(len(ranges)) if i not in failed]
    iters = [shard_records(ctx, parent, i, "entries.jsonl") for i in live]
    n_test = len(p.test_ids)
    best = GlobalTop(k_global)
    preds = predictions(bundle, p.test_ids)
    with open(out_dir / "results.jsonl", "w", encoding="utf-8") as res_fh, \
            open(out_dir / "influence.csv", "w", newline="", encoding="utf-8") as csv_fh:
        writer = csv.DictWriter(csv_fh, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for t in range(n_test):
            if t % 64 == 0:
                ctx.progress(t, n_test, "test triples", message=f"merging test triple {t + 1}/{n_test}")
            parts = [next(it) for it in iters]
            merged = merge_entries(parts, top_k) if parts else {
                "test_triple": ds.decode(p.test_ids[t:t + 1])[0], "self_influence": None, "n_candidates": 0,
                "n_positive": 0, "n_negative": 0}
            best.add(t, merged)
            public = finish_entry(merged, top_k)
            add_predictions([public], preds[t:t + 1])
            res_fh.write(json.dumps(_clean(public)) + "\n")
            writer.writerows(entry_csv_rows(ds, public))
    result: dict[str, Any] = {**p.settings, "n_test": n_test, "n_candidates_scored": len(p.union)}
    result.update(best.result())
    n_pairs = pair_count(p)
    if top_k is None:
        _merge_dense(ctx, parent, ranges, failed, n_test, len(p.union), out_dir / "scores.npy")
        write_candidates(ds, p.train, p.union, out_dir / "candidates.tsv")
        result["scores"] = {"artifact": "scores.npy", "shape": [n_test, len(p.union)],
                            "rows": "test_triples in request order", "columns": "candidates.tsv"}
        if n_pairs > LIST_ALL_MAX_PAIRS:
            result["lists_omitted"] = (f"top_k null asks for all {n_pairs} scores, more than the "
                                       f"{LIST_ALL_MAX_PAIRS} listed in a result: they are in the scores artifact")
    result["results"] = {"artifact": "results.jsonl", "count": n_test}
    return result


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
