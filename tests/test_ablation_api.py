"""POST /ablations end to end through a real worker, and the 422s."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from safetensors.torch import save_file

from models.lora.synthetic import generate_dataset
from tests.service import ROOT, Service

TINY = dict(num_classes=3, per_class=10, width_divisor=32, max_blocks=2, strength=0.8)
FAST = {"representations": ["simple_stats", "spectral_delta"], "quick": True, "max_epochs": 8,
        "hidden_dim": 32, "batch_size": 64}


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    data = home / "data"
    generate_dataset(data / "tiny", signal=("visual",), seed=1, **TINY)
    generate_dataset(data / "one-class", num_classes=1, per_class=4, width_divisor=32, max_blocks=1)
    nolabels = generate_dataset(data / "nolabels", seed=2, **TINY)
    (nolabels / "labels.csv").unlink()
    visual_only = data / "visual-only"
    visual_only.mkdir(parents=True)
    import torch

    for i in range(6):
        save_file({"unet.x.attn1.to_q.lora.down.weight": torch.randn(1, 8),
                   "unet.x.attn1.to_q.lora.up.weight": torch.randn(8, 1)}, str(visual_only / f"{i}.safetensors"))
    (visual_only / "labels.csv").write_text("file,label\n" + "".join(f"{i}.safetensors,{i % 2}\n" for i in range(6)))
    with Service(home, env={"OMP_NUM_THREADS": "1"}) as s:
        yield s


def _loc(r) -> list:
    assert r.status_code == 422, r.text
    return r.json()["detail"][0]["loc"]


def test_api_module_does_not_import_torch() -> None:
    code = "import sys, core.kinds.ablations; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_bad_requests_name_the_field(svc: Service) -> None:
    c = svc.client
    assert _loc(c.post("/ablations", json={"dataset": "tiny", "representations": ["spectral", "nope"]})) == [
        "body", "representations"]
    assert _loc(c.post("/ablations", json={"dataset": "nolabels"})) == ["body", "dataset"]
    assert "labels" in c.post("/ablations", json={"dataset": "nolabels"}).json()["detail"][0]["msg"]
    assert _loc(c.post("/ablations", json={"dataset": "one-class"})) == ["body", "dataset"]
    r = c.post("/ablations", json={"dataset": "visual-only", "layer_sets": ["all", "text"]})
    assert _loc(r) == ["body", "layer_sets", 1]
    assert _loc(c.post("/ablations", json={"dataset": "../../etc"})) == ["body", "dataset"]
    assert _loc(c.post("/ablations", json={"dataset": "tiny", "layer_sets": ["audio"]}))[:2] == ["body", "layer_sets"]
    assert _loc(c.post("/ablations", json={"dataset": "tiny", "sample_layers": 0})) == ["body", "sample_layers"]
    assert _loc(c.post("/ablations", json={"dataset": "tiny", "bogus": 1})) == ["body", "bogus"]


def test_ablation_by_path_end_to_end(svc: Service) -> None:
    r = svc.client.post("/ablations", json={"dataset": "tiny", "layer_sets": ["all", "visual", "text"], **FAST})
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=240)
    assert job["status"] == "succeeded", (job, svc.worker_logs())
    assert job["progress"]["done"] == job["progress"]["total"] == 3 * 2 * 3 and job["progress"]["unit"] == "runs"
    res = svc.client.get(f"/jobs/{job['id']}/result").json()
    res = res.get("result", res)
    assert res["num_classes"] == 3 and res["num_layers"] == {"all": 16, "visual": 8, "text": 8}
    cell = res["results"]["visual"]["spectral_delta"]
    assert set(cell["test_acc"]) == {"mean", "std"} and 0 <= cell["test_acc"]["mean"] <= 1
    assert set(res["drop"]) == {"simple_stats", "spectral_delta"}
    names = {a["name"]: a for a in res["artifacts"]}
    assert {"results.json", "results.txt"} <= set(names)
    assert all("path" not in a for a in res["artifacts"])  # results never carry a server path
    full = json.loads(svc.artifact(job["id"], "results.json"))
    assert len(full["results"]["all"]["simple_stats"]["runs"]) == 3
    assert "simple_stats" in svc.artifact(job["id"], "results.txt").decode()
    local = {p.name for p in (svc.home / "cache" / "features").glob("*.safetensors")}
    from core import registry

    shared = {f["name"] for f in registry.store(svc.settings).list_files("cache/features")}
    assert local and local == shared  # every matrix is also in the store for other hosts


def test_demo_dataset_registered_and_runs(svc: Service) -> None:
    from core import registry
    from workers.jobs.ablations import prepare_demo

    prepare_demo(svc.settings, progress=False)
    entry = registry.get_dataset(svc.settings, "lora-demo")
    assert entry["owner"] == "system" and entry["location"].startswith("datasets/lora-demo/")
    prepare_demo(svc.settings, progress=False)  # idempotent: nothing regenerated
    assert registry.get_dataset(svc.settings, "lora-demo") == entry
    body = {"dataset": "lora-demo", **FAST, "representations": ["simple_stats"], "sample_layers": 0.25}
    r = svc.client.post("/ablations", json=body)
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=240)
    assert job["status"] == "succeeded", (job, svc.worker_logs())
    res = svc.client.get(f"/jobs/{job['id']}/result").json()
    res = res.get("result", res)
    assert res["num_layers"] == {"all": 128, "visual": 64, "text": 64}
    # one sample of 32 of the 128 layers; "visual" is its attn1 part, not a second, independent draw
    assert res["layers_used"]["all"] == 32 and 0 < res["layers_used"]["visual"] < 32
    assert res["synthetic"] is True and "SYNTHETIC" in res["table"].splitlines()[0]
