"""Worker side of ``POST /attributions`` and the news demo models."""

from __future__ import annotations

import shutil
from typing import Any

import numpy as np

from workers.context import JobContext, JobError
from workers.context import json_safe as _clean

NPZ_MIN_SAMPLES = 32  # runs with at least this many samples also write an npz artifact


def _samples(payload: dict[str, Any], ctx: JobContext, with_bodies: bool) -> list:
    from app import registry
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
                            payload.get("max_history", 50))
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


def run(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    from models.news.attribution import (
        AttributionError,
        IGOptions,
        compare_reports,
        explain,
        samples_to_arrays,
    )

    bundle = ctx.model(payload["model"])
    model = bundle.model
    samples = _samples(payload, ctx, with_bodies="body" in model.views)
    if not samples:
        raise JobError("no_samples", "the request selected no samples")
    opts = IGOptions(
        n_steps=payload["n_steps"], method=payload["method"], tolerance=payload.get("tolerance"),
        alpha_batch_size=payload["alpha_batch_size"], batch_size=payload["batch_size"],
        precision=payload["precision"], baseline=payload["baseline"], top_k=payload["top_k"],
        optimized=payload["optimized"], max_history=payload.get("max_history", 50),
    )
    compare = payload.get("compare_with")
    passes = 2 if compare else 1

    def progress_for(k: int):
        def progress(done: int, total: int, message: str) -> None:
            ctx.progress(k * total + done, passes * total, "samples", message=message)
        return progress

    try:
        report = explain(model, samples, opts, progress_for(0))
    except AttributionError as exc:
        raise JobError("attribution_failed", str(exc)) from exc
    if not report["samples"]:
        detail = "; ".join(f"{e['id']}: {e['error']}" for e in report["errors"][:10])
        raise JobError("all_samples_failed", f"no sample could be attributed ({detail})")
    report["model"] = payload["model"]
    report["warnings"] = input_warnings(samples, model.views)
    if compare:
        other = ctx.model(compare)
        try:
            report_b = explain(other.model, samples, opts, progress_for(1))
        except AttributionError as exc:
            raise JobError("attribution_failed", f"compare_with {compare!r}: {exc}") from exc
        report["comparison"] = {
            "model": compare,
            **compare_reports(report, report_b, payload["compare_threshold"]),
            "summary": report_b["summary"],
            "errors": report_b["errors"],
            "word_stats": report_b["word_stats"],
        }
    if len(report["samples"]) >= NPZ_MIN_SAMPLES:
        np.savez_compressed(ctx.artifact_path("attributions.npz"), **samples_to_arrays(report))
    report["artifacts"] = ctx.artifacts()
    return _clean(report)


def prepare_demo(settings: Any, progress: bool = True) -> None:
    """Generate the synthetic datasets and train the demo models (idempotent: existing ones are kept)."""
    from tqdm.auto import tqdm

    from app import registry
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
        print(f"{spec.name}: validation AUC {metrics['valid']['auc']:.3f} (impression AUC "
              f"{metrics['valid']['imp_auc']:.3f}) in {metrics['train_seconds']}s", flush=True)
        from models.news.checkpoint import load

        params = load(out_dir, "cpu").parameters
        registry.register_model(settings, spec.name, kind="news", loader="models.news.checkpoint:load",
                                path=out_dir, parameters=params, preload=True,
                                meta={"architecture": spec.config["kind"], "encoder": spec.config.get("encoder"),
                                      "dataset": spec.dataset, "valid_auc": metrics["valid"]["auc"]})
        shutil.rmtree(out_dir, ignore_errors=True)
