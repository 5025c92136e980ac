"""End to end with real workers: an attribution comparison whose completeness fails on purpose (two left-Riemann
steps), read back as the result, the words' CSV and the dashboard's page, in a browser at phone width too; and a
TracIn job whose card CSV is its artifact and whose test triple, a training triple, is badged."""

from __future__ import annotations

import csv
import html as htmlmod
import io
import os
import re
from pathlib import Path

import pytest
import torch

from core import registry
from models.news.checkpoint import save
from models.news.modules import build_model
from models.news.summary import WORDS_CSV_COLUMNS, completeness_excess
from models.news.text import WordTokenizer

pytestmark = pytest.mark.slow

TEXTS = ["SHOCKING: Fans can't believe the Derby result", "Senate passes the Budget bill",
         "Lakers beat Celtics in overtime", "Markets rally on Rate cut", "Coach praises the Defence"]


def _word_model(path, seed: int) -> None:
    torch.manual_seed(seed)
    model = build_model({"kind": "nrms", "encoder": "word", "emb_dim": 16, "heads": 2, "head_dim": 4,
                         "query_dim": 8, "dropout": 0.0}, tokenizer=WordTokenizer.build(TEXTS)).eval()
    save(model, path)


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    from models.kg.train import TrainConfig, train_conve
    from models.kg.triples import load_nations
    from tests.service import Service

    home = tmp_path_factory.mktemp("ui-analysis")
    service = Service(home, heartbeat_ttl_s=20, start=False, env={"OMP_NUM_THREADS": "1"})
    for name, seed in (("word-a", 0), ("word-b", 1)):
        _word_model(home / "models" / name, seed)
        registry.register_model(service.settings, name, kind="news", loader="models.news.checkpoint:load",
                                path=home / "models" / name, parameters=1)
    out = home / "models" / "conve-tiny"
    summary = train_conve(load_nations(), TrainConfig(epochs=1, embedding_dim=20, embedding_height=4,
                                                      num_filters=4, checkpoint_every=1), out, device="cpu")
    registry.register_model(service.settings, "conve-tiny", kind="conve", loader="models.kg.checkpoint:load",
                            path=out, parameters=summary["parameters"])
    with service.start():
        yield service


def _run(svc, route: str, body: dict) -> tuple[dict, dict]:
    r = svc.client.post(route, json=body)
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=300)
    assert job["status"] == "succeeded", (job, svc.worker_logs())
    return job, svc.client.get(f"/jobs/{job['id']}/result").json()


@pytest.fixture(scope="module")
def comparison(svc):
    samples = [{"id": f"s{i}", "history": TEXTS[1:], "candidate": t, "label": "fake" if i == 0 else "real"}
               for i, t in enumerate([TEXTS[0], TEXTS[2], TEXTS[3], TEXTS[1]])]
    return _run(svc, "/attributions", {"model": "word-a", "compare_with": "word-b", "samples": samples,
                                       "n_steps": 2, "method": "riemann_left", "precision": "fp32",
                                       "compare_top_n": 2, "compare_min_count": 2})


def test_result_warns_for_exactly_the_samples_over_the_threshold(comparison) -> None:
    job, result = comparison
    assert job["progress"]["total"] == 4 == job["progress"]["done"]  # samples, not samples x models
    over = [s["id"] for s in result["samples"] if completeness_excess(s, 0.05)]
    over_b = [s["id"] for s in result["comparison"]["samples"] if completeness_excess(s, 0.05)]
    assert over or over_b, "two left-Riemann steps met completeness: the warning is not exercised"
    warned = [w for w in result["warnings"] if not w.startswith("compare_with")]
    warned_b = [w for w in result["warnings"] if w.startswith("compare_with 'word-b'")]
    assert [re.search(r"sample '([^']+)'", w).group(1) for w in warned] == over
    assert [re.search(r"sample '([^']+)'", w).group(1) for w in warned_b] == over_b
    assert result["samples"][0]["display_words"][:2] == ["SHOCKING", ":"]
    assert all(len(p["changed"]) <= 2 for p in result["comparison"]["per_sample"])


def test_words_csv_artifact_is_what_the_result_and_page_say(svc, comparison) -> None:
    job, result = comparison
    text = svc.artifact(job["id"], "words.csv").decode()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == WORDS_CSV_COLUMNS
    expected = [(m, s["id"], i, w, d, a) for m, recs in (("word-a", result["samples"]),
                                                          ("word-b", result["comparison"]["samples"]))
                for s in recs for i, (w, d, a) in enumerate(zip(s["words"], s["display_words"],
                                                               s["word_attributions"], strict=True))]
    assert [(r["model"], r["sample_id"], int(r["position"]), r["word"], r["display_word"], float(r["attribution"]))
            for r in rows] == expected
    page = svc.client.get(f"/ui/jobs/{job['id']}?view=table").text
    assert f'/jobs/{job["id"]}/artifacts/words.csv' in page
    s0 = result["samples"][0]
    article = re.search(r'data-sample-id="s0".*?</article>', page, re.S).group(0)
    shown = [htmlmod.unescape(v) for v in re.findall(r'data-display="([^"]*)"', article)]
    assert shown[:len(s0["display_words"])] == s0["display_words"]
    for sid in [s["id"] for s in result["samples"] if completeness_excess(s, 0.05)]:
        assert re.search(rf'data-sample-id="{sid}" data-warned="1"', page)


@pytest.fixture(scope="module")
def tracin(svc):
    from models.kg.triples import load_nations

    ds = load_nations()
    train_triple = ds.decode(ds.train[:1])[0]
    return _run(svc, "/tracin", {"model": "conve-tiny", "test_triples": [train_triple, ds.decode(ds.test[:1])[0]],
                                 "top_k": 5, "layers": "last", "filter": {"n_hops": 1}})


def test_tracin_card_csv_is_the_artifact_and_a_training_triple_is_badged(svc, tracin) -> None:
    from models.kg.triples import load_nations

    ds = load_nations()
    job, result = tracin
    entry = result["results"][0]
    assert entry["in_train"] is True and entry["prediction"]["n_entities"] == len(ds.entities)
    card = svc.client.get(f"/ui/jobs/{job['id']}/influence.csv")
    assert card.status_code == 200 and card.content == svc.artifact(job["id"], "influence.csv")
    page = svc.client.get(f"/ui/jobs/{job['id']}").text
    assert "in the training set" in page and "filtered rank of the tail" in page


def test_the_real_pages_have_no_horizontal_overflow_at_390_px(svc, comparison, tracin) -> None:
    from tests.browser import CHROMIUM
    from tests.http_server import HttpServer

    if CHROMIUM is None:
        pytest.skip("no system Chromium")
    from playwright.sync_api import sync_playwright

    job, _ = comparison
    tracin_job, _ = tracin
    shots = os.environ.get("EXPLAINQ_UI_SCREENSHOTS")
    with HttpServer(svc.settings) as http, sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            pg = b.new_page(viewport={"width": 390, "height": 844})
            for options in ("", "?values=1", "?view=table"):
                pg.goto(f"{http.url}/ui/jobs/{job['id']}{options}")
                pg.locator("article.sample").first.wait_for()
                assert pg.evaluate("document.documentElement.scrollWidth") <= 391, options
            if shots:
                pg.goto(f"{http.url}/ui/jobs/{job['id']}?values=1")
                pg.locator("article.sample").first.scroll_into_view_if_needed()
                pg.screenshot(path=str(Path(shots) / "dashboard-comparison-phone.png"))
            pg.goto(f"{http.url}/ui/jobs/{tracin_job['id']}")
            pg.locator("article.test-triple").first.wait_for()
            assert pg.evaluate("document.documentElement.scrollWidth") <= 391, "tracin"
            if shots:
                pg.set_viewport_size({"width": 1280, "height": 900})
                pg.locator("article.test-triple").first.scroll_into_view_if_needed()
                pg.screenshot(path=str(Path(shots) / "dashboard-tracin.png"))
        finally:
            b.close()
