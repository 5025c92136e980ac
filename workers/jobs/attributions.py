"""Worker side of ``POST /attributions`` and the news demo models."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from workers.context import JobContext, JobError

NPZ_MIN_SAMPLES = 32  # runs with at least this many samples also write an npz artifact


def _clean(obj: Any) -> Any:
    """JSON-safe: non-finite floats become None (RQ's JSON serializer would write NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def _samples(payload: dict[str, Any], ctx: JobContext, with_bodies: bool) -> list:
    from app import registry
    from models.news.data import Sample, load_samples

    if payload.get("samples") is not None:
        return [Sample(id=s["id"], history=list(s["history"]), candidate=s["candidate"], label=s.get("label"),
                       candidate_body=s.get("candidate_body")) for s in payload["samples"]]
    ds = payload["dataset"]
    entry = registry.get_dataset(ctx.settings, ds["name"])
    if entry is None:
        raise JobError("unknown_dataset", f"dataset {ds['name']!r} is not registered on this server")
    root = registry.absolute_path(ctx.settings, entry)
    try:
        return load_samples(root, ds["split"], ds["n_samples"], ds["balanced"], ds["seed"], with_bodies,
                            payload.get("max_history", 50))
    except (FileNotFoundError, ValueError) as exc:
        raise JobError("bad_dataset", f"dataset {ds['name']!r}: {exc}") from exc


def run(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    from models.common import NonFiniteError
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
    except NonFiniteError as exc:
        raise JobError("non_finite_scores", str(exc)) from exc
    except AttributionError as exc:
        raise JobError("attribution_failed", str(exc)) from exc
    if not report["samples"]:
        detail = "; ".join(f"{e['id']}: {e['error']}" for e in report["errors"][:10])
        raise JobError("all_samples_failed", f"no sample could be attributed ({detail})")
    report["model"] = payload["model"]
    if compare:
        other = ctx.model(compare)
        try:
            report_b = explain(other.model, samples, opts, progress_for(1))
        except NonFiniteError as exc:
            raise JobError("non_finite_scores", f"compare_with {compare!r}: {exc}") from exc
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

    data_root = settings.home / "data"
    for name, info in make_datasets(data_root).items():
        if registry.get_dataset(settings, name) is None:
            registry.register_dataset(settings, name, kind="news", path=info["path"],
                                      meta={"format": "mind", "synthetic": True, "poisoned": "poisoned" in name})
    device = default_device()
    for spec in DEMOS:
        out_dir = settings.home / "models" / spec.name
        entry = registry.get_model(settings, spec.name)
        if entry is not None and (registry.absolute_path(settings, entry) / "config.json").exists():
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
                                path=out_dir, parameters=params,
                                meta={"architecture": spec.config["kind"], "encoder": spec.config.get("encoder"),
                                      "dataset": spec.dataset, "valid_auc": metrics["valid"]["auc"]})
