"""The SDK on the real pipelines (tiny models): attributions, ConvE training then TracIn on the trained model, and
a Vision-BDH run whose curves grow while it runs; each result as it renders in Jupyter."""

from __future__ import annotations

import re
import shutil
from html import escape

import pytest
from explainq_client import AttributionResult, Client, TracInResult, TrainingResult, diverging_color

from tests.http_server import HttpServer

NEWS_MODEL = "nrms-word-sdk"
HISTORY = ["Lakers beat Celtics in overtime thriller", "Yankees rally to win the league title"]
CONVE = {"dataset": "nations", "epochs": 2, "batch_size": 256, "lr": 0.01, "embedding_dim": 20,
         "embedding_height": 4, "num_filters": 4, "checkpoint_every": 1, "seed": 0}
BDH_MODEL = {"n_layer": 1, "n_embd": 16, "n_head": 2, "mlp_multiplier": 2, "dropout": 0.0}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from core import registry
    from models.news.demo import build_small
    from tests.service import Service

    paths = build_small(tmp_path_factory.getbasetemp() / "news-small", ("nrms-word-demo",), n_news=240, n_users=60)
    home = tmp_path_factory.mktemp("sdk-pipelines")
    service = Service(home, heartbeat_ttl_s=30, start=False, env={"OMP_NUM_THREADS": "1"})
    shutil.copytree(paths["nrms-word-demo"], home / "models" / NEWS_MODEL)
    registry.register_model(service.settings, NEWS_MODEL, kind="news", loader="models.news.checkpoint:load",
                            path=home / "models" / NEWS_MODEL, parameters=1)
    with service.start(), HttpServer(service.settings) as server, Client(server.url) as c:
        yield c


def test_attributions_render_every_word_with_its_sign(client):
    candidate = "Dodgers sign star quarterback to record deal"
    job = client.attributions(model=NEWS_MODEL, samples=[{"id": "a", "history": HISTORY, "candidate": candidate,
                                                          "label": "real"}], n_steps=16, precision="fp32")
    result = job.wait(timeout=180).result()
    assert isinstance(result, AttributionResult)
    (sample,) = result["samples"]
    assert abs(sample["delta"]) < 1e-3 * max(abs(sample["score"] - sample["baseline_score"]), 1.0)
    html = result._repr_html_()
    scale = max(abs(a) for a in sample["word_attributions"])
    spans = re.findall(r"<span title='([+-][^']*)' data-attribution='[^']*' style='background:(#[0-9a-f]{6})",
                       html)
    assert len(spans) == len(sample["words"])
    for word, value, (title, colour) in zip(sample["words"], sample["word_attributions"], spans, strict=True):
        assert escape(word) in html
        assert title == f"{value:+.4g}" and colour == diverging_color(value, scale)
    assert job.id in job._repr_html_()  # the job shows its status and, once fetched, its result
    text = result.text()  # `explainq-client result <id> --table`
    (row,) = [line for line in text.splitlines() if line.startswith("a ")]
    top = max(zip(sample["words"], sample["word_attributions"], strict=True), key=lambda p: abs(p[1]))
    assert row.split()[:2] == ["a", "real"] and f"{top[0]}({top[1]:+.4g})" in row


def test_train_conve_then_tracin_on_the_trained_model(client):
    train = client.train_conve(name="conve-sdk", **CONVE).wait(timeout=300)
    trained = train.result()
    assert isinstance(trained, TrainingResult) and len(trained.history) == 2
    assert "conve-sdk" in client.models.list().names()
    assert "<polyline" in trained._repr_html_()
    epochs = trained.text().splitlines()
    assert epochs[2].split()[0] == "epoch" and [line.split()[0] for line in epochs[3:5]] == ["1", "2"]

    job = client.tracin(model="conve-sdk", test_triples=[["usa", "embassy", "uk"]], top_k=3,
                        filter={"n_hops": 1})
    result = job.wait(timeout=300).result()
    assert isinstance(result, TracInResult)
    (entry,) = result["results"]
    html = result._repr_html_()
    assert "usa · embassy · uk" in html
    for row in entry["proponents"] + entry["opponents"]:
        assert " · ".join(row["train_triple"]) in html and f"{row['influence']:+.4g}" in html
    text = result.text()
    assert "test triple usa · embassy · uk" in text and "top proponents" in text and "top opponents" in text
    for row in entry["proponents"] + entry["opponents"]:
        assert any(" · ".join(row["train_triple"]) in line and f"{row['influence']:+.4g}" in line
                   for line in text.splitlines())


def test_bdh_curve_grows_while_it_runs(client):
    job = client.train_bdh(dataset="digits", epochs=3, batch_size=32, lr=3e-3, warmup_steps=2, model=BDH_MODEL,
                           max_train_samples=128, precision="fp32", deterministic=True, seed=3)
    lengths = []
    for event in job.stream(interval_s=0.05):
        history = ((event.job or {}).get("metrics") or {}).get("history")
        if history is not None and event.event == "running":
            lengths.append(len(history))
            if len(history) >= 1:
                assert "<polyline" in job._repr_html_()  # the live job shows its curves so far
    assert job.status == "succeeded"
    assert lengths and lengths == sorted(lengths) and lengths[0] < 3
    result = job.result()
    assert isinstance(result, TrainingResult) and len(result.history) == 3
    html = result._repr_html_()
    assert html.count("<polyline") >= 4 and "val_accuracy" in html and "train_loss" in html
    text = result.text().splitlines()
    assert "train_loss" in text[2].split() and [line.split()[0] for line in text[3:6]] == ["1", "2", "3"]
