"""Exported classifiers through the service: ``POST /models/import`` with ``kind: "export"`` (the archive and its
spec checked as data at submission, built by the worker's interpreter, registered as ``exported_classifier``),
then ``POST /attributions`` over ``inputs``: a whole and a sharded run give one result, with ``compare_with`` and
faithfulness, rendered by the SDK and the CLI; every request the model cannot take is a 422 naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from core import registry
from core.contract.results.attributions import AttributionResult
from tests.export_fixtures import (
    TABULAR_SPEC,
    edit_program,
    hostile_pickle,
    rewrite,
    save_model_dir,
)
from tests.results_compare import assert_renders, assert_same

IMG, IMG_B, TAB, NOMEAN, NEWS_STUB = "img-cnn", "img-cnn-b", "tab-net", "tab-nomean", "news-stub"
PER_RUN = {"seconds", "seconds_prepare", "batch_size", "alpha_batch_size", "cpu_seconds", "attribution_seconds",
           "time_ratio"}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("export-svc")
    data = base / "home" / "data"
    marker = base / "outside" / "code-ran"
    marker.parent.mkdir(parents=True)
    out: dict[str, Path] = {"home": base / "home", "data": data, "marker": marker}
    out["image"], model = save_model_dir(data / "image", "image", seed=0)
    out["image_b"], _ = save_model_dir(data / "image-b", "image", seed=1)
    out["tabular"], _ = save_model_dir(data / "tabular", "tabular", seed=0)
    nomean = {**TABULAR_SPEC, "input": {k: v for k, v in TABULAR_SPEC["input"].items() if k != "mean"}}
    out["nomean"], _ = save_model_dir(data / "nomean", "tabular", seed=2, spec=nomean)
    torch.save(model.state_dict(), data / "image" / "eager.pt")  # the oracle's weights (never read by the service)
    src = out["image"] / "model.pt2"
    for case, change in {
        "pickled": lambda f: {**f, **_pickled_weight(f)},
        "custom-op": edit_program(lambda p: p["graph_module"]["graph"]["nodes"][1].update(
            target="torch.ops.mylib.fast_conv.default")),
        "hostile-sample": lambda f: {**f, next(n for n in f if "sample_inputs" in n): hostile_pickle(marker)},
    }.items():
        (data / case).mkdir()
        rewrite(src, data / case / "model.pt2", change)
        (data / case / "spec.json").write_text((out["image"] / "spec.json").read_text())
    return out


def _pickled_weight(files: dict[str, bytes]) -> dict[str, bytes]:
    name = next(n for n in files if n.endswith("_weights_config.json"))
    config = json.loads(files[name])
    config["config"][next(iter(config["config"]))]["use_pickle"] = True
    return {name: json.dumps(config).encode()}


@pytest.fixture(scope="module")
def svc(sources):
    from tests.service import Service

    with Service(sources["home"], heartbeat_ttl_s=30) as service:
        registry.register_model(service.settings, NEWS_STUB, kind="news", loader="models.news.checkpoint:load",
                                path=sources["image"])  # never loaded: submission checks only
        yield service


def _import(svc, body: dict) -> dict:
    r = svc.client.post("/models/import", json=body)
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=300)
    assert job["status"] == "succeeded", (job, svc.worker_logs())
    return svc.client.get(f"/jobs/{r.json()['id']}/result").json()


@pytest.fixture(scope="module")
def imported(svc, sources):
    out = {IMG: _import(svc, {"name": IMG, "kind": "export", "path": "image"}),
           IMG_B: _import(svc, {"name": IMG_B, "kind": "export", "path": "image-b", "weights": "model.pt2"}),
           TAB: _import(svc, {"name": TAB, "kind": "export", "path": "tabular", "config": TABULAR_SPEC}),
           NOMEAN: _import(svc, {"name": NOMEAN, "kind": "export", "path": "nomean"})}
    return out


def test_an_exported_program_imports_and_predicts_as_the_eager_model(svc, sources, imported):
    from models.export.program import load
    from tests.export_fixtures import DigitCNN

    res = imported[IMG]
    assert res["registry_kind"] == "exported_classifier" and res["kind"] == "export"
    assert res["labels"] == [str(i) for i in range(10)]
    assert res["spec"]["input"] == {"name": "x", "kind": "image", "dtype": "float32", "shape": ["batch", 1, 8, 8],
                                    "mean": [0.3]}
    assert "aten.conv2d.default" in res["operators"]
    assert res["smoke"]["logits_shape"] == [2, 10] and res["smoke"]["finite"] is True
    listed = {m["name"]: m for m in svc.client.get("/models").json()["models"]}[IMG]
    assert listed["kind"] == "exported_classifier"
    entry = registry.get_model(svc.settings, IMG)
    clf = load(registry.local_path(svc.settings, entry))
    eager = DigitCNN().eval()
    eager.load_state_dict(torch.load(sources["image"] / "eager.pt", weights_only=True))
    x = torch.randn(7, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(clf.logits(x), eager(x), rtol=1e-6, atol=1e-6)
    assert imported[TAB]["spec"]["input"]["features"] == TABULAR_SPEC["input"]["features"]


def test_a_hostile_sample_inputs_pickle_is_never_opened_by_api_or_worker(svc, sources, imported):
    res = _import(svc, {"name": "hostile-sample", "kind": "export", "path": "hostile-sample"})
    assert res["registry_kind"] == "exported_classifier"
    assert not sources["marker"].exists()


@pytest.mark.parametrize(("body", "loc", "says"), [
    ({"path": "pickled"}, ("body", "weights"), "pickle, which the service never opens"),
    ({"path": "custom-op"}, ("body", "weights"), "mylib.fast_conv.default, which is not an ATen operator"),
    ({"path": "image", "config": {"input": {"kind": "image", "shape": ["batch", 3, 8, 8]}}},
     ("body", "config", "input", "shape"), "has shape [batch, 1, 8, 8]"),
    ({"path": "image", "config": {"input": {"kind": "tabular"}}}, ("body", "config", "input", "kind"),
     "tabular input is [batch, features]"),
    ({"path": "image", "weights": "eager.pt"}, ("body", "weights"), "not a torch.export program"),
    ({"path": "image", "weights": "missing.pt2"}, ("body", "weights"), "no file"),
    ({"path": "image", "entities": "e.tsv"}, ("body", "entities"), "not for exported programs"),
])
def test_what_an_import_cannot_take_is_a_422_naming_the_field(svc, body, loc, says):
    r = svc.client.post("/models/import", json={"name": "refused", "kind": "export", **body})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert tuple(detail["loc"]) == loc and says in detail["msg"], detail
    assert "/tmp" not in r.text and str(Path.home()) not in r.text


def _image_inputs(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    items = [{"id": f"img{i}", "values": rng.normal(size=(1, 8, 8)).round(4).tolist(), "label": str(i % 3)}
             for i in range(n)]
    items[1]["target"] = "7"
    items[2]["target"] = 3
    return items


def test_whole_and_sharded_image_runs_give_one_result(svc, imported):
    body = {"model": IMG, "inputs": _image_inputs(6), "n_steps": 8, "top_k": 4, "precision": "fp32",
            "compare_with": IMG_B, "faithfulness": True, "baseline": "blur"}
    ids = []
    for shard_size in (6, 2):
        r = svc.client.post("/attributions", json={**body, "shard_size": shard_size})
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    for job_id in ids:
        job = svc.wait(job_id, timeout_s=300)
        assert job["status"] == "succeeded", (job.get("error"), svc.worker_logs()[-3000:])
    whole, sharded = (svc.client.get(f"/jobs/{j}/result").json() for j in ids)
    for result in (whole, sharded):
        AttributionResult.model_validate(result)
    assert sharded["shards"] == {"total": 3, "failed": []}

    def tolerance(where: str) -> tuple[float, float]:
        return (5e-2, 1e-4) if "relative_delta" in where or where.endswith("delta") else (1e-4, 1e-6)

    assert_same(*({k: v for k, v in r.items() if k not in ("shards", "artifacts")} for r in (sharded, whole)),
                tolerance, PER_RUN)
    assert whole["n_samples"] == 6 and whole["summary"]["baseline"] == "blur"
    by_id = {s["id"]: s for s in whole["samples"]}
    assert by_id["img1"]["target"] == {"index": 7, "label": "7", "source": "request"}
    assert by_id["img2"]["target"]["index"] == 3 and by_id["img0"]["target"]["source"] == "predicted"
    assert by_id["img0"]["input"]["grid"] == [8, 8] and len(by_id["img0"]["words"]) == 64
    compared = {s["id"]: s for s in whole["comparison"]["samples"]}
    assert all(compared[i]["target"]["label"] == by_id[i]["target"]["label"] for i in by_id)
    assert all(p["aligned"] == 64 for p in whole["comparison"]["per_sample"])
    assert whole["faithfulness"]["n_samples"] == 6

    from explainq_client import AttributionResult as SDKAttributionResult
    from explainq_client.render import attribution_html, tensor_html

    assert_renders(svc.settings, ids, SDKAttributionResult)
    # Jupyter draws each image as its grid of cells, each with its value
    grid = tensor_html(whole["samples"][0], 1.0)
    assert grid.count("<td title='r") == 64 and "r0c0: " in grid
    assert attribution_html(whole).count("<td title='r") == 64 * min(6, len(whole["samples"]))
    rows = SDKAttributionResult(whole).rows()
    assert len(rows) == 6 * 64
    first = rows[9]  # sample img0, cell r1c1
    assert (first["sample"], first["name"], first["row"], first["column"]) == ("img0", "r1c1", 1, 1)
    assert first["attribution"] == by_id["img0"]["word_attributions"][9]
    assert first["value"] == by_id["img0"]["input"]["values"][9] and first["target"] == by_id["img0"]["target"]["label"]


def test_a_tabular_run_names_its_features(svc, imported):
    rows = [{"id": f"r{i}", "values": [0.1 * i, -0.5, 1.0, 0.0, 2.0, -1.0], "target": "leave"} for i in range(3)]
    r = svc.client.post("/attributions", json={"model": TAB, "inputs": rows, "n_steps": 16, "baseline": "mean",
                                               "tolerance": 1e-3})
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=300)
    assert job["status"] == "succeeded", (job, svc.worker_logs())
    result = svc.client.get(f"/jobs/{r.json()['id']}/result").json()
    rec = result["samples"][0]
    assert rec["words"] == TABULAR_SPEC["input"]["features"] and rec["input"]["kind"] == "tabular"
    assert rec["input"]["values"] == pytest.approx(rows[0]["values"])
    assert result["summary"]["baseline"] == "mean" and result["summary"]["tolerance_met"] is True
    from explainq_client import AttributionResult as SDKAttributionResult
    from explainq_client.render import tensor_html

    frame = SDKAttributionResult(result).to_pandas()
    assert frame.shape[0] == 3 * 6 and list(frame["name"][:6]) == TABULAR_SPEC["input"]["features"]
    assert list(frame["value"][:6]) == pytest.approx(rows[0]["values"])
    bars = tensor_html(rec, 1.0)
    assert all(f"<td>{name}</td>" in bars for name in TABULAR_SPEC["input"]["features"])


ROW = [0.0] * 6


@pytest.mark.parametrize(("body", "loc", "says"), [
    ({"model": IMG}, ("body", "inputs"), "give inputs"),
    ({"model": IMG, "texts": [{"id": "a", "text": "x"}]}, ("body", "texts"), "exported classifier"),
    ({"model": IMG, "inputs": [{"id": "a", "values": [[[0.0] * 8] * 8]}] * 2}, ("body", "inputs", 1, "id"),
     "duplicate"),
    ({"model": IMG, "inputs": [{"id": "a", "values": [[[0.0] * 8] * 7]}]}, ("body", "inputs", 0, "values", 0),
     "has 7 entries"),
    ({"model": IMG, "inputs": [{"id": "a", "values": [[[0.0] * 7 + ["x"]] * 8]}]},
     ("body", "inputs", 0, "values", 0, 7, 7), "finite number"),
    ({"model": TAB, "inputs": [{"id": "a", "values": ROW, "target": "churn"}]}, ("body", "inputs", 0, "target"),
     "not a class"),
    ({"model": TAB, "inputs": [{"id": "a", "values": ROW}], "baseline": "blur"}, ("body", "baseline"),
     "for images"),
    ({"model": TAB, "inputs": [{"id": "a", "values": ROW}], "baseline": "pad"}, ("body", "baseline"),
     "for text models"),
    ({"model": NOMEAN, "inputs": [{"id": "a", "values": ROW}], "baseline": "mean"}, ("body", "baseline"),
     "no training mean"),
    ({"model": TAB, "inputs": [{"id": "a", "values": ROW}], "baseline": "custom"}, ("body", "baseline_values"),
     "needs baseline_values"),
    ({"model": TAB, "inputs": [{"id": "a", "values": ROW}], "baseline": "custom", "baseline_values": [0.0] * 5},
     ("body", "baseline_values", ), "has 5 entries"),
    ({"model": TAB, "inputs": [{"id": "a", "values": ROW}], "baseline_values": ROW}, ("body", "baseline_values"),
     "baseline is 'zero'"),
    ({"model": TAB, "inputs": [{"id": "a", "values": ROW}], "compare_with": IMG}, ("body", "compare_with"),
     "same input spec"),
    ({"model": NEWS_STUB, "inputs": [{"id": "a", "values": ROW}]}, ("body", "inputs"), "news recommender"),
])
def test_what_an_exported_model_cannot_take_is_a_422_naming_the_field(svc, imported, body, loc, says):
    r = svc.client.post("/attributions", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert tuple(detail["loc"]) == loc and says in detail["msg"], detail
