"""The job pages of TracIn, ConvE training and the LoRA ablation, rendered from real finished jobs."""

from __future__ import annotations

import csv
import html as htmlmod
import io
import json
import re

import pytest

from core import registry
from models.kg.train import TrainConfig, train_conve
from models.kg.triples import load_nations
from models.lora.synthetic import generate_dataset

TINY = {"epochs": 2, "batch_size": 256, "lr": 0.01, "embedding_dim": 20, "embedding_height": 4, "num_filters": 4,
        "checkpoint_every": 1, "seed": 0}


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    from tests.service import Service

    home = tmp_path_factory.mktemp("ui-kinds")
    generate_dataset(home / "data" / "lora-tiny", signal=("visual",), seed=1, num_classes=3, per_class=10,
                     width_divisor=32, max_blocks=2, strength=0.8)
    service = Service(home, heartbeat_ttl_s=20, start=False, env={"OMP_NUM_THREADS": "1"})
    out = home / "models" / "conve-tiny"
    summary = train_conve(load_nations(), TrainConfig(**TINY), out, device="cpu")
    registry.register_model(service.settings, "conve-tiny", kind="conve", loader="models.kg.checkpoint:load",
                            path=out, parameters=summary["parameters"])
    with service.start():
        yield service


def _run(svc, route: str, body: dict) -> tuple[str, dict]:
    r = svc.client.post(route, json=body)
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=180)
    assert job["status"] == "succeeded", (job, svc.worker_logs())
    return job["id"], svc.client.get(f"/jobs/{job['id']}/result").json()


def _text(fragment: str) -> str:
    return htmlmod.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", fragment))).strip()


def test_tracin_page_tables_filter_and_csv(svc) -> None:
    job_id, result = _run(svc, "/tracin", {"model": "conve-tiny", "test_triples": [["usa", "embassy", "uk"]],
                                           "top_k": 4, "layers": "all", "filter": {"n_hops": 1}})
    page = svc.client.get(f"/ui/jobs/{job_id}").text
    assert "1-hop neighbourhood of the test triple" in page
    assert "<h2>Request</h2>" in page and "\"lr_weight\"" in page  # the stored request, defaults included
    (r,) = result["results"]
    assert r["proponents"], r
    tables = re.findall(r'<table class="compact influence"><caption>([^<]+)</caption>(.*?)</table>', page, re.S)
    assert [c for c, _ in tables] == ["Proponents (support the prediction)", "Opponents (work against it)"]
    all_widths = []
    for (_, body), key in zip(tables, ("proponents", "opponents"), strict=True):
        rows = re.findall(r"<tr><td>\d+</td>(.*?)</tr>", body, re.S)
        assert len(rows) == len(r[key])
        if not rows:
            assert re.search(r'<td colspan="5" class="hint">none( \(see below\))?</td>', body), body
            continue
        for row, p in zip(rows, r[key], strict=True):
            assert _text(row).startswith(" ".join(p["train_triple"]))
        widths = [float(w) for w in re.findall(r'<span style="width:([\d.]+)%">', body)]
        assert widths == sorted(widths, reverse=True)
        all_widths += widths
    assert max(all_widths) == 100.0  # one scale per test triple: its largest |influence|, either sign
    download = svc.client.get(f"/ui/jobs/{job_id}/influence.csv")
    assert download.headers["content-type"].startswith("text/csv")
    assert download.content == svc.artifact(job_id, "influence.csv")  # one CSV: the card's is the artifact
    rows = list(csv.DictReader(io.StringIO(download.text)))
    assert len(rows) == len(r["proponents"]) + len(r["opponents"])
    assert float(rows[0]["TracInScore"]) == r["proponents"][0]["influence"]
    assert "influence.csv" in page  # the job's own artifact is listed too

    job_id, result = _run(svc, "/tracin", {"model": "conve-tiny", "mode": "self", "top_k": 5, "layers": "last"})
    page = svc.client.get(f"/ui/jobs/{job_id}").text
    assert "Self-influence ranking" in page and f"5 of {result['n_candidates']} training triples" in page


def test_conve_training_page_curves_metrics_and_checkpoints(svc) -> None:
    job_id, result = _run(svc, "/train/conve", {"name": "conve-ui", **{k: v for k, v in TINY.items()
                                                                      if k != "seed"}, "epochs": 3})
    page = svc.client.get(f"/ui/jobs/{job_id}").text
    rows = json.loads(htmlmod.unescape(re.search(r'data-rows="([^"]*)"', page).group(1)))
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert [r["loss"] for r in rows] == [h["loss"] for h in result["history"]]
    assert rows[-1]["valid_mrr"] == result["history"][-1]["valid"]["mrr"]
    assert page.count('<figure class="chart"') == 3  # the per-step running loss, loss, MRR / Hits@k
    for c in result["checkpoints"]:
        assert c["file"] in page
    assert re.search(r'<th scope="row">test</th>', page) and "Registered as <a class=\"mono\" href=\"/ui/models#model-conve-ui\">conve-ui" in page


def test_ablation_page_table_with_mean_std_and_drop(svc) -> None:
    job_id, result = _run(svc, "/ablations", {"dataset": "lora-tiny", "representations": ["simple_stats",
                                              "spectral_delta"], "layer_sets": ["all", "visual"], "quick": True,
                                              "max_epochs": 8, "hidden_dim": 32, "batch_size": 64})
    page = svc.client.get(f"/ui/jobs/{job_id}").text
    body = re.search(r'<table class="compact ablation">(.*?)</table>', page, re.S).group(1)
    rows = re.findall(r'<tr><th scope="row">([^<]+)</th>(.*?)</tr>', body, re.S)
    assert [r for r, _ in rows] == ["simple_stats", "spectral_delta"]
    for rep, cells in rows:
        for ls in ("all", "visual"):
            acc = result["results"][ls][rep]["test_acc"]
            assert f"{acc['mean']:.3f}".rstrip("0").rstrip(".") in cells
        drop = result["drop"][rep]["absolute"]
        assert f"{abs(drop):.3f}".rstrip("0").rstrip(".") in cells
    assert "results.json" in page
