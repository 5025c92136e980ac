"""Worker side of ``POST /train/conve`` and the ``conve-nations-demo`` demo model."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from app import registry
from app.kinds.train_conve import resolve_dataset
from app.settings import Settings
from workers.context import JobContext, JobError

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
                        progress: Any = None, show_progress: bool = False, register: Any = None) -> dict:
    from models.kg.train import TrainConfig, train_conve
    from models.kg.triples import TriplesFormatError, load_nations, load_triples_dir

    path = resolve_dataset(settings, dataset)
    try:
        ds = load_nations() if path is None else load_triples_dir(path, dataset)
    except (TriplesFormatError, FileNotFoundError) as exc:
        raise JobError("bad_dataset", str(exc)) from None
    cfg = TrainConfig(**{k: params[k] for k in TRAIN_FIELDS if k in params})
    final = settings.home / "models" / name
    staging = settings.home / "models" / f".{name}.staging-{int(time.time() * 1000)}"
    try:
        summary = train_conve(ds, cfg, staging, device=device, progress=progress, show_progress=show_progress)
        # swap in atomically-ish: the old directory (same name, overwrite=true) goes away only after success
        old = None
        if final.exists():
            old = final.with_name(f".{name}.old-{int(time.time() * 1000)}")
            final.rename(old)
        staging.rename(final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    meta = {"dataset": ds.name, "entities": len(ds.entities), "relations": len(ds.relations),
            "train_triples": len(ds.train), "metrics": summary["metrics"], "checkpoints": summary["checkpoints"],
            "training": {k: getattr(cfg, k) for k in TRAIN_FIELDS}}
    entry = dict(kind="conve", loader=LOADER, path=final, parameters=summary["parameters"], meta=meta)
    (register or (lambda n, **e: registry.register_model(settings, n, **e)))(name, **entry)
    return {"model": name, "path": str(final), **summary}


def run(payload: dict, ctx: JobContext) -> dict:
    """Train, checkpoint every ``checkpoint_every`` epochs, evaluate (filtered MRR, Hits@1/3/10), register."""

    def progress(done: int, total: int, message: str, metrics: dict | None) -> None:
        ctx.progress(done, total, "batches", message=message, metrics=metrics)

    try:
        return _train_and_register(ctx.settings, payload["name"], payload["dataset"], payload, ctx.device,
                                   progress=progress, register=ctx.register_model)
    except ValueError as exc:
        raise JobError("invalid_request", str(exc)) from None


def prepare_demo(settings: Settings, progress: bool = True) -> None:
    """Train and register ``conve-nations-demo`` unless it is already registered with its files present."""
    entry = registry.get_model(settings, DEMO_NAME)
    if entry is not None and (registry.absolute_path(settings, entry) / "config.json").is_file():
        return
    from models.common import default_device

    dataset_dir = settings.data_roots[0] / "nations"
    if registry.get_dataset(settings, "nations") is None:
        from models.kg.triples import nations_dir

        dataset_dir.mkdir(parents=True, exist_ok=True)
        for f in nations_dir().iterdir():
            shutil.copy2(f, dataset_dir / f.name)
        registry.register_dataset(settings, "nations", kind="triples", path=Path(dataset_dir),
                                  meta={"source": "pykeen 1.11.1 wheel, see SOURCE.md"})
    import torch

    device = default_device()
    threads = torch.get_num_threads()
    if device.type == "cpu":
        # This model's ops are small: on the 2-core development machine, shared with other processes, two
        # OpenMP threads spent about 10x the CPU time of one (64 s against 6 s).
        torch.set_num_threads(1)
    try:
        _train_and_register(settings, DEMO_NAME, "nations", DEMO_CONFIG, device, show_progress=progress)
    finally:
        torch.set_num_threads(threads)
