"""``POST /train/bdh`` end to end through a real worker: validation, training, metrics, cancel, resume, CIFAR."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.service import ROOT, Service
from tests.test_vision_data import write_cifar_dir

TINY_MODEL = {"n_layer": 1, "n_embd": 16, "n_head": 2, "mlp_multiplier": 2, "dropout": 0.0}


def body(**overrides) -> dict:
    base = {"dataset": "digits", "epochs": 2, "batch_size": 32, "lr": 3e-3, "warmup_steps": 2, "model": TINY_MODEL,
            "max_train_samples": 128, "precision": "fp32", "deterministic": True, "seed": 3}
    return {**base, **overrides}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("bdh-home")
    write_cifar_dir(home / "data", "cifar10", per_batch=16)
    with Service(home, env={"OMP_NUM_THREADS": "1"}) as svc:
        yield svc


def test_kind_module_does_not_import_torch() -> None:
    code = "import sys, core.kinds.train_bdh; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


@pytest.mark.parametrize(
    ("overrides", "loc"),
    [
        ({"dataset": "imagenet"}, ["body", "dataset"]),
        ({"dataset": "cifar10", "data_dir": "/etc"}, ["body", "data_dir"]),
        ({"dataset": "cifar10", "data_dir": "../../.."}, ["body", "data_dir"]),
        ({"dataset": "cifar100"}, ["body", "data_dir"]),  # not extracted under the data root
        ({"data_dir": "cifar-10-batches-py"}, ["body", "data_dir"]),  # digits takes no directory
        ({"epochs": 0}, ["body", "epochs"]),
        ({"epochs": -3}, ["body", "epochs"]),
        ({"model": {**TINY_MODEL, "n_embd": 30, "n_head": 4}}, ["body", "model", "n_head"]),
        ({"resume_from": "../../etc"}, ["body", "resume_from"]),
        ({"precision": "fp8"}, ["body", "precision"]),
        ({"compile": "fast"}, ["body", "compile"]),
        ({"bogus": 1}, ["body", "bogus"]),
    ],
)
def test_bad_requests_give_422_naming_the_field(service: Service, overrides: dict, loc: list) -> None:
    r = service.client.post("/train/bdh", json=body(**overrides))
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == loc
    if loc == ["body", "model", "n_head"]:
        assert "divisible" in r.json()["detail"][0]["msg"]
    if overrides.get("dataset") == "cifar100":
        assert "cifar-100-python/train" in r.json()["detail"][0]["msg"]


def test_train_digits_end_to_end(service: Service) -> None:
    r = service.client.post("/train/bdh", json=body())
    assert r.status_code == 202 and r.headers["Location"].startswith("/jobs/")
    job = service.wait(r.json()["id"], timeout_s=300)
    assert job["status"] == "succeeded", job
    assert job["progress"]["unit"] == "epochs" and job["progress"]["done"] == 2
    assert [row["epoch"] for row in job["metrics"]["history"]] == [1, 2]
    result = service.client.get(f"/jobs/{job['id']}/result").json()
    result = result.get("result", result)
    assert len(result["history"]) == 2 and result["best_epoch"] in (1, 2)
    assert 0.0 <= result["test_accuracy"] <= 1.0 and result["best_val_accuracy"] > 0.1
    assert result["parameters"] == result["expected_parameters"]
    names = {a["name"] for a in result["artifacts"]}
    assert {"metrics.csv", "checkpoints/best/model.safetensors", "checkpoints/last/trainer_state.pt"} <= names
    rows = list(csv.DictReader(io.StringIO(service.artifact(job["id"], "metrics.csv").decode())))
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    model = service.client.get(f"/models/{result['model_name']}")
    if model.status_code == 200:  # the registry route shows what the job registered
        assert model.json().get("kind", "vision_bdh") == "vision_bdh"
    from core import registry

    assert registry.get_model(service.settings, result["model_name"])["loader"] == "models.vision.checkpoint:load"


def test_resume_from_an_unknown_job_is_404_naming_the_field(service: Service) -> None:
    r = service.client.post("/train/bdh", json=body(resume_from="no-such-job"))
    assert r.status_code == 404, r.text
    assert r.json()["detail"]["loc"] == ["body", "resume_from"]


def test_cancel_keeps_the_last_checkpoint_and_resume_continues(service: Service) -> None:
    r = service.client.post("/train/bdh", json=body(epochs=400, max_train_samples=64))
    job_id = r.json()["id"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait for two finished epochs (history is in the job's metrics)
        view = service.client.get(f"/jobs/{job_id}").json()
        if view["status"] in ("failed", "succeeded"):
            pytest.fail(f"job ended before cancel: {view}")
        if len((view.get("metrics") or {}).get("history") or []) >= 2:
            break
        time.sleep(0.1)
    else:
        pytest.fail("no epoch finished in time")
    assert view["progress"]["unit"] == "batches" and view["progress"]["total"] == 400 * 2
    assert service.client.delete(f"/jobs/{job_id}").status_code == 202
    canceled = service.wait(job_id, timeout_s=60)
    assert canceled["status"] == "canceled", canceled
    assert canceled["progress"]["done"] < 400 * 2
    listed = {a["name"] for a in service.client.get(f"/jobs/{job_id}/artifacts").json()["items"]}
    assert "checkpoints/last/trainer_state.pt" in listed
    first_rows = list(csv.DictReader(io.StringIO(service.artifact(job_id, "metrics.csv").decode())))
    done_epochs = len(first_rows)
    assert done_epochs >= 2

    r = service.client.post("/train/bdh", json=body(epochs=done_epochs + 1, max_train_samples=64,
                                                     resume_from=job_id))
    assert r.status_code == 202, r.text
    resumed = service.wait(r.json()["id"], timeout_s=120)
    assert resumed["status"] == "succeeded", resumed
    result = service.client.get(f"/jobs/{resumed['id']}/result").json()
    result = result.get("result", result)
    assert [row["epoch"] for row in result["history"]] == list(range(1, done_epochs + 2))
    assert [float(r["train_loss"]) for r in first_rows] == [row["train_loss"] for row in result["history"][:-1]]


def test_cifar10_from_the_data_root(service: Service, tmp_path: Path) -> None:
    r = service.client.post("/train/bdh", json=body(dataset="cifar10", epochs=1, max_train_samples=48))
    assert r.status_code == 202, r.text
    job = service.wait(r.json()["id"], timeout_s=120)
    assert job["status"] == "succeeded", job
    result = service.client.get(f"/jobs/{job['id']}/result").json()
    result = result.get("result", result)
    assert result["samples"] == {"train": 48, "val": 8, "test": 16}  # 80 training images, 10% validation
    assert result["model_config"]["num_classes"] == 10


def test_prepare_demo_registers_datasets(service: Service) -> None:
    from core import registry
    from workers.jobs.train_bdh import prepare_demo

    prepare_demo(service.settings, progress=False)
    prepare_demo(service.settings, progress=False)  # idempotent
    assert registry.get_dataset(service.settings, "digits")["meta"]["classes"] == 10
    assert registry.get_dataset(service.settings, "cifar10") is not None
    assert registry.get_dataset(service.settings, "cifar100") is None
