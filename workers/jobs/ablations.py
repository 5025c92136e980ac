"""Worker side of ``POST /ablations``: run the LoRA ablation, report progress per (layer set,
representation, run), write ``results.json`` and ``results.txt``; and the demo dataset."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import uuid
from pathlib import Path
from typing import Any

from core import registry
from core.contract.results.ablation import AblationResult
from core.filestore import Store, get_store
from core.kinds.ablations import AblationRequest, resolve_dataset
from core.settings import Settings
from workers.context import JobContext, JobError, user_dataset

log = logging.getLogger("explainq.ablations")

DEMO_NAME = "lora-demo"
# 4 classes x 25 adapters on SD 1.5's 128 attention layers at 1/8 width; the class signal is strong in the
# text (attn2) layers and faint in the visual (attn1) ones, so the demo shows a real all -> visual drop
# (measured with quick=true: test accuracy ~0.95 on all layers, ~0.5 on visual only, chance 0.25).
DEMO_SPEC = {"num_classes": 4, "per_class": 25, "rank": 1, "signal": {"text": 0.6, "visual": 0.02},
             "width_divisor": 8, "naming": "diffusers", "seed": 2026}


class StoreFeatureTier:
    """The feature cache's shared tier: ``cache/features/<key>.safetensors`` in the store."""

    PREFIX = "cache/features"

    def __init__(self, store: Store):
        self.store = store

    def fetch(self, name: str, local_path: Path) -> bool:
        key = f"{self.PREFIX}/{name}"
        if not self.store.exists(key):
            return False
        tmp = local_path.with_name(f"{local_path.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_bytes(self.store.read_bytes(key))
        tmp.replace(local_path)
        return True

    def put(self, local_path: Path, name: str) -> None:
        try:
            self.store.put_file(local_path, f"{self.PREFIX}/{name}")
        except OSError:  # the local copy still serves this host; another host recomputes
            log.warning("could not copy feature matrix %s to the store", name, exc_info=True)


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    """The job result: mean/std per metric per cell (per-run details stay in results.json)."""
    slim: dict[str, Any] = {}
    for ls, cells in result["results"].items():
        slim[ls] = {}
        for rep, cell in cells.items():
            slim[ls][rep] = {k: v for k, v in cell.items() if k != "runs"}
    return {**{k: v for k, v in result.items() if k != "results"}, "results": slim}


def ablation_config(request: AblationRequest) -> Any:
    """The library's AblationConfig from the request: the fields the two share, ``representations: "all"`` as
    every representation's name."""
    from models.lora.experiment import AblationConfig
    from models.lora.keys import REPRESENTATION_NAMES

    shared = {f.name for f in dataclasses.fields(AblationConfig)} - {"representations"}
    reps = request.representations
    return AblationConfig(**request.model_dump(include=shared),
                          representations=list(REPRESENTATION_NAMES) if reps == "all" else list(reps))


def run(request: AblationRequest, ctx: JobContext) -> AblationResult:
    from models.lora.data import LoraDataset
    from models.lora.experiment import format_table, run_ablation
    from models.lora.keys import DatasetFormatError

    root = user_dataset(ctx, resolve_dataset, request.dataset)
    ctx.progress(0, None, "runs", message="reading the dataset")
    try:
        dataset = LoraDataset(root)
    except DatasetFormatError as exc:
        raise JobError("bad_dataset", str(exc)) from None
    config = ablation_config(request)
    cache_root = ctx.home / "cache"
    try:
        result = run_ablation(
            dataset, config, ctx.device,
            cache_dir=cache_root / "features",
            state_dir=cache_root / "ablations",
            progress=lambda done, total, msg: ctx.progress(done, total, "runs", message=msg),
            on_epoch=lambda epoch, acc: ctx.check_canceled(),
            dataset_name=request.dataset,
            shared_cache=StoreFeatureTier(get_store(ctx.settings)),
        )
    except DatasetFormatError as exc:
        raise JobError("bad_dataset", str(exc)) from None
    except FloatingPointError as exc:
        raise JobError("non_finite_features", str(exc)) from None
    ctx.artifact_path("results.json").write_text(json.dumps(result, indent=1))
    table = format_table(result)
    ctx.artifact_path("results.txt").write_text(table)
    return AblationResult.model_validate({**_summary(result), "table": table, "artifacts": ctx.artifacts()})


def demo_steps() -> list[Any]:
    from workers.demo import DemoStep

    return [DemoStep(DEMO_NAME, prepare_demo, datasets=(DEMO_NAME,), kinds=("ablations",), explains=True,
                     cost_s=3.0)]


def prepare_demo(settings: Settings, progress: bool = True) -> None:
    """Generate (once) and register the small synthetic demo dataset ``lora-demo``."""
    from models.lora.synthetic import generate_dataset

    entry = registry.system_entry(settings, "datasets", DEMO_NAME)
    if entry is not None and entry.get("meta", {}).get("synthetic") == DEMO_SPEC and entry.get("location"):
        return
    root = settings.work_dir / "lora-demo"
    stamp = root / "demo.json"
    spec = json.dumps(DEMO_SPEC, sort_keys=True)
    if not (stamp.is_file() and stamp.read_text() == spec and (root / "labels.csv").is_file()):
        generate_dataset(root, progress=progress, **DEMO_SPEC)
        stamp.write_text(spec)
    registry.register_dataset(
        settings, DEMO_NAME, kind="lora", path=root, upload=True,
        meta={"format": "safetensors_dir", "items": DEMO_SPEC["num_classes"] * DEMO_SPEC["per_class"],
              "classes": DEMO_SPEC["num_classes"], "layers": 128, "synthetic": DEMO_SPEC},
    )
    shutil.rmtree(root, ignore_errors=True)
