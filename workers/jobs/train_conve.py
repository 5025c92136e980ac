"""Worker side of ``POST /train/conve`` and the ``conve-nations-demo`` demo model."""

from __future__ import annotations

import math
import shutil
import uuid
from typing import Any

from core import registry
from core.kinds.base import FieldError
from core.kinds.train_conve import resolve_dataset
from core.settings import Settings
from core.userfiles import UserFileError, files_for
from models.curves import StepCurve
from workers.context import JobContext, JobError
from workers.live import LiveMetrics

LOADER = "models.kg.checkpoint:load"
DEMO_NAME = "conve-nations-demo"
# ConvE with 100-dim embeddings (10x10 images, 32 filters, 474k parameters), 10 epochs, a checkpoint every 2:
# about 6 s of CPU time (test MRR about 0.63). The paper's 200-dim set-up (2.1M parameters) costs 4x more, too
# slow for a first start on a small CPU; train it with POST /train/conve.
DEMO_CONFIG: dict[str, Any] = {"epochs": 10, "batch_size": 128, "lr": 0.01, "embedding_dim": 100,
                               "checkpoint_every": 2, "seed": 0}

TRAIN_FIELDS = ("epochs", "batch_size", "lr", "lr_decay", "weight_decay", "label_smoothing", "embedding_dim",
                "embedding_height", "num_filters", "input_dropout", "feature_dropout", "hidden_dropout",
                "reciprocal", "checkpoint_every", "seed")


def _train_and_register(settings: Settings, name: str, dataset: str, params: dict[str, Any], device: Any,
                        progress: Any = None, show_progress: bool = False, register: Any = None,
                        preload: bool = False, owner: str = registry.SYSTEM, curve_for: Any = None) -> dict:
    from models.kg.train import TrainConfig, train_conve
    from models.kg.triples import TriplesFormatError, load_nations, load_triples_dir

    try:
        path = resolve_dataset(settings, dataset, owner)
        ds = load_nations() if path is None else load_triples_dir(path, dataset, files_for(settings, path))
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
                "train_triples": len(ds.train), "metrics": summary["metrics"],
                "checkpoints": summary["checkpoints"], "training": {k: getattr(cfg, k) for k in TRAIN_FIELDS}}
        entry = dict(kind="conve", loader=LOADER, path=staging, parameters=summary["parameters"], meta=meta,
                     preload=preload)
        (register or (lambda n, **e: registry.register_model(settings, n, **e)))(name, **entry)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"model": name, **summary}


def run(payload: dict, ctx: JobContext) -> dict:
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
        return _train_and_register(ctx.settings, payload["name"], payload["dataset"], payload, ctx.device,
                                   progress=progress, register=ctx.register_model, owner=ctx.owner,
                                   curve_for=lambda n: curve.setdefault("c", StepCurve(n)))
    except ValueError as exc:
        raise JobError("invalid_request", str(exc)) from None


DEMO_COST_S = 15.0  # estimated seconds on 2 free cores (one torch thread; 24 to 33 s measured at load average 14)


def demo_steps() -> list[Any]:
    from workers.demo import DemoStep

    return [DemoStep(DEMO_NAME, prepare_demo, models=(DEMO_NAME,), datasets=("nations",),
                     kinds=("tracin", "train_conve"), explains=True, cost_s=DEMO_COST_S)]


def prepare_demo(settings: Settings, progress: bool = True) -> None:
    """Train and register ``conve-nations-demo`` unless it is already registered with its files present."""
    entry = registry.get_model(settings, DEMO_NAME)
    if entry is not None and registry.store(settings).exists(f"{entry['location']}/config.json"):
        return
    from models.common import default_device

    if registry.get_dataset(settings, "nations") is None:
        from models.kg.triples import nations_dir

        registry.register_dataset(settings, "nations", kind="triples", path=nations_dir(), upload=True,
                                  meta={"source": "pykeen 1.11.1 wheel, see SOURCE.md"})
    import torch

    device = default_device()
    threads = torch.get_num_threads()
    if device.type == "cpu":
        # This model's ops are small: on the 2-core development machine, shared with other processes, two
        # OpenMP threads spent about 10x the CPU time of one (64 s against 6 s).
        torch.set_num_threads(1)
    try:
        _train_and_register(settings, DEMO_NAME, "nations", DEMO_CONFIG, device, show_progress=progress,
                            preload=True)
    finally:
        torch.set_num_threads(threads)
