"""Worker side of ``POST /attributions`` and the news demo models.

A request of at most one shard's samples runs whole (``run``); a larger one fans out (``run_shard`` per range of
samples, then ``run_reduce``). Both end in the same builder, ``models.news.report.AttributionReport``, fed the
same parts (a whole run is one part, a shard one each), so the result has one shape and the same numbers either
way (``core.contract.results.attributions.AttributionResult``).

The loaded model decides the pipeline at one explain point (:func:`_explain`): a Hugging Face classifier
(``models.hf.checkpoint.HFClassifier``, registry kind ``hf_classifier``) is explained over the request's ``texts``
by ``models.hf.attribution``, an exported classifier (``models.export.program.ExportedClassifier``, registry
kind ``exported_classifier``) over the request's ``inputs`` by ``models.export.attribution``, a news recommender
over its ``samples`` (or dataset's) by ``models.news.attribution``; all give the same report shape, so everything
after that point is shared.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from typing import Any

from core.artifacts import artifacts_key
from core.contract.kind import ReduceRequest, ShardRequest
from core.contract.results.attributions import AttributionResult, SampleRecord
from core.filestore import get_store
from core.kinds.attributions import AttributionsRequest, baseline_of
from workers.context import JobContext, JobError
from workers.fanout import (
    Planned,
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

# the request's default (the tests' completeness threshold); the request model is where it lives
DEFAULT_WARN_RELATIVE_DELTA: float = AttributionsRequest.model_fields["warn_relative_delta"].default
DEFAULT_SAMPLE_STEPS_PER_S = 100.0  # before any shard of this model has run (a 2-core CPU does ~250 in fp32)


# ------------------------------------------------------------------------------------------------ the request
def _samples(request: AttributionsRequest, ctx: JobContext, with_bodies: bool) -> list:
    from core import registry
    from core.userfiles import files_for
    from models.news.data import LabelsMissing, Sample, load_samples

    if request.samples is not None:
        return [Sample(id=s.id, history=list(s.history), candidate=s.candidate, label=s.label,
                       candidate_body=s.candidate_body,
                       history_bodies=list(s.history_bodies) if s.history_bodies is not None else None)
                for s in request.samples]
    ds = request.dataset
    if ds is None:
        raise JobError("invalid_request", "give exactly one of samples or dataset")
    entry = registry.get_dataset(ctx.settings, ds.name)
    if entry is None:
        raise JobError("unknown_dataset", f"dataset {ds.name!r} is not registered on this server")
    root = registry.absolute_path(ctx.settings, entry)
    try:
        return load_samples(root, ds.split, ds.n_samples, ds.balanced, ds.seed, with_bodies, request.max_history,
                            files_for(ctx.settings, root))
    except LabelsMissing as exc:
        raise JobError("invalid_request", f"dataset.balanced: dataset {ds.name!r}: {exc}") from exc
    except (FileNotFoundError, ValueError) as exc:
        raise JobError("bad_dataset", f"dataset {ds.name!r}: {exc}") from exc


def _texts(request: AttributionsRequest) -> list:
    from models.hf.batches import TextSample

    if request.texts is None:
        raise JobError("invalid_request", f"model {request.model!r} is a Hugging Face classifier: give texts")
    return [TextSample(id=t.id, text=t.text, label=t.label, target=t.target) for t in request.texts]


def _tensors(request: AttributionsRequest) -> list:
    import numpy as np

    from models.export.attribution import TensorSample

    if request.inputs is None:
        raise JobError("invalid_request", f"model {request.model!r} is an exported classifier: give inputs")
    return [TensorSample(id=t.id, values=np.asarray(t.values, dtype=np.float64), label=t.label, target=t.target)
            for t in request.inputs]


def _family(loaded: Any) -> str:
    """``hf`` (a Hugging Face classifier), ``export`` (an exported classifier) or ``news`` (a news bundle, whose
    ``.model`` is explained)."""
    from models.export.program import ExportedClassifier
    from models.hf.checkpoint import HFClassifier

    return "hf" if isinstance(loaded, HFClassifier) else "export" if isinstance(loaded, ExportedClassifier) \
        else "news"


def _classifier(loaded: Any) -> bool:
    """Whether a loaded model is a classifier whose records name classes (Hugging Face or exported)."""
    return _family(loaded) != "news"


def _inputs(request: AttributionsRequest, ctx: JobContext, loaded: Any) -> list:
    """The request's items for the loaded model: texts or inputs for a classifier, news samples for a
    recommender."""
    if _family(loaded) == "export":
        if request.samples is not None or request.dataset is not None or request.texts is not None:
            raise JobError("invalid_request", f"model {request.model!r} is an exported classifier: give inputs")
        return _tensors(request)
    if request.inputs is not None:
        raise JobError("invalid_request", f"model {request.model!r} takes no inputs (they are for exported "
                       "classifiers)")
    if _classifier(loaded):
        if request.samples is not None or request.dataset is not None:
            raise JobError("invalid_request", f"model {request.model!r} is a Hugging Face classifier: give texts, "
                           "not samples or dataset")
        return _texts(request)
    if request.texts is not None:
        raise JobError("invalid_request", f"model {request.model!r} is a news recommender: give samples or "
                       "dataset, not texts")
    return _samples(request, ctx, with_bodies="body" in loaded.model.views)


def _classifier_options(request: AttributionsRequest) -> dict[str, Any]:
    """The engine options every classifier family takes from the request."""
    return dict(
        n_steps=request.n_steps, method=request.method, tolerance=request.tolerance,
        alpha_batch_size=request.alpha_batch_size, batch_size=request.batch_size, precision=request.precision,
        baseline=baseline_of(request), top_k=request.top_k, optimized=request.optimized,
        faithfulness=request.faithfulness, faithfulness_seed=request.faithfulness_seed,
    )


def _hf_options(request: AttributionsRequest) -> Any:
    from models.hf.attribution import HFOptions

    return HFOptions(**_classifier_options(request))


def _export_options(request: AttributionsRequest) -> Any:
    import numpy as np

    from models.export.attribution import ExportOptions

    values = request.baseline_values
    return ExportOptions(**_classifier_options(request),
                         baseline_values=np.asarray(values, dtype=np.float64) if values is not None else None)


def _options(request: AttributionsRequest) -> Any:
    from models.news.attribution import IGOptions

    return IGOptions(
        n_steps=request.n_steps, method=request.method, tolerance=request.tolerance,
        alpha_batch_size=request.alpha_batch_size, batch_size=request.batch_size, precision=request.precision,
        baseline=baseline_of(request), top_k=request.top_k, optimized=request.optimized,
        max_history=request.max_history,
        faithfulness=request.faithfulness, faithfulness_seed=request.faithfulness_seed,
    )


def _report_options(request: AttributionsRequest) -> Any:
    from models.news.report import ReportOptions

    return ReportOptions(
        model=request.model, top_k=request.top_k, warn_relative_delta=request.warn_relative_delta,
        compare_with=request.compare_with, compare_threshold=request.compare_threshold,
        compare_min_count=request.compare_min_count, compare_top_n=request.compare_top_n,
        faithfulness=request.faithfulness, faithfulness_seed=request.faithfulness_seed, baseline=baseline_of(request),
    )


def _record(rec: dict[str, Any]) -> dict[str, Any]:
    """A sample record as the result holds it, inline and in its JSONL alike (``SampleRecord``'s dump)."""
    return SampleRecord.model_validate(rec).model_dump(mode="json")


def _part(n: int, report: dict[str, Any], report_b: dict[str, Any] | None, items: list, hf: bool) -> dict[str, Any]:
    """One part's summary (``models.news.report.part_summary``); a classifier's texts have no bodies to miss, and
    whether any has a label is what the input warnings' state says of them."""
    from models.news.report import part_summary

    if not hf:
        return part_summary(n, report, report_b, items)
    from models.hf.attribution import input_state

    done = part_summary(n, report, report_b, ())
    done["inputs"] = input_state(items)
    return done


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


# ------------------------------------------------------------------------------------------- one part's work
def _explain(loaded: Any, items: list, request: AttributionsRequest, progress: Any, prefix: str = "",
             compare: bool = False, targets: dict[str, str] | None = None) -> dict[str, Any]:
    """The one explain point: the report of a Hugging Face classifier over texts (``models.hf.attribution``) or of
    a news recommender over samples (``models.news.attribution``), with its failures as job errors (``prefix``
    names the comparison model) and its errors in the items' order (as a sharded run lists them, shard after
    shard). ``compare``: the ``compare_with`` pass (faithfulness is the request's model's only); ``targets``: the
    classes it explains (text id -> class name)."""
    from models.common import NonFiniteError
    from models.news.attribution import AttributionError

    try:
        if _family(loaded) == "export":
            from models.export.attribution import explain as explain_inputs

            opts = _export_options(request)
            if compare:
                opts = dataclasses.replace(opts, faithfulness=False)
            report = explain_inputs(loaded, items, opts, progress, targets=targets)
        elif _classifier(loaded):
            from models.hf.attribution import explain as explain_texts

            opts = _hf_options(request)
            if compare:
                opts = dataclasses.replace(opts, faithfulness=False)
            report = explain_texts(loaded, items, opts, progress, targets=targets)
        else:
            from models.news.attribution import explain

            opts = _options(request)
            if compare:
                opts = dataclasses.replace(opts, faithfulness=False)
            report = explain(loaded.model, items, opts, progress)
    except NonFiniteError as exc:
        raise JobError("non_finite_scores", f"{prefix}{exc}") from exc
    except AttributionError as exc:
        raise JobError("attribution_failed", f"{prefix}{exc}") from exc
    except ValueError as exc:  # options the model cannot take (a baseline token its tokenizer lacks)
        raise JobError("invalid_request", f"{prefix}{exc}") from exc
    position = {s.id: i for i, s in enumerate(items)}
    report["errors"].sort(key=lambda e: position.get(e["id"], len(position)))
    return report


def _attribute(ctx: JobContext, request: AttributionsRequest, loaded: Any, items: list,
               whole: bool) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The model's report over ``items``, and the ``compare_with`` model's (for a classifier, explaining the class
    the model's record explains). A whole run with no item attributed fails, naming them (a shard's failures count
    towards the parent's ``max_failed_fraction``)."""
    compare = request.compare_with
    progress_for = _pass_progress(ctx, 2 if compare else 1, len(items))
    report = _explain(loaded, items, request, progress_for(0))
    if whole and not report["samples"]:
        detail = "; ".join(f"{e['id']}: {e['error']}" for e in report["errors"][:10])
        raise JobError("all_samples_failed", f"no sample could be attributed ({detail})")
    report_b = None
    if compare is not None:
        other = ctx.model(compare)
        if _family(other) != _family(loaded):
            raise JobError("invalid_request", f"compare_with {compare!r} is not the same kind of model as "
                           f"{request.model!r}")
        targets = {r["id"]: r["target"]["label"] for r in report["samples"]} if _classifier(loaded) else None
        report_b = _explain(other, items, request, progress_for(1), f"compare_with {compare!r}: ", compare=True,
                            targets=targets)
    return report, report_b


def run(request: AttributionsRequest, ctx: JobContext) -> AttributionResult | Planned:
    from models.news.report import AttributionReport

    loaded = ctx.model(request.model)
    samples = _inputs(request, ctx, loaded)
    if not samples:
        raise JobError("no_samples", "the request selected no samples")
    shard_size = _shard_size(request, ctx)
    if len(samples) > shard_size:  # a dataset-scale run: shards on every worker, then a reduce step
        return _fan_out(request, ctx, len(samples), shard_size)
    report, report_b = _attribute(ctx, request, loaded, samples, whole=True)
    with AttributionReport(ctx.artifacts_dir, _report_options(request), _record) as out:
        out.part(_part(len(samples), report, report_b, samples, _classifier(loaded)), report["samples"],
                 report_b["samples"] if report_b is not None else ())
        result = out.finish()
    result["artifacts"] = ctx.artifacts()
    return AttributionResult.model_validate(result)


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
        if registry.system_entry(settings, "datasets", name) is None:
            registry.register_dataset(settings, name, kind="news", path=info["path"], upload=True,
                                      meta={"format": "mind", "synthetic": True, "poisoned": "poisoned" in name})
    device = default_device()
    store = registry.store(settings)
    for spec in DEMOS:
        if only is not None and spec.name not in only:
            continue
        out_dir = settings.work_dir / "demo-models" / spec.name
        entry = registry.system_entry(settings, "models", spec.name)
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
def _shard_size(request: AttributionsRequest, ctx: JobContext) -> int:
    if request.shard_size != "auto":
        return int(request.shard_size)
    cost = request.n_steps * (2 if request.compare_with else 1)
    return auto_shard_size(ctx, "attributions", request.model, cost, DEFAULT_SAMPLE_STEPS_PER_S)


def _fan_out(request: AttributionsRequest, ctx: JobContext, n: int, shard_size: int) -> Planned:
    inline = next((name for name in ("texts", "inputs", "samples") if getattr(request, name) is not None), None)

    def shard_items(carried: dict[str, Any], start: int, end: int) -> tuple[dict[str, Any], int, int]:
        if inline is None:
            return carried, start, end
        return {**carried, inline: carried[inline][start:end]}, 0, end - start  # a shard carries its own

    return fan_out(ctx, "attributions", request, n, shard_size, retries=request.shard_retries,
                   max_failed_fraction=request.max_failed_fraction, shard_items=shard_items)


def run_shard(shard: ShardRequest[AttributionsRequest], ctx: JobContext) -> dict[str, Any]:
    """Attribute samples ``[start, end)`` of the parent's request; write ``samples.jsonl`` (and ``compare.jsonl``)
    and return the part's summary (``models.news.report.part_summary``), stored as ``done.json``."""
    request = shard.request

    def work() -> dict[str, Any]:
        loaded = ctx.model(request.model)
        samples = _inputs(request, ctx, loaded)[shard.start:shard.end]
        t0 = time.perf_counter()
        report, report_b = _attribute(ctx, request, loaded, samples, whole=False)
        write_jsonl(ctx.artifact_path("samples.jsonl"), report["samples"])
        if report_b is not None:
            write_jsonl(ctx.artifact_path("compare.jsonl"), report_b["samples"])
        done = _part(len(samples), report, report_b, samples, _classifier(loaded))
        # the rate is of sample-steps: the faithfulness numbers' time (no steps) is left out of it
        passes = 2 if report_b is not None else 1
        record_rate(ctx, "attributions", request.model, len(samples) * request.n_steps * passes,
                    time.perf_counter() - t0 - done["faithfulness_seconds"])
        return done

    return run_shard_once(ctx, work)


def run_reduce(reduce: ReduceRequest[AttributionsRequest], ctx: JobContext) -> AttributionResult:
    """Feed the shards to the result's builder in sample order; the parent's artifacts are the builder's."""
    from models.news.report import AttributionReport

    parent, request = reduce.parent, reduce.request
    compare = request.compare_with is not None
    store = get_store(ctx.settings)
    out_dir = ctx.settings.work_dir / f"{ctx.job_id}-merged"
    failed: list[int] = []
    n_total = 0
    try:
        with AttributionReport(out_dir, _report_options(request), _record) as out:
            for i in range(reduce.shards):
                ctx.progress(i, reduce.shards, "shards", message=f"merging shard {i + 1}/{reduce.shards}")
                done = shard_done(ctx, parent, i)
                if done is None:
                    failed.append(i)
                    continue
                n_total += done["n"]
                out.part(done, shard_records(ctx, parent, i, "samples.jsonl"),
                         shard_records(ctx, parent, i, "compare.jsonl") if compare else ())
            if failed:  # name every sample of a shard that failed for good
                ids = _parent_sample_ids(request, ctx)
                ranges = (ctx.job.connection and parent_ranges(ctx, parent)) or []
                for i in failed:
                    start, end = ranges[i] if i < len(ranges) else (0, 0)
                    n_total += end - start
                    out.errors([{"id": sid, "error": f"shard {i} failed"} for sid in ids[start:end]])
            fraction = failed_fraction(out.n_errors, n_total)
            limit = request.max_failed_fraction
            if n_total and fraction > limit:
                raise JobError("too_many_failures", f"{out.n_errors} of {n_total} samples failed ({fraction:.1%} > "
                               f"max_failed_fraction {limit:.1%}); first: {out.main.errors_inline[:3]}")
            result = out.finish(shards={"total": reduce.shards, "failed": failed})
        store.sync_dir(out_dir, artifacts_key(parent))
        result["artifacts"] = store.list_files(artifacts_key(parent))
        return AttributionResult.model_validate(result)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def _parent_sample_ids(request: AttributionsRequest, ctx: JobContext) -> list[str]:
    """The parent's samples' (or texts') ids in order (for naming the samples of a failed shard)."""
    if request.texts is not None:
        return [t.id for t in request.texts]
    if request.inputs is not None:
        return [t.id for t in request.inputs]
    if request.samples is not None:
        return [s.id for s in request.samples]
    try:
        return [s.id for s in _samples(request, ctx, with_bodies=False)]
    except JobError:
        return []
