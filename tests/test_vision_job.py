"""The ``train/bdh`` job function with a stand-in context: restarts that find the job's own checkpoint in the
store (as on another host)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from core.artifacts import artifacts_key
from core.filestore import get_store
from core.kinds.train_bdh import TrainBDHRequest
from core.settings import Settings
from workers.jobs import train_bdh

TINY_MODEL = {"n_layer": 1, "n_embd": 16, "n_head": 2, "mlp_multiplier": 2, "dropout": 0.0}
PAYLOAD = {"dataset": "digits", "epochs": 2, "batch_size": 32, "grad_accum_steps": 1, "lr": 3e-3,
           "weight_decay": 0.05, "warmup_steps": 2, "model": TINY_MODEL, "compile": "off", "precision": "fp32",
           "deterministic": True, "seed": 3, "val_fraction": 0.1, "max_train_samples": 96}
REQUEST = TrainBDHRequest.model_validate(PAYLOAD)  # what the runner hands the job function


class FakeContext:
    """What the job function uses of ``workers.context.JobContext``; models are recorded, not registered."""

    def __init__(self, settings: Settings, job_id: str, artifacts_dir: Path) -> None:
        self.settings, self.job_id, self.owner = settings, job_id, "alice"
        self.artifacts_dir = artifacts_dir
        self.device = torch.device("cpu")
        self.registered: list[tuple[str, dict[str, Any]]] = []

    def progress(self, *args: Any, **kwargs: Any) -> None:
        pass

    def publish_artifacts(self, subdir: str | None = None) -> None:
        local = self.artifacts_dir / subdir if subdir else self.artifacts_dir
        key = artifacts_key(self.job_id, subdir) if subdir else artifacts_key(self.job_id)
        get_store(self.settings).sync_dir(local, key, {})

    def register_model(self, name: str, **entry: Any) -> dict[str, Any]:
        assert (Path(entry["path"]) / "model.safetensors").is_file()
        self.registered.append((name, entry))
        return {}

    def artifacts(self) -> list[str]:
        return []


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(EXPLAINQ_HOME=str(tmp_path / "home"))


def test_a_job_restarted_on_another_host_after_its_last_epoch_registers_and_succeeds(
    settings: Settings, tmp_path: Path
) -> None:
    first_ctx = FakeContext(settings, "job-1", tmp_path / "host1")
    first = train_bdh.run(REQUEST, first_ctx)
    # the worker stopped after the last epoch's checkpoint reached the store, before the job was finished
    first_ctx.publish_artifacts("checkpoints/last")
    again_ctx = FakeContext(settings, "job-1", tmp_path / "host2")
    again = train_bdh.run(REQUEST, again_ctx)
    assert again.epochs_completed == 2 and again.history == first.history
    assert again.test_accuracy is not None and [n for n, _ in again_ctx.registered] == ["bdh-digits-job-1"]
    assert again.changed_on_resume == {} and again.model_name == "bdh-digits-job-1"


def test_best_is_published_with_last(settings: Settings, tmp_path: Path) -> None:
    ctx = FakeContext(settings, "job-2", tmp_path / "host1")
    train_bdh.run(REQUEST.model_copy(update={"epochs": 3}), ctx)
    store = get_store(settings)
    assert store.exists(f"{artifacts_key('job-2', 'checkpoints', 'best')}/model.safetensors")
