"""Hugging Face sequence classifiers through ``POST /models/import`` (``kind: "huggingface"``), running none of their
code: BERT, DistilBERT, RoBERTa and GPT-2 classifiers saved with ``save_pretrained`` import, are listed as
``hf_classifier`` with their labels, and the registered version predicts exactly as transformers does; crafted
directories (remote code, pickles, unsupported types and architectures, no fast tokenizer, a garbage safetensors
header, links out of the data roots) are refused with a 422 on ``path`` that says why (and how to convert). The
pickles here would run code if anything unpickled them: a marker file proves nothing did, at the API or the worker.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
import torch

from models.hf.files import CheckpointError, checkpoint_files, inspect_checkpoint
from tests.hf_fixtures import LABELS, TEXTS, save_classifier

ARCHITECTURES = {"bert": "BertForSequenceClassification", "distilbert": "DistilBertForSequenceClassification",
                 "roberta": "RobertaForSequenceClassification", "gpt2": "GPT2ForSequenceClassification"}
SAVED = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


class RunsCode:
    """An object whose unpickling writes ``marker``: a pickle holding it runs code when loaded."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def write_evil_pickle(directory: Path, marker: Path) -> Path:
    """``pytorch_model.bin``: the classifier's state dict written with ``torch.save``, plus an entry whose unpickling
    writes ``marker``."""
    from transformers import AutoModelForSequenceClassification

    state = AutoModelForSequenceClassification.from_pretrained(directory).state_dict() \
        if (directory / "model.safetensors").is_file() else {}
    state["runs_code"] = RunsCode(marker)
    torch.save(state, directory / "pytorch_model.bin")
    return directory / "pytorch_model.bin"


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def craft(base: Path, directory: Path, case: str, marker: Path, outside: Path) -> Path:
    """A copy of the checkpoint ``base`` in ``directory``, made wrong the ``case`` way."""
    shutil.copytree(base, directory)
    if case == "remote_config":
        _edit_json(directory / "config.json", auto_map={
            "AutoConfig": "modeling_evil.EvilConfig", "AutoModelForSequenceClassification": "modeling_evil.Evil"})
        (directory / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w')\n")
    elif case == "remote_tokenizer":
        _edit_json(directory / "tokenizer_config.json", auto_map={"AutoTokenizer": ["tokenization_evil.Evil", None]})
        (directory / "tokenization_evil.py").write_text(f"open({str(marker)!r}, 'w')\n")
    elif case == "pickle_only":
        write_evil_pickle(directory, marker)
        (directory / "model.safetensors").unlink()
    elif case == "llama":
        _edit_json(directory / "config.json", model_type="llama", architectures=["LlamaForSequenceClassification"])
    elif case == "made_up_type":
        _edit_json(directory / "config.json", model_type="bertish")
    elif case == "not_a_classifier":
        _edit_json(directory / "config.json", architectures=["BertForMaskedLM"])
    elif case == "other_classifier":
        _edit_json(directory / "config.json", architectures=["RobertaForSequenceClassification"])
    elif case == "no_config":
        (directory / "config.json").unlink()
    elif case == "no_tokenizer":
        (directory / "tokenizer.json").unlink()
    elif case == "garbage_header":
        (directory / "model.safetensors").write_bytes(struct.pack("<Q", 24) + b"{this is not json at all")
    elif case == "link_out":
        outside.mkdir(parents=True, exist_ok=True)
        shutil.copy(directory / "model.safetensors", outside / "model.safetensors")
        (directory / "model.safetensors").unlink()
        (directory / "model.safetensors").symlink_to(outside / "model.safetensors")
    else:
        raise ValueError(case)
    return directory


# case -> words the refusal must say (the reason, and the way out where there is one)
REFUSALS = {
    "remote_config": ("config.json", "auto_map", "trust_remote_code", "safe_serialization=True"),
    "remote_tokenizer": ("tokenizer_config.json", "auto_map", "trust_remote_code"),
    "pickle_only": ("pytorch_model.bin", "pickle", "save_pretrained", "safe_serialization=True"),
    "llama": ("model_type", "'llama'", "bert"),
    "made_up_type": ("model_type", "'bertish'"),
    "not_a_classifier": ("BertForMaskedLM", "not a sequence classifier", "BertForSequenceClassification"),
    "other_classifier": ("RobertaForSequenceClassification", "'bert'", "BertForSequenceClassification"),
    "no_config": ("no config.json", "save_pretrained"),
    "no_tokenizer": ("tokenizer.json", "tokenizer.save_pretrained"),
    "garbage_header": ("model.safetensors", "safetensors header", "safe_serialization=True"),
}


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return save_classifier(tmp_path_factory.mktemp("hf-unit") / "bert", "bert")


# ---------------------------------------------------------------------------------------------- inspection alone


def test_inspect_reads_a_saved_classifier_as_data(bert) -> None:
    info = inspect_checkpoint(bert)
    assert (info.model_type, info.architecture, info.task) == ("bert", ARCHITECTURES["bert"],
                                                               "sequence_classification")
    assert info.labels == list(LABELS) and info.weights == ["model.safetensors"]
    assert info.files == SAVED  # what loading reads, never a pickle
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(bert)
    assert info.parameters == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_inspect_refuses_each_crafted_directory_saying_why(bert, tmp_path, case) -> None:
    marker = tmp_path / "marker"
    directory = craft(bert, tmp_path / case, case, marker, tmp_path / "outside")
    with pytest.raises(CheckpointError) as info:
        inspect_checkpoint(directory)
    for words in REFUSALS[case]:
        assert words in str(info.value), (case, str(info.value))
    assert not marker.exists()


def test_the_evil_pickle_really_runs_code_when_unpickled(tmp_path) -> None:
    """The pickles of these tests are potent: loading one without weights_only writes its marker."""
    (tmp_path / "d").mkdir()
    write_evil_pickle(tmp_path / "d", tmp_path / "proof")
    torch.load(tmp_path / "d" / "pytorch_model.bin", weights_only=False)
    assert (tmp_path / "proof").exists()


def test_inspect_refuses_malformed_labels_and_indexes(bert, tmp_path) -> None:
    d = tmp_path / "labels"
    shutil.copytree(bert, d)
    _edit_json(d / "config.json", id2label={"0": "a", "2": "c"})
    with pytest.raises(CheckpointError, match="0, 1, ..., n - 1"):
        inspect_checkpoint(d)
    (d / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="JSON object"):
        inspect_checkpoint(d)
    (d / "config.json").write_text("{" * 100_000)
    with pytest.raises(CheckpointError, match="not JSON"):
        inspect_checkpoint(d)
    d = tmp_path / "index"
    shutil.copytree(bert, d)
    (d / "model.safetensors").rename(d / "weights.safetensors")
    for weight_map in ({"a": "../bert/model.safetensors"}, {"a": "missing.safetensors"}, {"a": ["x"]}, {},
                       {"a": "weights.bin"}):
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        with pytest.raises(CheckpointError, match="must map the tensors"):
            inspect_checkpoint(d)


def test_a_sharded_checkpoint_is_read_from_its_index(tmp_path) -> None:
    from transformers import AutoModelForSequenceClassification

    src = save_classifier(tmp_path / "one", "bert")
    model = AutoModelForSequenceClassification.from_pretrained(src)
    model.save_pretrained(tmp_path / "sharded", safe_serialization=True, max_shard_size="20KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, tmp_path / "sharded" / name)
    info = inspect_checkpoint(tmp_path / "sharded")
    assert len(info.weights) > 1 and info.files[:2] == ["config.json", "model.safetensors.index.json"]
    assert info.parameters == sum(p.numel() for p in model.parameters())
    assert checkpoint_files(["model.safetensors"], {"special_tokens_map.json"}) == [
        "config.json", "model.safetensors", "tokenizer.json", "special_tokens_map.json"]


def headless(base: Path, directory: Path) -> Path:
    """The checkpoint without its classifier head (a base model's weights under a classifier's config)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(base, directory)
    state = {k: v for k, v in load_file(directory / "model.safetensors").items() if not k.startswith("classifier.")}
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def test_load_refuses_weights_without_the_classifier_head(bert, tmp_path) -> None:
    """transformers would initialise a missing classifier at random and only warn: the loader refuses it."""
    from models.hf.checkpoint import load

    with pytest.raises(ValueError, match="classifier.weight"):
        load(headless(bert, tmp_path / "headless"))


def test_load_never_opens_a_pickle_beside_the_safetensors(bert, tmp_path) -> None:
    from models.hf.checkpoint import load

    d = tmp_path / "mixed"
    shutil.copytree(bert, d)
    write_evil_pickle(d, tmp_path / "marker")
    clf = load(d)
    assert clf.logits(TEXTS).shape == (len(TEXTS), len(LABELS))
    assert not (tmp_path / "marker").exists()


# ------------------------------------------------------------------------------------------------- the service


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("hf-import")
    data = base / "home" / "data"
    marker = base / "outside" / "code-ran"
    out = {"home": base / "home", "data": data, "marker": marker}
    for model_type in ARCHITECTURES:
        out[model_type] = save_classifier(data / f"hf-{model_type}", model_type, seed=len(model_type))
    for case in REFUSALS:
        craft(out["bert"], data / case.replace("_", "-"), case, marker, base / "outside" / case)
    craft(out["bert"], data / "link-out", "link_out", marker, base / "outside" / "link")
    shutil.copytree(out["bert"], base / "outside" / "dir")
    (data / "dir-link").symlink_to(base / "outside" / "dir")
    shutil.copytree(out["bert"], data / "mixed")
    write_evil_pickle(data / "mixed", marker)
    shutil.copytree(out["bert"], data / "swap")
    headless(out["bert"], data / "headless")
    return out


@pytest.fixture(scope="module")
def svc(sources):
    from tests.service import Service

    with Service(sources["home"], heartbeat_ttl_s=30) as service:
        yield service


def _submit(svc, body: dict) -> dict:
    r = svc.client.post("/models/import", json=body)
    assert r.status_code == 202, r.text
    return r.json()


def _finish(svc, job_id: str, ok: bool = True) -> dict:
    job = svc.wait(job_id, timeout_s=300)
    if not ok:
        assert job["status"] == "failed", job
        return job
    assert job["status"] == "succeeded", (job, svc.worker_logs())
    return svc.client.get(f"/jobs/{job_id}/result").json()


def _load_registered(svc, name: str):
    from core import registry
    from core.contract.kind import import_object

    entry = registry.get_model(svc.settings, name)
    path = registry.local_path(svc.settings, entry)
    return import_object(entry["loader"])(path, "cpu"), sorted(os.listdir(path))


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_a_saved_classifier_imports_and_predicts_exactly_as_transformers(svc, sources, model_type) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    name = f"hf-{model_type}"
    res = _finish(svc, _submit(svc, {"name": name, "kind": "huggingface", "path": name})["id"])
    reference = AutoModelForSequenceClassification.from_pretrained(sources[model_type]).eval()
    tokenizer = AutoTokenizer.from_pretrained(sources[model_type])
    assert res.pop("provenance")["registered"][0]["name"] == name  # what produced it (tests/test_provenance.py)
    assert res == {
        "model": name, "kind": "huggingface", "registry_kind": "hf_classifier",
        "parameters": sum(p.numel() for p in reference.parameters()),
        "smoke": {"texts": 3, "logits_shape": [3, len(LABELS)], "finite": True},
        "model_type": model_type, "architecture": ARCHITECTURES[model_type], "task": "sequence_classification",
        "labels": list(LABELS), "entities": None, "relations": None, "reciprocal": None, "pykeen": None,
        "train_triples": None, "checkpoints": None, "metrics": None, "spec": None, "operators": None}
    listed = {m["name"]: m for m in svc.client.get("/models").json()["models"]}[name]
    assert listed["kind"] == "hf_classifier" and listed["parameters"] == res["parameters"]
    meta = listed["meta"]
    assert meta["labels"] == list(LABELS) and meta["imported"] is True and meta["source"] == name
    assert (meta["model_type"], meta["architecture"], meta["task"]) == (model_type, ARCHITECTURES[model_type],
                                                                         "sequence_classification")
    clf, files = _load_registered(svc, name)
    assert files == SAVED
    with torch.no_grad():
        expected = torch.stack([reference(**tokenizer(t, return_tensors="pt")).logits[0] for t in TEXTS])
    got = clf.logits(TEXTS)
    assert torch.equal(got, expected), (got, expected)
    assert clf.labels == list(LABELS) and not any(p.requires_grad for p in clf.model.parameters())


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_each_crafted_directory_is_a_422_on_path_saying_why(svc, sources, case) -> None:
    path = case.replace("_", "-")
    r = svc.client.post("/models/import", json={"name": "crafted", "kind": "huggingface", "path": path})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"] == ["body", "path"], detail
    for words in REFUSALS[case]:
        assert words in detail["msg"], (case, detail["msg"])
    assert str(sources["data"]) not in detail["msg"]  # no server path
    assert not sources["marker"].exists()


def test_links_out_of_the_data_roots_are_422_on_path(svc, sources) -> None:
    for path, says in (("link-out", "link-out/model.safetensors leads outside the data roots"),
                       ("dir-link", "outside the data roots")):
        r = svc.client.post("/models/import", json={"name": "linked", "kind": "huggingface", "path": path})
        assert r.status_code == 422, r.text
        detail = r.json()["detail"][0]
        assert detail["loc"] == ["body", "path"] and says in detail["msg"], detail


def test_fields_of_other_kinds_are_422_naming_them(svc) -> None:
    for field, value in (("weights", "model.safetensors"), ("config", {"num_labels": 3}), ("vocab", "vocab.json"),
                         ("checkpoints", [{"file": "model.safetensors", "lr": 0.1}]), ("reciprocal", False),
                         ("train_triples", "train.txt")):
        r = svc.client.post("/models/import", json={"name": "x", "kind": "huggingface", "path": "hf-bert",
                                                    field: value})
        assert r.status_code == 422, r.text
        detail = r.json()["detail"][0]
        assert detail["loc"] == ["body", field] and "not for Hugging Face imports" in detail["msg"], detail
    # the other kinds answer a checkpoint list that is not theirs with a JSON 422 too (it once failed to serialise)
    r = svc.client.post("/models/import", json={"name": "x", "kind": "nrms", "path": "hf-bert",
                                                "checkpoints": [{"file": "model.safetensors", "lr": 0.1}]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "checkpoints"], r.text


def test_a_pickle_beside_the_safetensors_is_never_opened_nor_copied(svc, sources) -> None:
    res = _finish(svc, _submit(svc, {"name": "hf-mixed", "kind": "huggingface", "path": "mixed"})["id"])
    assert res["registry_kind"] == "hf_classifier"
    _, files = _load_registered(svc, "hf-mixed")
    assert files == SAVED and not sources["marker"].exists()
    r = svc.client.post("/tracin", json={"model": "hf-mixed", "test_triples": [["a", "r", "b"]]})
    assert r.status_code == 422 and "hf_classifier" in r.json()["detail"][0]["msg"]  # not another kind's model


def test_a_classifier_without_its_head_fails_the_job_naming_the_tensors(svc, sources) -> None:
    failed = _finish(svc, _submit(svc, {"name": "hf-headless", "kind": "huggingface", "path": "headless"})["id"],
                     ok=False)
    assert failed["error"]["code"] == "invalid_model", failed
    message = failed["error"]["message"]
    assert "classifier.weight" in message and "save_pretrained" in message, message
    assert str(svc.settings.work_dir) not in message and str(sources["data"]) not in message
    assert "hf-headless" not in {m["name"] for m in svc.client.get("/models").json()["models"]}


def test_the_worker_checks_the_directory_again_and_never_unpickles(svc, sources) -> None:
    """The directory changes between submission and the job: the job refuses the pickle it now holds."""
    r = svc.client.post("/test/train-sleep", json={"steps": 20, "step_s": 0.1})  # holds the train queue
    assert r.status_code == 202, r.text
    job = _submit(svc, {"name": "hf-swapped", "kind": "huggingface", "path": "swap"})
    write_evil_pickle(sources["data"] / "swap", sources["marker"])
    (sources["data"] / "swap" / "model.safetensors").unlink()
    assert svc.client.get(f"/jobs/{job['id']}").json()["status"] == "queued"  # the swap came first
    failed = _finish(svc, job["id"], ok=False)
    assert failed["error"]["code"] == "invalid_model", failed
    assert "pytorch_model.bin" in failed["error"]["message"] and "safe_serialization" in failed["error"]["message"]
    assert not sources["marker"].exists()
    assert "hf-swapped" not in {m["name"] for m in svc.client.get("/models").json()["models"]}
