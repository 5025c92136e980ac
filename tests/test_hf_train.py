"""Fine-tuning Hugging Face classifiers (``models.hf.train``, ``POST /train/classifier`` on an ``hf_classifier``):
a padded batch's step equals the mean of its texts' unpadded gradients, element-wise (BERT, RoBERTa, GPT-2); a run
is reproducible whatever the worker did before; text datasets (CSV and JSONL) register with their labels; the
service fine-tunes, keeps checkpoints, registers a model that loads and is explained; what it cannot take is a 422
naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.hf_fixtures import LABELS, save_classifier

NOUNS = ("movie", "film", "plot", "acting", "story")
GOOD = ("good", "great", "funny", "moving", "fine")
BAD = ("bad", "awful", "boring", "dull", "poor")


def _texts(n: int, seed: int) -> tuple[list[str], list[str]]:
    """``n`` short reviews over the fixtures' words: positive ones use GOOD adjectives, negative ones BAD."""
    gen = torch.Generator().manual_seed(seed)
    texts, labels = [], []
    for _ in range(n):
        positive = bool(torch.randint(2, (1,), generator=gen))
        adj = (GOOD if positive else BAD)[int(torch.randint(5, (1,), generator=gen))]
        noun = NOUNS[int(torch.randint(5, (1,), generator=gen))]
        texts.append(f"the {noun} was {'very ' if int(torch.randint(3, (1,), generator=gen)) == 0 else ''}{adj}")
        labels.append("positive" if positive else "negative")
    return texts, labels


def _write_csv(directory: Path, splits: dict[str, int]) -> Path:
    import csv

    directory.mkdir(parents=True, exist_ok=True)
    for i, (split, n) in enumerate(splits.items()):
        texts, labels = _texts(n, seed=i)
        with open(directory / f"{split}.csv", "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(["id", "text", "label"])
            w.writerows([[k, t, lab] for k, (t, lab) in enumerate(zip(texts, labels, strict=True))])
    return directory


def _no_dropout(directory: Path) -> Path:
    config = json.loads((directory / "config.json").read_text())
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop", "embd_pdrop", "attn_pdrop",
                "summary_first_dropout", "classifier_dropout"):
        if key in config:
            config[key] = 0.0
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize("model_type", ["bert", "roberta", "gpt2"])
def test_a_padded_batch_step_equals_the_mean_of_unpadded_gradients(tmp_path, model_type):
    from models.hf.checkpoint import load
    from models.hf.train import Encoded, train
    from models.textdata import TextSplit
    from models.training import TrainOptions

    path = _no_dropout(save_classifier(tmp_path / model_type, model_type))
    texts = ["the movie was good", "a very boring and long film", "great acting but the plot was dull", "not bad"]
    labels = ["positive", "negative", "neutral", "0"]
    ref = load(path, trainable=True)
    ref.model.train()
    grads = {n: torch.zeros_like(p) for n, p in ref.model.named_parameters()}
    for text, y in zip(texts, [2, 0, 1, 0], strict=True):
        enc = ref.tokenizer(text, return_tensors="pt")
        loss = torch.nn.functional.cross_entropy(ref.model(**enc).logits, torch.tensor([y]))
        ref.model.zero_grad()
        loss.backward()
        for n, p in ref.model.named_parameters():
            grads[n] += p.grad / len(texts)
    lr = 0.1
    expected = {n: p.detach() - lr * grads[n] for n, p in ref.model.named_parameters()}

    clf = load(path, trainable=True)
    data = Encoded(clf, TextSplit(texts, labels), max_length=64)
    assert data.labels.tolist() == [2, 0, 1, 0]
    trained = train(clf, data, TrainOptions(epochs=1, batch_size=len(texts), lr=lr, optimizer="sgd", momentum=0.0))
    assert len(trained.history) == 1
    for n, p in clf.model.named_parameters():
        torch.testing.assert_close(p.detach(), expected[n], rtol=1e-5, atol=1e-6, msg=n)


def test_a_run_is_reproducible_whatever_ran_before(tmp_path):
    from models.hf.checkpoint import load
    from models.hf.train import Encoded, train
    from models.textdata import TextSplit
    from models.training import TrainOptions

    path = save_classifier(tmp_path / "bert", "bert")  # dropout 0.1: drawn from the run's seed
    texts, labels = _texts(24, seed=0)
    weights = []
    for noise in (0, 1):
        torch.manual_seed(1234 + noise)  # what an earlier job left in the process's generator
        torch.rand(7)
        clf = load(path, trainable=True)
        train(clf, Encoded(clf, TextSplit(texts, labels), 32), TrainOptions(epochs=2, batch_size=8, lr=1e-3,
                                                                           optimizer="adamw"))
        weights.append({n: p.detach().clone() for n, p in clf.model.named_parameters()})
    for n in weights[0]:
        assert torch.equal(weights[0][n], weights[1][n]), n


def test_labels_are_class_names_or_indices_and_others_are_refused(tmp_path):
    from models.hf.checkpoint import load
    from models.hf.train import Encoded
    from models.textdata import TextSplit

    clf = load(save_classifier(tmp_path / "bert", "bert"))
    assert Encoded(clf, TextSplit(["a", "b", "c"], ["positive", "1", "0"]), 8).labels.tolist() == [2, 1, 0]
    with pytest.raises(ValueError, match=r"\['happy', '3'\]"):
        Encoded(clf, TextSplit(["a", "b", "c"], ["happy", "3", "positive"]), 8)


def test_text_files_are_read_bounded_and_name_the_bad_line(tmp_path):
    from models.textdata import TextDataError, read_split, summarize

    d = _write_csv(tmp_path / "ok", {"train": 10, "valid": 4})
    counts = summarize(d)
    assert counts["train"] == 10 and counts["valid"] == 4 and counts["file_format"] == "csv"
    assert counts["labels"] == ["negative", "positive"]
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / "train.jsonl").write_text('{"text": "good", "label": 1}\n\n{"text": "bad", "label": "0"}\n')
    split = read_split(tmp_path / "j" / "train.jsonl")
    assert split.texts == ["good", "bad"] and split.labels == ["1", "0"]
    for name, body, says in [
        ("train.csv", "text,label\n", "has no rows"),
        ("train.csv", "words,label\nx,1\n", "missing text"),
        ("train.csv", "text,label\nx,1,2\n", ":2: 3 columns"),
        ("train.csv", "text,label\n  ,1\n", ":2: text is empty"),
        ("train.jsonl", '{"text": "x", "label": 1}\n[1, 2]\n', ":2: each line must be a JSON object"),
        ("train.jsonl", '{"text": "x", "label": true}\n', ":1: label must be a class name"),
        ("train.jsonl", '{"text": 5, "label": 1}\n', ":1: text must be a string"),
    ]:
        d = tmp_path / f"bad{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        (d / name).write_text(body)
        with pytest.raises(TextDataError, match=says):
            summarize(d)


def test_a_text_too_long_is_refused_without_reading_on(tmp_path):
    from models.textdata import MAX_TEXT_CHARS, TextDataError, summarize

    (tmp_path / "train.csv").write_text("text,label\n" + "x" * (MAX_TEXT_CHARS + 10) + ",1\n")
    with pytest.raises(TextDataError, match="2"):
        summarize(tmp_path)


# ---------------------------------------------------------------------------------------------------- service
@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    from tests.service import Service

    home = tmp_path_factory.mktemp("hf-train") / "home"
    data = home / "data"
    save_classifier(data / "bert", "bert", hidden=32, scale=None)  # transformers' initialisation: it learns
    _write_csv(data / "reviews", {"train": 96, "valid": 32})
    (data / "moods").mkdir(parents=True)
    (data / "moods" / "train.jsonl").write_text('{"text": "good", "label": "happy"}\n{"text": "bad", "label": "sad"}\n')
    with Service(home, heartbeat_ttl_s=30) as service:
        r = service.client.post("/models/import", json={"name": "bert", "kind": "huggingface", "path": "bert"})
        assert r.status_code == 202, r.text
        assert service.wait(r.json()["id"], timeout_s=120)["status"] == "succeeded", service.worker_logs()
        yield service


def test_a_text_dataset_registers_with_its_labels(svc):
    r = svc.client.post("/datasets", json={"name": "reviews", "path": "reviews"})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["kind"] == "text_classification" and body["format"] == "text_csv"
    assert body["counts"]["train"] == 96 and body["counts"]["valid"] == 32
    assert body["counts"]["labels"] == ["negative", "positive"]


def test_fine_tune_register_and_explain(svc):
    r = svc.client.post("/train/classifier", json={"name": "bert-reviews", "model": "bert", "dataset": "reviews",
                                                   "epochs": 6, "batch_size": 16, "lr": 5e-3, "checkpoint_every": 4})
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=300)
    assert job["status"] == "succeeded", (job.get("error"), svc.worker_logs()[-3000:])
    result = svc.client.get(f"/jobs/{r.json()['id']}/result").json()
    assert result["optimizer"] == "adamw" and result["lr"] == 5e-3
    assert result["examples"] == {"train": 96, "valid": 32}
    assert [c["epoch"] for c in result["checkpoints"]] == [4, 6]
    assert all(c["file"].endswith(".safetensors") for c in result["checkpoints"])
    assert result["history"][-1]["loss"] < result["history"][0]["loss"]
    assert result["accuracy"]["valid"] >= 0.9, result["history"]
    entry = {m["name"]: m for m in svc.client.get("/models").json()["models"]}["bert-reviews"]
    assert entry["kind"] == "hf_classifier" and entry["meta"]["labels"] == list(LABELS)
    assert entry["meta"]["dims"] == {"hidden": 32, "layers": 2, "heads": 2}
    r = svc.client.post("/attributions", json={"model": "bert-reviews", "n_steps": 16,
                                               "texts": [{"id": "a", "text": "the plot was boring"}]})
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=120)
    assert job["status"] == "succeeded", job
    sample = svc.client.get(f"/jobs/{r.json()['id']}/result").json()["samples"][0]
    assert sample["target"]["label"] == "negative", sample["target"]


@pytest.mark.parametrize(("body", "loc", "says"), [
    ({"model": "bert", "dataset": "moods"}, ("body", "dataset"), "['happy', 'sad'] are neither class names"),
    ({"model": "bert", "dataset": "nope"}, ("body", "dataset"), "unknown dataset"),
    ({"model": "bert", "dataset": "reviews", "optimizer": "lbfgs"}, ("body", "optimizer"), "sgd"),
    ({"model": "bert", "dataset": "reviews", "max_length": 1}, ("body", "max_length"), "greater than"),
])
def test_what_fine_tuning_cannot_take_is_a_422_naming_the_field(svc, body, loc, says):
    r = svc.client.post("/train/classifier", json={"name": "x", **body})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert tuple(detail["loc"]) == loc and says in detail["msg"], detail


def test_fine_tuning_past_a_workers_memory_is_refused(svc):
    from core import registry
    from core.kinds.train_classifier import fine_tune_bytes

    entry = registry.get_model(svc.settings, "bert")
    need = fine_tune_bytes(entry["parameters"], entry["meta"]["dims"], 4096, 4096)
    assert need > svc.settings.worker_memory_bytes > 0
    r = svc.client.post("/train/classifier", json={"name": "x", "model": "bert", "dataset": "reviews",
                                                   "batch_size": 4096, "max_length": 4096})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "batch_size"], r.text
    assert "worker memory" in r.json()["detail"][0]["msg"]


@pytest.mark.slow  # MiniLM-L6 fine-tuned for an epoch: about a minute on 2 cores
def test_the_minilm_demo_learns_its_task(tmp_path):
    from core import registry
    from models.hf.checkpoint import load
    from models.hf.demo import TOPICS
    from tests.service import Service
    from workers.jobs.train_classifier import HF_DEMO_DATASET, HF_DEMO_MODEL, prepare_hf_demo

    service = Service(tmp_path / "home", start=False)
    try:
        prepare_hf_demo(service.settings, progress=False)
        entry = registry.get_model(service.settings, HF_DEMO_MODEL)
        assert entry["kind"] == "hf_classifier" and entry["meta"]["labels"] == list(TOPICS)
        assert entry["meta"]["accuracy"]["test"] >= 0.9, entry["meta"]["accuracy"]
        assert entry["meta"]["dims"] == {"hidden": 384, "layers": 6, "heads": 12}
        dataset = registry.get_dataset(service.settings, HF_DEMO_DATASET)
        assert dataset["kind"] == "text_classification" and dataset["meta"]["counts"]["train"] == 400
        created = entry["created_at"]
        prepare_hf_demo(service.settings, progress=False)  # idempotent: kept as registered
        assert registry.get_model(service.settings, HF_DEMO_MODEL)["created_at"] == created
        clf = load(registry.local_path(service.settings, entry))  # loads as any checkpoint a user brings
        assert clf.logits(["the senate passes the budget bill"]).argmax(1).item() == TOPICS.index("politics")
    finally:
        service.stop()
