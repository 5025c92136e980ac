"""Worker side of ``POST /train/conve`` and the ConvE demo models (``conve-nations-demo``, ``conve-umls-demo``,
``conve-kinships-demo``) on the shipped graphs, which demo preparation also registers as datasets."""

from __future__ import annotations

import logging
import math
import shutil
import uuid
from typing import Any

from core import registry
from core.contract.errors import FieldError
from core.contract.results.training import TrainConvEResult
from core.kinds.train_conve import SHIPPED_COUNTS, TrainConvERequest, resolve_dataset
from core.ownership import owns
from core.settings import Settings
from core.userfiles import UserFileError, files_for
from models.curves import StepCurve
from workers.context import JobContext, JobError
from workers.live import LiveMetrics

log = logging.getLogger("explainq.demo")
LOADER = "models.kg.checkpoint:load"
DEMO_NAME = "conve-nations-demo"
# ConvE with 100-dim embeddings (10x10 images, 32 filters, 474k parameters), 10 epochs, a checkpoint every 2:
# about 6 s of CPU time (test MRR about 0.63). The paper's 200-dim set-up (2.1M parameters) costs 4x more, too
# slow for a first start on a small CPU; train it with POST /train/conve.
DEMO_CONFIG: dict[str, Any] = {"epochs": 10, "batch_size": 128, "lr": 0.01, "embedding_dim": 100,
                               "checkpoint_every": 2, "seed": 0}
# The larger shipped graphs, trained after Nations (demo_models); their measured time and test metrics are in
# docs/tracin.md, "Shipped knowledge graphs".
# Without dropout: on these small graphs it converges in far fewer epochs and costs less per epoch (UMLS, test MRR
# after 20 epochs: 0.87 without dropout, 0.84 with 0.1 everywhere; ConvE's 0.2/0.2/0.3 reached 0.82 after 60).
NO_DROPOUT = {"input_dropout": 0.0, "feature_dropout": 0.0, "hidden_dropout": 0.0}
UMLS_DEMO_CONFIG: dict[str, Any] = {"epochs": 40, "batch_size": 128, "lr": 0.01, "embedding_dim": 100,
                                    **NO_DROPOUT, "checkpoint_every": 10, "seed": 0}
KINSHIPS_DEMO_CONFIG: dict[str, Any] = {"epochs": 50, "batch_size": 128, "lr": 0.01, "embedding_dim": 100,
                                        **NO_DROPOUT, "checkpoint_every": 10, "seed": 0}

TRAIN_FIELDS = ("epochs", "batch_size", "lr", "lr_decay", "weight_decay", "label_smoothing", "embedding_dim",
                "embedding_height", "num_filters", "input_dropout", "feature_dropout", "hidden_dropout",
                "reciprocal", "checkpoint_every", "seed")


def headline(metrics: dict[str, dict[str, float]]) -> dict[str, float]:
    """The test split's filtered MRR and Hits@1/3/10 as flat fields (what the models page lists)."""
    test = metrics.get("test") or {}
    return {f"test_{k}": round(float(test[k]), 4) for k in ("mrr", "hits@1", "hits@3", "hits@10") if k in test}


def published_meta(dataset: str) -> dict[str, Any]:
    """ConvE's published figures on a shipped graph, labelled as published (never this model's measurement)."""
    from models.kg.shipped import CONVE_SOURCE, shipped_graph

    figures = shipped_graph(dataset).published
    return {**{f"published_conve_{k}": v for k, v in figures.items() if k != "mr"}, "published_source": CONVE_SOURCE}


def _train_and_register(settings: Settings, name: str, dataset: str, params: dict[str, Any], device: Any,
                        progress: Any = None, show_progress: bool = False, register: Any = None,
                        preload: bool = False, owner: str = registry.SYSTEM, curve_for: Any = None,
                        published: dict[str, Any] | None = None) -> dict:
    from models.kg.train import TrainConfig, train_conve
    from models.kg.triples import TriplesFormatError, load_shipped, load_triples_dir

    try:
        path = resolve_dataset(settings, dataset, owner)
        ds = load_shipped(dataset) if path is None else load_triples_dir(path, dataset, files_for(settings, path))
    except FieldError as exc:
        raise JobError("bad_dataset", exc.message) from None
    except (TriplesFormatError, FileNotFoundError, UserFileError) as exc:
        raise JobError("bad_dataset", str(exc)) from None
    except UnicodeDecodeError:
        raise JobError("bad_dataset", f"dataset {dataset!r}: a file is not UTF-8 text") from None
    cfg = TrainConfig(**{k: params[k] for k in TRAIN_FIELDS if k in params})
    # the per-step curve the caller reads live (curve_for(steps per epoch)), or the library's own
    curve = curve_for(math.ceil(len(ds.train) / cfg.batch_size)) if curve_for is not None else None
    # Train into local scratch; registering uploads it into the store as a new version, so a model replaced
    # with overwrite=true changes no file that a worker may be reading.
    staging = settings.work_dir / f"conve-{name}-{uuid.uuid4().hex[:12]}"
    try:
        summary = train_conve(ds, cfg, staging, device=device, progress=progress, show_progress=show_progress,
                              curve=curve)
        meta = {"dataset": ds.name, "entities": len(ds.entities), "relations": len(ds.relations),
                "train_triples": len(ds.train), **headline(summary["metrics"]), "metrics": summary["metrics"],
                "checkpoints": summary["checkpoints"], "training": {k: getattr(cfg, k) for k in TRAIN_FIELDS},
                "train_seconds": round(summary["seconds"], 1)}
        if published is not None:
            meta.update(published)
        entry = dict(kind="conve", loader=LOADER, path=staging, parameters=summary["parameters"], meta=meta,
                     preload=preload)
        (register or (lambda n, **e: registry.register_model(settings, n, **e)))(name, **entry)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"model": name, **summary}


def _published_for(settings: Settings, dataset: str, owner: str) -> dict[str, Any] | None:
    """ConvE's published figures when ``dataset`` names a shipped graph as the service holds it (its packaged copy
    or the service's own registration of it), None otherwise (another dataset of the same name is not that graph)."""
    if dataset not in SHIPPED_COUNTS:
        return None
    entry = registry.get_dataset(settings, dataset)
    if entry is not None and not owns(entry, registry.SYSTEM):
        return None
    return published_meta(dataset)


def run(request: TrainConvERequest, ctx: JobContext) -> TrainConvEResult:
    """Train, checkpoint every ``checkpoint_every`` epochs, evaluate (filtered MRR, Hits@1/3/10), register.

    Live metrics: the history so far and the per-step running loss (``steps``), at most every
    ``METRICS_INTERVAL_S`` and at every epoch's end."""
    live = LiveMetrics(ctx)
    history: list[dict] = []
    curve: dict[str, StepCurve] = {}

    def progress(done: int, total: int, message: str, metrics: dict | None) -> None:
        if metrics is not None:
            history.append(metrics)
        sent = live.metrics(history, curve.get("c"), force=metrics is not None,
                            **({"epoch": metrics["epoch"]} if metrics else {}))
        ctx.progress(done, total, "batches", message=message, metrics=sent)

    try:
        out = _train_and_register(ctx.settings, request.name, request.dataset,
                                  request.model_dump(include=set(TRAIN_FIELDS)), ctx.device,
                                  progress=progress, register=ctx.register_model, owner=ctx.owner,
                                  curve_for=lambda n: curve.setdefault("c", StepCurve(n)),
                                  published=_published_for(ctx.settings, request.dataset, ctx.owner))
    except ValueError as exc:
        raise JobError("invalid_request", str(exc)) from None
    return TrainConvEResult.model_validate(out)


def demo_models() -> list[tuple[str, str, dict[str, Any]]]:
    """(model name, shipped dataset, training configuration) of the ConvE demos, in the order they are prepared:
    Nations first (seconds, preloaded), then the larger graphs (32 s and 59 s measured on a quiet 2-core
    machine)."""
    return [(DEMO_NAME, "nations", DEMO_CONFIG), ("conve-umls-demo", "umls", UMLS_DEMO_CONFIG),
            ("conve-kinships-demo", "kinships", KINSHIPS_DEMO_CONFIG)]


def register_shipped_dataset(settings: Settings, name: str) -> None:
    """Register the shipped graph ``name`` (copied into the store) unless the service registered it already; its
    files are checked against their SHA-256 first, and its counts recorded as ``POST /datasets`` records them.
    Another owner's registration of the name (from before it was reserved) fails, naming them."""
    if registry.system_entry(settings, "datasets", name) is not None:
        return
    from models.kg.shipped import CONVE_SOURCE, shipped_graph, verify_shipped

    graph = shipped_graph(name)
    counts = {f"{s}_triples": n for s, n in graph.splits.items()}
    counts.update(entities=graph.entities, relations=graph.relations)
    registry.register_dataset(settings, name, kind="triples", path=verify_shipped(name), upload=True,
                              meta={"format": "triples", "counts": counts, "title": graph.title,
                                    "source": "pykeen 1.11.1 wheel, see SOURCE.md", "citation": graph.citation,
                                    **{f"published_conve_{k}": v for k, v in graph.published.items() if k != "mr"},
                                    "published_source": CONVE_SOURCE})


# estimated seconds on 2 free cores (one torch thread): Nations 5 s measured quiet (24 to 33 s at load average 14),
# UMLS 32 s, Kinships 59 s (benchmarks/kg_datasets.py)
DEMO_COST_S = {"nations": 15.0, "umls": 35.0, "kinships": 60.0}


def demo_steps() -> list[Any]:
    """One step per ConvE demo: Nations first (it makes TracIn usable), then the larger graphs in the background."""
    from workers.demo import DemoStep

    def step(model_name: str, dataset: str, config: dict[str, Any]) -> Any:
        def run(settings: Settings, progress: bool = True) -> None:
            prepare_one(settings, model_name, dataset, config, progress)
        return DemoStep(model_name, run, models=(model_name,), datasets=(dataset,),
                        kinds=("tracin", "train_conve"), explains=True, cost_s=DEMO_COST_S[dataset])

    return [step(*d) for d in demo_models()]


def prepare_one(settings: Settings, model_name: str, dataset: str, config: dict[str, Any],
                progress: bool = True) -> None:
    """Register the shipped graph ``dataset`` and train and register ``model_name`` on it unless it is already
    registered with its files present. Both names are reserved; another owner's registration of either (from
    before they were) fails the step, naming them, rather than skipping the demo or training on their data."""
    from models.common import default_device

    register_shipped_dataset(settings, dataset)
    published = published_meta(dataset)
    entry = registry.system_entry(settings, "models", model_name)
    if entry is not None and registry.store(settings).exists(f"{entry['location']}/config.json"):
        return
    import torch

    device = default_device()
    threads = torch.get_num_threads()
    if device.type == "cpu":
        # This model's ops are small: on the 2-core development machine, shared with other processes, two
        # OpenMP threads spent about 10x the CPU time of one (64 s against 6 s).
        torch.set_num_threads(1)
    try:
        _train_and_register(settings, model_name, dataset, config, device, show_progress=progress,
                            preload=model_name == DEMO_NAME, published=published)
    finally:
        torch.set_num_threads(threads)


def prepare_demo(settings: Settings, progress: bool = True) -> None:
    """Every ConvE demo in turn (:func:`demo_steps`' order). Every demo is attempted; a failure is raised after the
    others are done."""
    failures: list[str] = []
    for model_name, dataset, config in demo_models():
        try:
            prepare_one(settings, model_name, dataset, config, progress)
        except Exception as exc:  # the next demo still gets its chance; the step fails at the end
            log.exception("demo model %s failed", model_name)
            failures.append(f"{model_name}: {exc}")
    if failures:
        raise RuntimeError("ConvE demo models failed: " + "; ".join(failures))
