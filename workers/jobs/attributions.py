"""Worker side of ``POST /attributions`` and the news demo models."""

from __future__ import annotations

import shutil
import time
from typing import Any

import numpy as np

from core.artifacts import artifacts_key
from core.filestore import get_store
from workers.context import JobContext, JobError
from workers.context import json_safe as _clean
from workers.fanout import (
    auto_shard_size,
    failed_fraction,
    fan_out,
    parent_ranges,
    record_rate,
    shard_done,
    shard_records,
    write_jsonl,
)
from workers.fanout import run_shard as run_shard_once

NPZ_MIN_SAMPLES = 32  # runs with at least this many samples also write an npz artifact
DEFAULT_WARN_RELATIVE_DELTA = 0.05  # the request's default (core.kinds.attributions)


def _samples(payload: dict[str, Any], ctx: JobContext, with_bodies: bool) -> list:
    from core import registry
    from core.userfiles import files_for
    from models.news.data import LabelsMissing, Sample, load_samples

    if payload.get("samples") is not None:
        return [Sample(id=s["id"], history=list(s["history"]), candidate=s["candidate"], label=s.get("label"),
                       candidate_body=s.get("candidate_body"), history_bodies=s.get("history_bodies"))
                for s in payload["samples"]]
    ds = payload["dataset"]
    entry = registry.get_dataset(ctx.settings, ds["name"])
    if entry is None:
        raise JobError("unknown_dataset", f"dataset {ds['name']!r} is not registered on this server")
    root = registry.absolute_path(ctx.settings, entry)
    try:
        return load_samples(root, ds["split"], ds["n_samples"], ds["balanced"], ds["seed"], with_bodies,
                            payload.get("max_history", 50), files_for(ctx.settings, root))
    except LabelsMissing as exc:
        raise JobError("invalid_request", f"dataset.balanced: dataset {ds['name']!r}: {exc}") from exc
    except (FileNotFoundError, ValueError) as exc:
        raise JobError("bad_dataset", f"dataset {ds['name']!r}: {exc}") from exc


def input_warnings(samples: list, views: tuple[str, ...]) -> list[str]:
    """What the caller should know about the inputs: missing labels, missing bodies for a body view."""
    out = []
    if all(s.label is None for s in samples):
        out.append("no sample has a real/fake label: word_stats has the single group 'unlabelled' and no "
                   "per-label statistics")
    if "body" in views:
        no_hist = [s.id for s in samples if s.history_bodies is None]
        no_cand = [s.id for s in samples if s.candidate_body is None]
        if no_hist:
            out.append(f"{len(no_hist)} sample(s) have no history_bodies (e.g. {no_hist[:3]}): their user vectors "
                       "were built with empty history bodies")
        if no_cand:
            out.append(f"{len(no_cand)} sample(s) have no candidate_body (e.g. {no_cand[:3]}): the body view "
                       "was attributed over an empty body")
    return out


def _options(payload: dict[str, Any]) -> Any:
    from models.news.attribution import IGOptions

    return IGOptions(
        n_steps=payload["n_steps"], method=payload["method"], tolerance=payload.get("tolerance"),
        alpha_batch_size=payload["alpha_batch_size"], batch_size=payload["batch_size"],
        precision=payload["precision"], baseline=payload["baseline"], top_k=payload["top_k"],
        optimized=payload["optimized"], max_history=payload.get("max_history", 50),
        faithfulness=bool(payload.get("faithfulness", False)), faithfulness_seed=payload.get("faithfulness_seed", 0),
    )


def _without_faithfulness(opts: Any) -> Any:
    """The options of the ``compare_with`` pass: faithfulness is reported for the request's own model only."""
    import dataclasses

    return dataclasses.replace(opts, faithfulness=False)


def _pass_progress(ctx: JobContext, passes: int, n_samples: int) -> Any:
    """``progress_for(k)``: the progress callback of pass ``k`` of ``passes`` (the model, then ``compare_with``).
    The total is the request's ``n_samples`` whatever the passes and views: the work done so far (pass ``k``'s
    share plus the earlier passes) is reported as that fraction of the samples, and the message names the
    pass."""
    def progress_for(k: int):
        def progress(done: int, total: int, message: str) -> None:
            fraction = (k + (done / total if total else 1.0)) / passes
            label = f"model {k + 1} of {passes}: " if passes > 1 else ""
            ctx.progress(min(n_samples, int(fraction * n_samples)), n_samples, "samples", message=label + message)
        return progress
    return progress_for


def _compare_options(payload: dict[str, Any]) -> dict[str, Any]:
    return {"threshold": payload.get("compare_threshold", 0.1),
            "changed_min_count": payload.get("compare_min_count", 3)}


def _warn_threshold(payload: dict[str, Any]) -> float:
    return float(payload.get("warn_relative_delta", DEFAULT_WARN_RELATIVE_DELTA))


def _write_words_csv(path: Any, parts: list[tuple[str, list[dict[str, Any]]]], main_view: str) -> None:
    from models.news.summary import WordsCsv

    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = WordsCsv(fh)
        for model, records in parts:
            for rec in records:
                out.add(model, rec, main_view)


def run(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    from models.common import NonFiniteError
    from models.news.attribution import (
        AttributionError,
        compare_reports,
        explain,
        samples_to_arrays,
    )
    from models.news.summary import CompletenessWarnings

    bundle = ctx.model(payload["model"])
    model = bundle.model
    samples = _samples(payload, ctx, with_bodies="body" in model.views)
    if not samples:
        raise JobError("no_samples", "the request selected no samples")
    shard_size = _shard_size(payload, ctx)
    if len(samples) > shard_size:  # a dataset-scale run: shards on every worker, then a reduce step
        return _fan_out(payload, ctx, len(samples), shard_size)
    opts = _options(payload)
    compare = payload.get("compare_with")
    progress_for = _pass_progress(ctx, 2 if compare else 1, len(samples))
    threshold = _warn_threshold(payload)
    main_view = model.views[0]

    try:
        report = explain(model, samples, opts, progress_for(0))
    except NonFiniteError as exc:
        raise JobError("non_finite_scores", str(exc)) from exc
    except AttributionError as exc:
        raise JobError("attribution_failed", str(exc)) from exc
    if not report["samples"]:
        detail = "; ".join(f"{e['id']}: {e['error']}" for e in report["errors"][:10])
        raise JobError("all_samples_failed", f"no sample could be attributed ({detail})")
    report["model"] = payload["model"]
    report["warn_relative_delta"] = threshold
    report["warnings"] = input_warnings(samples, model.views) + CompletenessWarnings(
        threshold, main_view).extend(report["samples"]).warnings()
    csv_parts = [(payload["model"], report["samples"])]
    if compare:
        other = ctx.model(compare)
        try:
            report_b = explain(other.model, samples, _without_faithfulness(opts), progress_for(1))
        except NonFiniteError as exc:
            raise JobError("non_finite_scores", f"compare_with {compare!r}: {exc}") from exc
        except AttributionError as exc:
            raise JobError("attribution_failed", f"compare_with {compare!r}: {exc}") from exc
        report["comparison"] = {
            "model": compare,
            **compare_reports(report, report_b, top_n=payload.get("compare_top_n", 3), **_compare_options(payload)),
            "summary": report_b["summary"],
            "errors": report_b["errors"],
            "word_stats": report_b["word_stats"],
            "n_samples": len(report_b["samples"]),
            "samples": report_b["samples"],
        }
        report["warnings"] += CompletenessWarnings(threshold, other.model.views[0], f"compare_with {compare!r}: "
                                                   ).extend(report_b["samples"]).warnings()
        csv_parts.append((compare, report_b["samples"]))
    _write_words_csv(ctx.artifact_path("words.csv"), csv_parts, main_view)
    if len(report["samples"]) >= NPZ_MIN_SAMPLES:
        np.savez_compressed(ctx.artifact_path("attributions.npz"), **samples_to_arrays(report))
    report["artifacts"] = ctx.artifacts()
    return _clean(report)


# Estimated seconds of each demo model's preparation on 2 free cores: they order the demo and make its ETA. The
# whole demo measured about 574 CPU-s (docs/attributions.md); in one first start at load average ~10 the word
# model trained in 383 s and the frozen-MiniLM one in 278 s, so the MiniLM model (the README's) comes first, then
# its poisoned twin (the comparison's pair).
DEMO_COSTS = {"nrms-minilm-demo": 90.0, "nrms-minilm-poisoned-demo": 90.0, "naml-demo": 100.0,
              "nrms-word-demo": 125.0}


def demo_steps() -> list[Any]:
    """One step per news demo model (each makes the synthetic datasets first when they are missing)."""
    from workers.demo import DemoStep

    names = ("nrms-minilm-demo", "nrms-minilm-poisoned-demo", "nrms-word-demo", "naml-demo")
    return [DemoStep(name, lambda settings, progress, name=name: prepare_demo(settings, progress, only=(name,)),
                     models=(name,), datasets=("news-synthetic", "news-synthetic-poisoned"),
                     kinds=("attributions", "train_news"), explains=True, cost_s=DEMO_COSTS[name])
            for name in names]


def prepare_demo(settings: Any, progress: bool = True, only: tuple[str, ...] | None = None) -> None:
    """Generate the synthetic datasets and train the demo models (``only`` those named), idempotent: existing
    ones are kept."""
    from tqdm.auto import tqdm

    from core import registry
    from models.common import default_device
    from models.news.demo import DEMOS, make_datasets, train_demo

    # Generated on this host (training reads it here), then copied into the store for every host.
    data_root = settings.work_dir / "demo-data"
    for name, info in make_datasets(data_root).items():
        if registry.get_dataset(settings, name) is None:
            registry.register_dataset(settings, name, kind="news", path=info["path"], upload=True,
                                      meta={"format": "mind", "synthetic": True, "poisoned": "poisoned" in name})
    device = default_device()
    store = registry.store(settings)
    for spec in DEMOS:
        if only is not None and spec.name not in only:
            continue
        out_dir = settings.work_dir / "demo-models" / spec.name
        entry = registry.get_model(settings, spec.name)
        if entry is not None and entry.get("location") and store.exists(f"{entry['location']}/config.json"):
            continue
        bar = tqdm(desc=f"train {spec.name}", unit="step", disable=not progress)

        def report(step: int, total: int, metrics: dict[str, float], bar: Any = bar) -> None:
            bar.total = total
            bar.n = step
            bar.set_postfix(loss=f"{metrics['loss']:.3f}", epoch=int(metrics["epoch"]), refresh=False)
            bar.refresh()

        metrics = train_demo(spec, data_root, out_dir, device, report)
        bar.close()
        print(f"{spec.name}: validation AUC {metrics['valid']['auc']:.3f} (pooled AUC "
              f"{metrics['valid']['pooled_auc']:.3f}) in {metrics['train_seconds']}s", flush=True)
        from models.news.checkpoint import load

        params = load(out_dir, "cpu").parameters
        registry.register_model(settings, spec.name, kind="news", loader="models.news.checkpoint:load",
                                path=out_dir, parameters=params, preload=True,
                                meta={"architecture": spec.config["kind"], "encoder": spec.config.get("encoder"),
                                      "dataset": spec.dataset, "valid_auc": metrics["valid"]["auc"]})
        shutil.rmtree(out_dir, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ fan-out
DEFAULT_SAMPLE_STEPS_PER_S = 100.0  # before any shard of this model has run (a 2-core CPU does ~250 in fp32)
SUMMARY_TOP_WORDS = 50


def _shard_size(payload: dict[str, Any], ctx: JobContext) -> int:
    if payload.get("shard_size", "auto") != "auto":
        return int(payload["shard_size"])
    cost = payload["n_steps"] * (2 if payload.get("compare_with") else 1)
    return auto_shard_size(ctx, "attributions", payload["model"], cost, DEFAULT_SAMPLE_STEPS_PER_S)


def _fan_out(payload: dict[str, Any], ctx: JobContext, n: int, shard_size: int) -> dict[str, Any]:
    inline = payload.get("samples") is not None

    def shard_payload(index: int, start: int, end: int) -> dict[str, Any]:
        request = dict(payload)
        if inline:  # a shard carries only its own samples
            request["samples"] = payload["samples"][start:end]
        return {"parent": ctx.job_id, "index": index, "start": 0 if inline else start,
                "end": end - start if inline else end, "request": request}

    return fan_out(ctx, shard_kind="attributions_shard", reduce_kind="attributions_reduce", request=payload,
                   n_items=n, shard_size=shard_size, unit="samples", shard_payload=shard_payload,
                   timeout_s=2 * 3600, retries=payload.get("shard_retries", 1),
                   max_failed_fraction=payload.get("max_failed_fraction", 0.01))


def run_shard(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Attribute samples ``[start, end)`` of the parent's request; write ``samples.jsonl`` (and ``compare.jsonl``)."""
    from models.news.attribution import AttributionError, explain

    request, start, end = payload["request"], payload["start"], payload["end"]

    def work() -> dict[str, Any]:
        model = ctx.model(request["model"]).model
        samples = _samples(request, ctx, with_bodies="body" in model.views)[start:end]
        opts = _options(request)
        compare = request.get("compare_with")
        passes = 2 if compare else 1
        progress_for = _pass_progress(ctx, passes, len(samples))
        t0 = time.perf_counter()
        try:
            report = explain(model, samples, opts, progress_for(0))
            write_jsonl(ctx.artifact_path("samples.jsonl"), report["samples"])
            out = {"n": len(samples), "errors": report["errors"], "summary": report["summary"],
                   "warnings": input_warnings(samples, model.views)}
            if report.get("faithfulness"):
                out["faithfulness_seconds"] = report["faithfulness"]["seconds"]
            if compare:
                report_b = explain(ctx.model(compare).model, samples, _without_faithfulness(opts),
                                   progress_for(1))
                write_jsonl(ctx.artifact_path("compare.jsonl"), report_b["samples"])
                out["compare_errors"] = report_b["errors"]
                out["compare_summary"] = report_b["summary"]
        except AttributionError as exc:
            raise JobError("attribution_failed", str(exc)) from exc
        # the rate is of sample-steps: the faithfulness numbers' time (no steps) is left out of it
        record_rate(ctx, "attributions", request["model"], len(samples) * opts.n_steps * passes,
                    time.perf_counter() - t0 - out.get("faithfulness_seconds", 0.0))
        return _clean(out)

    return run_shard_once(ctx, work)


def run_reduce(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Merge the shards in sample order: ``samples.jsonl`` for the parent, and a compact summary as the result."""
    import json

    from models.news.summary import CompletenessWarnings, ReportAccumulator, WordsCsv, compare

    parent, n_shards, request = payload["parent"], payload["shards"], payload["request"]
    store = get_store(ctx.settings)
    out_dir = ctx.settings.work_dir / f"{ctx.job_id}-merged"
    out_dir.mkdir(parents=True, exist_ok=True)
    acc, acc_b = ReportAccumulator(), ReportAccumulator() if request.get("compare_with") else None
    errors: list[dict[str, Any]] = []
    failed_shards: list[int] = []
    shard_summaries: list[dict[str, Any]] = []
    compare_summaries: list[dict[str, Any]] = []
    warnings: list[str] = []  # per shard (counts are a shard's)
    faithful: list[dict[str, Any]] = []  # each merged record's faithfulness (when asked for)
    faithful_seconds = 0.0
    n_total = 0
    threshold = _warn_threshold(request)
    model_b = request.get("compare_with")
    try:
        with open(out_dir / "samples.jsonl", "w", encoding="utf-8") as merged, \
                open(out_dir / "compare.jsonl", "w", encoding="utf-8") as merged_b, \
                open(out_dir / "words.csv", "w", newline="", encoding="utf-8") as words_fh:
            words_csv = WordsCsv(words_fh)
            warn, warn_b = CompletenessWarnings(threshold), CompletenessWarnings(
                threshold, prefix=f"compare_with {model_b!r}: ")
            for i in range(n_shards):
                ctx.progress(i, n_shards, "shards", message=f"merging shard {i + 1}/{n_shards}")
                done = shard_done(ctx, parent, i)
                if done is None:
                    failed_shards.append(i)
                    continue
                n_total += done["n"]
                errors.extend(done["errors"])
                if not shard_summaries and done["summary"].get("views"):  # the view records hold at top level
                    acc.main_view = done["summary"]["views"][0]
                    warn.main_view = warn_b.main_view = acc.main_view
                    if acc_b is not None:
                        acc_b.main_view = acc.main_view
                shard_summaries.append(done["summary"])
                if done.get("compare_summary"):
                    compare_summaries.append(done["compare_summary"])
                warnings.extend(w for w in done.get("warnings", []) if w not in warnings)
                faithful_seconds += done.get("faithfulness_seconds") or 0.0
                for rec in shard_records(ctx, parent, i, "samples.jsonl"):
                    acc.add(rec)
                    if rec.get("faithfulness"):
                        faithful.append(rec["faithfulness"])
                    warn.add(rec)
                    words_csv.add(request["model"], rec, acc.main_view)
                    merged.write(json.dumps(rec) + "\n")
                if acc_b is not None:
                    for rec in shard_records(ctx, parent, i, "compare.jsonl"):
                        acc_b.add(rec)
                        warn_b.add(rec)
                        merged_b.write(json.dumps(rec) + "\n")
            if acc_b is not None:  # the second model's words after the first's, read back from the merged file
                merged_b.flush()
                with open(out_dir / "compare.jsonl", encoding="utf-8") as again:
                    for line in again:
                        words_csv.add(model_b, json.loads(line), acc.main_view)
            warnings += warn.warnings() + (warn_b.warnings() if acc_b is not None else [])
        if failed_shards:  # name every sample of a shard that failed for good
            ids = _parent_sample_ids(request, ctx)
            ranges = (ctx.job.connection and parent_ranges(ctx, parent)) or []
            for i in failed_shards:
                start, end = ranges[i] if i < len(ranges) else (0, 0)
                n_total += end - start
                errors.extend({"id": sid, "error": f"shard {i} failed"} for sid in ids[start:end])
        fraction = failed_fraction(len(errors), n_total)
        limit = request.get("max_failed_fraction", 0.01)
        if n_total and fraction > limit:
            raise JobError("too_many_failures", f"{len(errors)} of {n_total} samples failed ({fraction:.1%} > "
                           f"max_failed_fraction {limit:.1%}); first: {errors[:3]}")
        stats = acc.word_stats()
        (out_dir / "word_stats.json").write_text(json.dumps(stats))
        top_k = request.get("top_k", 10)
        result: dict[str, Any] = {
            "model": request["model"],
            "n_samples": acc.n,
            "n_errors": len(errors),
            "errors": errors[:1000],
            "errors_truncated": len(errors) > 1000,
            "relative_delta": acc.delta_distribution(),  # every view of every sample
            "relative_delta_by_view": acc.delta_by_view(),
            "top_words": acc.top_words(top_k),
            "word_stats": {label: {"top": rows[:SUMMARY_TOP_WORDS], "bottom": rows[-SUMMARY_TOP_WORDS:][::-1],
                                   "words": len(rows)} for label, rows in stats.items()},
            "labels": sorted(acc.n_label.items()),
            "summary": _merge_summaries(shard_summaries, acc, len(errors)),
            "shards": {"total": n_shards, "failed": failed_shards},
            "warnings": warnings,
            "warn_relative_delta": threshold,
        }
        if request.get("faithfulness"):
            from models.news.faithfulness import merged_section

            result["faithfulness"] = merged_section(faithful, request, (result["summary"].get("views") or [None])[0],
                                                    faithful_seconds,
                                                    result["summary"].get("seconds") or 0.0)
        if acc_b is not None:
            cmp = compare(acc, acc_b, **_compare_options(request))
            (out_dir / "comparison.json").write_text(json.dumps(cmp))
            result["comparison"] = {"model": request["compare_with"], **cmp,
                                    "changed": cmp["changed"][:SUMMARY_TOP_WORDS],
                                    "changed_total": len(cmp["changed"]),
                                    "relative_delta": acc_b.delta_distribution(),
                                    "relative_delta_by_view": acc_b.delta_by_view(),
                                    "summary": _merge_summaries(compare_summaries, acc_b, len(errors))}
        else:
            (out_dir / "compare.jsonl").unlink()
        (out_dir / "summary.json").write_text(json.dumps(_clean(result)))
        store.sync_dir(out_dir, artifacts_key(parent))
        result["artifacts"] = store.list_files(artifacts_key(parent))
        return _clean(result)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def _merge_summaries(summaries: list[dict[str, Any]], acc: Any, n_errors: int) -> dict[str, Any]:
    """The single-job ``summary`` (``models.news.attribution.explain``) of the shards together, field by field:
    settings from the first shard; counts from the merged records; ``n_steps`` the largest (an adaptive run's
    largest per-sample rule); ``gradient_evaluations`` the sum (additive over samples); ``tolerance_met`` true
    when every shard met it; the relative-delta statistics over every view of every merged record, overall and
    ``relative_delta_by_view``. Times are summed over shards (work, not wall time). ``batch_size`` and
    ``alpha_batch_size`` are the first shard's (``auto`` resolves per shard). With a tolerance and
    ``optimized: false`` (the reference loop doubles the whole run until the median meets it) each shard doubles
    on its own, so only there can ``n_steps`` and ``tolerance_met`` differ from one job's."""
    if not summaries:
        return {}
    first = summaries[0]
    keep = ("method", "precision", "baseline", "optimized", "views", "tolerance", "batch_size", "alpha_batch_size")
    steps = [s["n_steps"] for s in summaries if s.get("n_steps") is not None]
    evals = [s.get("gradient_evaluations") for s in summaries]
    met = [s.get("tolerance_met") for s in summaries]
    dist = acc.delta_distribution()
    seconds = sum(s.get("seconds") or 0 for s in summaries)
    return {**{k: first.get(k) for k in keep},
            "n_samples": acc.n,
            "n_errors": n_errors,
            "n_steps": max(steps) if steps else None,
            "gradient_evaluations": None if any(e is None for e in evals) else sum(evals),
            "median_relative_delta": dist["median"] if dist["median"] is not None else float("nan"),
            "max_relative_delta": dist["max"] if dist["max"] is not None else float("nan"),
            "relative_delta_by_view": acc.delta_by_view(),
            "tolerance_met": None if all(m is None for m in met) else all(m is True for m in met),
            "seconds": seconds,
            "seconds_prepare": sum(s.get("seconds_prepare") or 0 for s in summaries),
            "n_steps_max": max(steps) if steps else 0,
            "seconds_total": round(seconds, 3)}


def _parent_sample_ids(request: dict[str, Any], ctx: JobContext) -> list[str]:
    """The parent's samples' ids in order (for naming the samples of a failed shard)."""
    if request.get("samples") is not None:
        return [s["id"] for s in request["samples"]]
    try:
        return [s.id for s in _samples(request, ctx, with_bodies=False)]
    except JobError:
        return []
